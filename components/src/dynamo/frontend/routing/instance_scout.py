"""Finding a live instance of a model among many that may be dead, with bounded work.

A discovery directory can hold thousands of records whose workers are gone (or were never
there: a peer may write them), beside one live instance the frontend has never routed to.
Trying them one request at a time would make requests fail until round-robin reached the live
one. When a request's first attempt failed and no instance is known to serve, the router asks
the scout instead: it sends ``GET /health`` to the model's untried instances (in random order,
the router's suspects last) and hands back the first that answers without a 5xx (a draining
worker answers 503) or a redirect (never followed); each that does not answer within
:data:`SCOUT_PROBE_TIMEOUT_S` of the frontend's own time (its event-loop lag does not count:
:mod:`.loop_lag`), or answers so, is reported dead (the router benches it, so the next requests
skip it). Records that name the same endpoint share one probe per sweep: a peer's thousands of
records pointing at one address cost that address one probe, not thousands.

A dead pod's address often accepts a connection and never answers, so a probe of a dead
instance can cost its whole deadline: the sweep starts :data:`FIRST_PROBERS` probes, each dead
instance starts two more (the probes in flight double every deadline), up to
:data:`SCOUT_CONCURRENCY` at once. Once the live one is found, the requests waiting for it go on
and the sweep finishes probing the rest, so every dead instance is benched once and the next
requests do not try it. One sweep per model at a time, shared by every request that needs it,
so the work is per instance (each probed at most once per sweep), not per request; a request
waits for a sweep at most :data:`SCOUT_WAIT_S` (of the frontend's own time, as the probes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Sequence

import aiohttp

from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.peer_text import escape

from .health_probe import describe, is_redirect, probe_health
from .loop_lag import LoopLag

# Health probes in flight at once, per sweep (each holds a socket): with every probe hanging
# for its deadline, a ramped-up sweep still gets through this many instances a second.
SCOUT_CONCURRENCY = 256
# Probes a sweep starts with; each instance found dead starts two more, up to SCOUT_CONCURRENCY.
FIRST_PROBERS = 32
PROBERS_PER_DEAD = 2
# How long a probe waits to connect and be answered, in the frontend's own time (wall time
# less its event loop's lag): a live worker's /health answers in milliseconds (its event loop
# does nothing slow); a dead address that accepts and never answers costs this much.
SCOUT_PROBE_TIMEOUT_S = 1.0
# How long a request waits for a sweep to find a live instance before it is a 503 (the sweep
# goes on for the requests after it), in the frontend's own time as the probes are.
SCOUT_WAIT_S = 10.0
# Instances a sweep found dead that a failed request's log line names (the rest are counted).
NAMED_DEAD = 5


class SweepResult:
    """What a sweep found: a live instance (or None), and the dead it probed."""

    def __init__(self, found: ModelRecord | None = None) -> None:
        self.found = found
        self.dead: list[str] = []  # the first NAMED_DEAD, "<id> at <endpoint>"
        self.dead_count = 0

    def describe_dead(self) -> str:
        more = self.dead_count - len(self.dead)
        return ", ".join(self.dead) + (f" and {more} more" if more > 0 else "")


class _Sweep:
    """A sweep in progress: its task, the instances found live so far (in order), the dead."""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.live: list[ModelRecord] = []
        self.changed = asyncio.Condition()  # notified at each instance found live
        self.dead: list[str] = []  # the first NAMED_DEAD, "<id> at <endpoint>"
        self.dead_count = 0


class InstanceScout:
    """Per-model sweeps of health probes (see the module docstring).

    ``timeout_s``: how long one probe waits to connect and be answered, on ``lag``'s clock;
    ``is_benched``: the router's bench (an instance on it is not probed); ``on_dead``: told of
    each instance whose probe went unanswered (or answered a 5xx or a redirect), with why."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        timeout_s: float,
        lag: LoopLag,
        is_benched: Callable[[ModelRecord], bool],
        on_dead: Callable[[ModelRecord, str], None],
    ) -> None:
        self._session = session
        self._timeout_s = timeout_s
        self._lag = lag
        self._is_benched = is_benched
        self._on_dead = on_dead
        self._sweeps: dict[str, _Sweep] = {}

    async def find(
        self,
        model: str,
        candidates: Sequence[ModelRecord],
        exclude: Collection[tuple[str, str]] = (),
    ) -> SweepResult:
        """As soon as one answers: an instance that answered its health probe (no 5xx), is not
        in ``exclude`` (by instance id and endpoint) and is not benched, with the dead probed
        so far; or none (none did, or none within :data:`SCOUT_WAIT_S`). A sweep of
        ``candidates`` is started unless one is running for the model; they are probed in the
        order given (the router's: random, its suspects last)."""
        sweep = self._sweeps.get(model)
        if sweep is None:
            sweep = self._sweeps[model] = _Sweep()
            sweep.task = asyncio.ensure_future(self._sweep(list(candidates), sweep))
            sweep.task.add_done_callback(lambda done: self._forget(model, done))
        assert sweep.task is not None

        def usable() -> ModelRecord | None:
            # Not one this request tried, nor one benched since it answered (a request of the
            # sweep's found it failing).
            wanted = (
                r
                for r in sweep.live
                if (r.instance_id, r.endpoint) not in exclude and not self._is_benched(r)
            )
            return next(wanted, None)

        async def until_usable() -> None:
            async with sweep.changed:
                await sweep.changed.wait_for(lambda: usable() is not None)

        waiter = asyncio.ensure_future(until_usable())
        try:
            either = asyncio.wait({waiter, sweep.task}, return_when=asyncio.FIRST_COMPLETED)
            with contextlib.suppress(asyncio.TimeoutError):
                await self._lag.within(either, SCOUT_WAIT_S)
        finally:
            waiter.cancel()
        result = SweepResult(usable())
        result.dead, result.dead_count = list(sweep.dead), sweep.dead_count
        return result

    def _forget(self, model: str, task: asyncio.Task) -> None:
        sweep = self._sweeps.get(model)
        if sweep is not None and sweep.task is task:
            del self._sweeps[model]
        if not task.cancelled():
            task.exception()  # retrieved: a sweep's failure is its requests' 503, not a log

    async def aclose(self) -> None:
        """Stop the sweeps still running (the frontend is stopping)."""
        tasks = [sweep.task for sweep in self._sweeps.values() if sweep.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _sweep(self, candidates: list[ModelRecord], result: _Sweep) -> None:
        """Probe every candidate's endpoint once, telling the waiting requests of each instance
        that answers; the rest are probed all the same (so each dead one is benched once per
        sweep)."""
        by_endpoint: dict[str, list[ModelRecord]] = {}
        for record in candidates:
            by_endpoint.setdefault(record.endpoint, []).append(record)
        queue = iter(by_endpoint.values())  # shared by the probers: each endpoint probed once
        probers: set[asyncio.Task[None]] = set()
        all_done = asyncio.Event()

        def start_prober() -> None:
            task = asyncio.ensure_future(prober())
            probers.add(task)
            task.add_done_callback(ended)

        def ended(task: asyncio.Task[None]) -> None:
            probers.discard(task)
            if not task.cancelled():
                task.exception()  # retrieved: a prober that failed (a closed session) just ends
            if not probers:
                all_done.set()

        async def prober() -> None:
            for group in queue:
                records = [record for record in group if not self._is_benched(record)]
                if not records:
                    continue
                why_dead = await self._why_dead(records[0].endpoint)
                if why_dead is None:
                    async with result.changed:
                        result.live.extend(records)
                        result.changed.notify_all()
                    continue
                for record in records:
                    self._on_dead(record, why_dead)
                    result.dead_count += 1
                    if len(result.dead) < NAMED_DEAD:
                        result.dead.append(f"{record.instance_id} at {escape(record.endpoint)}")
                # Each dead endpoint starts more probers, up to the bound: a live one among the
                # first costs a few probes, while the probes in flight double every probe
                # deadline when the dead hang.
                for _ in range(PROBERS_PER_DEAD):
                    if len(probers) < SCOUT_CONCURRENCY:
                        start_prober()

        for _ in range(min(FIRST_PROBERS, len(by_endpoint))):
            start_prober()
        if not probers:
            all_done.set()
        try:
            await all_done.wait()
        finally:
            for task in list(probers):
                task.cancel()
            await asyncio.gather(*probers, return_exceptions=True)

    async def _why_dead(self, endpoint: str) -> str | None:
        """None when ``endpoint`` answered its health probe in time without a 5xx or a
        redirect; else why not, for the log line."""
        status = await probe_health(self._session, endpoint, self._timeout_s, self._lag)
        if status is not None and status < 500 and not is_redirect(status):
            return None
        return describe(status, self._timeout_s)
