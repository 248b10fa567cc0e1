"""Discovery on etcd: one key per record, held by the worker's lease, watched by the frontend.

Keys: ``dynamo-gc/<namespace>/models/<instance_id>``, the value the record's JSON. The worker
grants a lease of ``--discovery-ttl`` seconds (rounded up), puts its record with it at
``register_model`` and keeps it alive every third of the TTL (as etcd's own clients do); at the
start of the drain it revokes the lease, which deletes the key at once. A worker that dies
(SIGKILL included) stops the keep-alives and etcd deletes the key after the TTL: no code of
ours is involved, unlike the file backend's expiry by the watchers.

The frontend lists the prefix (in pages, at one revision) and watches from the next revision,
so no change between the list and the watch is lost. A compacted revision or a broken stream
makes it list again and reconcile (records gone are removed, new ones added), then watch again.

Outages: everything retries with back-off (0.25 s doubling to 5 s) and nothing exits. While
etcd is unreachable the worker keeps serving and the frontend keeps routing to the instances it
knew (a discovery outage is not a serving outage); each logs one WARNING per outage and one INFO
on recovery, never a traceback. A worker whose lease expired meanwhile grants a new one and puts
its record again.

The client is aetcd (asyncio, gRPC): every call is a coroutine on the event loop, nothing
blocks it, and there is no thread of ours. A user and password come from ``ETCD_AUTH_USERNAME``
/ ``ETCD_AUTH_PASSWORD`` (upstream Dynamo's names) and are never logged; aetcd opens plain-text
channels only, so upstream's TLS variables (``ETCD_AUTH_CA`` ...) are refused rather than
ignored.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import aetcd
import aetcd.exceptions
import aetcd.rpc
import grpc

from dynamo.runtime.discovery.etcd_endpoints import EtcdEndpoint
from dynamo.runtime.discovery.interface import (
    STATE_CONNECTING,
    STATE_DEGRADED,
    STATE_OK,
    DiscoverySettings,
    DiscoverySetupError,
    RecordCallback,
)
from dynamo.runtime.discovery.record import DEFAULT_LEASE_TTL_S, MAX_RECORD_BYTES, ModelRecord

logger = logging.getLogger(__name__)

KEY_ROOT = "dynamo-gc"
USERNAME_ENV = "ETCD_AUTH_USERNAME"
PASSWORD_ENV = "ETCD_AUTH_PASSWORD"
TLS_ENVS = ("ETCD_AUTH_CA", "ETCD_AUTH_CLIENT_CERT", "ETCD_AUTH_CLIENT_KEY")
# One etcd call (not a watch stream) that takes longer than this counts as a failure.
RPC_TIMEOUT_S = 5.0
# How long the drain waits for the lease revocation before leaving the key to its TTL.
REVOKE_TIMEOUT_S = 2.0
# Every await on aetcd or gRPC is bounded on the asyncio side too, a little past gRPC's own
# deadline: a completion that never arrives (a call queued behind aetcd's watch lock or its
# bounded request queue, a gRPC event that reaches no loop) must fail like any other RPC, never
# hang the keep-alive, the watcher, a stop or a drain. Closing a client gets a shorter bound.
CALL_BOUND_S = RPC_TIMEOUT_S + 1.0
CLOSE_BOUND_S = 2.0
BACKOFF_INITIAL_S = 0.25
BACKOFF_MAX_S = 5.0
# Keys per range request when listing: a page of records at the size limit still fits in one
# gRPC message (below); ordinary records are ~1 KiB, so 1,000 of them take 20 round trips.
LIST_PAGE = 50
CHANNEL_OPTIONS = {
    # gRPC's own reconnect back-off grows to 120 s: a restarted etcd would stay unused for
    # minutes. Ours (above) is the one that paces retries.
    "grpc.initial_reconnect_backoff_ms": 250,
    "grpc.min_reconnect_backoff_ms": 250,
    "grpc.max_reconnect_backoff_ms": int(BACKOFF_MAX_S * 1000),
    # A watch on a half-open connection (a partition, a frozen peer) would wait forever without
    # pings; etcd accepts them down to 5 s apart.
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.max_receive_message_length": LIST_PAGE * MAX_RECORD_BYTES + (1 << 20),
}


# Log lines quoted by docs/operator-guide.md (kept whole so the guide's check finds them).
DEGRADED_LINE = "Discovery degraded: lost etcd at %s (%s); still routing to the %d instance(s) known, retrying with back-off"  # noqa: E501
WORKER_LOST_LINE = "Discovery: lost etcd at %s (%s); still serving, retrying with back-off (the record expires after %d s if this lasts, and is put back when etcd is reachable again)"  # noqa: E501
REREGISTERED_LINE = (
    "Discovery: lease expired; registered again in etcd at %s with lease %x (instance %s)"
)
QUIET_END_LINE = "Discovery: etcd watch stream ended before any event; listing again in %.2f s"
DUPLICATE_LINE = "Ignoring discovery record %s (revision %d): instance %s is already registered"


class EtcdSettingsError(DiscoverySetupError):
    """etcd settings in the environment that cannot work (exit 2 at start-up, naming them)."""


@dataclass(frozen=True)
class EtcdCredentials:
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a repr, never logged

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EtcdCredentials:
        env = os.environ if env is None else env
        tls = [name for name in TLS_ENVS if env.get(name)]
        if tls:
            raise EtcdSettingsError(
                f"{', '.join(tls)} set, but this project's etcd client (aetcd) does not speak "
                "TLS; unset them and reach etcd over a trusted network (or a TLS-terminating "
                "proxy next to each process)"
            )
        username, password = env.get(USERNAME_ENV) or None, env.get(PASSWORD_ENV) or None
        if (username is None) != (password is None):
            missing = PASSWORD_ENV if password is None else USERNAME_ENV
            raise EtcdSettingsError(
                f"{USERNAME_ENV} and {PASSWORD_ENV} go together: {missing} is not set"
            )
        return cls(username, password)


def lease_ttl_for(ttl_s: float) -> int:
    """etcd leases are whole seconds: the TTL rounded up (never shorter than asked)."""
    return max(1, math.ceil(ttl_s))


class Backoff:
    def __init__(self, initial_s: float = BACKOFF_INITIAL_S, max_s: float = BACKOFF_MAX_S):
        self.initial_s = initial_s
        self.max_s = max_s
        self._next = initial_s

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = self.initial_s


def describe_error(exc: BaseException) -> str:
    """One line, no traceback: what went wrong talking to etcd."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    cause = exc.__cause__
    if isinstance(cause, grpc.aio.AioRpcError):
        return f"{cause.code().name}: {cause.details()}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class EtcdConnection:
    """One aetcd client at a time, on the endpoints in turn: a failure moves to the next."""

    def __init__(self, endpoints: tuple[EtcdEndpoint, ...], credentials: EtcdCredentials):
        self.endpoints = endpoints
        self.credentials = credentials
        self._index = 0
        self._client: aetcd.Client | None = None

    @property
    def url(self) -> str:
        return self.endpoints[self._index].url

    async def client(self) -> aetcd.Client:
        if self._client is None:
            endpoint = self.endpoints[self._index]
            host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
            client = aetcd.Client(
                host=host,
                port=endpoint.port,
                username=self.credentials.username,
                password=self.credentials.password,
                timeout=RPC_TIMEOUT_S,
                options=CHANNEL_OPTIONS,
            )
            # Opens the channel; authenticates when a user is set.
            await asyncio.wait_for(client.connect(), CALL_BOUND_S)
            self._client = client
        return self._client

    async def reset(self) -> None:
        """Drop the client after a failure; the next one talks to the next endpoint."""
        client, self._client = self._client, None
        self._index = (self._index + 1) % len(self.endpoints)
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), CLOSE_BOUND_S)
            except Exception:  # noqa: BLE001 - a broken channel may fail to close; it is gone
                pass

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), CLOSE_BOUND_S)
            except Exception:  # noqa: BLE001
                pass


