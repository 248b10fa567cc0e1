"""Deadlines that judge a peer, not the frontend's own event loop.

A health probe's deadline (1 s for an instance not known to serve) asks whether the peer
answered in time. What the frontend can measure is when its own coroutine saw the answer, which
is later by however long its event loop took to get there: thousands of other probes'
callbacks, a long callback, a garbage collection, a CPU the process shares with other processes.
Under load that lag alone can pass the deadline, and a live instance would be judged dead for
the frontend's own slowness (issue 37: on a loaded machine a frontend answered 503 while a live
instance was listed).

:class:`LoopLag` measures the lag: while a deadline is pending, a timer every :data:`TICK_S`
notes how late it ran (beyond :data:`SLACK_S`, a loop's ordinary jitter); the lateness adds up
to the time the loop was behind. :meth:`LoopLag.within` runs an awaitable under a deadline of
that many seconds of the loop's *own* time: wall time less the lag accrued meanwhile. So a
stalled or starved loop does not count against the peer, and a peer that is slow while the loop
keeps up still misses the deadline as before. No deadline grows without bound: each is at most
``cap_factor`` (by default :data:`CAP_FACTOR`) times its length in wall time, however far behind
the loop stays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

# How often the lag is sampled while a deadline is pending: a stall shorter than this is seen
# at the next tick, and a deadline checks the tick that is overdue as it checks itself.
TICK_S = 0.02
# Lateness a healthy loop has anyway (timer granularity, a callback or two): not counted.
SLACK_S = 0.005
# However far behind the loop stays, a deadline of d seconds ends within CAP_FACTOR x d (unless
# its caller chooses another factor).
CAP_FACTOR = 3.0


class LoopLag:
    """The running loop's lag (see the module docstring); one per frontend, on its loop."""

    def __init__(self, *, tick_s: float = TICK_S, slack_s: float = SLACK_S) -> None:
        self._tick_s = tick_s
        self._slack_s = slack_s
        self._total = 0.0  # lag of the ticks that ran
        self._due: float | None = None  # when the next tick should run (None: not ticking)
        self._timer: asyncio.TimerHandle | None = None
        self._pending = 0  # deadlines that need the ticks

    def lag(self) -> float:
        """The lag accrued so far (seconds), the tick now overdue included."""
        if self._due is None:
            return self._total
        late = asyncio.get_running_loop().time() - self._due - self._slack_s
        return self._total + max(0.0, late)

    async def within(
        self, awaitable: Awaitable[T], timeout_s: float, *, cap_factor: float = CAP_FACTOR
    ) -> T:
        """``awaitable``'s result, if it comes within ``timeout_s`` of the loop's own time
        (and ``cap_factor`` x ``timeout_s`` of wall time); else it is cancelled and
        ``asyncio.TimeoutError`` raised. No task of its own: one timer, checked when it fires
        and set again for the time the lag added (probes are many, each must stay cheap)."""
        loop = asyncio.get_running_loop()
        start, lag_at_start = loop.time(), self.lag()
        cap = start + cap_factor * timeout_s
        self._start(loop)
        check: asyncio.TimerHandle | None = None
        try:
            async with asyncio.timeout(None) as timeout:

                def expire_unless_lagged() -> None:
                    nonlocal check
                    now = loop.time()
                    own_time = (now - start) - (self.lag() - lag_at_start)
                    left = min(timeout_s - own_time, cap - now)
                    if left <= 0:
                        timeout.reschedule(now)  # cancels the awaitable: TimeoutError
                    else:
                        check = loop.call_at(now + left, expire_unless_lagged)

                check = loop.call_at(start + timeout_s, expire_unless_lagged)
                return await awaitable
        finally:
            if check is not None:
                check.cancel()
            self._stop()

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending += 1
        if self._timer is None:
            self._due = loop.time() + self._tick_s
            self._timer = loop.call_at(self._due, self._tick)

    def _stop(self) -> None:
        self._pending -= 1
        if self._pending == 0 and self._timer is not None:
            self._total = self.lag()
            self._timer.cancel()
            self._timer, self._due = None, None

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        self._total = self.lag()
        self._due = loop.time() + self._tick_s
        self._timer = loop.call_at(self._due, self._tick)
