"""The two GC options, declared once and instantiated per surface.

The frontend reads them as ``--dyn-freeze-gc-heap`` / ``DYN_FREEZE_GC_HEAP``; the vLLM worker as
``--freeze-gc-heap`` / ``DYN_VLLM_FREEZE_GC_HEAP``. Both surfaces put them in the same
``freeze_gc_heap`` and ``gc_pause_log_ms`` attributes so the lifecycle code is shared.
"""

from __future__ import annotations

from dataclasses import dataclass

from .options import Option, milliseconds_option


@dataclass(frozen=True)
class GcSettings:
    """What a process does to its GC heap: freeze it at the quiescent point, log long pauses."""

    freeze_gc_heap: bool
    gc_pause_log_ms: float


FREEZE_GC_HEAP = Option(
    name="freeze-gc-heap",
    env_var="FREEZE_GC_HEAP",
    default=True,
    dest="freeze_gc_heap",
    help=(
        "Collect once and move the start-up heap into CPython's permanent GC generation at the "
        "last quiescent start-up point, so later full collections skip it. --no-* restores "
        "stock CPython behaviour."
    ),
)

# The pause log's threshold is not a wait: its limit is what a GC pause can be. The longest
# reported are tens of seconds (SGLang #28067: 46 s on a heap grown for 6.5 hours); a threshold
# above an hour could never log anything, so it is taken for a typo (a unit mix-up, a stray
# digit) rather than accepted.
MAX_PAUSE_LOG_MS = 3_600_000.0

GC_PAUSE_LOG_MS = milliseconds_option(
    "gc-pause-log-ms",
    "GC_PAUSE_LOG_MS",
    0.0,
    "Log a WARNING for every GC pause at least this many milliseconds long; 0 turns the log off.",
    maximum=MAX_PAUSE_LOG_MS,
    maximum_reason="one hour: no GC pause comes near it, so a larger threshold would never log",
)


def gc_options(*, flag_prefix: str, env_prefix: str) -> list[Option]:
    """The GC options under one surface's naming scheme."""
    return [
        option.renamed(name=flag_prefix + option.name, env_var=env_prefix + option.env_var)
        for option in (FREEZE_GC_HEAP, GC_PAUSE_LOG_MS)
    ]


def debug_gc_endpoint_option(*, name: str, env_var: str, where: str, collect: bool) -> Option:
    """The debug switch every surface has, declared once: the same name on each (``dest``
    ``debug_gc_endpoint``, so shared code reads one attribute) and a help that says what this
    surface serves (``collect``: ``POST /debug/gc/collect`` beside ``GET /debug/gc/state``) and
    where."""
    routes = "POST /debug/gc/collect and GET /debug/gc/state" if collect else "GET /debug/gc/state"
    collect_help = " POST /debug/gc/collect runs one full gc.collect()." if collect else ""
    return Option(
        name=name,
        env_var=env_var,
        default=False,
        dest="debug_gc_endpoint",
        help=(
            f"Serve {routes} on {where}. GET /debug/gc/state answers JSON (serving phase, "
            "thresholds, frozen and tracked objects, pause counters) and walks the heap to count "
            f"them.{collect_help} Each call pauses the process: for tests and diagnosis, keep off "
            "in production."
        ),
    )
