"""SIGINT and SIGTERM while upstream's vLLM worker starts: one line and a prompt exit.

Upstream's ``worker()`` installs its graceful-shutdown handlers (``install_signal_handlers``:
``loop.add_signal_handler``) before it builds the engine, and then builds the engine with
blocking calls on the event loop's thread. A handler of the loop runs only when the loop runs
again, so a SIGTERM during engine init (tens of seconds, minutes on a large model) is handled
once the engine is up, after which upstream goes on to register the model it is shutting down
(measured on ai-dynamo 1.6.1: 32 s from SIGTERM to exit, the heap frozen and the model
registered meanwhile); Ctrl-C kills vLLM's EngineCore, and upstream's worker ends with a
RuntimeError traceback. Neither is what an operator who stops a starting pod expects.

So the adapter keeps the two signals until the process is about to register (the freeze
point). Its handler cannot rely on an exception alone: while vLLM waits for its EngineCore, the
main thread sits in pyzmq's poll, which runs the handler and then drops what it raised (pyzmq's
``_check_rc`` ignores ``PyErr_CheckSignals``'s result and retries the interrupted poll). So the
handler starts the stop in a thread of its own (:func:`_stop`): one line, SIGTERM to the
process's children (vLLM's EngineCore stops its model worker), SIGKILL to what is left after a
grace period, exit 0 (the exit a stop by a signal gives) without the interpreter's teardown
(collecting vLLM's heap at exit takes seconds on a CPU; nothing was registered, nothing is left
to finalise). It also raises :class:`StartupInterrupted` in the main thread, which ends start-up
at once where it can be raised (vLLM's import, upstream's coroutines): the adapter then waits
for the stop quietly, and the freeze point refuses to freeze or register once a stop began.

Upstream's ``install_signal_handlers`` is wrapped (:meth:`StartupSignals.defer`): its call is
recorded and made with the same arguments at the freeze point (:meth:`StartupSignals.hand_over`),
before the freeze, so that from there on every signal is upstream's, as without the adapter.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from dynamo_gc import startup_stop

# The one start-up interruption of the layer (a ``KeyboardInterrupt``, so that code which cleans
# up on Ctrl-C does so for SIGTERM too), named here for the adapter's callers.
StartupInterrupted = startup_stop.StartupInterrupted

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long vLLM's processes get to end on SIGTERM before SIGKILL (its EngineCore stops its model
# worker in about a second once it handles the signal; during its own init it may not).
CHILDREN_GRACE_S = 3.0


class StartupSignals:
    """The adapter's handlers from :meth:`install` until :meth:`hand_over` (once each)."""

    def __init__(self, program: str) -> None:
        self.program = program
        self._lock = threading.Lock()
        self._previous: dict[int, Any] = {}
        self._installed = False
        self._handed_over = False
        self._stopper: threading.Thread | None = None
        self._deferred: list[Callable[[], Any]] = []

    @property
    def stopping(self) -> bool:
        return self._stopper is not None

    def install(self) -> None:
        """Our handlers, in the main thread (elsewhere Python lets no handler be set)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        self._installed = True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Recorded first (dynamo_gc.startup_stop): whatever becomes of the exception below, every
        # freeze point checks the record and refuses to freeze or register.
        signame = startup_stop.record(signum)
        with self._lock:
            if self._stopper is not None or self._handed_over:
                return  # the stop is under way: one line, one stop
            self._stopper = threading.Thread(
                target=_stop, args=(signame, self.program), name="dynamo-gc-startup-stop"
            )
            self._stopper.start()
        raise StartupInterrupted(signame)

    def wait_for_stop(self) -> NoReturn:
        """The main thread's end once a stop began: the stopping thread exits the process."""
        assert self._stopper is not None
        while True:
            self._stopper.join()

    def defer(self, install_signal_handlers: Callable[..., Any]) -> Callable[..., Any]:
        """Upstream's ``install_signal_handlers``, its call recorded for :meth:`hand_over`."""

        @functools.wraps(install_signal_handlers)
        def deferred(*args: Any, **kwargs: Any) -> None:
            with self._lock:
                handed_over = self._handed_over
                if not handed_over:
                    self._deferred.append(
                        functools.partial(install_signal_handlers, *args, **kwargs)
                    )
            if handed_over:  # after the freeze point: upstream's, at once
                install_signal_handlers(*args, **kwargs)
            else:
                logger.debug("Upstream's signal handlers deferred to the GC freeze point")

        return deferred

    def hand_over(self) -> None:
        """At the freeze point: our handlers out, upstream's (recorded) in. Once. Refuses (the
        start-up exception) once a stop began: nothing is frozen or registered then."""
        with self._lock:
            if self._stopper is not None:
                raise StartupInterrupted("a stop signal")
            if self._handed_over:
                return
            self._handed_over = True
            deferred, self._deferred = self._deferred, []
        if self._installed:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
        for install in deferred:
            install()


def _children(pid: int) -> list[int]:
    """``pid``'s child processes (Linux's /proc; else multiprocessing's own children), but
    multiprocessing's resource tracker: it ends by itself once this process has, after
    releasing what vLLM's processes left (shared memory, semaphores)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                cmdline = (stat.parent / "cmdline").read_bytes()
                if b"multiprocessing.resource_tracker" not in cmdline:
                    found.append(int(stat.parent.name))
    if not found and not Path("/proc/self").exists():
        found = [child.pid for child in multiprocessing.active_children() if child.pid]
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False  # a zombie has ended
    return True


def _stop(signame: str, program: str) -> NoReturn:
    """The stop, from its own thread (the main thread may be anywhere, pyzmq's poll included)."""
    message = (
        f"Received {signame} during start-up ({program}, before the model is registered): "
        "stopping; nothing was frozen or registered"
    )
    if logging.getLogger().handlers:
        logger.info("%s", message)
    else:
        print(message, file=sys.stderr, flush=True)
    children = _children(os.getpid())
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + CHILDREN_GRACE_S
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in children:
        for each in [*_children(pid), pid]:  # what a child started would be orphaned
            with contextlib.suppress(OSError):
                os.kill(each, signal.SIGKILL)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)
