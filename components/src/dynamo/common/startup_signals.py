"""SIGINT and SIGTERM before the event loop takes them over: one line, no traceback.

A launcher spends its first seconds outside the event loop: parsing, then importing vLLM (or
SGLang) and parsing vLLM's arguments. Python's own handling of a signal there is no good to an
operator: Ctrl-C raises ``KeyboardInterrupt`` wherever the import happens to be (an 89-line
traceback through vLLM's modules), and SIGTERM ends the process with nothing logged.

While :func:`~dynamo_gc.startup_stop.interrupting_startup` is active both signals are recorded
and raise :class:`~dynamo_gc.startup_stop.StartupInterrupted` (a ``KeyboardInterrupt``, so code
that cleans up on Ctrl-C does so for SIGTERM too), which the launcher's ``main`` catches and
reports with :func:`report_interrupted` as one line; nothing has started by then (no child
process, no listener, the GC state untouched), so nothing needs stopping. Where the exception is
swallowed on its way (raised inside a finalizer, Python prints it and carries on), the record
stops start-up at its next check (:mod:`dynamo_gc.startup_stop`). Once the event loop runs,
:class:`dynamo.common.launcher.StopSignals` replaces these handlers with the loop's own, which
record the same way.

A process stopped during start-up ends with :func:`exit_process`: without the interpreter's
teardown, which for vLLM's import heap is seconds of garbage collection on a CPU (6 s measured
on 2 loaded cores), so the stop stays within seconds however far start-up had got.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from dynamo_gc import startup_stop
from dynamo_gc.startup_stop import StartupInterrupted

# Set when a signal stopped this process's start-up (see exit_process).
_stopped_during_startup = False


def report_interrupted(logger: logging.Logger, exc: KeyboardInterrupt) -> int:
    """The one line saying start-up stopped, and the exit code (0, as after any stop by a
    signal). Before logging is configured the line goes to stderr as it is."""
    stopped_during_startup()
    if isinstance(exc, StartupInterrupted):
        signame = exc.signame
    else:  # Python's own KeyboardInterrupt (a handler that was not ours): Ctrl-C, as a rule
        signame = startup_stop.received() or "SIGINT"
    message = f"Received {signame} during start-up: stopped before anything started"
    if logging.getLogger().handlers:
        logger.info("%s", message)
    else:
        print(message, file=sys.stderr)
    return 0


def run_stoppable(
    run_main: Callable[[Sequence[str] | None], int],
    argv: Sequence[str] | None,
    logger: logging.Logger,
) -> int:
    """A launcher's ``main``: ``run_main(argv)`` with Ctrl-C and SIGTERM before the event loop
    (vLLM's or SGLang's import takes seconds) ending it with one line and exit 0, no traceback."""
    try:
        with startup_stop.interrupting_startup():
            return run_main(argv)
    except KeyboardInterrupt as exc:
        return report_interrupted(logger, exc)


def stopped_during_startup() -> None:
    """Note that a signal stopped start-up (the launcher has closed what it opened)."""
    global _stopped_during_startup
    _stopped_during_startup = True


def was_stopped_during_startup() -> bool:
    return _stopped_during_startup


def forget_stop() -> None:
    """Forget a stop during start-up, and the signal's record (a test that ran a launcher's
    ``main`` in its process)."""
    global _stopped_during_startup
    _stopped_during_startup = False
    startup_stop.forget()


def exit_process(code: int) -> NoReturn:
    """End the process with ``code``: as usual (``SystemExit``), but after a stop during
    start-up at once, once the ``atexit`` callbacks have run and the output is flushed. The
    interpreter's teardown is skipped then: nothing is left to finalise (the launcher has
    closed every part it opened), and collecting an imported vLLM's heap takes seconds."""
    if not _stopped_during_startup:
        raise SystemExit(code)
    atexit._run_exitfuncs()  # logging's flush, multiprocessing's, weakref.finalize's
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
