"""Snapshot and put back a process's GC state, and undo what a launcher did to it at exit.

The collector's own settings plus what :mod:`dynamo_gc.freeze` and :mod:`dynamo_gc.pause_logger`
keep about them (observers, the last freeze record, the installed pause logger), so code that
runs many start-ups in one interpreter (tests) and a launcher's shutdown leave nothing behind.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

from dynamo_gc import freeze, pause_logger
from dynamo_gc.freeze import FreezeRecord
from dynamo_gc.pause_logger import GcPauseLogger, uninstall_gc_pause_logger


@dataclass(frozen=True)
class GcState:
    """A snapshot of the process's GC state and of what this layer keeps about it.

    The collector's settings (automatic collection on or off, thresholds, ``gc.callbacks``),
    the installed pause logger, the freeze observers and the last freeze record. The permanent
    generation is not in it: it cannot be put back as it was (see :func:`restore_gc_state`).
    """

    enabled: bool
    thresholds: tuple[int, ...]
    callbacks: tuple[Callable[..., object], ...]
    pause_logger: GcPauseLogger | None
    freeze_observers: tuple[Callable[[FreezeRecord], None], ...]
    last_freeze: FreezeRecord | None


def snapshot_gc_state() -> GcState:
    """The process's GC state now, for :func:`restore_gc_state`."""
    observers, last = freeze._bookkeeping()
    return GcState(
        enabled=gc.isenabled(),
        thresholds=gc.get_threshold(),
        callbacks=tuple(gc.callbacks),
        pause_logger=pause_logger.installed_gc_pause_logger(),
        freeze_observers=observers,
        last_freeze=last,
    )


def restore_gc_state(state: GcState) -> None:
    """Put back everything ``state`` holds, and unfreeze the heap.

    Whatever froze since the snapshot is unfrozen (``gc.unfreeze()``, a splice, no heap walk):
    a frozen heap is never collected (see :class:`ProcessGcState`), and a snapshot cannot tell
    the frozen objects apart. For code that runs several launchers' start-ups in one process
    (the tests put the state back after each one).
    """
    pause_logger._restore_installed(state.callbacks, state.pause_logger)
    gc.unfreeze()
    gc.set_threshold(*state.thresholds)
    (gc.enable if state.enabled else gc.disable)()
    freeze._restore_bookkeeping(state.freeze_observers, state.last_freeze)


class ProcessGcState:
    """What a launcher did to its process's GC state, undone once everything else has stopped.

    Undone last (after the engine, listener, pool and sessions have closed, so no pause of
    their shutdown goes unrecorded): the pause logger leaves ``gc.callbacks`` (no pause line
    after the launcher's final line), the metrics stop observing, and a heap this process froze
    is unfrozen. Frozen objects are never collected, not even by the interpreter's final
    collections at exit, so cycles holding native objects would never be finalized (vLLM's
    triton/nanobind instances are then reported as leaked). ``gc.unfreeze()`` is a splice, no
    heap walk. With the freeze off nothing is unfrozen: the process never touched the
    generations.
    """

    def __init__(self, metrics=None) -> None:
        self.metrics = metrics  # anything with detach(): dynamo_gc.metrics.DynamoMetrics
        self.froze = False

    def restore(self) -> None:
        uninstall_gc_pause_logger()
        if self.metrics is not None:
            self.metrics.detach()
        if self.froze:
            gc.unfreeze()
