"""The self-benchmark's GC policy: no automatic gen2 collection in a measured window, no trace.

A self-benchmark times one forward pass per point. CPython's full (gen2) collection fires whenever
the objects promoted since the last full pass exceed 25% of the long-lived ones, so over a sweep it
lands at geometrically spaced points, each time walking the whole heap (and, with ranks in
lockstep, stalling every rank). While the policy runs:

* automatic gen2 collections are off, gen0/gen1 collections and refcounting go on as usual;
* the heap is frozen once at start, and a daemon thread repeats a bare ``gc.freeze()`` every
  interval so that survivors of young collections leave the generations the collector walks;
* :func:`gc_maintain` (unfreeze, collect, freeze) reclaims cyclic garbage in an untimed window
  between points of a long sweep.

:func:`stop_policy` puts everything back: stock thresholds (exactly as saved, never a
hard-coded 700: 3.13 uses 2000), the deferred garbage collected, and the heap frozen again only if
it was frozen before the policy started or the caller's serving freeze follows. Both functions are
idempotent.

Two faces, one state. A worker uses :func:`start_policy` / :func:`stop_policy` /
:func:`maintain` (its options decide; stop knows whether a serving freeze follows). Upstream
Dynamo's public names live here too, with upstream's meaning and return types:
:func:`start_gc_policy` (env-gated: nothing unless ``DYN_FPM_GC_POLICY=freeze``, any case),
:func:`stop_gc_policy` (``None``) and :func:`gc_maintain` (the permanent generation's size); the
vLLM glue (the worker extension vLLM mixes into every rank, the EngineCore scheduler) calls them
from the launcher's side. Unlike upstream, importing this module starts nothing: the worker
starts the policy in every rank through the extension when its self-benchmark begins, so a
serving process never carries it.

How gen2 is disabled (CPython 3.10-3.13, Modules/gcmodule.c ``gc_collect_generations`` /
3.13 ``gc_select_generation``): on each automatic collection CPython picks the oldest generation
``i`` whose ``count > threshold[i]``; for gen2 it also requires ``long_lived_pending >=
long_lived_total / 4``. ``count[2]`` grows by one per gen1 collection. So ``threshold2 = 0`` does
*not* disable gen2 -- it makes gen2 eligible after every gen1 collection, gated only by the 25%
rule (measured: the same gen2 count as the stock 10). Only ``threshold0 = 0`` turns automatic
collection off, and then gen0/gen1 go too. We keep threshold0/threshold1 and set threshold2 to
INT_MAX (``set_threshold`` takes C ints): gen2 would need 2**31 gen1 collections, i.e. never.

Unsound builds: on a free-threaded build ``gc.freeze()`` is a stop-the-world walk of the whole
heap, and on CPython 3.14.0-3.14.4 (incremental GC) the third threshold is ignored and a freeze
walks part of the heap. There the policy logs a WARNING and runs without the periodic freeze, and
its start line says that automatic full collections still run (the raised threshold is ignored).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field

from dynamo_gc.bench_policy_config import policy_config_from_env
from dynamo_gc.gc_builds import GEN2_NEVER, threshold2_ignored_reason, unsound_build_reason
from dynamo_gc.pause_logger import installed_gc_pause_logger

logger = logging.getLogger(__name__)

FREEZE_THREAD_NAME = "dynamo-gc-policy-freeze"


# CPython 3.12.1 starts every interpreter with 375 of its own objects in the permanent
# generation (measured here with `python -I -S`; 3.10, 3.11 and 3.13 start with 0). A heap that
# someone froze holds tens of thousands at least, so only more than this counts as frozen.
INTERPRETER_RESIDUE_MAX = 1000


def heap_is_frozen() -> bool:
    """Whether someone froze this process's heap (walks the permanent generation once)."""
    return gc.get_freeze_count() > INTERPRETER_RESIDUE_MAX


@dataclass
class _RunningPolicy:
    saved_thresholds: tuple[int, ...]
    was_frozen: bool
    interval_s: float
    unsound_reason: str | None
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    periodic_freezes: int = 0


