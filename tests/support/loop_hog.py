"""A starved event loop on demand: a frontend loaded whatever the machine's speed.

:func:`loop_hog` blocks the running loop for ``block_s`` out of every ``block_s + run_s`` (a
callback that sleeps: the loop runs nothing meanwhile, as when the process waits for a CPU it
shares, runs a long callback or a collection). Everything on that loop (the frontend and the
fake workers of a unit test) runs that much slower in wall time, on an idle machine as on a
loaded one, so a test under it shows what load does without depending on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class LoopHog:
    """How often the hog blocked the loop, and for how long in all."""

    def __init__(self) -> None:
        self.blocks = 0
        self.blocked_s = 0.0


@contextlib.asynccontextmanager
async def loop_hog(block_s: float = 0.1, run_s: float = 0.05):
    """The running loop blocked ``block_s`` of every ``block_s + run_s`` until the block
    ends: the :class:`LoopHog`'s counts."""
    loop = asyncio.get_running_loop()
    hog = LoopHog()
    timer: asyncio.TimerHandle | None = None

    def block() -> None:
        nonlocal timer
        started = time.monotonic()
        time.sleep(block_s)  # the load itself: the loop can do nothing meanwhile
        hog.blocks += 1
        hog.blocked_s += time.monotonic() - started
        timer = loop.call_later(run_s, block)

    timer = loop.call_later(run_s, block)
    try:
        yield hog
    finally:
        timer.cancel()
