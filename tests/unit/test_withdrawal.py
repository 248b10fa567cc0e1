"""``--gc-maintenance withdraw``'s way to quiescence, on fakes of what it talks to (the record's
registration, the model's lock, the peers' watcher): when it withdraws and when not, that it
comes back on every path, and that the last instance serving a model never leaves it.
The real stores are tests/integration/test_gc_maintenance.py's."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dynamo.runtime.discovery import STATE_OK, ModelRecord
from dynamo.vllm import withdrawal
from dynamo.vllm.withdrawal import ALONE_LINE, Peers, WithdrawQuiescence
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.maintainer import GaveUp, IdleQuiescence, Quiet
from tests.support import wait_until_async
from tests.support.admission import in_flight
from tests.support.clock import FakeClock

MODEL = "m"


class FakeWatcher:
    state = STATE_OK

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class FakeDiscovery:
    def __init__(self) -> None:
        self.quiet: bool | None = None

    def watcher(self, *, on_add, on_remove, quiet=False) -> FakeWatcher:
        self.quiet = quiet
        return FakeWatcher()


class FakeRegistration:
    def __init__(self) -> None:
        self.states: list[str | None] = []
        self.fail = False

    async def set_state(self, state: str | None) -> None:
        self.states.append(state)
        if self.fail:
            raise OSError("store unreachable")


class FakeLock:
    def __init__(self) -> None:
        self.free = True
        self.asked = 0
        self.holding = False
        self.releases = 0

    async def acquire(self) -> bool:
        self.asked += 1
        self.holding = self.free
        return self.free

    async def held(self) -> bool:
        return self.holding

    async def release(self) -> None:
        self.holding = False
        self.releases += 1

    async def close(self) -> None:
        await self.release()


class Setup:
    def __init__(
        self,
        *peer_states: str | None,
        bound_s: float = 5.0,
        settle_s: float = 0.0,
        clock: FakeClock | None = None,
    ) -> None:
        self.clock = clock or FakeClock()
        self.gate = AdmissionGate(clock=self.clock)
        self.registration = FakeRegistration()
        self.lock = FakeLock()
        self.peers = Peers(FakeDiscovery(), MODEL, "me")  # type: ignore[arg-type]
        for index, state in enumerate(peer_states):
            self.peers._add(
                ModelRecord(MODEL, f"http://127.0.0.1:{index + 1}", f"p{index}", state=state)
            )
        self.quiescence = WithdrawQuiescence(
            self.gate,
            registration=self.registration,  # type: ignore[arg-type]
            lock=self.lock,
            peers=self.peers,
            idle=IdleQuiescence(self.gate, hold_bound_s=0.05, clock=self.clock),
            bound_s=bound_s,
            context="vllm worker",
            settle_s=settle_s,
            clock=self.clock,
        )

    def back(self) -> bool:
        """Admitting again, its record serving, the lock released."""
        return (
            not self.gate.withdrawn
            and self.registration.states[-1:] in ([], [None])
            and not self.lock.holding
        )


def test_the_peer_view_keeps_the_models_other_instances():
    peers = Peers(FakeDiscovery(), MODEL, "me")  # type: ignore[arg-type]
    for record in (
        ModelRecord(MODEL, "http://127.0.0.1:1", "me"),  # itself
        ModelRecord("other", "http://127.0.0.1:2", "o1"),  # another model's
        ModelRecord(MODEL, "http://127.0.0.1:3", "p1"),
        ModelRecord(MODEL, "http://127.0.0.1:4", "p2", state="withdrawn"),
    ):
        peers._add(record)
    assert [r.instance_id for r in peers.serving()] == ["p1"]
    assert [r.instance_id for r in peers.withdrawn()] == ["p2"]
    peers._remove(ModelRecord(MODEL, "http://127.0.0.1:3", "p1"))
    assert peers.serving() == []


def test_with_a_serving_peer_it_withdraws_and_comes_back_after_the_maintenance():
    async def scenario():
        setup = Setup(None)
        quiet = await setup.quiescence.reach("pause", 0.0)
        assert isinstance(quiet, Quiet) and quiet.mode == "withdraw"
        assert setup.gate.withdrawn and setup.lock.holding
        assert setup.registration.states == ["withdrawn"]
        assert await setup.quiescence.leave(quiet) == []
        assert setup.back() and setup.registration.states == ["withdrawn", None]

    asyncio.run(scenario())


def test_the_last_instance_serving_a_model_never_withdraws(caplog):
    caplog.set_level(logging.INFO, logger="dynamo.vllm.withdrawal")

    async def scenario():
        setup = Setup()  # no peer at all: idle's way, said once
        for _ in range(2):
            setup.clock.advance(1.0)  # an idle moment: nothing in flight for a while
            quiet = await setup.quiescence.reach("pause", 0.0)
            assert isinstance(quiet, Quiet) and quiet.mode == "idle" and "as idle" in quiet.note
            assert setup.gate.held and not setup.gate.withdrawn
            await setup.quiescence.leave(quiet)
        assert setup.lock.asked == 0 and setup.registration.states == []

    asyncio.run(scenario())
    assert [r.msg for r in caplog.records].count(ALONE_LINE) == 1


def test_with_every_peer_withdrawn_it_waits_for_them():
    async def scenario():
        setup = Setup("withdrawn")
        assert await setup.quiescence.reach("pause", 10.0) is None
        assert setup.lock.asked == 0 and not setup.gate.held and not setup.gate.withdrawn

    asyncio.run(scenario())


def test_a_peer_holding_the_lock_is_asked_again_only_after_a_moment():
    async def scenario():
        setup = Setup(None)
        setup.lock.free = False
        assert await setup.quiescence.reach("pause", 0.0) is None
        assert await setup.quiescence.reach("pause", 0.0) is None
        assert setup.lock.asked == 1
        setup.clock.advance(withdrawal.LOCK_RETRY_S)
        setup.lock.free = True
        assert isinstance(await setup.quiescence.reach("pause", 0.0), Quiet)
        assert setup.lock.asked == 2

    asyncio.run(scenario())


def test_a_peer_gone_by_the_time_the_lock_is_held_keeps_it_serving():
    async def scenario():
        setup = Setup(None)
        real_acquire = setup.lock.acquire

        async def acquire_while_the_peer_goes() -> bool:
            setup.peers.records.clear()
            return await real_acquire()

        setup.lock.acquire = acquire_while_the_peer_goes  # type: ignore[method-assign]
        assert await setup.quiescence.reach("pause", 0.0) is None
        assert setup.back() and setup.registration.states == []

    asyncio.run(scenario())


def test_requests_that_outlast_the_bound_bring_it_back_unmaintained():
    async def scenario():
        setup = Setup(None, bound_s=0.01)
        async with in_flight(setup.gate) as requests:
            await requests.admitted()
            attempt = await setup.quiescence.reach("pause", 0.0)
            assert isinstance(attempt, GaveUp) and attempt.mode == "withdraw"
            assert attempt.in_flight == 1
            assert setup.back() and setup.registration.states == ["withdrawn", None]
            assert await setup.quiescence.reach("pause", 0.0) is None  # retried later, not now

    asyncio.run(scenario())


def test_it_maintains_only_once_no_request_was_turned_away_for_the_settle_time():
    """A frontend that has not seen the record yet still sends requests: each is turned away
    (another instance takes it) and the maintenance waits, so that none arrives while the
    synchronous maintenance blocks the worker's event loop."""

    async def scenario():
        setup = Setup(None, bound_s=1.0, settle_s=0.3)
        attempt = asyncio.ensure_future(setup.quiescence.reach("pause", 0.0))
        await wait_until_async(lambda: setup.gate.withdrawn, deadline_s=10.0)
        for _ in range(3):  # turned away at 0.2, 0.4 and 0.6 s
            setup.clock.advance(0.2)
            setup.gate.turn_away()
        assert not attempt.done()
        setup.clock.advance(0.3)  # 0.3 s since the last one, within the 1 s bound
        quiet = await asyncio.wait_for(attempt, 10.0)
        assert isinstance(quiet, Quiet) and quiet.mode == "withdraw"
        await setup.quiescence.leave(quiet)

        again = Setup(None, bound_s=1.0, settle_s=0.3)
        attempt = asyncio.ensure_future(again.quiescence.reach("pause", 0.0))
        await wait_until_async(lambda: again.gate.withdrawn, deadline_s=10.0)
        again.clock.advance(0.8)
        again.gate.turn_away()  # still sent at 0.8 s: settled at 1.1 s, past the bound
        attempt_result = await asyncio.wait_for(attempt, 10.0)
        assert isinstance(attempt_result, GaveUp) and again.back()

    asyncio.run(scenario())


