"""Noticing, from the event loop, the moment a child process ends.

A ``multiprocessing`` process's ``sentinel`` is a file descriptor that becomes readable when the
process ends, however it ends (SIGKILL and a segfault included): on POSIX it is the read end of
a pipe whose only write end the child holds. The event loop watches it with ``add_reader``, so a
death is noticed within one loop iteration, with no thread and no polling. The worker uses it
for the mock engine's rank processes and for vLLM's EngineCore process while serving.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
