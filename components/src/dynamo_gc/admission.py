"""The admission gate a serving-time maintenance closes: requests in flight, a hold, a withdrawal.

A launcher puts every request it wants counted through :meth:`AdmissionGate.admitted` (the
frontend its OpenAI API requests, the worker its generate requests; probes and ``/metrics``
stay outside). The maintainer (:mod:`dynamo_gc.maintainer`) reads :attr:`in_flight` and
:meth:`idle_for_s` to find a quiescent moment, and closes the gate one of two ways:

* **held** (``idle``): a request that arrives waits at the gate until the maintenance is done.
  :meth:`release` returns how long each waiting request waited: that wait is a pause the
  request saw, reported as one;
* **withdrawn** (``withdraw``): the launcher answers a request that still reaches it at once
  (the worker: a distinct 503 that the frontend's router takes as "another instance, now");
  the gate carries the flag, and when it last turned a request away (:meth:`turn_away`): the
  maintenance waits until the frontends have stopped sending.

Everything here runs on one event loop; nothing is shared with other threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable


class _Waiter:
    __slots__ = ("arrived",)

    def __init__(self, arrived: float) -> None:
        self.arrived = arrived


class AdmissionGate:
    """Requests in flight, and the hold and withdrawal a maintenance puts on admission."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.in_flight = 0
        self.withdrawn = False
        self._opened: asyncio.Event | None = None  # set while held; set() at the release
        self._held_since: float | None = None
        self._waiters: set[_Waiter] = set()
        self._idle: asyncio.Event | None = None  # set when in_flight reaches 0
        self._idle_since = clock()
        self.turned_away_at: float | None = None  # clock() when a request was last turned away

    @property
    def held(self) -> bool:
        return self._opened is not None

    @property
    def waiting(self) -> int:
        """Requests waiting at the held gate now."""
        return len(self._waiters)

    def count(self) -> int:
        """Requests in flight (the maintenance window's count)."""
        return self.in_flight

    def idle_for_s(self) -> float:
        """How long nothing has been in flight (0 while something is)."""
        if self.in_flight:
            return 0.0
        return max(0.0, self._clock() - self._idle_since)

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Admit one request (waiting first while the gate is held); counted in flight until
        the block ends."""
        while self._opened is not None:
            waiter = _Waiter(self._clock())
            self._waiters.add(waiter)
            try:
                await self._opened.wait()
            finally:
                self._waiters.discard(waiter)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle_since = self._clock()
                idle, self._idle = self._idle, None
                if idle is not None:
                    idle.set()

    def turn_away(self) -> None:
        """A request was answered as withdrawn (the launcher sent it elsewhere)."""
        self.turned_away_at = self._clock()

    def hold(self) -> None:
        """New requests wait at the gate from now on (until :meth:`release`)."""
        if self._opened is None:
            self._opened = asyncio.Event()
            self._held_since = self._clock()

    def release(self) -> list[float]:
        """Admit again; the seconds each request waiting now has waited (its pause)."""
        opened, self._opened = self._opened, None
        self._held_since = None
        now = self._clock()
        waits = [now - waiter.arrived for waiter in self._waiters]
        for waiter in self._waiters:
            waiter.arrived = now  # should it wait again, only the new wait counts then
        if opened is not None:
            opened.set()
        return waits

    async def until_idle(self, timeout_s: float) -> bool:
        """Whether nothing is in flight within ``timeout_s`` (True at once when nothing is)."""
        if self.in_flight == 0:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return self.in_flight == 0
        return True
