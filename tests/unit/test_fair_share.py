"""The fair share of a few workers between models (issue 37): one model at most all but one of
them, heavy work of all models together at most all but one, models taking turns while they
wait, and a waiter that gives up leaves nothing held. Every wait here is on a condition: the
share is driven step by step."""

from __future__ import annotations

import asyncio

import pytest

from dynamo.frontend.processors.fair_share import FairShare


async def settle() -> None:
    """Let every task that can run do so (each step here is a few loop turns at most)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_one_model_leaves_a_worker_to_the_others():
    async def scenario():
        share = FairShare(4)
        for _ in range(3):
            await share.acquire("hostile")
        fourth = asyncio.ensure_future(share.acquire("hostile"))
        await settle()
        assert not fourth.done() and share.busy == 3  # its share is full
        await asyncio.wait_for(share.acquire("healthy"), 1)  # the other model's at once
        assert share.busy == 4
        share.release("healthy")
        share.release("hostile")
        await asyncio.wait_for(fourth, 1)  # its next, once one of its own went

    asyncio.run(scenario())


def test_heavy_work_of_every_model_together_leaves_a_worker_to_light_work():
    async def scenario():
        share = FairShare(4)
        for model in ("a", "b", "c"):
            assert await share.acquire(model, heavy=True) is True
        heavy = asyncio.ensure_future(share.acquire("d", heavy=True))
        await settle()
        assert not heavy.done() and share.heavy == 3
        assert await asyncio.wait_for(share.acquire("e"), 1) is False  # light: the last worker
        share.release("a", heavy=True)
        assert await asyncio.wait_for(heavy, 1) is True

    asyncio.run(scenario())


def test_waiting_models_take_turns_whatever_each_has_queued():
    """A model with many requests waiting goes no faster than one with a single request."""

    async def scenario():
        share = FairShare(2)
        await share.acquire("x")
        await share.acquire("y")
        order: list[str] = []

        async def take(model: str) -> None:
            async with share.slot(model):
                order.append(model)

        many = [asyncio.ensure_future(take("many")) for _ in range(5)]
        await settle()
        one = asyncio.ensure_future(take("one"))
        await settle()
        share.release("x")  # one worker at a time: they go in turn order
        share.release("y")
        await asyncio.wait_for(asyncio.gather(*many, one), 1)
        return order

    order = asyncio.run(scenario())
    assert order.index("one") <= 1, order  # not after the five of "many"


@pytest.mark.parametrize("granted", [False, True], ids=["waiting", "granted as it gave up"])
def test_a_waiter_that_gives_up_holds_nothing(granted):
    async def scenario():
        share = FairShare(2)
        await share.acquire("a")
        waiter = asyncio.ensure_future(share.acquire("a"))  # a's share (1) is full
        await settle()
        if granted:
            share.release("a")  # the worker is granted to the waiter, which is then cancelled
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        if not granted:
            share.release("a")
        assert (share.busy, share.held("a"), share.waiting) == (0, 0, 0)
        async with asyncio.timeout(1):
            await share.acquire("a")  # nothing was lost
            await share.acquire("b")

    asyncio.run(scenario())


def test_heaviness_is_decided_when_the_work_is_admitted():
    """A model may turn suspect while its request waits: it is admitted as what it is then."""

    async def scenario():
        share = FairShare(3)
        suspects: set[str] = set()
        await share.acquire("a")
        await share.acquire("a")  # a's share (2) is full
        queued = asyncio.ensure_future(share.acquire("a", heavy=lambda: "a" in suspects))
        await settle()
        suspects.add("a")
        share.release("a")
        assert await asyncio.wait_for(queued, 1) is True
        assert share.heavy == 1

    asyncio.run(scenario())


def test_a_single_worker_is_everyones():
    async def scenario():
        share = FairShare(1)
        assert (share.per_key, share.heavy_slots) == (1, 1)
        async with share.slot("a", heavy=True):
            assert share.busy == 1
        async with share.slot("b"):
            assert share.busy == 1

    asyncio.run(scenario())
