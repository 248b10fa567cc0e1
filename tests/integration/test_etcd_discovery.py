"""The etcd backend against a real etcd server on loopback (no mock of etcd anywhere).

In-process: the worker's registration and the frontend's watcher on one event loop, with a test
client (aetcd) to write what a test needs into etcd. The launchers on etcd are in
test_etcd_pair.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import aetcd
import pytest

from dynamo.runtime.discovery import MAX_RECORD_BYTES, ModelRecord
from dynamo.runtime.discovery.etcd_backend import EtcdDiscovery
from dynamo.runtime.discovery.etcd_client import EtcdCredentials
from dynamo.runtime.discovery.etcd_endpoints import parse_endpoints
from tests.support import wait_until_async

pytestmark = pytest.mark.integration

DEADLINE_S = 15.0


def discovery(server, namespace: str = "test") -> EtcdDiscovery:
    return EtcdDiscovery(parse_endpoints(server.url), namespace, EtcdCredentials())


def client(server) -> aetcd.Client:
    return aetcd.Client(host="127.0.0.1", port=server.client_port, timeout=5)


class Seen:
    """What a watcher reported, in order."""

    def __init__(self) -> None:
        self.added: list[ModelRecord] = []
        self.removed: list[ModelRecord] = []

    def on_add(self, record: ModelRecord) -> None:
        self.added.append(record)

    def on_remove(self, record: ModelRecord) -> None:
        self.removed.append(record)


async def stop_and_withdraw(registration, *watchers) -> None:
    """Stop the watchers, then withdraw the registration's record and close it."""
    for watcher in watchers:
        await watcher.stop()
    await registration.unregister()
    await registration.close()


async def outage_and_relist(server, watcher) -> None:
    """etcd stops (the watch stream breaks) and comes back: returns once ``watcher`` has seen the
    outage and listed the keys again."""
    server.stop()
    await wait_until_async(lambda: watcher.state == "degraded", deadline_s=DEADLINE_S)
    server.start()
    await wait_until_async(
        lambda: watcher.state == "ok" and watcher.lists >= 2, deadline_s=DEADLINE_S
    )


