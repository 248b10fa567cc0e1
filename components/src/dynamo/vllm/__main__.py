"""``python -m dynamo.vllm``: see :mod:`dynamo.vllm.main`."""

from dynamo.vllm.main import main

raise SystemExit(main())
