"""Noticing, from the event loop, the moment a child process ends.

A ``multiprocessing`` process's ``sentinel`` is a file descriptor that becomes readable when the
process ends, however it ends (SIGKILL and a segfault included): on POSIX it is the read end of
a pipe whose only write end the child holds. The event loop watches it with ``add_reader``, so a
death is noticed within one loop iteration, with no thread and no polling. The worker uses it
for the mock engine's rank processes and for vLLM's EngineCore process while serving.

:func:`ending_stuck_children` ends vLLM's EngineCore workers that a clean stop leaves blocked,
so vLLM has nothing to force-kill (and no WARNING to log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# A process whose sentinel fired has closed its end of the pipe, so it is exiting: its exit
# status is normally there at once. This bounds the wait for it on a loaded machine.
EXIT_STATUS_WAIT_S = 5.0


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, in words: 'was killed by signal SIGKILL (9)' or 'exited with code 3'."""
    if exitcode is None:
        return "died (exit status not yet known)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by signal {name} ({-exitcode})"
    return f"exited with code {exitcode}"


@dataclass(frozen=True)
class ProcessExit:
    """Which watched process ended, and how."""

    label: str  # what the process is to an operator: "rank 1", "vLLM EngineCore"
    pid: int | None
    exitcode: int | None

    def describe(self) -> str:
        return f"{self.label} (pid {self.pid}) {describe_exit(self.exitcode)}"


async def first_exit(processes: Sequence[tuple[str, Any]]) -> ProcessExit:
    """Wait until one of ``processes`` (``(label, multiprocessing process)`` pairs) ends.

    Returns at once when one has already ended (a sentinel stays readable). Cancelling the wait
    removes the watches; call it again to watch again.
    """
    if not processes:
        raise ValueError("no process to watch")
    loop = asyncio.get_running_loop()
    ended: asyncio.Future = loop.create_future()

    def on_ready(label: str, process: Any) -> None:
        if not ended.done():
            ended.set_result((label, process))

    watched: list[int] = []
    try:
        for label, process in processes:
            fd = process.sentinel
            loop.add_reader(fd, on_ready, label, process)
            watched.append(fd)
        label, process = await ended
    finally:
        for fd in watched:
            loop.remove_reader(fd)
    await asyncio.to_thread(process.join, EXIT_STATUS_WAIT_S)
    return ProcessExit(label, process.pid, process.exitcode)


# How long EngineCore's workers get to exit on their own once vLLM's shutdown has begun, within
# vLLM's own bound (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, 5 s by default).
WORKER_EXIT_GRACE_S = 1.0


@contextlib.contextmanager
def ending_stuck_children(
    processes: Sequence[Any], grace_s: float = WORKER_EXIT_GRACE_S
) -> Iterator[None]:
    """While the body stops ``processes`` (vLLM's ``AsyncLLM.shutdown`` stopping its EngineCore
    processes), their children (EngineCore's workers) still running ``grace_s`` after it began
    are killed, with one INFO line each.

    Why: ``AsyncLLM.shutdown`` sends SIGTERM to EngineCore, whose executor closes its workers'
    queues and waits ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` (5 s) for them to exit. On this
    vLLM a worker does not: its main thread stays blocked on the closed queue, and from then on
    it ignores SIGTERM (its handler acts once, and the closed queue counts as that once). The
    process manager in this process waits the same 5 s for EngineCore, then SIGKILLs it and its
    workers with three "force killing" WARNINGs, on every clean stop. A worker has nothing left
    to do by then (no request is in flight), so ending it here lets EngineCore's executor see it
    gone, EngineCore exit, and vLLM's shutdown finish within its bound, with nothing to force.
    Killing EngineCore itself would not do: vLLM's client would warn that it "exited
    unexpectedly".
    """
    import psutil  # vLLM's dependency; only the vLLM engine calls this

    children: list[Any] = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, ValueError, TypeError):
            children += psutil.Process(process.pid).children(recursive=True)

    def end_the_stuck() -> None:
        _, alive = psutil.wait_procs(children, timeout=grace_s)
        for child in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                logger.info(
                    "vLLM process %s (pid %d) still running %g s into the engine's shutdown: "
                    "ending it",
                    child.name(),
                    child.pid,
                    grace_s,
                )
                child.kill()

    reaper = threading.Thread(target=end_the_stuck, name="engine-shutdown-reaper", daemon=True)
    reaper.start()
    try:
        yield
    finally:
        reaper.join()