def warnings(caplog, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


def test_register_watch_and_revoke(etcd_server):
    backend = discovery(etcd_server)
    seen = Seen()

    async def scenario():
        registration = replace(backend, ttl_s=2.0).registration()
        await registration.connect()
        record = await registration.register(ModelRecord(model="m", endpoint="http://w:1"))
        watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        watcher.start()
        try:
            await wait_until_async(
                lambda: seen.added, what="the record to be listed", deadline_s=DEADLINE_S
            )
            assert watcher.state == "ok"
            # The keep-alive holds the 2 s lease well past its TTL.
            async with client(etcd_server) as c:
                lease_id = registration.lease_id
                for _ in range(3):
                    info = await c.get_lease_info(lease_id)
                    assert info.TTL > 0
                    await asyncio.sleep(registration.keepalive_interval_s)  # spans 1 TTL
            began = time.monotonic()
            await registration.unregister()
            await wait_until_async(
                lambda: seen.removed, what="the revoked record to go", deadline_s=DEADLINE_S
            )
            return record, time.monotonic() - began
        finally:
            await watcher.stop()
            await registration.close()

    record, removal_s = asyncio.run(scenario())
    assert [r.instance_id for r in seen.added] == [record.instance_id]
    assert [r.instance_id for r in seen.removed] == [record.instance_id]
    assert removal_s < 1.0  # revoked, not expired: the watch sees the DELETE at once


def test_a_lease_left_unrenewed_expires_and_its_record_goes(etcd_server, record_property):
    """What a SIGKILLed worker leaves: a lease nobody keeps alive; etcd deletes the key."""
    backend = discovery(etcd_server)
    seen = Seen()

    async def scenario():
        registration = replace(backend, ttl_s=2.0).registration()
        await registration.register(ModelRecord(model="m", endpoint="http://w:1"))
        registration._task.cancel()  # the worker is gone: no more keep-alives
        began = time.monotonic()
        watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        watcher.start()
        try:
            await wait_until_async(
                lambda: seen.removed, what="the expired record to go", deadline_s=DEADLINE_S
            )
            return time.monotonic() - began
        finally:
            await watcher.stop()
            await registration.close()

    gone_after_s = asyncio.run(scenario())
    record_property("lease_expiry_s", round(gone_after_s, 2))
    print(f"record gone {gone_after_s:.2f} s after its last keep-alive (lease 2 s)")
    assert len(seen.added) == 1


def test_namespaces_do_not_see_each_other(etcd_server):
    seen_a, seen_b = Seen(), Seen()

    async def scenario():
        reg = replace(discovery(etcd_server, "a"), ttl_s=5.0).registration()
        await reg.register(ModelRecord(model="only-a", endpoint="http://w:1"))
        watch_a = discovery(etcd_server, "a").watcher(
            on_add=seen_a.on_add, on_remove=seen_a.on_remove
        )
        watch_b = discovery(etcd_server, "b").watcher(
            on_add=seen_b.on_add, on_remove=seen_b.on_remove
        )
        watch_a.start()
        watch_b.start()
        try:
            await wait_until_async(
                lambda: seen_a.added and watch_b.state == "ok", deadline_s=DEADLINE_S
            )
        finally:
            await stop_and_withdraw(reg, watch_a, watch_b)

    asyncio.run(scenario())
    assert [r.model for r in seen_a.added] == ["only-a"] and seen_b.added == []


def test_malformed_and_oversized_records_get_one_warning_each_and_are_skipped(etcd_server, caplog):
    caplog.set_level(logging.INFO)
    backend = discovery(etcd_server)
    prefix = backend.prefix.encode()
    seen = Seen()
    good = ModelRecord(model="good", endpoint="http://w:1")

    async def scenario():
        async with client(etcd_server) as c:
            await c.put(prefix + b"garbage", b"{not json")
            await c.put(prefix + b"huge", b" " * (MAX_RECORD_BYTES + 1))
            watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
            watcher.start()
            try:
                await wait_until_async(lambda: watcher.state == "ok", deadline_s=DEADLINE_S)
                await c.put(prefix + good.instance_id.encode(), good.to_json().encode())
                await wait_until_async(
                    lambda: seen.added, what="the good record", deadline_s=DEADLINE_S
                )
                # The same instance under a key that is not its id: a copy or a forgery,
                # malformed (one WARNING); the record under its own key is the instance's.
                await c.put(prefix + b"copy", good.to_json().encode())
                await wait_until_async(
                    lambda: warnings(caplog, "whose key is another"), deadline_s=DEADLINE_S
                )
                # The watch stream breaks (etcd restarts): the re-list must not warn again
                # about the same versions of the same keys.
                await outage_and_relist(etcd_server, watcher)
            finally:
                await watcher.stop()

    asyncio.run(scenario())
    assert [r.model for r in seen.added] == ["good"] and seen.removed == []
    malformed = warnings(caplog, "Ignoring malformed discovery record")
    assert len(malformed) == 3, malformed
    assert any("garbage" in w for w in malformed)
    assert any("huge" in w and f"{MAX_RECORD_BYTES}-byte record limit" in w for w in malformed)
    (duplicate,) = warnings(caplog, "whose key is another")
    assert "copy" in duplicate and good.instance_id in duplicate


def test_a_quiet_reader_sees_the_same_records_and_says_nothing_above_debug(etcd_server, caplog):
    """A worker's view of its peers (``quiet``): malformed records skipped and an outage
    survived as a frontend's watcher does, with every line at DEBUG (the frontends and the
    worker's own registration report them)."""
    caplog.set_level(logging.DEBUG)
    backend = discovery(etcd_server, "quiet")
    prefix = backend.prefix.encode()
    seen = Seen()
    good = ModelRecord(model="good", endpoint="http://w:1")

    async def scenario():
        async with client(etcd_server) as c:
            await c.put(prefix + b"garbage", b"{not json")
            watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove, quiet=True)
            watcher.start()
            try:
                await c.put(prefix + good.instance_id.encode(), good.to_json().encode())
                await wait_until_async(lambda: seen.added, deadline_s=DEADLINE_S)
                await outage_and_relist(etcd_server, watcher)
            finally:
                await watcher.stop()

    asyncio.run(scenario())
    assert [r.model for r in seen.added] == ["good"] and seen.removed == []
    ours = [r for r in caplog.records if r.name.startswith("dynamo.runtime.discovery.etcd_watcher")]
    said = " ".join(r.getMessage() for r in ours)
    assert "Ignoring malformed discovery record" in said and "Discovery degraded" in said
    assert {r.levelno for r in ours} == {logging.DEBUG}


