"""Freeze the GC heap at quiescent points.

CPython facts this module relies on (checked on 3.10-3.15, see docs/design.md):

* ``gc.freeze()`` moves every tracked object into the permanent generation, which later
  collections never walk. Freezing without collecting first would keep today's garbage forever,
  so :func:`freeze_gc_heap` always collects every generation first.
* ``gc.get_freeze_count()`` walks the permanent generation (milliseconds per 100k objects): it is
  called once per freeze for the log line and nowhere else.

Where a freeze may happen is the serving-phase guard's call (:mod:`dynamo_gc.lifecycle`); how long
pauses are measured is :mod:`dynamo_gc.pause_logger`.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from dynamo_gc import lifecycle

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FreezeRecord:
    """What one successful freeze did (for metrics and status endpoints)."""

    context: str
    collected: int
    frozen: int
    took_ms: float
    # The collection alone (without the freeze and the count): with collected + frozen, the
    # objects a full walk examines per millisecond here (the maintenance trigger's estimate).
    collect_ms: float | None = None


# Observers of successful freezes (metrics). They get the FreezeRecord and must not block.
_freeze_observers: list[Callable[[FreezeRecord], None]] = []
_last_freeze: FreezeRecord | None = None


def add_freeze_observer(observer: Callable[[FreezeRecord], None]) -> None:
    _freeze_observers.append(observer)


def remove_freeze_observer(observer: Callable[[FreezeRecord], None]) -> None:
    if observer in _freeze_observers:
        _freeze_observers.remove(observer)


def last_freeze() -> FreezeRecord | None:
    """The most recent successful freeze in this process, or ``None``."""
    return _last_freeze


def freeze_gc_heap(*, context: str) -> int | None:
    """Collect every generation, freeze what survives, log one line; return the frozen count.

    Refused (WARNING, ``None``, no GC state touched) once the process admits requests: a
    blocking full collection then would stall every request in flight, which is the very pause
    this project exists to remove.
    """
    if not lifecycle.freeze_allowed():
        # The exact line in every non-starting phase: a draining process still serves
        # the requests in flight. The phase itself is in the lifecycle's own log.
        logger.warning("GC heap freeze refused (%s): process is serving requests", context)
        return None
    started = time.perf_counter()
    collected = gc.collect()  # every generation: garbage must not be frozen
    collect_ms = (time.perf_counter() - started) * 1000.0
    gc.freeze()
    frozen = gc.get_freeze_count()  # one heap walk per freeze, for the log line and metrics
    # took_ms is everything the process paid before admission, the count's walk included
    # (~130 ms of a real vLLM parent's ~600 ms).
    took_ms = (time.perf_counter() - started) * 1000.0
    record = FreezeRecord(context, collected, frozen, took_ms, collect_ms)
    _set_last_freeze(record)
    logger.info(
        "GC heap frozen (%s): collected=%d frozen=%d took_ms=%.1f",
        context,
        collected,
        frozen,
        took_ms,
    )
    tell_freeze_observers(record)
    return frozen


def _set_last_freeze(record: FreezeRecord) -> None:
    global _last_freeze
    _last_freeze = record


def tell_freeze_observers(record: FreezeRecord) -> None:
    """Make ``record`` the last freeze and tell every observer (the start-up freeze, and a
    maintenance that counted what it froze: :mod:`dynamo_gc.maintenance`)."""
    _set_last_freeze(record)
    for observer in list(_freeze_observers):
        # The freeze has happened; a broken metrics observer must not fail the launcher's
        # start-up or keep the other observers from hearing about it.
        try:
            observer(record)
        except Exception:  # see above
            logger.exception("GC freeze observer %r failed", observer)


def maybe_freeze_gc_heap(enabled: bool, *, context: str) -> int | None:
    """:func:`freeze_gc_heap` when ``enabled``; otherwise ``None`` and no GC state touched."""
    if not enabled:
        logger.info("GC heap freeze disabled (%s): stock CPython GC", context)
        return None
    return freeze_gc_heap(context=context)


def _bookkeeping() -> tuple[tuple[Callable[[FreezeRecord], None], ...], FreezeRecord | None]:
    """The observers and the last record, for :mod:`dynamo_gc.gc_state`'s snapshot."""
    return tuple(_freeze_observers), _last_freeze


def _restore_bookkeeping(
    observers: tuple[Callable[[FreezeRecord], None], ...], record: FreezeRecord | None
) -> None:
    """Put back what :func:`_bookkeeping` returned (:func:`dynamo_gc.gc_state.restore_gc_state`)."""
    global _last_freeze
    _freeze_observers[:] = observers
    _last_freeze = record
