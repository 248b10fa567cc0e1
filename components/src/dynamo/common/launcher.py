"""The lifecycle both launchers share: start, freeze at the quiescent point, admit, serve, drain.

``python -m dynamo.frontend`` and ``python -m dynamo.vllm`` differ in what they build and how
they admit requests (the frontend opens its HTTP listener; the worker registers its model); the
steps around those are the same, and are here:

1. before the event loop: bad input exits 2 (:class:`UsageError`, :func:`exit_code`), logging is
   configured and upstream Dynamo's ignored env vars are reported
   (:func:`configure_process_logging`), then the process's GC state is set up: metrics, the
   pause logger (:func:`start_process_gc`);
2. :func:`run_lifecycle`, on the loop:

   * the service builds everything static (``Service.start``), registering each part it opens
     with the :class:`Closer`; a SIGTERM/SIGINT meanwhile cancels start-up (engine init and a
     self-benchmark can take minutes, and nothing is admitted yet, so there is nothing to drain);
     the signal is recorded first, and start-up checks the record at every phase boundary and
     right before each step that admits, so a stop whose exception or cancellation was lost on
     its way is acted on all the same (:mod:`dynamo_gc.startup_stop`);
   * **the quiescent point**: the GC heap is frozen, then the phase becomes ``serving`` (from
     here on any freeze is refused);
   * the service admits requests (``Service.admit``) and serves until a signal (or until it
     fails: the worker's engine dying) (``Service.serve``), which starts the drain with one
     deadline and marks the phase ``draining``;
   * every part is closed, last opened first, each one even if another fails (exit 1 then);
3. the process's GC state is put back last (pause logger off, metrics detached, heap unfrozen).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from dynamo.common import logging_setup, startup_signals
from dynamo.common.configuration import Option, prerequisites, upstream
from dynamo_gc import freeze, lifecycle, startup_stop
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.maintenance import settle_after_freeze
from dynamo_gc.process_gc import ProcessGc

# The GC layer's start-up step, named here too: each launcher's main takes its steps from here.
from dynamo_gc.process_gc import start_process_gc as start_process_gc

logger = logging.getLogger(__name__)

STOP_SIGNALS = startup_stop.STOP_SIGNALS


class UsageError(Exception):
    """Bad input found before anything runs: the program exits 2 with this message."""


class StartupFailed(Exception):
    """A start-up step failed for a reason the operator can fix (engine init, a bind): the
    program logs this message as one ERROR line and exits with :attr:`exit_status` (1)."""

    exit_status = 1


class OptionUnusable(StartupFailed):
    """An option's value cannot be used on this machine, found at the earliest point that can
    know (a port that is taken or privileged, a host that is none of its addresses: only the
    bind can tell). Still before anything is frozen or announced, and the message names the
    flag and the env var: exit 2, as for any bad input."""

    exit_status = 2


def exit_code(exc: SystemExit) -> int:
    """The exit code a ``SystemExit`` from a parser means (``--help``: 0; bad input: 2)."""
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def usage_error(prog: str, message: str) -> int:
    """Say why the input is bad the way argparse does, on stderr; the exit code (2)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def configure_process_logging(
    prog: str, levels: logging_setup.LogLevels, options: Sequence[Option]
) -> None:
    """The process's logging (``DYN_LOG``), then the WARNINGs an operator needs first: log
    targets that name no logger, and upstream Dynamo env vars set but meaningless here."""
    logging_setup.configure_logging(levels)
    logging_setup.warn_unmatched_targets(levels)
    upstream.warn_ignored_env(prog, upstream.declared_names(options))


def warn_unmet_prerequisites(
    requirements: Sequence[prerequisites.Requires], config: object, argv: Sequence[str] | None
) -> None:
    """One WARNING per option set through its env var whose prerequisite is missing (on the
    command line the parse has exited 2 already; see
    :mod:`dynamo.common.configuration.prerequisites`)."""
    given = sys.argv[1:] if argv is None else argv
    for line in prerequisites.env_warnings(requirements, config, given, os.environ):
        logger.warning("%s", line)


class Closer:
    """Closes what was opened, last opened first, every part even if another one fails.

    A failure is logged with its traceback and remembered (the exit code becomes 1); the parts
    after it are still closed, so one broken part never leaves a listener, a client session, an
    engine or child processes behind.
    """

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.failed: list[str] = []

    def push(self, what: str, close: Callable[[], Awaitable[None] | None]) -> None:
        async def guarded() -> None:
            try:
                result = close()
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # see the class docstring
                self.failed.append(what)
                logger.exception("Shutdown: closing the %s failed", what)

        self._stack.push_async_callback(guarded)

    async def aclose(self) -> None:
        await self._stack.aclose()