def test_an_outage_keeps_the_known_instances_and_logs_once(etcd_server, caplog):
    caplog.set_level(logging.INFO)
    backend = discovery(etcd_server)
    seen = Seen()

    async def scenario():
        registration = replace(backend, ttl_s=2.0).registration()
        record = await registration.register(ModelRecord(model="m", endpoint="http://w:1"))
        watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        watcher.start()
        try:
            await wait_until_async(lambda: seen.added, deadline_s=DEADLINE_S)
            etcd_server.stop()
            await wait_until_async(
                lambda: watcher.state == "degraded",
                what="the watcher to see the outage",
                deadline_s=DEADLINE_S,
            )
            # Longer than the lease: the worker cannot renew, nothing is removed meanwhile.
            await wait_until_async(
                lambda: "Discovery: lost etcd" in caplog.text,
                what="the worker to see it",
                deadline_s=DEADLINE_S,
            )
            await asyncio.sleep(registration.lease_ttl_s + 1)  # the outage outlasts the lease
            assert watcher.known == {record.instance_id: record} and seen.removed == []
            etcd_server.start()
            await wait_until_async(
                lambda: (
                    watcher.state == "ok"
                    and "registered again" in caplog.text
                    or "still held" in caplog.text
                ),
                what="recovery",
                deadline_s=DEADLINE_S,
            )
            await wait_until_async(lambda: watcher.state == "ok", deadline_s=DEADLINE_S)
            async with client(etcd_server) as c:
                listed = await c.get_prefix(backend.prefix.encode())
            keys = sorted(kv.key.decode().rsplit("/", 1)[1] for kv in listed)
            await wait_until_async(
                lambda: sorted(watcher.known) == keys == [record.instance_id], deadline_s=DEADLINE_S
            )
        finally:
            await stop_and_withdraw(registration, watcher)

    asyncio.run(scenario())
    assert len(warnings(caplog, "Discovery degraded: lost etcd")) == 1
    assert len(warnings(caplog, "Discovery: lost etcd")) == 1
    assert "Discovery recovered: etcd at" in caplog.text
    # Our code logs no traceback. (grpc's asyncio poller may still report, through the asyncio
    # logger, a callback aimed at the loop of an earlier asyncio.run() in this test process:
    # that loop is closed; a launcher runs one loop for its life, so only tests see it.)
    ours = [r for r in caplog.records if r.name.startswith("dynamo")]
    assert not [r for r in ours if r.exc_info or "Traceback" in r.getMessage()]


def test_start_up_with_etcd_down_waits_and_connects_when_it_comes(etcd_server, caplog):
    caplog.set_level(logging.INFO)
    etcd_server.stop()
    backend = discovery(etcd_server)
    seen = Seen()

    async def scenario():
        watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        watcher.start()
        registration = replace(backend, ttl_s=2.0).registration()
        connecting = asyncio.ensure_future(registration.connect())
        try:
            # Both must have met the outage before etcd starts: the first WARNING alone (either
            # one's) left the other free, on a loaded machine, to make its first attempt only
            # once etcd was up, and never warn.
            await wait_until_async(
                lambda: len(warnings(caplog, "cannot reach etcd")) == 2,
                what="the watcher's and the registration's WARNING",
                deadline_s=DEADLINE_S,
            )
            assert watcher.state == "connecting" and not connecting.done()
            etcd_server.start()
            await asyncio.wait_for(connecting, DEADLINE_S)
            await wait_until_async(lambda: watcher.state == "ok", deadline_s=DEADLINE_S)
        finally:
            connecting.cancel()
            await watcher.stop()
            await registration.close()

    asyncio.run(scenario())
    assert len(warnings(caplog, "cannot reach etcd")) == 2  # one each: watcher, registration
    assert "Discovery: connected to etcd at" in caplog.text


