"""The serving phase of this process, and the guard that keeps freezes at quiescent points.

A process is ``starting`` until it admits requests (frontend: its HTTP listener opens; worker:
``register_model`` is about to be called), then ``serving``, then ``draining`` on shutdown.
:func:`dynamo_gc.freeze.freeze_gc_heap` asks :func:`freeze_allowed` and refuses
outside ``starting``, so a freeze from the discovery watcher or the chat engine factory is
impossible by construction rather than by review.

While serving, a process may pass through ``maintaining`` (serving -> maintaining -> serving):
the serving-time maintenance (:mod:`dynamo_gc.maintenance`), when the process admits nothing
and has nothing in flight. Entering it hands out a :class:`MaintenanceWindow`, a capability:
only :func:`dynamo_gc.maintenance.maintain_gc_heap` called with the current, open window may
collect and freeze there; ``freeze_gc_heap`` stays refused, and so does any other caller.
Nothing else goes back: ``draining`` is reachable from ``serving`` and ``maintaining``, and is
the last phase.

The phase is per process: a spawned child (a preprocess worker, a rank) starts in ``starting``.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)


class Phase(str, enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    MAINTAINING = "maintaining"
    DRAINING = "draining"


# Where each phase may go next (staying put is always allowed, and does nothing).
_NEXT = {
    Phase.STARTING: (Phase.SERVING, Phase.DRAINING),
    Phase.SERVING: (Phase.MAINTAINING, Phase.DRAINING),
    Phase.MAINTAINING: (Phase.SERVING, Phase.DRAINING),
    Phase.DRAINING: (),
}
_lock = threading.Lock()
_phase = Phase.STARTING
_listeners: list = []
_window: MaintenanceWindow | None = None  # the open maintenance window, if any


def current_phase() -> Phase:
    return _phase


def serving() -> bool:
    """True while the process serves: ``serving``, or passing through ``maintaining`` (a
    maintenance is part of serving: readiness holds, a request held at the gate is admitted)."""
    return _phase in (Phase.SERVING, Phase.MAINTAINING)


def freeze_allowed() -> bool:
    """True only while the process admits no requests yet."""
    return _phase is Phase.STARTING


def _advance(to: Phase, reason: str, *, allowed_from: tuple[Phase, ...] | None = None) -> None:
    global _phase, _window
    with _lock:
        if to is _phase:
            return
        if to not in _NEXT[_phase] or (allowed_from is not None and _phase not in allowed_from):
            raise RuntimeError(f"serving phase cannot go from {_phase.value} to {to.value}")
        previous, _phase = _phase, to
        if to is not Phase.MAINTAINING and _window is not None:
            _window._open = False  # leaving maintenance, by its close or by a drain
            _window = None
        listeners = list(_listeners)
    # A maintenance passes through its phase twice and logs its own one line; the start-up and
    # shutdown transitions are the ones an operator reads.
    maintenance = Phase.MAINTAINING in (previous, to)
    logger.log(
        logging.DEBUG if maintenance else logging.INFO,
        "Serving phase %s -> %s (%s)",
        previous.value,
        to.value,
        reason,
    )
    for listener in listeners:
        # The phase has changed; a broken listener (metrics) must not fail the launcher at the
        # moment it opens for traffic, nor keep the other listeners from hearing about it.
        try:
            listener(to)
        except Exception:  # see above
            logger.exception("Serving-phase listener %r failed", listener)


def mark_serving(reason: str) -> None:
    """Call right before the process admits its first request."""
    _advance(Phase.SERVING, reason, allowed_from=(Phase.STARTING,))


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


class MaintenanceWindow:
    """The capability to collect and freeze while ``maintaining``: handed out by
    :func:`open_maintenance_window`, valid while it is the current window and open.

    ``in_flight`` is the launcher's count of requests in flight: the operation reads it at the
    moment it would collect, and refuses if anything is in flight.
    """

    def __init__(self, reason: str, in_flight: Callable[[], int]) -> None:
        self.reason = reason
        self.in_flight = in_flight
        self._open = True

    @property
    def open(self) -> bool:
        return self._open

    def __repr__(self) -> str:
        return f"MaintenanceWindow({self.reason!r}, open={self._open})"


def open_maintenance_window(reason: str, in_flight: Callable[[], int]) -> MaintenanceWindow:
    """``serving`` -> ``maintaining``; the window that lets the maintenance run.

    Raises ``RuntimeError`` outside ``serving`` (a second maintainer while one is open, a
    drain): the caller has not reached the quiescent point it thinks it has.
    """
    global _window
    window = MaintenanceWindow(reason, in_flight)
    with _lock:
        if _phase is not Phase.SERVING:
            raise RuntimeError(f"no maintenance window while {_phase.value}")
        _window = window
    _advance(Phase.MAINTAINING, reason)
    return window


def close_maintenance_window(window: MaintenanceWindow) -> None:
    """``maintaining`` -> ``serving``, when ``window`` is the current one; otherwise (closed
    already, or a drain began meanwhile) nothing changes."""
    with _lock:
        if window is not _window or _phase is not Phase.MAINTAINING:
            window._open = False
            return
    _advance(Phase.SERVING, "maintenance done", allowed_from=(Phase.MAINTAINING,))


@contextlib.contextmanager
def maintenance_window(reason: str, in_flight: Callable[[], int]) -> Iterator[MaintenanceWindow]:
    """:func:`open_maintenance_window`, closed on leaving the block, whatever ends it."""
    window = open_maintenance_window(reason, in_flight)
    try:
        yield window
    finally:
        close_maintenance_window(window)


def window_is_current(window: object) -> bool:
    """Whether ``window`` is the open window of the current ``maintaining`` phase."""
    with _lock:
        return (
            _phase is Phase.MAINTAINING
            and isinstance(window, MaintenanceWindow)
            and window is _window
            and window._open
        )


def reset_for_new_process() -> None:
    """Put the phase back to ``starting``, as in a freshly started process.

    For tests, which run many launchers' start-ups in one interpreter. The project's child
    processes (preprocess workers, ranks) are spawned, not forked, so they start in
    ``starting`` by themselves. Never call it in a process that has admitted requests.
    """
    global _phase, _window
    with _lock:
        _phase = Phase.STARTING
        _window = None


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
    telling any listener; a maintenance window left open is closed. For tests, which run many
    launchers in one interpreter, as :func:`reset_for_new_process`."""
    global _phase, _window
    with _lock:
        _phase = state.phase
        _listeners[:] = state.listeners
        if _window is not None:
            _window._open = False
            _window = None
