"""Noticing, from the event loop, the moment a child process ends.

A ``multiprocessing`` process's ``sentinel`` is a file descriptor that becomes readable when the
process ends, however it ends (SIGKILL and a segfault included): on POSIX it is the read end of
a pipe whose only write end the child holds. The event loop watches it with ``add_reader``, so a
death is noticed within one loop iteration, with no thread and no polling. The worker uses it
for the mock engine's rank processes and for vLLM's EngineCore process while serving.

:func:`terminate_process_trees` ends vLLM's EngineCore processes and their workers on a clean
stop, without vLLM's force-kill WARNINGs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
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


# How long EngineCore and its workers get to exit on SIGTERM before the worker ends them itself,
# within vLLM's own bound (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, 5 s by default).
ENGINE_EXIT_GRACE_S = 3.0


def terminate_process_trees(processes: Sequence[Any], grace_s: float = ENGINE_EXIT_GRACE_S) -> None:
    """SIGTERM to each process (vLLM's EngineCore processes) and each of its children at once
    (as a terminal's Ctrl-C signals the whole process group), then SIGKILL to any still running
    after ``grace_s`` (one INFO line each).

    Why: ``AsyncLLM.shutdown`` signals EngineCore alone. EngineCore's executor then waits
    ``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS`` (5 s) for its workers, which block on their message
    queue and do not exit on their own; and the process manager in this process waits the same
    5 s for EngineCore, then SIGKILLs it and its workers with three "force killing" WARNINGs, on
    every clean stop. A worker signalled directly usually exits at once; but its main thread
    can sit in a blocking wait that a signal delivered to another of its threads does not
    interrupt, and once EngineCore closes its death pipe it ignores SIGTERM altogether. What is
    left after the grace period has nothing to finish (no request is in flight by now), so it is
    ended here and vLLM's manager finds nothing to force.
    """
    import psutil  # vLLM's dependency, as this module is

    tree: list[Any] = []
    for process in processes:
        try:
            core = psutil.Process(process.pid)
            tree += [*core.children(recursive=True), core]
        except (psutil.NoSuchProcess, ValueError, TypeError):  # gone, or never started
            continue
    for member in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            logger.info(
                "vLLM process %s (pid %d) did not exit within %g s of SIGTERM: ending it",
                member.name(),
                member.pid,
                grace_s,
            )
            member.kill()
    psutil.wait_procs(alive, timeout=grace_s)