def test_compaction_while_watching_relists_and_misses_nothing(etcd_server, caplog):
    """The watcher falls behind a compaction (its first list's callbacks are slow): it lists
    again and ends with exactly what etcd holds."""
    caplog.set_level(logging.INFO)
    backend = discovery(etcd_server)
    prefix = backend.prefix.encode()
    first = [ModelRecord(model=f"m{i}", endpoint=f"http://w:{i + 1}") for i in range(3)]
    later = [ModelRecord(model=f"n{i}", endpoint=f"http://v:{i + 1}") for i in range(3)]
    release = asyncio.Event()
    seen = Seen()

    async def slow_add(record: ModelRecord) -> None:
        seen.on_add(record)
        await release.wait()

    async def scenario():
        async with client(etcd_server) as c:
            for record in first:
                await c.put(prefix + record.instance_id.encode(), record.to_json().encode())
            watcher = backend.watcher(on_add=slow_add, on_remove=seen.on_remove)
            watcher.start()
            try:
                await wait_until_async(
                    lambda: seen.added,
                    what="the first list to reach a callback",
                    deadline_s=DEADLINE_S,
                )
                # Meanwhile: one record goes, three come, and the history is compacted away.
                await c.delete(prefix + first[0].instance_id.encode())
                for record in later:
                    await c.put(prefix + record.instance_id.encode(), record.to_json().encode())
                status = await c.get_prefix(prefix)
                await c.compact(status.header.revision, physical=True)
                release.set()
                expected = {r.instance_id for r in first[1:] + later}
                await wait_until_async(
                    lambda: set(watcher.known) == expected,
                    what="the re-listed view",
                    deadline_s=DEADLINE_S,
                )
                # And it keeps watching after the re-list.
                extra = ModelRecord(model="x", endpoint="http://x:1")
                await c.put(prefix + extra.instance_id.encode(), extra.to_json().encode())
                await wait_until_async(
                    lambda: extra.instance_id in watcher.known, deadline_s=DEADLINE_S
                )
            finally:
                release.set()
                await watcher.stop()

    asyncio.run(scenario())
    assert "compacted past our revision" in caplog.text
    assert [r.instance_id for r in seen.removed] == [first[0].instance_id]


def test_a_thousand_records_are_all_seen(etcd_server, record_property):
    backend = discovery(etcd_server)
    prefix = backend.prefix.encode()
    records = [
        ModelRecord(model=f"model-{i % 10}", endpoint=f"http://w:{i + 1}") for i in range(1000)
    ]
    seen = Seen()

    async def scenario():
        async with client(etcd_server) as c:
            for start in range(0, len(records), 100):
                await asyncio.gather(
                    *(
                        c.put(prefix + r.instance_id.encode(), r.to_json().encode())
                        for r in records[start : start + 100]
                    )
                )
            watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
            began = time.monotonic()
            watcher.start()
            try:
                await wait_until_async(lambda: len(watcher.known) == len(records), deadline_s=60)
                listed_s = time.monotonic() - began
                # And 1,000 more changes through the watch: every record deleted.
                began = time.monotonic()
                await c.delete_prefix(prefix)
                await wait_until_async(lambda: not watcher.known, deadline_s=60)
                return listed_s, time.monotonic() - began
            finally:
                await watcher.stop()

    listed_s, deleted_s = asyncio.run(scenario())
    record_property("list_1000_records_s", round(listed_s, 3))
    record_property("watch_1000_deletes_s", round(deleted_s, 3))
    print(f"1,000 records: listed in {listed_s:.3f} s, their deletes watched in {deleted_s:.3f} s")
    assert len({r.instance_id for r in seen.added}) == 1000 and len(seen.removed) == 1000


