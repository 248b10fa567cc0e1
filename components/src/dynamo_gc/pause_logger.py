"""Measure GC pauses without lengthening them: the process's ``gc.callbacks`` entry.

``gc.callbacks`` get ``(phase, info)`` around each collection, in the thread that triggered it,
never nested. A pause logger is two timestamps and a comparison; it must not walk the heap.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from dynamo_gc import lifecycle

logger = logging.getLogger(__name__)

# The generations CPython reports in ``info["generation"]`` (0, 1, 2 on 3.10-3.15).
GENERATIONS = 3


class GcPauseLogger:
    """A ``gc.callbacks`` entry that times each collection and logs the long ones.

    The callback reads a clock, subtracts and bumps a few integers: no heap walk, no
    ``gc.get_objects()``, no ``gc.get_freeze_count()``, so it does not lengthen the pause it
    reports. Counters are plain attributes that metrics and tests read.

    ``threshold_ms <= 0`` records every pause without logging any (metrics only).
    ``on_pause(generation, seconds)`` runs for every collection, after the counters; it must be
    as cheap as the callback itself (a histogram ``observe``). ``on_collection(generation,
    seconds, info)`` runs after it, with CPython's ``info`` (the serving-time maintenance's
    trigger: it sets a few attributes, nothing more).

    Long pauses log at WARNING once the process admits requests, and at INFO while it is still
    ``starting``: imports, engine init and the freeze's own collection pause a process that
    serves nothing yet, and an operator alerting on WARNING lines should not be paged by every
    pod start. A serving-time maintenance's own collections (``maintaining``: nothing in flight,
    nothing admitted) log at INFO too.

    The pause is ours on every version: two timestamps around the collection, so the work of
    the other callbacks that run with it (another library's GC logger walking the heap) counts,
    since it stalls the process too. CPython 3.15 also hands callbacks the collector's own
    ``duration`` and the ``candidates`` it examined; there the line gives both beside ours,
    which tells an operator whether a long pause was the collector or a callback.
    docs/design.md ("CPython 3.14 and 3.15") has the measurement behind this.
    """

    LINE = "GC gen%d pause %.1f ms (collected=%s uncollectable=%s)"
    LINE_WITH_COLLECTOR = (
        "GC gen%d pause %.1f ms (collected=%s uncollectable=%s collector_ms=%.1f candidates=%s)"
    )

    def __init__(
        self,
        threshold_ms: float,
        log: logging.Logger | None = None,
        on_pause: Callable[[int, float], None] | None = None,
        on_collection: Callable[[int, float, dict], None] | None = None,
    ) -> None:
        self.threshold_ms = float(threshold_ms)
        # round, not int: 4.1 * 1e6 is 4099999.9999..., and truncating it would log a pause one
        # nanosecond under the operator's threshold.
        self._threshold_ns = round(self.threshold_ms * 1e6) if self.threshold_ms > 0 else None
        self._log = log if log is not None else logger
        self._on_pause = on_pause
        self._on_collection = on_collection
        self._start_ns: int | None = None
        self.collections = [0] * GENERATIONS
        self.pauses_logged = [0] * GENERATIONS
        self.max_pause_ns = 0
        self.total_pause_ns = 0
        self.callback_errors = 0

    @property
    def max_pause_ms(self) -> float:
        return self.max_pause_ns / 1e6

    @property
    def total_pause_ms(self) -> float:
        return self.total_pause_ns / 1e6

    def __call__(self, phase: str, info: dict) -> None:
        # Never raise into the collector: CPython would print the error and carry on, but a
        # noisy traceback on every collection is its own outage.
        try:
            if phase == "start":
                self._start_ns = time.perf_counter_ns()
                return
            if phase != "stop" or self._start_ns is None:
                return  # a stop without a start (installed mid-collection) is ignored
            pause_ns = time.perf_counter_ns() - self._start_ns
            self._start_ns = None
            generation = info.get("generation", GENERATIONS - 1)
            if not isinstance(generation, int) or not 0 <= generation < GENERATIONS:
                generation = GENERATIONS - 1
            self.collections[generation] += 1
            self.total_pause_ns += pause_ns
            if pause_ns > self.max_pause_ns:
                self.max_pause_ns = pause_ns
            if self._threshold_ns is not None and pause_ns >= self._threshold_ns:
                self.pauses_logged[generation] += 1
                self._log_pause(generation, pause_ns, info)
            # Last, so a failing sink (metrics) cannot swallow the WARNING above.
            if self._on_pause is not None:
                self._on_pause(generation, pause_ns / 1e9)
            if self._on_collection is not None:
                self._on_collection(generation, pause_ns / 1e9, info)
        except Exception as exc:  # noqa: BLE001 - see above
            self.callback_errors += 1
            if self.callback_errors == 1:
                self._warn_callback_failed(exc)

    def _log_pause(self, generation: int, pause_ns: int, info: dict) -> None:
        quiet = lifecycle.current_phase() in (lifecycle.Phase.STARTING, lifecycle.Phase.MAINTAINING)
        level = logging.INFO if quiet else logging.WARNING
        counts = (
            generation,
            pause_ns / 1e6,
            info.get("collected", "?"),
            info.get("uncollectable", "?"),
        )
        duration_s = info.get("duration")  # CPython 3.15+
        if isinstance(duration_s, float):
            candidates = info.get("candidates", "?")
            self._log.log(level, self.LINE_WITH_COLLECTOR, *counts, duration_s * 1e3, candidates)
        else:
            self._log.log(level, self.LINE, *counts)

    def _warn_callback_failed(self, exc: Exception) -> None:
        # Once: a sink that fails on every collection would otherwise flood the log, and a
        # silent counter would hide a broken metrics pipeline.
        try:
            self._log.warning(
                "GC pause logger callback failed (%r); later failures are only counted", exc
            )
        except Exception:  # noqa: BLE001 - never raise into the collector
            pass

    def snapshot(self) -> dict:
        """The counters as plain data (for status endpoints and tests)."""
        return {
            "threshold_ms": self.threshold_ms,
            "collections": list(self.collections),
            "pauses_logged": list(self.pauses_logged),
            "max_pause_ms": self.max_pause_ms,
            "total_pause_ms": self.total_pause_ms,
        }


_install_lock = threading.Lock()
_installed: GcPauseLogger | None = None


def installed_gc_pause_logger() -> GcPauseLogger | None:
    return _installed


def install_gc_pause_logger(
    threshold_ms: float,
    *,
    on_pause: Callable[[int, float], None] | None = None,
    on_collection: Callable[[int, float, dict], None] | None = None,
) -> GcPauseLogger | None:
    """Install the process's pause logger (replacing an earlier one: one callback at most).

    ``threshold_ms <= 0`` with no ``on_pause`` nor ``on_collection`` installs nothing and
    returns ``None``.
    """
    global _installed
    with _install_lock:
        _remove_installed()
        if threshold_ms <= 0 and on_pause is None and on_collection is None:
            return None
        pause_logger = GcPauseLogger(threshold_ms, on_pause=on_pause, on_collection=on_collection)
        gc.callbacks.append(pause_logger)
        _installed = pause_logger
    if threshold_ms > 0:
        logger.info("GC pause logger installed: WARNING for pauses >= %g ms", threshold_ms)
    return pause_logger


def uninstall_gc_pause_logger() -> None:
    with _install_lock:
        _remove_installed()


def _remove_installed() -> None:
    global _installed
    if _installed is not None:
        try:
            gc.callbacks.remove(_installed)
        except ValueError:
            pass  # someone cleared gc.callbacks (a test fixture); nothing left to remove
        _installed = None


def _restore_installed(
    callbacks: tuple[Callable[..., object], ...], pause_logger: GcPauseLogger | None
) -> None:
    """Put back ``gc.callbacks`` and the installed pause logger together, under the install
    lock, so no install can land between the two (:func:`dynamo_gc.gc_state.restore_gc_state`)."""
    global _installed
    with _install_lock:
        gc.callbacks[:] = callbacks
        _installed = pause_logger
