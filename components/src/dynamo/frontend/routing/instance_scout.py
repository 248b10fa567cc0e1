"""Finding a live instance of a model among many that may be dead, with bounded work.

A discovery directory can hold thousands of records whose workers are gone (or were never
there: a peer may write them), beside one live instance the frontend has never routed to.
Trying them one request at a time would make requests fail until round-robin reached the live
one. When a request's first attempt failed and no instance is known to serve, the router asks
the scout instead: it sends ``GET /health`` to the model's untried instances, at most
:data:`SCOUT_CONCURRENCY` at a time, and hands back the first that answers without a 5xx (a
draining worker answers 503); each that does not answer in time is reported dead (the router
benches it, so the next requests skip it). One sweep per model at a time, shared by every
request that needs it, so the work is per instance (each probed at most once per sweep, a sweep
at most every bench period), not per request; a request waits for a sweep at most
:data:`SCOUT_WAIT_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.peer_text import escape
from dynamo.runtime.request_plane import HEALTH_PATH

# Health probes in flight at once, per sweep: connections to dead instances on a LAN are
# refused in a round trip, and a sweep of a few thousand takes well under a second.
SCOUT_CONCURRENCY = 64
# Probers a sweep starts with; each instance found dead adds one, up to SCOUT_CONCURRENCY.
FIRST_PROBERS = 2
# How long a request waits for a sweep to find a live instance before it is a 503 (the sweep
# goes on for the requests after it).
SCOUT_WAIT_S = 10.0
# Instances a sweep found dead that a failed request's log line names (the rest are counted).
NAMED_DEAD = 5


class SweepResult:
    """What a sweep found: a live instance (or None), and the dead it probed."""

    def __init__(self) -> None:
        self.found: ModelRecord | None = None
        self.dead: list[str] = []  # the first NAMED_DEAD, "<id> at <endpoint>"
        self.dead_count = 0

    def describe_dead(self) -> str:
        more = self.dead_count - len(self.dead)
        return ", ".join(self.dead) + (f" and {more} more" if more > 0 else "")


class InstanceScout:
    """Per-model sweeps of health probes (see the module docstring).

    ``timeout_s``: how long one probe waits for an answer; ``is_benched``: the router's bench
    (an instance on it is not probed); ``on_dead``: told of each instance whose probe went
    unanswered, with why."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        timeout_s: float,
        is_benched: Callable[[ModelRecord], bool],
        on_dead: Callable[[ModelRecord, str], None],
    ) -> None:
        self._session = session
        self._timeout_s = timeout_s
        self._is_benched = is_benched
        self._on_dead = on_dead
        self._sweeps: dict[str, asyncio.Task[SweepResult]] = {}

    async def find(self, model: str, candidates: Sequence[ModelRecord]) -> SweepResult:
        """The sweep's result: an instance of ``candidates`` that answered its health probe
        (no 5xx), or none (none did, or the sweep took over :data:`SCOUT_WAIT_S`)."""
        task = self._sweeps.get(model)
        if task is None:
            task = asyncio.ensure_future(self._sweep(list(candidates)))
            self._sweeps[model] = task
            task.add_done_callback(lambda done: self._forget(model, done))
        try:
            return await asyncio.wait_for(asyncio.shield(task), SCOUT_WAIT_S)
        except asyncio.TimeoutError:
            return SweepResult()

    def _forget(self, model: str, task: asyncio.Task) -> None:
        if self._sweeps.get(model) is task:
            del self._sweeps[model]
        if not task.cancelled():
            task.exception()  # retrieved: a sweep's failure is its requests' 503, not a log

    async def aclose(self) -> None:
        """Stop the sweeps still running (the frontend is stopping)."""
        tasks = list(self._sweeps.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _sweep(self, candidates: list[ModelRecord]) -> SweepResult:
        result = SweepResult()
        queue = iter(candidates)  # shared by the probers: each instance is probed once
        found: asyncio.Future[ModelRecord] = asyncio.get_running_loop().create_future()

        probers: set[asyncio.Task[None]] = set()
        all_done = asyncio.Event()

        def start_prober() -> None:
            task = asyncio.ensure_future(prober())
            probers.add(task)
            task.add_done_callback(ended)

        def ended(task: asyncio.Task[None]) -> None:
            probers.discard(task)
            if not probers:
                all_done.set()

        async def prober() -> None:
            for record in queue:
                if found.done():
                    return
                if self._is_benched(record):
                    continue
                if await self._ready(record.endpoint):
                    if not found.done():
                        found.set_result(record)
                    return
                self._on_dead(record, "its health probe went unanswered or answered 5xx")
                result.dead_count += 1
                if len(result.dead) < NAMED_DEAD:
                    result.dead.append(f"{record.instance_id} at {escape(record.endpoint)}")
                # Each dead instance adds a prober, up to the bound: a live one among the first
                # costs a probe or two, thousands of dead ones are swept 64 at a time.
                if len(probers) < SCOUT_CONCURRENCY:
                    start_prober()

        for _ in range(min(FIRST_PROBERS, len(candidates))):
            start_prober()
        if not probers:
            all_done.set()
        everyone = asyncio.ensure_future(all_done.wait())
        try:
            waits: set[asyncio.Future[Any]] = {found, everyone}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            result.found = found.result() if found.done() else None
            return result
        finally:
            everyone.cancel()
            for task in list(probers):
                task.cancel()
            await asyncio.gather(*probers, return_exceptions=True)

    async def _ready(self, endpoint: str) -> bool:
        url = endpoint.rstrip("/") + HEALTH_PATH
        try:
            timeout = aiohttp.ClientTimeout(total=self._timeout_s)
            async with self._session.get(url, timeout=timeout) as response:
                return response.status < 500
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return False