def test_a_user_and_password_from_the_environment_authenticate_and_are_never_logged(
    etcd_server, caplog
):
    """etcd with authentication on: the credentials from ETCD_AUTH_USERNAME / _PASSWORD work,
    no credentials are refused (and said so, without a traceback), the password is never logged."""
    caplog.set_level(logging.DEBUG)
    password = "pw-4f1c9e"

    async def enable_auth():
        async with client(etcd_server) as c:
            auth = aetcd.rpc.AuthStub(c.channel)
            await auth.UserAdd(aetcd.rpc.AuthUserAddRequest(name="root", password=password))
            await auth.UserGrantRole(aetcd.rpc.AuthUserGrantRoleRequest(user="root", role="root"))
            await auth.AuthEnable(aetcd.rpc.AuthEnableRequest())

    asyncio.run(enable_auth())
    credentials = EtcdCredentials.from_env(
        {"ETCD_AUTH_USERNAME": "root", "ETCD_AUTH_PASSWORD": password}
    )
    authed = EtcdDiscovery(parse_endpoints(etcd_server.url), "auth", credentials)
    anonymous = discovery(etcd_server, "auth")
    seen = Seen()

    async def scenario():
        refused = anonymous.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        refused.start()
        registration = replace(authed, ttl_s=2.0).registration()
        await registration.connect()
        await registration.register(ModelRecord(model="m", endpoint="http://w:1"))
        watcher = authed.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        watcher.start()
        try:
            await wait_until_async(
                lambda: seen.added and "cannot reach etcd" in caplog.text, deadline_s=DEADLINE_S
            )
            assert refused.state == "connecting" and watcher.state == "ok"
        finally:
            await stop_and_withdraw(registration, refused, watcher)

    asyncio.run(scenario())
    assert len(seen.added) == 1
    assert password not in caplog.text + authed.describe()
    ours = [r for r in caplog.records if r.name.startswith("dynamo.")]
    assert not [r for r in ours if r.exc_info], "a traceback in our logs"


def test_a_page_of_oversized_values_shrinks_the_pages_instead_of_blinding_the_watcher(
    etcd_server, caplog, mocker
):
    """etcd takes values up to 1.5 MiB, over the record limit: LIST_PAGE of them exceeded the
    gRPC message limit, and every list failed (RESOURCE_EXHAUSTED) for as long as they stayed,
    so the frontend never became ready. Here the message limit is lowered to keep the test
    light; the failure is the same."""
    from dynamo.runtime.discovery import etcd_client

    caplog.set_level(logging.INFO)
    mocker.patch.dict(etcd_client.CHANNEL_OPTIONS, {"grpc.max_receive_message_length": 4 << 20})
    backend = discovery(etcd_server)
    prefix = backend.prefix.encode()
    good = ModelRecord(model="good", endpoint="http://w:1")
    seen = Seen()

    async def scenario():
        async with client(etcd_server) as c:
            for i in range(10):
                await c.put(prefix + b"junk-%d" % i, b" " * (MAX_RECORD_BYTES + 100 * 1024))
            await c.put(prefix + good.instance_id.encode(), good.to_json().encode())
            watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
            watcher.start()
            try:
                await wait_until_async(
                    lambda: watcher.state == "ok",
                    what="a list that succeeds",
                    deadline_s=DEADLINE_S,
                )
                await wait_until_async(
                    lambda: seen.added, what="the good record", deadline_s=DEADLINE_S
                )
            finally:
                await watcher.stop()
                await c.delete_prefix(prefix)

    asyncio.run(scenario())
    assert [r.model for r in seen.added] == ["good"]
    assert len(warnings(caplog, "Ignoring malformed discovery record")) == 10
    assert not warnings(caplog, "cannot reach etcd")


def test_the_lease_quoted_in_the_logs_is_the_one_etcd_granted(etcd_server):
    """etcd raises a 1 s lease to its minimum (2 s with default election timeouts): the worker
    logged "etcd lease 1 s" while its record outlived a SIGKILL by 2 s."""
    backend = discovery(etcd_server)

    async def scenario():
        registration = replace(backend, ttl_s=1.0).registration()
        try:
            await registration.register(ModelRecord(model="m", endpoint="http://w:1"))
            async with client(etcd_server) as c:
                granted = (await c.get_lease_info(registration.lease_id)).grantedTTL
            return granted, registration.describe_lease()
        finally:
            await registration.unregister()
            await registration.close()

    granted, described = asyncio.run(scenario())
    assert granted >= 1 and described.startswith(f"etcd lease {granted} s,"), described


