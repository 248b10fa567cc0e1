"""The frontend's side on etcd: list the namespace's prefix at one revision, then watch from the
next one; list again and reconcile after a compaction or a broken stream."""

from __future__ import annotations

import asyncio
import logging

import aetcd
import aetcd.exceptions
import aetcd.rpc
import grpc

from dynamo.runtime.discovery.etcd_client import (
    CALL_BOUND_S,
    DEGRADED_LINE,
    LIST_PAGE,
    QUIET_END_LINE,
    RPC_TIMEOUT_S,
    Backoff,
    EtcdConnection,
    describe_error,
)
from dynamo.runtime.discovery.interface import (
    STATE_CONNECTING,
    STATE_DEGRADED,
    STATE_OK,
    RecordCallback,
)
from dynamo.runtime.discovery.periodic import notify
from dynamo.runtime.discovery.record import DEFAULT_MAX_RECORDS, MAX_RECORD_BYTES, ModelRecord
from dynamo.runtime.log_budget import LogBudget
from dynamo.runtime.peer_text import escape

logger = logging.getLogger(__name__)

# Malformed records get one WARNING each (per key version), but no more than this many a minute.
MALFORMED_LINES_PER_MINUTE = 50


class EtcdWatcher:
    """Lists, then watches, the namespace's prefix; reports records added and removed.

    ``state`` is ``connecting`` until the first list succeeds (the frontend is not ready), then
    ``ok``, or ``degraded`` while etcd cannot be reached (``known`` keeps the last view).

    ``quiet``: a reader for a process that only needs to know the records (a worker watching
    its peers): every line it would log (malformed records, etcd's outages, lists and
    recoveries) is DEBUG. The frontends report the records, and the worker's own registration
    reports its outages; the same lines from each worker would only repeat them.
    """

    def __init__(
        self,
        connection: EtcdConnection,
        prefix: str,
        *,
        on_add: RecordCallback,
        on_remove: RecordCallback,
        max_records: int = DEFAULT_MAX_RECORDS,
        quiet: bool = False,
    ) -> None:
        self.connection = connection
        self._warn_level = logging.DEBUG if quiet else logging.WARNING
        self._info_level = logging.DEBUG if quiet else logging.INFO
        self.prefix = prefix.encode()
        self.on_add = on_add
        self.on_remove = on_remove
        self.known: dict[str, ModelRecord] = {}  # by instance id
        self._by_key: dict[bytes, ModelRecord] = {}
        self._rejected: dict[bytes, int] = {}  # key -> mod revision last warned about
        self.max_records = max_records
        # Peers trigger these lines (a key under the prefix is anyone's who can write it).
        level = self._warn_level
        self._malformed_lines = LogBudget(logger, level, lines=MALFORMED_LINES_PER_MINUTE)
        self._over_limit_lines = LogBudget(logger, level, lines=1)
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
                if key == self.prefix + record.instance_id.encode():
                    self._rejected.pop(key, None)
                    return record
                # A worker puts its record under its own instance id; a record under another
                # key (a copy, a forgery) would make two records for one instance.
                error = f"holds instance {record.instance_id}, whose key is another"
        if self._rejected.get(key) != mod_revision:
            self._rejected[key] = mod_revision
            self._malformed_lines.emit(
                "Ignoring malformed discovery record %s (revision %d): %s",
                escape(key, 300),
                mod_revision,
                escape(error),
            )
        return None

    async def _set(self, key: bytes, record: ModelRecord | None, mod_revision: int = 0) -> None:
        old = self._by_key.get(key)
        if old == record:
            return
        if old is not None and record is not None and record.serves_like(old):
            # Only the routing state moved (withdrawn for a GC maintenance, or back): an update.
            self._by_key[key] = record
            self.known[record.instance_id] = record
            await notify(self.on_add, record)
            return
        if old is not None:
            # Gone, or put again to serve otherwise: the old one goes, the new one comes.
            del self._by_key[key]
            del self.known[old.instance_id]
            await notify(self.on_remove, old)
        if record is None:
            return
        if len(self._by_key) >= self.max_records:
            self._over_limit_lines.emit(
                "Ignoring discovery record %s: the frontend already holds %d records, the limit "
                "of --discovery-max-records / DYN_DISCOVERY_MAX_RECORDS",
                escape(key, 300),
                self.max_records,
            )
            return
        # The key is the instance id (see _decode): one record per instance, whatever the order.
        self._by_key[key] = record
        self.known[record.instance_id] = record
        await notify(self.on_add, record)

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
            left_out = False
            for kv in response.kvs:
                if len(found) >= self.max_records:
                    left_out = True  # the first max_records keys, in key order, as all see
                    break
                found[kv.key] = (kv.value, kv.mod_revision)
            if left_out or (len(found) >= self.max_records and response.more):
                self._over_limit_lines.emit(
                    "Discovery prefix %s holds more than %d records, the limit of "
                    "--discovery-max-records / DYN_DISCOVERY_MAX_RECORDS: the last by key are "
                    "ignored",
                    escape(self.prefix),
                    self.max_records,
                )
                return found, revision
            if not response.more or not response.kvs:
                return found, revision
            start = response.kvs[-1].key + b"\0"

    async def _reconcile(self, listing: dict[bytes, tuple[bytes, int]]) -> None:
        for key in [k for k in self._by_key if k not in listing]:
            await self._set(key, None)
        for key in [k for k in self._rejected if k not in listing]:
            del self._rejected[key]
        for key, (value, mod_revision) in listing.items():
            await self._set(key, self._decode(key, value, mod_revision), mod_revision)

    async def _apply(self, event) -> None:
        key = event.kv.key
        if event.kind == aetcd.rtypes.EventKind.DELETE:
            self._rejected.pop(key, None)
            await self._set(key, None)
        else:
            revision = event.kv.mod_revision
            await self._set(key, self._decode(key, event.kv.value, revision), revision)

    def _went_down(self, exc: BaseException) -> None:
        """One WARNING per outage (and one while never connected), then quiet retries."""
        if self.state == STATE_OK:
            self.state = STATE_DEGRADED
            logger.log(
                self._warn_level,
                DEGRADED_LINE,
                self.connection.url,
                describe_error(exc),
                len(self.known),
            )
        elif self.state == STATE_CONNECTING and not self._connect_warned:
            self._connect_warned = True
            logger.log(
                self._warn_level,
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
                    logger.log(
                        self._info_level,
                        "Discovery recovered: etcd at %s reachable again; %d instance(s) listed",
                        self.connection.url,
                        len(self.known),
                    )
                elif self.lists == 1:
                    logger.log(
                        self._info_level,
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
                    logger.log(
                        self._info_level, "Discovery: etcd watch stream ended; listing again"
                    )
                    continue
                delay = quiet_ends.next()
                # The first of a run at INFO; the rest (ever further apart) at DEBUG.
                level = self._info_level if delay == quiet_ends.initial_s else logging.DEBUG
                logger.log(level, QUIET_END_LINE, delay)
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                raise
            except aetcd.exceptions.RevisionCompactedError as exc:
                # The revision after our list is gone (compaction): list again at the current
                # one and reconcile; nothing is missed, the list is the whole truth.
                logger.log(
                    self._info_level,
                    "Discovery: etcd compacted past our revision (%s); listing again",
                    exc,
                )
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