# _lifecycle_lock serialises start/stop (so a start can never save the policy's own thresholds).
# _freeze_lock serialises every freeze/unfreeze the policy does, so the thread cannot freeze the
# heap between gc_maintain's unfreeze and its collect. stop joins the thread without holding
# _freeze_lock, so the thread can always finish its last tick.
_lifecycle_lock = threading.Lock()
_freeze_lock = threading.Lock()
_running: _RunningPolicy | None = None


def _freeze_loop(policy: _RunningPolicy) -> None:
    # Event.wait returns True as soon as stop is asked: no sleep to wait out on shutdown.
    while not policy.stop_event.wait(policy.interval_s):
        with _freeze_lock:
            gc.freeze()  # a list splice: no traversal, no pause, no get_freeze_count()
        policy.periodic_freezes += 1


def start_policy(*, interval_s: float | None = None) -> bool:
    """Start the policy in this process, whatever the env says; ``False`` (and nothing changed)
    if it already runs. The worker calls this once its own options have turned the policy on.

    ``interval_s`` is the period of the background freeze; ``None`` reads
    ``DYN_FPM_GC_FREEZE_INTERVAL_S`` (WARNING and default when bad).
    """
    global _running
    if interval_s is None:
        interval_s = policy_config_from_env().interval_s
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"GC policy freeze interval must be a positive number, not {interval_s!r}")
    with _lifecycle_lock:
        if _running is not None:
            return False
        reason = unsound_build_reason()
        # One walk of the permanent generation, once, before any measurement: it tells stop
        # whether the heap must be frozen again to look as it did (vLLM freezes its ranks).
        was_frozen = heap_is_frozen()
        saved = gc.get_threshold()
        policy = _RunningPolicy(
            saved_thresholds=saved,
            was_frozen=was_frozen,
            interval_s=float(interval_s),
            unsound_reason=reason,
        )
        gc.set_threshold(saved[0], saved[1], GEN2_NEVER)
        with _freeze_lock:
            # No collect first: stop_gc_policy unfreezes and collects, so today's garbage is
            # deferred, not kept forever.
            gc.freeze()
        if reason is None:
            policy.thread = threading.Thread(
                target=_freeze_loop, args=(policy,), name=FREEZE_THREAD_NAME, daemon=True
            )
            policy.thread.start()
        else:
            logger.warning(
                "GC policy is not sound on this build (%s): running without the periodic "
                "freeze; gen2 pauses may still land in measured windows",
                reason,
            )
        _running = policy
    if reason is None:
        periodic = f"bare gc.freeze() every {policy.interval_s:g}s"
    else:
        periodic = "no periodic freeze"
    ignored = threshold2_ignored_reason()
    if ignored is None:
        logger.info(
            "GC policy started: automatic gen2 off (thresholds %s -> %s), heap frozen, %s",
            saved,
            gc.get_threshold(),
            periodic,
        )
    else:
        # Saying "gen2 off" here would be false: the threshold is set, the collector ignores it.
        logger.info(
            "GC policy started: thresholds %s -> %s, but automatic full collections still run "
            "(%s); heap frozen, %s",
            saved,
            gc.get_threshold(),
            ignored,
            periodic,
        )
    return True


def stop_policy(*, serving_freeze: bool = False) -> bool:
    """Stop the policy and put GC state back; ``False`` if it was not running.

    Stops the freeze thread, restores the saved thresholds exactly, unfreezes and collects the
    garbage the policy deferred. The heap is frozen again when it was frozen before the policy
    started, or when ``serving_freeze`` says the caller's serving freeze follows: that freeze
    (``freeze_gc_heap``, with its log line) then only collects the young generations and splices,
    instead of walking the whole heap a second time. Either way the end state is the one serving
    would have had without the benchmark.
    """
    global _running
    with _lifecycle_lock:
        policy = _running
        if policy is None:
            return False
        policy.stop_event.set()
        if policy.thread is not None:
            policy.thread.join()
        started = time.perf_counter()
        gc.set_threshold(*policy.saved_thresholds)
        refreeze = serving_freeze or policy.was_frozen
        with _freeze_lock:
            gc.unfreeze()
            collected = gc.collect()
            if refreeze:
                gc.freeze()
        _running = None
    logger.info(
        "GC policy stopped: thresholds restored to %s, collected=%d deferred objects, heap %s, "
        "took_ms=%.1f",
        policy.saved_thresholds,
        collected,
        _refreeze_outcome(serving_freeze=serving_freeze, was_frozen=policy.was_frozen),
        (time.perf_counter() - started) * 1000.0,
    )
    return True


