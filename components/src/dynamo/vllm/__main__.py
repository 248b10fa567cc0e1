"""``python -m dynamo.vllm``: see :mod:`dynamo.vllm.main`."""

from dynamo.common.startup_signals import exit_process
from dynamo.vllm.main import main

exit_process(main())
