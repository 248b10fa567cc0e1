"""A stop signal during start-up is recorded first, so that no signal can be lost.

Python runs a signal handler in the main thread between two bytecodes, wherever the thread is,
inside a finalizer (``__del__``) that a garbage collection runs included. An exception the
handler raises there is printed ("Exception ignored in ...") and dropped, and start-up carries
on: 4 of 40 Ctrl-Cs sent to a starting frontend went on to serve that way. A cancellation that
a stop sends to the start-up task can be caught on its way just as well.

So stopping is a record before it is an exception. Every stop handler's first act is
:func:`record` (two assignments: nothing in it can fail or be caught); an exception it raises
as well (:class:`StartupInterrupted`, which cuts a long import short) is a shortcut, not the
mechanism. Start-up acts on the record with :func:`check` at every phase boundary and right
before each step that admits anything (the freeze, the phase ``serving``, a listener opening, a
model's registration), whether or not an exception got through. :func:`interrupting_startup`
installs such handlers for the time before an event loop runs; on a loop, the launcher's own
handlers call :func:`record` the same way.

One record per process, never cleared by a running launcher: once a stop signal has arrived,
this process's start-up ends. (A spawned child process starts without one.)

What the upstream adapters call (``dynamo_gc.upstream``): :func:`interrupting_startup` around
what runs before upstream's event loop, :func:`record` from any handler of their own, and
:func:`check` before they freeze and before upstream admits (their freeze points do).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# The name of the first stop signal this process received, and how many have arrived.
_first: str | None = None
_deliveries = 0


class StartupInterrupted(KeyboardInterrupt):
    """A stop signal arrived during start-up: the launcher stops before admitting anything.

    A ``KeyboardInterrupt``, so code that cleans up on Ctrl-C does so for SIGTERM too."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


def record(signum: int) -> str:
    """Note that stop signal ``signum`` arrived; its name. Safe in a signal handler: it only
    assigns (the first signal's name is kept, later ones are counted)."""
    global _first, _deliveries
    name = signal.Signals(signum).name
    _deliveries += 1
    if _first is None:
        _first = name
    return name


def received() -> str | None:
    """The name of the first stop signal this process received, or ``None``."""
    return _first


def deliveries() -> int:
    """How many stop signals the handlers have recorded so far."""
    return _deliveries


def check() -> None:
    """Raise :class:`StartupInterrupted` when a stop signal has arrived. Call it at each
    start-up phase boundary and right before a step that admits anything."""
    if _first is not None:
        raise StartupInterrupted(_first)


def forget() -> None:
    """Forget every recorded signal: for tests, which run many start-ups in one process."""
    global _first, _deliveries
    _first, _deliveries = None, 0


def record_and_interrupt(signum: int, frame: FrameType | None) -> None:
    """The handler before an event loop runs: record, then interrupt what runs (an import of
    seconds). Where the exception is swallowed, the record still stops start-up."""
    raise StartupInterrupted(record(signum))


def record_only(signum: int, frame: FrameType | None) -> None:
    """The handler's Python part while an event loop runs (its own part acts on the loop):
    the record is made at once, even while the loop is busy with a synchronous step."""
    record(signum)


@contextlib.contextmanager
def interrupting_startup(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """``signals`` record and raise :class:`StartupInterrupted` in the main thread meanwhile;
    the previous handlers come back afterwards. Elsewhere than the main thread (a test calling
    a ``main``) Python lets no handler be set: nothing changes.

    Meanwhile an interruption that Python cannot raise (it landed in a finalizer) is not
    printed either: the record acts on it, and the operator sees the stop's one line, not
    "Exception ignored in ..." and a traceback that looks like a failure."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, record_and_interrupt) for signum in signals}
    previous_hook = sys.unraisablehook

    def unraisable(report: Any) -> None:
        if not isinstance(report.exc_value, StartupInterrupted):
            previous_hook(report)

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        if sys.unraisablehook is unraisable:  # not if a library has put its own in since
            sys.unraisablehook = previous_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
