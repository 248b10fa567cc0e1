"""Deadlines in the frontend's own time (dynamo.frontend.routing.loop_lag, issue 37): a stalled
or starved event loop does not count against the peer; a slow peer on a loop that keeps up
still misses its deadline; and no deadline grows beyond CAP_FACTOR x its length.

The stalls are made on purpose (a callback that blocks the loop: tests/support/loop_hog.py),
so what is checked does not depend on the machine's speed or load."""

from __future__ import annotations

import asyncio
import time

import pytest

from dynamo.frontend.routing.loop_lag import CAP_FACTOR, LoopLag
from tests.support.loop_hog import loop_hog


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), 60))


async def peer() -> str:
    """An answer ready 50 ms in that takes the loop a few turns to reach its reader (as bytes
    from a socket do: the transport's callback, the parser, the waiting task)."""
    await asyncio.sleep(0.05)
    for _ in range(3):
        await asyncio.sleep(0)
    return "answered"


def test_a_stalled_loop_does_not_count_against_the_peer():
    """The answer is ready 50 ms in, but the loop is blocked for 0.6 s from 20 ms in: in wall
    time the answer comes at 0.6 s, over a 0.3 s deadline; in the loop's own time it came in
    about 50 ms."""
    lag = LoopLag()

    async def scenario():
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, time.sleep, 0.6)  # the stall: the loop runs nothing meanwhile
        started = time.monotonic()
        result = await lag.within(peer(), 0.3)
        return result, time.monotonic() - started

    result, waited = run(scenario)
    assert result == "answered" and waited >= 0.6
    assert lag.lag() >= 0.5


def test_a_wall_clock_deadline_would_have_judged_the_same_answer_late():
    """The control for the test above: the same stall under asyncio's own timeout."""

    async def scenario():
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, time.sleep, 0.6)
        await asyncio.wait_for(peer(), 0.3)

    with pytest.raises(asyncio.TimeoutError):
        run(scenario)


def test_a_slow_peer_on_a_loop_that_keeps_up_misses_its_deadline():
    lag = LoopLag()

    async def scenario():
        started = time.monotonic()
        with pytest.raises(asyncio.TimeoutError):
            await lag.within(asyncio.sleep(5), 0.2)
        return time.monotonic() - started

    waited = run(scenario)
    assert 0.2 <= waited < 5


@pytest.mark.parametrize("cap_factor", [CAP_FACTOR, 5.0])
def test_under_a_loop_that_never_catches_up_a_deadline_ends_within_its_cap(cap_factor):
    """Blocked 0.1 s of every 0.12 s, the loop's own time barely moves: the deadline still ends
    by its cap factor x its length (and a block)."""
    lag = LoopLag()

    async def scenario():
        async with loop_hog(block_s=0.1, run_s=0.02) as hog:
            started = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await lag.within(asyncio.Event().wait(), 0.3, cap_factor=cap_factor)
            return time.monotonic() - started, hog.blocks

    waited, blocks = run(scenario)
    assert blocks >= 3
    assert 0.3 < waited <= cap_factor * 0.3 + 0.25, waited


def test_the_answer_and_the_failure_of_the_awaitable_are_its_own():
    lag = LoopLag()

    async def failing():
        raise ConnectionRefusedError("refused")

    async def scenario():
        assert await lag.within(asyncio.sleep(0, "ok"), 1) == "ok"
        with pytest.raises(ConnectionRefusedError):
            await lag.within(failing(), 1)

    run(scenario)


def test_nothing_ticks_once_no_deadline_is_pending_and_a_cancelled_wait_cancels_its_work():
    lag = LoopLag()

    async def scenario():
        work = asyncio.ensure_future(asyncio.Event().wait())
        waiting = asyncio.ensure_future(lag.within(work, 10))
        await asyncio.sleep(0.05)
        assert lag._timer is not None  # ticking while the deadline is pending
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return work

    work = run(scenario)
    assert work.cancelled() and lag._timer is None