def _refreeze_outcome(*, serving_freeze: bool, was_frozen: bool) -> str:
    """What the stop did with the heap, and why, for its log line."""
    if was_frozen:
        return "frozen again (it was frozen before the policy started)"
    if serving_freeze:
        return "frozen again (the serving freeze follows)"
    return "left unfrozen (no serving freeze follows)"


def maintain() -> int:
    """Unfreeze, collect, freeze: an untimed window in a long sweep. Returns objects collected.

    Only while the policy runs (0 otherwise): outside it, a freeze here would be a trace.
    """
    if _running is None:
        return 0
    with _freeze_lock:
        gc.unfreeze()
        collected = gc.collect()
        gc.freeze()
    return collected


def policy_running() -> bool:
    return _running is not None


def gc_process_report(label: str) -> dict:
    """:func:`gc_policy_state` plus what a benchmark reports per process, from an untimed window.

    Walks the heap twice (``gc.get_freeze_count()`` and ``gc.get_objects()``: ~0.1 s on a
    600k-object heap), so never call it inside a measured window. ``tracked_objects`` counts the
    objects the collector tracks outside the permanent generation (what a full collection walks),
    ``frozen_objects`` those inside it; ``collections`` is CPython's per-generation count since
    the process started (``gc.get_stats()``), and ``pause_logger`` the pause logger's counters
    when one is installed here.
    """
    state = gc_policy_state()
    state["label"] = label
    state["frozen_objects"] = gc.get_freeze_count()
    state["heap_frozen"] = state["frozen_objects"] > INTERPRETER_RESIDUE_MAX
    state["tracked_objects"] = len(gc.get_objects())
    state["counts"] = list(gc.get_count())
    state["collections"] = [generation["collections"] for generation in gc.get_stats()]
    installed = installed_gc_pause_logger()
    state["pause_logger"] = None if installed is None else installed.snapshot()
    return state


def gc_policy_state() -> dict:
    """This process's GC state and policy, as plain data (no heap walk)."""
    policy = _running
    return {
        "pid": os.getpid(),
        "thresholds": tuple(gc.get_threshold()),
        "isenabled": gc.isenabled(),
        "policy_running": policy is not None,
        "interval_s": None if policy is None else policy.interval_s,
        "periodic_freezes": 0 if policy is None else policy.periodic_freezes,
        "freeze_thread_alive": bool(policy and policy.thread and policy.thread.is_alive()),
        "unsound_reason": unsound_build_reason(),
    }


# --- Upstream Dynamo's public API (``dynamo.vllm.gc_policy`` in ai-dynamo 1.6.1) ------------
#
# Same names, arguments and return types as upstream, so a call site written for upstream runs
# here unchanged. What differs on purpose (see docs/upstream.md): importing this module starts
# nothing; a bad env value is refused or warned about instead of silently clamped; stop freezes
# the heap again only if it was frozen before; gc_maintain outside the policy changes nothing.


def start_gc_policy() -> bool:
    """Start the policy if ``DYN_FPM_GC_POLICY`` says ``freeze`` (any case, blanks ignored).

    Upstream's env-gated start: nothing happens, and ``False`` is returned, unless the env turns
    the policy on; then it runs with ``DYN_FPM_GC_FREEZE_INTERVAL_S`` (a bad value: WARNING and
    the default) and ``True`` is returned, also when it was already running.
    """
    config = policy_config_from_env()
    if not config.enabled:
        return False
    start_policy(interval_s=config.interval_s)
    return True


def stop_gc_policy() -> None:
    """Stop the policy and put GC state back (idempotent; nothing to do if it never started)."""
    stop_policy()


def gc_maintain() -> int:
    """Reclaim the garbage the policy deferred (unfreeze, collect, freeze), from an untimed window.

    Returns the number of objects in the permanent generation afterwards, as upstream does
    (``gc.get_freeze_count()``: a walk of the frozen heap, so never call it per step). Outside the
    policy it changes nothing and only reports that count.
    """
    maintain()
    return gc.get_freeze_count()