def test_a_stop_in_the_middle_of_a_withdrawal_brings_it_back():
    async def scenario():
        setup = Setup(None, bound_s=30.0)
        async with in_flight(setup.gate) as requests:
            await requests.admitted()
            attempt = asyncio.ensure_future(setup.quiescence.reach("pause", 0.0))
            await wait_until_async(lambda: setup.gate.withdrawn, deadline_s=10.0)
            attempt.cancel()  # the drain stops the maintainer
            with pytest.raises(asyncio.CancelledError):
                await attempt
            assert setup.back() and setup.lock.releases == 1

    asyncio.run(scenario())


def test_a_store_that_cannot_be_written_still_withdraws_and_comes_back(caplog):
    async def scenario():
        setup = Setup(None)
        setup.registration.fail = True
        quiet = await setup.quiescence.reach("pause", 0.0)
        assert isinstance(quiet, Quiet) and setup.gate.withdrawn  # the 503s still send them away
        await setup.quiescence.leave(quiet)
        assert not setup.gate.withdrawn and not setup.lock.holding

    asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "could not say withdrawn" in warnings[0]
    assert "could not say serving again" in warnings[1]


def test_a_worker_that_just_let_go_asks_for_the_lock_again_only_after_the_yield():
    async def scenario():
        setup = Setup(None)
        quiet = await setup.quiescence.reach("ahead", 0.0)
        assert isinstance(quiet, Quiet)
        await setup.quiescence.leave(quiet)
        setup.clock.advance(withdrawal.LOCK_RETRY_S)  # its own retry pace allows it: not yet
        assert await setup.quiescence.reach("ahead", 0.0) is None
        assert setup.lock.asked == 1
        setup.clock.advance(withdrawal.LOCK_YIELD_S - withdrawal.LOCK_RETRY_S)
        assert isinstance(await setup.quiescence.reach("pause", 0.0), Quiet)
        assert setup.lock.asked == 2

    asyncio.run(scenario())


