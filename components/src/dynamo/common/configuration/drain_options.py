"""The drain deadline, declared once and instantiated per surface (like the GC options).

The frontend reads it as ``--dyn-drain-timeout`` / ``DYN_DRAIN_TIMEOUT``, the worker as
``--drain-timeout`` / ``DYN_VLLM_DRAIN_TIMEOUT``; both put it in ``drain_timeout``.
"""

from __future__ import annotations

from dataclasses import replace

from dynamo_gc.configuration.options import Option, seconds_option

# The default fits the Kubernetes examples under docs/deploy: terminationGracePeriodSeconds 45
# = the frontend's 5 s preStop pause + this + a margin for the endings and the exit.
DEFAULT_DRAIN_TIMEOUT_S = 30.0

_HELP = (
    "After SIGTERM, how long requests in flight may run before they are cut short: a "
    "stream then ends with a final error {ending}, any other request gets 503, and the "
    "process exits a few seconds later. Keep the pod's terminationGracePeriodSeconds at "
    "least its preStop pause + this + 5"
)

# How each launcher ends a stream cut short: each help describes its own process's ending.
STREAM_ENDINGS = {
    "dyn-": "(an SSE error event, then [DONE])",  # the frontend's
    "": "(an in-band error line, which the frontend passes on as an SSE error event)",
}


# One declaration (one dest, drain_timeout, for both surfaces); each surface's help tells its
# own process's ending.
DRAIN_TIMEOUT = seconds_option(
    "drain-timeout",
    "DRAIN_TIMEOUT",
    DEFAULT_DRAIN_TIMEOUT_S,
    _HELP.format(ending="(the launcher's own)"),
)


def drain_option(*, flag_prefix: str, env_prefix: str) -> Option:
    """The drain deadline under a launcher's naming, its help telling that launcher's ending."""
    return replace(
        DRAIN_TIMEOUT.renamed(
            name=flag_prefix + DRAIN_TIMEOUT.name, env_var=env_prefix + DRAIN_TIMEOUT.env_var
        ),
        help=_HELP.format(ending=STREAM_ENDINGS[flag_prefix]),
    )
