"""vLLM's engine init, which a signal can stop within seconds.

``AsyncLLM.from_engine_args`` blocks for 10-40 s (spawning EngineCore and its workers, loading
weights, warm-up) and cannot be interrupted from another thread. It runs in a daemon thread of
its own (:func:`run_in_init_thread`), so the event loop stays free for health probes and
signals, and a process that stops meanwhile never waits for it at exit (an executor thread
would be joined).

A signal during the init (:func:`abandon_init`) kills the processes the init started
(EngineCore and its workers), which makes vLLM's wait for EngineCore's handshake fail at once,
so the thread ends; the wait for it is bounded all the same. Whatever the init starts after
that (it was still before its spawn) is killed the same way until the deadline. No child
process of the init is left behind.

The processes the init starts never get the terminal's Ctrl-C (:func:`sparing_children_ctrl_c`):
a SIGINT to the process group is this process's to act on, and it stops them itself (killed
during the init, shut down by vLLM after it). Left to them, EngineCore took it during its
imports, before it installs its own handler, and printed a ``KeyboardInterrupt`` traceback of
its own (once in two runs); after that its own shutdown began under the worker's drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

logger = logging.getLogger(__name__)

# How long a stop waits for the init thread in all; a few seconds, whatever the phase.
ABANDON_DEADLINE_S = 6.0
# How often the stop looks for processes the init started after the previous look.
RECHECK_S = 0.25


def child_pids() -> set[int]:
    """The pids of this process's running descendants (zombies aside), but multiprocessing's
    resource tracker (it ignores SIGTERM, and once this process exits it ends on its own)."""
    from multiprocessing import resource_tracker

    import psutil  # vLLM's dependency; only the vLLM engine calls this

    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    running = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.status() != psutil.STATUS_ZOMBIE and child.pid != tracker:
                running.add(child.pid)
    return running


def run_in_init_thread(create: Callable[[], Any], on_orphan: Callable[[Any], None]) -> Any:
    """``create()`` in a daemon thread; the future of its result on the running loop.

    ``on_orphan(result)`` runs in the thread when ``create`` returns after the event loop has
    gone (the process is stopping): it must release what the result holds (its processes)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def run() -> None:
        try:
            sparing_children_ctrl_c()
            result = create()
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits
                loop.call_soon_threadsafe(settle, functools.partial(future.set_exception, exc))
            return
        try:
            loop.call_soon_threadsafe(settle, functools.partial(future.set_result, result))
        except RuntimeError:  # the loop is closed
            on_orphan(result)

    threading.Thread(target=run, name="vllm-engine-init", daemon=True).start()
    return future


def sparing_children_ctrl_c() -> None:
    """Block SIGINT in the calling thread (the init's own), so that every process it starts
    begins with SIGINT blocked: the signal mask is inherited through fork and exec, and Python
    does not unblock it at start-up. A handler EngineCore installs later changes nothing then:
    the signal stays pending until the process ends. This process still gets Ctrl-C: its main
    thread, which runs its handlers, does not block it.

    multiprocessing's resource tracker is started first: starting it unblocks SIGINT in the
    thread that starts it (it blocks SIGINT and SIGTERM around its own spawn, then unblocks
    both), and vLLM's first spawn would start it after the block otherwise."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


async def abandon_init(init: asyncio.Future, spared: Collection[int]) -> Any:
    """Stop an init that a signal interrupts: its processes (this process's descendants but
    ``spared``, the ones that were there before it) are killed until its thread has ended and
    none is left, or the deadline passes. The engine when the init had finished anyway (the
    caller shuts it down), else None.

    SIGKILL, not SIGTERM: during its init EngineCore only notes a SIGTERM and carries on (it
    even starts its workers afterwards), and nothing of a half-initialised engine is worth
    saving. A worker EngineCore started is still seen after EngineCore is gone: this process
    is their subreaper meanwhile (:func:`adopting_orphans`)."""
    deadline = time.monotonic() + ABANDON_DEADLINE_S
    while time.monotonic() < deadline:
        if init.done() and init.exception() is None:
            return init.result()  # ready after all: shut down as usual, gracefully
        left = child_pids() - set(spared)
        if init.done() and not left:
            break
        await asyncio.to_thread(kill_processes, left)
        with contextlib.suppress(asyncio.TimeoutError, Exception):
            await asyncio.wait_for(asyncio.shield(init), RECHECK_S)
    else:
        logger.info(
            "vLLM engine init still running %g s after the stop: leaving it", ABANDON_DEADLINE_S
        )
        return None
    # The failure the stop caused (EngineCore gone before its handshake): expected.
    logger.debug("vLLM engine init ended by the stop", exc_info=init.exception())
    return None


def kill_processes(pids: Collection[int]) -> None:
    """SIGKILL to ``pids``. Not reaped here: vLLM reaps the processes it started (a process
    reaped behind its back looks alive to it, and it would log that it force-kills it)."""
    for pid in pids:
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# prctl(2): orphaned descendants are reparented to this process rather than to init.
PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def adopting_orphans() -> Iterator[None]:
    """This process is the subreaper of its descendants meanwhile (Linux; elsewhere nothing
    changes): a process whose parent dies stays this process's descendant, so killing an
    init's processes cannot miss one that its killed parent had just started."""
    libc = _libc()
    adopted = libc is not None and libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        if adopted and libc is not None:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
