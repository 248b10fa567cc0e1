"""Requests held in flight at an admission gate (dynamo_gc.admission), for the maintenance's
tests: admitted, they stay in flight until the test lets them finish."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from dynamo_gc.admission import AdmissionGate
from tests.support import wait_until_async

DEADLINE_S = 10.0


class InFlight:
    """Requests that entered ``gate`` (or wait at it while it is held) and run until
    :meth:`finish`; the ones still running when the block ends are cancelled."""

    def __init__(self, gate: AdmissionGate) -> None:
        self.gate = gate
        self.done = asyncio.Event()
        self.tasks: list[asyncio.Task] = []

    async def _request(self) -> None:
        async with self.gate.admitted():
            await self.done.wait()

    def arrive(self) -> asyncio.Task:
        """One more request (it waits at the gate while the gate is held)."""
        task = asyncio.ensure_future(self._request())
        self.tasks.append(task)
        return task

    async def admitted(self, count: int = 1) -> None:
        """One more request, in flight (returns once the gate counts ``count``)."""
        self.arrive()
        await wait_until_async(lambda: self.gate.in_flight == count, deadline_s=DEADLINE_S)

    def finish(self) -> None:
        self.done.set()


@contextlib.asynccontextmanager
async def in_flight(gate: AdmissionGate) -> AsyncIterator[InFlight]:
    requests = InFlight(gate)
    try:
        yield requests
    finally:
        for task in requests.tasks:
            task.cancel()
        await asyncio.gather(*requests.tasks, return_exceptions=True)