class _EndedWatch:
    """A watch stream that ends at once without an error (what a proxy closing streams does)."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        raise StopAsyncIteration

    async def cancel(self) -> None:
        pass


def test_a_watch_that_keeps_ending_quietly_is_backed_off_not_a_busy_loop(
    etcd_server, caplog, mocker
):
    caplog.set_level(logging.DEBUG, logger="dynamo.runtime.discovery")
    backend = discovery(etcd_server)
    seen = Seen()

    async def ended_watch(self, *args, **kwargs):
        return _EndedWatch()

    async def scenario():
        mocker.patch.object(aetcd.Client, "watch_prefix", ended_watch)
        watcher = backend.watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        watcher.start()
        try:
            await wait_until_async(
                lambda: watcher.lists >= 4, what="four lists", deadline_s=DEADLINE_S
            )
            assert watcher.state == "ok"  # the lists work: nothing is degraded
        finally:
            await watcher.stop()

    asyncio.run(scenario())
    ends = [r for r in caplog.records if "ended before any event" in r.getMessage()]
    delays = [float(r.getMessage().rsplit(" in ", 1)[1].split()[0]) for r in ends[:3]]
    assert delays == [0.25, 0.5, 1.0]  # doubling, as every etcd retry here
    assert [r.levelno for r in ends[:3]] == [logging.INFO, logging.DEBUG, logging.DEBUG]


def test_a_watch_cancel_that_never_answers_does_not_hang_the_stop(etcd_server, mocker):
    """aetcd's cancel waits on its lock and a bounded queue with no deadline of its own: the
    watcher's stop (the frontend's shutdown) must end anyway."""
    real_watch_prefix = aetcd.Client.watch_prefix
    seen = Seen()
    watches = []

    async def watch_whose_cancel_hangs(self, *args, **kwargs):
        watch = await real_watch_prefix(self, *args, **kwargs)

        async def never_answers() -> None:
            await asyncio.Event().wait()

        watch.cancel = never_answers
        watches.append(watch)
        return watch

    async def scenario():
        mocker.patch.object(aetcd.Client, "watch_prefix", watch_whose_cancel_hangs)
        watcher = discovery(etcd_server).watcher(on_add=seen.on_add, on_remove=seen.on_remove)
        watcher.start()
        await wait_until_async(
            lambda: watches, what="the watch", deadline_s=DEADLINE_S
        )  # the watcher is in it now
        # Unbounded, this never returns: the test's own bound turns that into a failure.
        await asyncio.wait_for(watcher.stop(), timeout=30)

    asyncio.run(scenario())


def test_a_keep_alive_that_outlives_its_unregister_never_puts_the_record_back(etcd_server):
    """unregister() waits for the keep-alive task within a bound; should the task outlive it,
    its next round finds the record revoked and must not register it again."""
    backend = discovery(etcd_server)
    prefix = backend.prefix.encode()

    async def scenario():
        registration = replace(backend, ttl_s=2.0).registration()
        await registration.connect()
        await registration.register(ModelRecord(model="m", endpoint="http://w:1"))
        keep_alive = registration._task
        async with client(etcd_server) as c:
            try:
                # What unregister() leaves when its bounded wait ends first: the task running,
                # no longer the registration's, the lease revoked.
                registration._task = None
                await c.revoke_lease(registration.lease_id)
                registration.lease_id = None
                # Three rounds of the keep-alive, each of which would re-register.
                await asyncio.sleep(3 * registration.keepalive_interval_s)  # the rounds' pace
                return keep_alive.done(), len((await c.get_prefix(prefix)).kvs)
            finally:
                keep_alive.cancel()
                await registration.close()

    ended, records = asyncio.run(scenario())
    assert ended and records == 0