@dataclass
class EtcdDiscovery:
    endpoints: tuple[EtcdEndpoint, ...]
    namespace: str
    credentials: EtcdCredentials = field(default_factory=EtcdCredentials)
    ttl_s: float = DEFAULT_LEASE_TTL_S
    backend: str = "etcd"

    @classmethod
    def from_settings(
        cls, settings: DiscoverySettings, env: Mapping[str, str] | None = None
    ) -> EtcdDiscovery:
        """Raises :class:`EtcdSettingsError` for credentials in ``env`` that cannot work."""
        credentials = EtcdCredentials.from_env(env)
        return cls(settings.etcd_endpoints, settings.namespace, credentials, settings.ttl_s)

    @property
    def prefix(self) -> str:
        return f"{KEY_ROOT}/{self.namespace}/models/"

    def describe(self) -> str:
        urls = ",".join(e.url for e in self.endpoints)
        user = f" as user {self.credentials.username!r}" if self.credentials.username else ""
        return f"etcd {urls} prefix {self.prefix}{user}"

    def check(self, *, writer: bool) -> None:
        return None  # an unreachable etcd is retried while the process serves, not an error

    def readable_beyond_host(self) -> str | None:
        remote = [e.url for e in self.endpoints if not e.is_loopback]
        if not remote:
            return None
        return f"its etcd endpoint(s) {', '.join(remote)} are reachable from other hosts"

    def connection(self) -> EtcdConnection:
        return EtcdConnection(self.endpoints, self.credentials)

    def registration(self) -> EtcdRegistration:
        return EtcdRegistration(self.connection(), self.prefix, self.ttl_s)

    def watcher(self, *, on_add: RecordCallback, on_remove: RecordCallback) -> EtcdWatcher:
        return EtcdWatcher(self.connection(), self.prefix, on_add=on_add, on_remove=on_remove)


