"""The drain deadline, declared once and instantiated per surface (like the GC options).

The frontend reads it as ``--dyn-drain-timeout`` / ``DYN_DRAIN_TIMEOUT``, the worker as
``--drain-timeout`` / ``DYN_VLLM_DRAIN_TIMEOUT``; both put it in ``drain_timeout``.
"""

from __future__ import annotations

from dynamo_gc.configuration.options import Option, seconds_option

# The default fits the Kubernetes examples under docs/deploy: terminationGracePeriodSeconds 45
# = the frontend's 5 s preStop pause + this + a margin for the endings and the exit.
DEFAULT_DRAIN_TIMEOUT_S = 30.0

DRAIN_TIMEOUT = seconds_option(
    "drain-timeout",
    "DRAIN_TIMEOUT",
    DEFAULT_DRAIN_TIMEOUT_S,
    (
        "After SIGTERM, how long requests in flight may run before they are cut short: a "
        "stream then ends with a final error (an SSE error event and [DONE] from the frontend, "
        "an in-band error line from the worker), any other request gets 503, and the process "
        "exits a few seconds later. Keep the pod's terminationGracePeriodSeconds at least its "
        "preStop pause + this + 5"
    ),
)


def drain_option(*, flag_prefix: str, env_prefix: str) -> Option:
    return DRAIN_TIMEOUT.renamed(
        name=flag_prefix + DRAIN_TIMEOUT.name, env_var=env_prefix + DRAIN_TIMEOUT.env_var
    )
