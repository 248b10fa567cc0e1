"""The serving phase of this process, and the guard that keeps freezes at quiescent points.

A process is ``starting`` until it admits requests (frontend: its HTTP listener opens; worker:
``register_model`` is about to be called), then ``serving``, then ``draining`` on shutdown.
:func:`dynamo_gc.freeze.freeze_gc_heap` asks :func:`freeze_allowed` and refuses
outside ``starting``, so a freeze from the discovery watcher or the chat engine factory is
impossible by construction rather than by review.

The phase is per process: a spawned child (a preprocess worker, a rank) starts in ``starting``.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


class Phase(str, enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"


_ORDER = {Phase.STARTING: 0, Phase.SERVING: 1, Phase.DRAINING: 2}
_lock = threading.Lock()
_phase = Phase.STARTING
_listeners: list = []


def current_phase() -> Phase:
    return _phase


def freeze_allowed() -> bool:
    """True only while the process admits no requests yet."""
    return _phase is Phase.STARTING


def _advance(to: Phase, reason: str) -> None:
    global _phase
    with _lock:
        if _ORDER[to] < _ORDER[_phase]:
            raise RuntimeError(f"serving phase cannot go back from {_phase.value} to {to.value}")
        if to is _phase:
            return
        previous, _phase = _phase, to
        listeners = list(_listeners)
    logger.info("Serving phase %s -> %s (%s)", previous.value, to.value, reason)
    for listener in listeners:
        # The phase has changed; a broken listener (metrics) must not fail the launcher at the
        # moment it opens for traffic, nor keep the other listeners from hearing about it.
        try:
            listener(to)
        except Exception:  # see above
            logger.exception("Serving-phase listener %r failed", listener)


def mark_serving(reason: str) -> None:
    """Call right before the process admits its first request."""
    _advance(Phase.SERVING, reason)


def mark_draining(reason: str) -> None:
    """Call when shutdown starts: no new requests, in-flight ones finish."""
    _advance(Phase.DRAINING, reason)


def add_phase_listener(listener) -> None:
    """``listener(phase)`` runs after every change (metrics use it); it must not block."""
    with _lock:
        _listeners.append(listener)


def remove_phase_listener(listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def reset_for_new_process() -> None:
    """Put the phase back to ``starting``, as in a freshly started process.

    For tests, which run many launchers' start-ups in one interpreter. The project's child
    processes (preprocess workers, ranks) are spawned, not forked, so they start in
    ``starting`` by themselves. Never call it in a process that has admitted requests.
    """
    global _phase
    with _lock:
        _phase = Phase.STARTING


@dataclass(frozen=True)
class PhaseState:
    """A snapshot of this process's serving phase and its phase listeners."""

    phase: Phase
    listeners: tuple[Callable[[Phase], object], ...]


def snapshot_phase_state() -> PhaseState:
    """The phase and listeners now, for :func:`restore_phase_state`."""
    with _lock:
        return PhaseState(_phase, tuple(_listeners))


def restore_phase_state(state: PhaseState) -> None:
    """Put back the phase (even an earlier one, unlike ``mark_*``) and the listeners, without
    telling any listener. For tests, which run many launchers in one interpreter, as
    :func:`reset_for_new_process`."""
    global _phase
    with _lock:
        _phase = state.phase
        _listeners[:] = state.listeners