class EtcdRegistration:
    """The worker's record under a lease it keeps alive; revoked at the start of the drain."""

    def __init__(self, connection: EtcdConnection, prefix: str, ttl_s: float) -> None:
        self.connection = connection
        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_for(ttl_s)
        self.keepalive_interval_s = self.lease_ttl_s / 3
        self.record: ModelRecord | None = None
        self.lease_id: int | None = None
        self._task: asyncio.Task | None = None

    def key(self, record: ModelRecord) -> bytes:
        return (self.prefix + record.instance_id).encode()

    async def _until_done(self, what: str, attempt) -> None:
        """``await attempt()`` until it succeeds: one WARNING, then one INFO when it does."""
        backoff = Backoff()
        failed = False
        while True:
            try:
                await attempt()
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 - any failure is "not reachable yet"
                if not failed:
                    logger.warning(
                        "Discovery: cannot %s at %s (%s); not ready, retrying with back-off",
                        what,
                        self.connection.url,
                        describe_error(exc),
                    )
                failed = True
                await self.connection.reset()
                await asyncio.sleep(backoff.next())
                continue
            if failed:
                logger.info("Discovery: %s at %s succeeded", what, self.connection.url)
            return

    async def connect(self) -> None:
        async def probe() -> None:
            client = await self.connection.client()
            await asyncio.wait_for(client.get(self.prefix.encode()), CALL_BOUND_S)

        await self._until_done("reach etcd", probe)
        logger.info("Discovery: connected to etcd at %s", self.connection.url)

    async def _put_with_new_lease(self) -> None:
        assert self.record is not None
        client = await self.connection.client()
        lease = await asyncio.wait_for(client.lease(self.lease_ttl_s), CALL_BOUND_S)
        try:
            value = self.record.to_json().encode()
            await asyncio.wait_for(
                client.put(self.key(self.record), value, lease=lease.id), CALL_BOUND_S
            )
        except BaseException:
            self.lease_id = None
            raise
        self.lease_id = lease.id
        # etcd raises a TTL under its minimum (1.5 election timeouts: 2 s by default) without
        # saying so but in its answer: the lines that quote the TTL say what etcd granted. The
        # keep-alives stay paced on the TTL asked for, which is the shorter.
        self.lease_ttl_s = max(self.lease_ttl_s, int(lease.ttl))

    async def register(self, record: ModelRecord) -> ModelRecord:
        self.record = record
        await self._until_done("register in etcd", self._put_with_new_lease)
        self._task = asyncio.get_running_loop().create_task(
            self._keep_alive(), name="discovery-lease"
        )
        return record

    def describe_lease(self) -> str:
        return f"etcd lease {self.lease_ttl_s} s, kept alive every {self.keepalive_interval_s:g} s"

    async def _refresh(self) -> bool:
        """Keep the lease alive; False when it has expired (etcd forgot it and the key)."""
        client = await self.connection.client()
        reply = await asyncio.wait_for(client.refresh_lease(self.lease_id), CALL_BOUND_S)
        return reply is not None and reply.TTL > 0

    async def _keep_alive(self) -> None:
        backoff = Backoff(max_s=max(BACKOFF_INITIAL_S, self.keepalive_interval_s))
        lost = False
        delay = self.keepalive_interval_s
        while True:
            await asyncio.sleep(delay)
            if self._task is not asyncio.current_task():
                # Unregistered meanwhile (its wait for this task is bounded): a record revoked
                # for the drain is never put back.
                return
            try:
                if self.lease_id is not None and await self._refresh():
                    if lost:
                        logger.info(
                            "Discovery: etcd at %s reachable again; lease %x still held",
                            self.connection.url,
                            self.lease_id,
                        )
                else:
                    await self._put_with_new_lease()
                    logger.info(
                        REREGISTERED_LINE,
                        self.connection.url,
                        self.lease_id,
                        self.record.instance_id,
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the worker keeps serving whatever etcd does
                if not lost:
                    logger.warning(
                        WORKER_LOST_LINE,
                        self.connection.url,
                        describe_error(exc),
                        self.lease_ttl_s,
                    )
                lost = True
                await self.connection.reset()
                delay = backoff.next()
                continue
            lost = False
            backoff.reset()
            delay = self.keepalive_interval_s

    async def unregister(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=CALL_BOUND_S)  # the drain goes on regardless
        if self.lease_id is None:
            return

        async def revoke() -> None:
            client = await self.connection.client()
            # Revoking deletes the key with it: the frontend's watch sees the DELETE at once.
            await client.revoke_lease(self.lease_id)

        try:
            # One bound for both: after an outage the client is rebuilt here, and with a user
            # set that authenticates first (up to RPC_TIMEOUT_S), which the drain cannot wait.
            await asyncio.wait_for(revoke(), REVOKE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the drain goes on; the TTL removes the key
            logger.warning(
                "Discovery: cannot revoke lease %x at %s (%s); the record expires within %d s",
                self.lease_id,
                self.connection.url,
                describe_error(exc),
                self.lease_ttl_s,
            )
        self.lease_id = None

    async def close(self) -> None:
        await self.connection.close()


class EtcdWatcher:
    """Lists, then watches, the namespace's prefix; reports records added and removed.

    ``state`` is ``connecting`` until the first list succeeds (the frontend is not ready), then
    ``ok``, or ``degraded`` while etcd cannot be reached (``known`` keeps the last view).
    """

    def __init__(
        self,
        connection: EtcdConnection,
        prefix: str,
        *,
        on_add: RecordCallback,
        on_remove: RecordCallback,
    ) -> None:
        self.connection = connection
        self.prefix = prefix.encode()
        self.on_add = on_add
        self.on_remove = on_remove
        self.known: dict[str, ModelRecord] = {}  # by instance id
        self._by_key: dict[bytes, ModelRecord] = {}
        self._rejected: dict[bytes, int] = {}  # key -> mod revision last warned about
        # Keys holding an instance already known under another key -> the revision warned about.
        self._duplicates: dict[bytes, int] = {}
        self.state = STATE_CONNECTING
        self.lists = 0  # full lists done (the first, and one per re-list)
        self._connect_warned = False
        self._task: asyncio.Task | None = None

    # --- records --------------------------------------------------------------------------

    def _decode(self, key: bytes, value: bytes, mod_revision: int) -> ModelRecord | None:
        """The record a value holds; None (one WARNING per key version) when it holds none."""
        if len(value) > MAX_RECORD_BYTES:
            error = f"{len(value)} bytes, over the {MAX_RECORD_BYTES}-byte record limit"
        else:
            try:
                record = ModelRecord.from_json(value.decode("utf-8"))
            except Exception as exc:  # noqa: BLE001 - any content (deep nesting too) is data
                error = str(exc) or type(exc).__name__
            else:
                self._rejected.pop(key, None)
                return record
        if self._rejected.get(key) != mod_revision:
            self._rejected[key] = mod_revision
            logger.warning(
                "Ignoring malformed discovery record %s (revision %d): %s",
                key.decode(errors="replace"),
                mod_revision,
                error,
            )
        return None

    async def _set(self, key: bytes, record: ModelRecord | None, mod_revision: int = 0) -> None:
        old = self._by_key.get(key)
        if old == record:
            return
        if old is not None:
            del self._by_key[key]
            if self.known.get(old.instance_id) is old:
                del self.known[old.instance_id]
                await self._call(self.on_remove, old)
        if record is not None:
            if record.instance_id in self.known:  # the same instance under a second key
                # One WARNING per version of the key, not one per re-list.
                if self._duplicates.get(key) != mod_revision:
                    self._duplicates[key] = mod_revision
                    logger.warning(
                        DUPLICATE_LINE,
                        key.decode(errors="replace"),
                        mod_revision,
                        record.instance_id,
                    )
                return
            self._duplicates.pop(key, None)
            self._by_key[key] = record
            self.known[record.instance_id] = record
            await self._call(self.on_add, record)

    async def _call(self, callback: RecordCallback, record: ModelRecord) -> None:
        try:
            result = callback(record)
            if asyncio.iscoroutine(result):
                await result
        except Exception:  # one bad model must not blind the frontend
            logger.exception("Discovery callback failed for %s (%s)", record.model, record.endpoint)

    # --- etcd -----------------------------------------------------------------------------

    async def _list(self, client: aetcd.Client) -> tuple[dict[bytes, tuple[bytes, int]], int]:
        """Every key under the prefix at one revision, in pages; and that revision."""
        end = aetcd.utils.prefix_range_end(self.prefix)
        start, revision, limit = self.prefix, 0, LIST_PAGE
        found: dict[bytes, tuple[bytes, int]] = {}
        while True:
            request = aetcd.rpc.RangeRequest(
                key=start, range_end=end, limit=limit, revision=revision
            )
            try:
                response = await asyncio.wait_for(
                    client.kvstub.Range(request, timeout=RPC_TIMEOUT_S, metadata=client.metadata),
                    CALL_BOUND_S,
                )
            except grpc.aio.AioRpcError as exc:
                # A page over the message limit: etcd takes values up to its --max-request-bytes
                # (1.5 MiB by default), over our record limit, and a page of such values would
                # fail every list, leaving the frontend blind (never ready, or degraded) for as
                # long as they stay. Smaller pages, down to one key; oversized records are then
                # skipped one by one, each with its WARNING.
                if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                    limit //= 2
                    continue
                raise
            if revision == 0:
                revision = response.header.revision  # later pages read the same snapshot
            for kv in response.kvs:
                found[kv.key] = (kv.value, kv.mod_revision)
            if not response.more or not response.kvs:
                return found, revision
            start = response.kvs[-1].key + b"\0"

    async def _reconcile(self, listing: dict[bytes, tuple[bytes, int]]) -> None:
        for key in [k for k in self._by_key if k not in listing]:
            await self._set(key, None)
        for forgotten in (self._rejected, self._duplicates):
            for key in [k for k in forgotten if k not in listing]:
                del forgotten[key]
        for key, (value, mod_revision) in listing.items():
            await self._set(key, self._decode(key, value, mod_revision), mod_revision)

    async def _apply(self, event) -> None:
        key = event.kv.key
        if event.kind == aetcd.rtypes.EventKind.DELETE:
            self._rejected.pop(key, None)
            self._duplicates.pop(key, None)
            await self._set(key, None)
        else:
            revision = event.kv.mod_revision
            await self._set(key, self._decode(key, event.kv.value, revision), revision)

    def _went_down(self, exc: BaseException) -> None:
        """One WARNING per outage (and one while never connected), then quiet retries."""
        if self.state == STATE_OK:
            self.state = STATE_DEGRADED
            logger.warning(
                DEGRADED_LINE,
                self.connection.url,
                describe_error(exc),
                len(self.known),
            )
        elif self.state == STATE_CONNECTING and not self._connect_warned:
            self._connect_warned = True
            logger.warning(
                "Discovery: cannot reach etcd at %s (%s); not ready, retrying with back-off",
                self.connection.url,
                describe_error(exc),
            )

    async def run(self) -> None:
        backoff = Backoff()
        # Watches that end without an error and without an event (a proxy or load balancer
        # that closes streams, say): backed off, so they are not a busy loop of lists.
        quiet_ends = Backoff()
        while True:
            try:
                client = await self.connection.client()
                listing, revision = await self._list(client)
                self.lists += 1
                was = self.state
                self.state = STATE_OK
                await self._reconcile(listing)
                backoff.reset()
                if was == STATE_DEGRADED:
                    logger.info(
                        "Discovery recovered: etcd at %s reachable again; %d instance(s) listed",
                        self.connection.url,
                        len(self.known),
                    )
                elif self.lists == 1:
                    logger.info(
                        "Discovery: connected to etcd at %s; %d instance(s) listed",
                        self.connection.url,
                        len(self.known),
                    )
                watch = await asyncio.wait_for(
                    client.watch_prefix(self.prefix, start_revision=revision + 1), CALL_BOUND_S
                )
                events = 0
                try:
                    async for event in watch:
                        events += 1
                        await self._apply(event)
                finally:
                    try:
                        await asyncio.wait_for(watch.cancel(), CALL_BOUND_S)
                    except Exception:  # noqa: BLE001 - the stream may be gone already
                        pass
                if events:
                    quiet_ends.reset()
                    logger.info("Discovery: etcd watch stream ended; listing again")
                    continue
                delay = quiet_ends.next()
                # The first of a run at INFO; the rest (ever further apart) at DEBUG.
                (logger.info if delay == quiet_ends.initial_s else logger.debug)(
                    QUIET_END_LINE, delay
                )
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except aetcd.exceptions.RevisionCompactedError as exc:
                # The revision after our list is gone (compaction): list again at the current
                # one and reconcile; nothing is missed, the list is the whole truth.
                logger.info("Discovery: etcd compacted past our revision (%s); listing again", exc)
                continue
            except Exception as exc:  # noqa: BLE001 - an outage, never a crash
                self._went_down(exc)
                await self.connection.reset()
                await asyncio.sleep(backoff.next())

    def start(self) -> asyncio.Task:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="discovery-etcd")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=CALL_BOUND_S)  # shutdown goes on regardless
        await self.connection.close()
