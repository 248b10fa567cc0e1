"""etcd's side of ``--gc-maintenance withdraw``, against a real etcd on loopback: the model's
maintenance lock (one holder at a time, freed within the TTL when its holder dies) and the
record's routing state, as a frontend's watcher sees it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from dynamo.runtime.discovery import ModelRecord
from tests.integration.test_etcd_discovery import DEADLINE_S, Seen, discovery
from tests.support import wait_until_async

pytestmark = pytest.mark.integration


def test_one_instance_of_a_model_holds_the_lock_until_it_releases_it(etcd_server):
    backend = replace(discovery(etcd_server, "locks"), ttl_s=2.0)

    async def scenario():
        first, second = backend.maintenance_lock("m", "a"), backend.maintenance_lock("m", "b")
        other = backend.maintenance_lock("n", "c")
        try:
            assert await first.acquire() and await first.held()
            assert not await second.acquire() and not await second.held()
            assert await other.acquire()  # another model's lock
            await asyncio.sleep(first.lease_ttl_s * 1.5)  # kept alive past its TTL
            assert not await second.acquire()
            await first.release()
            assert await second.acquire()
        finally:
            for each in (first, second, other):
                await each.close()

    asyncio.run(scenario())


def test_a_dead_holders_lock_goes_with_its_lease(etcd_server):
    backend = replace(discovery(etcd_server, "locks"), ttl_s=2.0)

    async def scenario():
        dead, waiting = backend.maintenance_lock("m", "dead"), backend.maintenance_lock("m", "b")
        try:
            assert await dead.acquire()
            # It dies: its keep-alives stop, and nobody revokes its lease.
            assert dead._task is not None
            dead._task.cancel()
            dead.lease_id = None
            began = asyncio.get_running_loop().time()

            async def taken() -> bool:
                return await waiting.acquire()

            while not await taken():
                assert asyncio.get_running_loop().time() - began < DEADLINE_S
                await asyncio.sleep(0.2)  # the polling interval of the wait
            assert asyncio.get_running_loop().time() - began < dead.lease_ttl_s + 3.0
        finally:
            await dead.close()
            await waiting.close()

    asyncio.run(scenario())


def test_the_routing_state_reaches_the_watcher_as_an_update(etcd_server):
    backend = replace(discovery(etcd_server, "state"), ttl_s=2.0)
    seen = Seen()

    async def scenario():
        registration = backend.registration()
        await registration.connect()
        record = await registration.register(ModelRecord("m", "http://127.0.0.1:9"))
        watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        watcher.start()
        try:
            await wait_until_async(lambda: len(seen.added) == 1, deadline_s=DEADLINE_S)
            await registration.set_state("withdrawn")
            await wait_until_async(lambda: len(seen.added) == 2, deadline_s=DEADLINE_S)
            await registration.set_state(None)
            await wait_until_async(lambda: len(seen.added) == 3, deadline_s=DEADLINE_S)
        finally:
            await watcher.stop()
            await registration.unregister()
            await registration.close()
        return record

    record = asyncio.run(scenario())
    assert [(r.instance_id, r.state) for r in seen.added] == [
        (record.instance_id, None),
        (record.instance_id, "withdrawn"),
        (record.instance_id, None),
    ]
    assert seen.removed == []
