"""Send a tokenised request to one of a model's worker instances, over the request plane.

Round-robin over the model's instances, failing over to another one while no output has been
produced (a dead instance costs a retry, not the request). What bounds a request's cost, and the
log's, however many instances a model has and however many of them are dead:

* **Failure memory.** An instance that fails before its first item (refused connection, an
  error answer, a broken or silent stream) is *benched*: not routed to for
  :data:`BENCH_FIRST_S`, doubling at each new failure up to :data:`BENCH_MAX_S`, and forgiven at
  its first success. With every instance benched the request is a 503 at once.
* **Attempts.** At most :data:`MAX_ATTEMPTS` distinct instances are tried per request: the one
  whose turn it is (unless it failed before: an instance that failed stays *suspect* after its
  bench, until it serves again), then instances that served a request last time they were
  tried (so a request pays for at most one dead instance once a live one is known), then the
  one the scout finds (:mod:`dynamo.frontend.routing.instance_scout`): the first untried instance to
  answer a health probe, probed in random order, suspects last. So one live instance among
  thousands of dead records takes its requests from the first one on, and the dead are benched
  by the probes, not by failed requests.
* **Deadlines.** A connection must be accepted within :data:`WORKER_CONNECT_TIMEOUT_S`. A worker
  that says nothing for :data:`PROBE_AFTER_S` (before its first item, or between two) is asked
  ``GET /health`` (one probe per instance at a time, shared by its requests): no answer within
  :data:`PROBE_TIMEOUT_S` (of the frontend's own time: its event-loop lag does not count,
  :mod:`.loop_lag`) means the process is stopped or gone (SIGSTOP, a frozen host) and the
  request fails over or fails, and so does a redirect (never followed: :mod:`.health_probe`);
  any other answer means it is alive and merely slow (a long prefill, a queue), and the wait
  goes on. An instance not known to serve (none of its last requests served: new, or failed
  before) is asked sooner, after :data:`UNPROVEN_PROBE_AFTER_S`, with the scout's probe
  deadline: a dead address that accepts and never answers costs a request two seconds, not
  ten. Each item must come within :data:`WORKER_READ_TIMEOUT_S` of
  the previous one (of the request, for the first), whatever else arrives meanwhile: bytes that
  are not an item (blank lines, a line that never ends, an error body sent a byte at a time)
  and answered probes do not extend it.
* **Withdrawn instances.** A worker withdrawn for a GC maintenance answers a distinct 503
  (:class:`~dynamo.runtime.request_plane.WorkerWithdrawn`): the request goes to the next
  instance at once; the withdrawn one is not benched (it is alive, and back in a moment) and
  counts as one of the request's attempts. The registry routes to withdrawn instances last,
  once discovery says so; this covers the moments before it does.
* **Log lines.** An instance going on the bench is one WARNING, coming back one INFO, both
  budgeted per cause (:class:`~dynamo.runtime.log_budget.CauseBudgets`); worker text in them is
  escaped and bounded (:mod:`dynamo.runtime.peer_text`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from dynamo.runtime import peer_text, request_plane
from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.request_plane import (
    GenerateRequest,
    StreamItem,
    WorkerProtocolError,
    WorkerUnavailable,
    WorkerWithdrawn,
)

from .health_probe import describe, is_redirect, probe_health
from .instance_scout import SCOUT_PROBE_TIMEOUT_S, InstanceScout
from .loop_lag import LoopLag
from .model_registry import ModelEntry

logger = logging.getLogger(__name__)

# A worker on loopback accepts within milliseconds; longer means it is stopped or gone.
WORKER_CONNECT_TIMEOUT_S = 5.0
# Longest wait for an item of a worker's stream (the first: from the request), whatever the
# worker sends meanwhile (a real engine's slowest prefill and step fit well inside); past it the
# request fails. Also the socket's read timeout.
WORKER_READ_TIMEOUT_S = 120.0
# Silence after which the worker is asked whether it is alive, and how long it has to answer.
PROBE_AFTER_S = 5.0
PROBE_TIMEOUT_S = 5.0
# The same for an instance not known to serve: its first silence is probed sooner, with the
# scout's deadline (a live worker's /health answers in milliseconds).
UNPROVEN_PROBE_AFTER_S = 1.0
# Instances tried per request before it is a 503.
MAX_ATTEMPTS = 3
# How long a failed instance is not routed to: the first time, and at most.
BENCH_FIRST_S = 1.0
BENCH_MAX_S = 30.0
# Instances remembered (benched or recently failed) at most; the oldest are forgotten first.
MAX_REMEMBERED = 16384
# One WARNING line per cause per this many seconds (the next one counts those held back).
LOG_INTERVAL_S = 10.0


def create_worker_session() -> aiohttp.ClientSession:
    """The frontend's one client session to its workers (call inside the running loop).

    Workers are peers: no cookie jar (a Set-Cookie from one worker would go to the next on the
    same host), and every request made on it says ``allow_redirects=False``."""
    return aiohttp.ClientSession(
        cookie_jar=aiohttp.DummyCookieJar(),
        # limit=0: no client-side cap on concurrent streams; the workers apply backpressure.
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=WORKER_CONNECT_TIMEOUT_S, sock_read=WORKER_READ_TIMEOUT_S
        ),
        # A worker's answer is read as sent: an error body is never inflated (request_plane).
        auto_decompress=False,
    )


class NoWorkerAvailable(Exception):
    """Every instance tried failed before producing output, or none could be tried.

    ``str()`` is for the client (it names no instance); ``detail`` is for the log line.
    """

    def __init__(
        self, message: str, detail: str | None = None, *, bad_answers: bool = False
    ) -> None:
        super().__init__(message)
        self.detail = detail or message
        # Every instance tried answered, but not in the wire format (the client's 502).
        self.bad_answers = bad_answers


class WatchedStream(AsyncGenerator[StreamItem, None]):
    """The rest of a worker's stream, each item under the same liveness watch as the first
    (:meth:`WorkerRouter._next`). Closing it closes the worker's stream (its connection, which
    aborts the request in the worker) at once, whether or not it was ever read: an async
    generator never started would skip its ``finally`` and leave the connection to a
    collection."""

    def __init__(
        self, router: WorkerRouter, record: ModelRecord, stream: AsyncGenerator[StreamItem, None]
    ) -> None:
        self._router = router
        self._record = record
        self._stream = stream

    async def asend(self, value: None) -> StreamItem:
        try:
            return await self._router._next(self._record, self._stream)
        except BaseException:  # ended, failed or cancelled: the connection goes at once
            await self._stream.aclose()
            raise

    async def athrow(self, typ: Any, val: Any = None, tb: Any = None) -> StreamItem:
        await self._stream.aclose()
        raise typ if val is None else val

    async def aclose(self) -> None:
        await self._stream.aclose()


@dataclass
class _Bench:
    until: float
    length: float


class WorkerRouter:
    def __init__(
        self, session: aiohttp.ClientSession, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.session = session
        self._clock = clock
        self._benched: dict[tuple[str, str], _Bench] = {}  # (instance id, endpoint) -> bench
        self._good: dict[tuple[str, str], None] = {}  # served the last request sent to it
        self._probes: dict[tuple[str, float], asyncio.Task] = {}  # (endpoint, deadline) -> probe
        self._log = CauseBudgets(logger, lines=1, interval_s=LOG_INTERVAL_S, clock=clock)
        self._info = CauseBudgets(
            logger, logging.INFO, lines=1, interval_s=LOG_INTERVAL_S, clock=clock
        )
        self._lag = LoopLag()
        self._scout = InstanceScout(
            session,
            timeout_s=SCOUT_PROBE_TIMEOUT_S,
            lag=self._lag,
            is_benched=self._is_benched,
            on_dead=self._failed,
        )

    async def aclose(self) -> None:
        """Stop what runs in the background (the scout's sweeps)."""
        await self._scout.aclose()

    def _is_benched(self, record: ModelRecord) -> bool:
        bench = self._benched.get(_key(record))
        return bench is not None and self._clock() < bench.until

    async def open_stream(
        self,
        entry: ModelEntry,
        plane_request: GenerateRequest | dict,
        *,
        max_token_id: int | None = None,
    ) -> tuple[StreamItem, AsyncGenerator[StreamItem, None]]:
        """The first item of a worker's stream and the rest of it (the caller closes it).

        Waiting for the first item before answering the client lets a dead worker become a
        proper 503 (or a retry on another instance) instead of a stream that breaks at once.
        ``max_token_id`` bounds the ids the worker may send (the model's vocabulary).
        """
        failures: list[str] = []  # "instance at endpoint: error", in the order tried
        protocol_errors = 0
        candidates = [record for record in entry.route_order() if not self._is_benched(record)]
        benched = len(entry.instances) - len(candidates)
        tried: set[tuple[str, str]] = set()
        probed: list[str] = []  # the dead the scout's sweeps found, described
        while len(failures) < MAX_ATTEMPTS:
            record = self._next_choice(candidates, tried)
            if record is None:
                untried = [r for r in candidates if _key(r) not in tried]
                # Random order, suspects last: dead records named before the live one (by a
                # peer, or by chance) do not all stand between it and the probes.
                random.shuffle(untried)
                untried.sort(key=lambda r: _key(r) in self._benched)
                if not untried:
                    break
                sweep = await self._scout.find(entry.name, untried, exclude=tried)
                if sweep.dead_count:
                    probed.append(sweep.describe_dead())
                record = sweep.found
                if record is None or _key(record) in tried:
                    break
            tried.add(_key(record))
            stream = request_plane.generate(
                self.session, record.endpoint, plane_request, max_token_id=max_token_id
            )
            try:
                first = await self._next(record, stream)
            except (WorkerUnavailable, StopAsyncIteration) as exc:
                await stream.aclose()
                protocol_errors += isinstance(exc, WorkerProtocolError)
                reason = str(exc) or "empty stream"
                if not isinstance(exc, WorkerWithdrawn):  # alive, out for a GC maintenance
                    self._failed(record, reason)
                failures.append(
                    f"{record.instance_id} at {peer_text.escape(record.endpoint)}: {reason}"
                )
                continue
            except BaseException:
                await stream.aclose()
                raise
            self._succeeded(record)
            return first, WatchedStream(self, record, stream)
        name = peer_text.escape(entry.name)
        if not failures:
            detail = f"model {name}: every instance failed recently ({benched} not retried yet)"
            raise NoWorkerAvailable(
                f"no worker instance of model `{entry.name}` is available right now", detail
            )
        raise NoWorkerAvailable(
            f"no worker instance of model `{entry.name}` could take the request",
            detail=f"model {name}: {len(failures)} instance(s) tried, {benched} benched: "
            + "; ".join(failures)
            + "".join(f"; health probe unanswered: {dead}" for dead in probed),
            bad_answers=protocol_errors == len(failures),
        )

    def _next_choice(
        self, candidates: list[ModelRecord], tried: set[tuple[str, str]]
    ) -> ModelRecord | None:
        """The instance whose turn it is (first attempt, unless it is a suspect), else one that
        served its last request; None: the scout is to find one."""
        if not tried and candidates and _key(candidates[0]) not in self._benched:
            return candidates[0]
        return next((r for r in candidates if _key(r) in self._good and _key(r) not in tried), None)

    async def _next(
        self, record: ModelRecord, stream: AsyncGenerator[StreamItem, None]
    ) -> StreamItem:
        """The next item within :data:`WORKER_READ_TIMEOUT_S`; while it does not come, the
        worker is probed every :data:`PROBE_AFTER_S` and given up on when a probe goes
        unanswered (the first time sooner, with a shorter deadline, for an instance not known
        to serve)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WORKER_READ_TIMEOUT_S
        waiting = asyncio.ensure_future(stream.__anext__())
        if _key(record) in self._good:
            silence, probe_timeout = PROBE_AFTER_S, PROBE_TIMEOUT_S
        else:
            silence, probe_timeout = UNPROVEN_PROBE_AFTER_S, SCOUT_PROBE_TIMEOUT_S
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise WorkerUnavailable(
                        f"worker at {peer_text.escape(record.endpoint)} sent no item within "
                        f"{WORKER_READ_TIMEOUT_S:g} s"
                    )
                done, _ = await asyncio.wait({waiting}, timeout=min(silence, left))
                if done:
                    return waiting.result()
                if loop.time() >= deadline:
                    continue  # the deadline's own message, not a probe's
                status = await self._alive(record.endpoint, probe_timeout)
                if status is None or is_redirect(status):
                    raise WorkerUnavailable(
                        f"worker at {peer_text.escape(record.endpoint)} silent for "
                        f"{silence:g} s and {describe(status, probe_timeout)} (stopped or gone)"
                    )
                silence, probe_timeout = PROBE_AFTER_S, PROBE_TIMEOUT_S  # it answers: alive
        finally:
            if not waiting.done():
                waiting.cancel()  # the generator ends with it: its connection is closed
                await asyncio.wait({waiting})

    async def _alive(self, endpoint: str, timeout_s: float) -> int | None:
        """The status the worker's process answers within ``timeout_s`` (any answer but a
        redirect means alive: a draining worker is), or None. One probe per endpoint and
        deadline at a time; a request that asks meanwhile shares it."""
        key = (endpoint, timeout_s)
        probe = self._probes.get(key)
        if probe is None:
            probe = asyncio.ensure_future(self._probe(endpoint, timeout_s))
            self._probes[key] = probe
            probe.add_done_callback(lambda _: self._probes.pop(key, None))
        return await asyncio.shield(probe)

    async def _probe(self, endpoint: str, timeout_s: float) -> int | None:
        return await probe_health(self.session, endpoint, timeout_s, self._lag)

    def _failed(self, record: ModelRecord, reason: str) -> None:
        key = _key(record)
        self._good.pop(key, None)
        previous = self._benched.get(key)
        if previous is not None and self._clock() < previous.until:
            # A request that was in flight when the instance went on the bench: the same
            # failure, not a new one (a burst of them must not double the bench each time).
            return
        self._benched.pop(key, None)
        length = BENCH_FIRST_S if previous is None else min(previous.length * 2, BENCH_MAX_S)
        self._benched[key] = _Bench(until=self._clock() + length, length=length)
        _bound(self._benched)
        if previous is None:
            self._log.emit(
                "instance unavailable",
                "Worker instance %s at %s unavailable (%s): not routed to for %g s, longer if "
                "it fails again",
                record.instance_id,
                peer_text.escape(record.endpoint),
                reason,
                length,
            )

    def _succeeded(self, record: ModelRecord) -> None:
        key = _key(record)
        self._good.pop(key, None)
        self._good[key] = None  # most recent last
        _bound(self._good)
        if self._benched.pop(key, None) is not None:
            self._info.emit(
                "instance back",
                "Worker instance %s at %s answers again",
                record.instance_id,
                peer_text.escape(record.endpoint),
            )


def _key(record: ModelRecord) -> tuple[str, str]:
    return record.instance_id, record.endpoint


def _bound(memory: dict) -> None:
    """Forget the oldest entries beyond :data:`MAX_REMEMBERED` (instances long gone)."""
    while len(memory) > MAX_REMEMBERED:
        del memory[next(iter(memory))]
