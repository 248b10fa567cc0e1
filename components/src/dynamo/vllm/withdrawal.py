"""``--gc-maintenance withdraw``: the worker reaches quiescence by leaving routing for a moment.

The worker's :class:`~dynamo_gc.maintainer.Quiescence` for ``withdraw``
(:class:`WithdrawQuiescence`); the rest of the maintenance (trigger, operation, report) is the
layer's. One attempt, when a maintenance is due:

1. a peer must serve the model: another instance registered in discovery, live (its lease
   holds) and not withdrawn itself (:class:`Peers`, a discovery watcher of the worker's own,
   a quiet reader: it deletes nothing and leaves the store's bad or expired records to the
   frontends to report); with none at all, the worker does what ``idle`` does, saying so once,
   since withdrawing would take the model out of service; with peers that are all withdrawn,
   it waits;
2. the model's maintenance lock (:meth:`Discovery.maintenance_lock`, under a lease: a holder
   that dies frees it within the TTL), so at most one instance of a model is out at a time;
   with the lock held the peer check is made again, so the last one serving never leaves;
3. out of routing: the gate answers every new generate request with the withdrawn 503 (the
   frontend's router takes another instance at once), and the record says ``withdrawn`` (the
   frontends route to it last as soon as they see it);
4. the requests in flight get ``--drain-timeout`` to finish, and the frontends time to stop
   sending: no request turned away for :data:`WITHDRAW_SETTLE_S`. A request that reaches the
   worker while its event loop runs is turned away at once; one that arrives during the
   synchronous maintenance would wait the whole of it. If either takes longer than the bound,
   the worker comes back without maintaining and tries again later (doubling waits): a
   maintenance never cuts a request short;
5. the maintenance runs (nothing in flight, checked by the operation itself), then the worker
   comes back: the gate admits, the record loses its state, the lock is released. Each of these
   also happens when the maintainer is stopped (the drain) in the middle of an attempt.

**Turns.** A worker that has just released the lock (after a maintenance or an attempt given
up) does not ask for it again for :data:`LOCK_YIELD_S`, longer than a waiting peer takes to see
it serving again and take the lock: its watcher sees the record (the file store's watchers poll
every 0.2 s; etcd's are told at once), and its next ask comes within :data:`LOCK_RETRY_S`. So of
two workers both due, the one just out lets the other go first and they take turns: in the soak,
a worker maintained at every cycle re-took the lock the moment it let go, hundreds of times, and
its peer, asking every 0.25 s, never got it (its heap went unmaintained, its full collections
grew to seconds). The yield is the releasing worker's own and needs nothing new in the store, so
it holds on the file and etcd backends alike; the lock still decides who is out, so at most one
is, and the peer check still keeps the last one serving. Its cost: a worker alone in being due
waits that long before its next maintenance, against a trigger whose margin is several full
collections.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from dynamo.runtime.discovery import (
    STATE_CONNECTING,
    STATE_WITHDRAWN,
    Discovery,
    MaintenanceLock,
    ModelRecord,
    Registration,
)
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.maintainer import GaveUp, IdleQuiescence, Quiet, Retry

logger = logging.getLogger(__name__)

# How often the model's maintenance lock is asked for while a peer holds it.
LOCK_RETRY_S = 0.25
# After releasing the lock, not asked for again for this long: a waiting peer goes first (Turns).
# Four of a waiter's asks: its watcher's 0.2 s poll, one ask and the time to take it, with margin
# for a loaded machine.
LOCK_YIELD_S = 4 * LOCK_RETRY_S
# Withdrawn, with nothing in flight: no request turned away for this long before the maintenance
# runs, so every frontend has seen the record (a frontend polling the file store sees it within
# its 0.2 s poll; etcd's watchers are told at once) and none sends a request into it.
WITHDRAW_SETTLE_S = 0.3

ALONE_LINE = (
    "GC maintenance (%s): no other live instance of model %s is registered; maintaining in "
    "place (as idle) rather than leaving the model without a server"
)


class Peers:
    """The other live instances of one model, kept current by a discovery watcher."""

    def __init__(self, discovery: Discovery, model: str, instance_id: str) -> None:
        self.model = model
        self.instance_id = instance_id
        self.records: dict[str, ModelRecord] = {}
        # A quiet reader: the frontends report and clean up the store's bad and expired records.
        self.watcher = discovery.watcher(on_add=self._add, on_remove=self._remove, quiet=True)

    def _add(self, record: ModelRecord) -> None:
        if record.model == self.model and record.instance_id != self.instance_id:
            self.records[record.instance_id] = record

    def _remove(self, record: ModelRecord) -> None:
        self.records.pop(record.instance_id, None)

    @property
    def listed(self) -> bool:
        """Whether the watcher has looked at the store at least once."""
        return self.watcher.state != STATE_CONNECTING

    def serving(self) -> list[ModelRecord]:
        return [r for r in self.records.values() if not r.withdrawn]

    def withdrawn(self) -> list[ModelRecord]:
        return [r for r in self.records.values() if r.withdrawn]

    def start(self) -> None:
        self.watcher.start()

    async def stop(self) -> None:
        await self.watcher.stop()


class WithdrawQuiescence:
    """``withdraw``'s way to quiescence (see the module docstring)."""

    mode = "withdraw"

    def __init__(
        self,
        gate: AdmissionGate,
        *,
        registration: Registration,
        lock: MaintenanceLock,
        peers: Peers,
        idle: IdleQuiescence,
        bound_s: float,
        context: str,
        settle_s: float = WITHDRAW_SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gate = gate
        self.settle_s = settle_s
        self.registration = registration
        self.lock = lock
        self.peers = peers
        self.idle = idle
        self.bound_s = bound_s
        self.context = context
        self._clock = clock
        self.retry = Retry(clock)
        self._alone_said = False
        self._lock_tried = float("-inf")
        self._released_at = float("-inf")  # when this worker last let go of the lock

    async def reach(self, reason: str, due_for_s: float) -> Quiet | GaveUp | None:
        if not self.peers.listed:
            return None
        if not self.peers.serving():
            if self.peers.withdrawn():
                return None  # a peer is out for its own maintenance: after it is back
            return await self._alone(reason, due_for_s)
        self._alone_said = False
        now = self._clock()
        if (
            not self.retry.ready()
            or now < self._lock_tried + LOCK_RETRY_S
            or now < self._released_at + LOCK_YIELD_S  # a waiting peer's turn first
        ):
            return None
        self._lock_tried = self._clock()
        if not await self.lock.acquire():
            return None  # a peer is maintaining: try again in a moment
        try:
            return await self._withdraw()
        except BaseException:
            await self._come_back()
            raise

    async def _alone(self, reason: str, due_for_s: float) -> Quiet | GaveUp | None:
        if not self._alone_said:
            self._alone_said = True
            logger.info(ALONE_LINE, self.context, self.peers.model)
        quiet = await self.idle.reach(reason, due_for_s)
        if isinstance(quiet, Quiet):
            quiet.note = " (no peer serving the model: as idle)"
        return quiet

    async def _withdraw(self) -> Quiet | GaveUp | None:
        if not self.peers.serving():  # checked again with the lock held
            await self.lock.release()
            return None
        gate = self.gate
        began = self._clock()
        gate.withdrawn = True  # new requests go elsewhere at once, whatever the record says
        try:
            await self.registration.set_state(STATE_WITHDRAWN)
        except Exception as exc:  # noqa: BLE001 - the 503 still sends them elsewhere
            logger.warning(
                "GC maintenance (%s): the record could not say withdrawn (%s); the withdrawn "
                "answer sends the requests that reach this worker to its peers meanwhile",
                self.context,
                exc,
            )
        finished = await gate.until_idle(self.bound_s) and await self._settled(began)
        if finished and await self.lock.held():
            self.retry.reset()
            return Quiet(self.mode, began, gate.count, handle=self.mode)
        in_flight = gate.in_flight
        await self._come_back()
        return GaveUp(self.mode, in_flight, self._clock() - began, self.retry.failed(), [])

    async def _settled(self, began: float) -> bool:
        """Whether, within the bound from ``began``, no request was turned away for
        ``settle_s`` (counted from the withdrawal at the earliest) with nothing in flight."""
        deadline = began + self.bound_s
        while True:
            last = max(began, self.gate.turned_away_at or began)
            wait = last + self.settle_s - self._clock()
            if wait <= 0:
                return self.gate.in_flight == 0
            if self._clock() + wait > deadline:
                return False
            await asyncio.sleep(wait)  # until the settle time has passed, then look again

    async def leave(self, quiet: Quiet) -> list[float]:
        if quiet.handle != self.mode:
            return await self.idle.leave(quiet)
        await self._come_back()
        return []

    async def _come_back(self) -> None:
        """Admit again, say so in the record, release the lock: each one even if another
        fails (a stop in the middle of an attempt included)."""
        self.gate.withdrawn = False
        try:
            await self.registration.set_state(None)
        except Exception as exc:  # noqa: BLE001 - the lease's next renewal writes it
            logger.warning(
                "GC maintenance (%s): the record could not say serving again (%s); the next "
                "renewal of its lease writes it",
                self.context,
                exc,
            )
        finally:
            try:
                await asyncio.shield(self.lock.release())
            finally:
                self._released_at = self._clock()