class SharedLock:
    """One model's lock in a store both instances share: at most one holder."""

    def __init__(self) -> None:
        self.holder: str | None = None

    def handle(self, name: str) -> FakeLock:
        shared = self

        class Handle(FakeLock):
            async def acquire(self) -> bool:
                self.asked += 1
                if shared.holder is None:
                    shared.holder = name
                self.holding = shared.holder == name
                return self.holding

            async def held(self) -> bool:
                return shared.holder == name

            async def release(self) -> None:
                if shared.holder == name:
                    shared.holder = None
                await super().release()

        return Handle()


def test_two_workers_both_due_take_turns_at_the_lock():
    """The soak's storm: both workers due at every cycle; the one just back re-took the lock at
    once, before its peer's watcher (the file store's, polling every 0.2 s) saw it serving
    again, so the peer never had a turn. With the yield, the one just out lets the waiting one
    go first: they alternate, one out at a time."""

    async def scenario():
        clock = FakeClock()
        shared = SharedLock()
        workers = {name: Setup(clock=clock) for name in ("a", "b")}
        seen: list[tuple[float, Setup, ModelRecord]] = []  # published, not yet seen by the peer
        for name, setup in workers.items():
            setup.lock = shared.handle(name)
            setup.quiescence.lock = setup.lock
        for name, setup in workers.items():  # each one's record, as its peer's watcher sees it
            other = workers["b" if name == "a" else "a"]
            url = f"http://127.0.0.1:{1 if name == 'a' else 2}"

            async def publish(state, other=other, name=name, url=url, setup=setup):
                setup.registration.states.append(state)
                seen.append((clock() + 0.2, other, ModelRecord(MODEL, url, name, state=state)))

            setup.registration.set_state = publish  # type: ignore[method-assign]
            other.peers._add(ModelRecord(MODEL, url, name))
        order: list[str] = []
        for _ in range(200):  # 10 s of the maintainers' polls, both due throughout
            for at, peer, record in [entry for entry in seen if entry[0] <= clock()]:
                peer.peers._add(record)  # the watcher's poll
                seen.remove((at, peer, record))
            for name, setup in workers.items():
                quiet = await setup.quiescence.reach("ahead", 0.0)
                if not isinstance(quiet, Quiet):
                    continue
                assert shared.holder == name
                out = [n for n, s in workers.items() if s.gate.withdrawn]
                assert out == [name]  # at most one out, never the last one serving
                order.append(name)
                clock.advance(0.4)  # withdrawn, settled, maintained
                await setup.quiescence.leave(quiet)
                assert shared.holder is None and not setup.gate.withdrawn
            clock.advance(0.05)
        assert len(order) >= 6
        assert order == ["a", "b"] * (len(order) // 2) + ["a"] * (len(order) % 2), order

    asyncio.run(scenario())