class StopSignals:
    """SIGTERM/SIGINT for one run of a launcher.

    Each signal is recorded the moment it arrives (:func:`dynamo_gc.startup_stop.record`, in
    the Python part of the handler, which runs between two bytecodes even while the loop is
    busy with a synchronous step such as the freeze's collection), then acted on by the loop.
    During start-up a signal cancels the start-up task (nothing is registered or listening yet,
    so there is nothing to drain); the start-up's checks (:meth:`stopping_for`) stop it all the
    same where the cancellation was caught on its way, or has not arrived yet. Once serving, a
    signal sets the stop that :meth:`wait` returns. Further signals while stopping are logged
    and otherwise ignored: the drain is already bounded by its deadline.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, startup_task: asyncio.Task) -> None:
        self._loop = loop
        self._startup_task = startup_task
        self._serving = False
        self._stop = asyncio.Event()
        self._previous: dict[int, object] = {}
        # Signals recorded since install() whose loop callbacks are still to come when a
        # check acted on their record first (each is the same stop, not another one).
        self._recorded_at_install = 0
        self._absorbed = 0
        self.received: str | None = None

    def install(self) -> None:
        self._recorded_at_install = startup_stop.deliveries()
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            self._loop.add_signal_handler(signum, self._on_signal, signum)
            # asyncio's own Python-level handler does nothing (the loop acts when it next
            # runs): this one records at once.
            signal.signal(signum, startup_stop.record_only)

    def uninstall(self) -> None:
        for signum in STOP_SIGNALS:
            self._loop.remove_signal_handler(signum)
            previous = self._previous.pop(signum, None)
            if previous is not None:  # the start-up handlers, until the process ends
                signal.signal(signum, previous)  # type: ignore[arg-type]

    def serving(self) -> None:
        self._serving = True
        if self.received is not None:  # came after the last check: serve drains at once
            self._stop.set()

    async def wait(self) -> str:
        """The name of the signal that stopped the process, once one has."""
        await self._stop.wait()
        assert self.received is not None, "the stop is set by a signal"
        return self.received

    def stopping_for(self, signame: str) -> None:
        """A start-up check found the record of ``signame``: the one line, unless the loop has
        acted on it already."""
        if self.received is not None:
            return
        self.received = signame
        self._absorbed = startup_stop.deliveries() - self._recorded_at_install
        logger.info("Received %s during start-up: stopping", signame)

    def _on_signal(self, signum: int) -> None:
        if self._absorbed > 0:  # a check acted on this signal's record already
            self._absorbed -= 1
            return
        name = signal.Signals(signum).name
        if self.received is not None:
            logger.info("Received %s while stopping (after %s): ignored", name, self.received)
            return
        self.received = name
        if self._serving:
            logger.info("Received %s: draining", name)
            self._stop.set()
        else:
            logger.info("Received %s during start-up: stopping", name)
            self._startup_task.cancel()


class Service(Protocol):
    """What a launcher builds and runs (see the module docstring)."""

    # The name of its freeze in the log line, and the step that marks the phase ``serving``.
    freeze_context: str
    admission: str

    async def start(self, closer: Closer) -> None:
        """Build everything static; push each part opened onto ``closer``."""

    async def admit(self) -> None:
        """Open for requests (the phase is ``serving`` already)."""

    async def serve(self, signals: StopSignals) -> int:
        """Serve until ``signals`` stops the process (or the service fails); start the drain
        (its one deadline) and mark the phase ``draining``; return the exit code."""


async def run_lifecycle(service: Service, *, gc: GcSettings, process_gc: ProcessGc) -> int:
    """Start, freeze at the quiescent point, admit, serve, drain, close; the exit code.

    The service's ``freeze_context`` names the freeze in its log line; its ``admission`` is
    what marks the phase ``serving`` (the step right after it). A signal during start-up ends
    it with exit 0.
    """
    signals = StopSignals(asyncio.get_running_loop(), _current_task())
    signals.install()
    closer = Closer()
    try:
        try:
            # Each check stops start-up on a signal recorded by then, wherever its exception
            # or cancellation went (see dynamo_gc.startup_stop): one before anything starts
            # (a signal before the loop), one after every start-up phase, one before each step
            # that admits (the services check again right before they open).
            startup_stop.check()
            await service.start(closer)
            startup_stop.check()
            # The quiescent point: everything static is built, nothing is admitted yet.
            froze = freeze.maybe_freeze_gc_heap(gc.freeze_gc_heap, context=service.freeze_context)
            process_gc.state.froze = froze is not None  # unfrozen at the end, stopped or not
            if froze is not None and process_gc.maintenance is not None:
                # The maintenance's trigger must see the serving heap's full collections from
                # the start (dynamo_gc.maintenance: the 25% rule, counted from what stays unfrozen).
                settle_after_freeze()
            startup_stop.check()  # a signal during the freeze's collection
            lifecycle.mark_serving(service.admission)
            await service.admit()
            signals.serving()
            code = await service.serve(signals)
        except startup_stop.StartupInterrupted as exc:
            signals.stopping_for(exc.signame)  # its one line, before the parts close
            raise
        finally:
            await closer.aclose()
    except (asyncio.CancelledError, startup_stop.StartupInterrupted) as exc:
        if signals.received is None:
            raise
        _consume_cancellation()
        startup_signals.stopped_during_startup()
        # DEBUG: the signal's own line said it all (one line per stop).
        logger.debug(
            "Stopped during start-up (%s, %s): nothing was admitted",
            signals.received,
            type(exc).__name__,
        )
        return 1 if closer.failed else 0
    finally:
        signals.uninstall()
    return 1 if closer.failed else code


def _current_task() -> asyncio.Task:
    task = asyncio.current_task()
    assert task is not None, "run_lifecycle runs in a task"
    return task


def _consume_cancellation() -> None:
    """Mark the start-up cancellation as handled (3.11+ counts pending cancellations); none
    when a check stopped start-up before the loop acted on the signal."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()
