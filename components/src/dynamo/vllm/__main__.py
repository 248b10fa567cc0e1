"""``python -m dynamo.vllm``: see :mod:`dynamo.vllm.main`."""

# Before anything heavy: where ai-dynamo is installed this tree must not run at all.
from dynamo.common.coexistence import refuse_beside_upstream

refuse_beside_upstream("python -m dynamo.vllm")

from dynamo.common.startup_signals import exit_process  # noqa: E402 - after the check
from dynamo.vllm.main import main  # noqa: E402 - only once the check above has passed

exit_process(main())
