"""The worker's side on etcd: its record under a lease it keeps alive, revoked at the drain."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from dynamo.runtime.discovery.etcd_client import (
    BACKOFF_INITIAL_S,
    CALL_BOUND_S,
    REREGISTERED_LINE,
    REVOKE_TIMEOUT_S,
    WORKER_LOST_LINE,
    Backoff,
    EtcdConnection,
    describe_error,
    lease_ttl_for,
)
from dynamo.runtime.discovery.record import ModelRecord

logger = logging.getLogger(__name__)


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
        self._unwritten = False  # a state change the store has not taken yet

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

    async def _put_with_new_lease(self) -> ModelRecord:
        """Put the registered record under a new lease; returns it."""
        record = self.record
        assert record is not None, "register() sets the record before any put"
        client = await self.connection.client()
        lease = await asyncio.wait_for(client.lease(self.lease_ttl_s), CALL_BOUND_S)
        try:
            value = record.to_json().encode()
            await asyncio.wait_for(
                client.put(self.key(record), value, lease=lease.id), CALL_BOUND_S
            )
        except BaseException:
            self.lease_id = None
            raise
        self.lease_id = lease.id
        self._unwritten = self.record is not record
        # etcd raises a TTL under its minimum (1.5 election timeouts: 2 s by default) without
        # saying so but in its answer: the lines that quote the TTL say what etcd granted. The
        # keep-alives stay paced on the TTL asked for, which is the shorter.
        self.lease_ttl_s = max(self.lease_ttl_s, int(lease.ttl))
        return record

    async def register(self, record: ModelRecord) -> ModelRecord:
        self.record = record
        await self._until_done("register in etcd", self._put_with_new_lease)
        self._task = asyncio.get_running_loop().create_task(
            self._keep_alive(), name="discovery-lease"
        )
        return record

    async def set_state(self, state: str | None) -> None:
        """Put the record with this routing state, under the lease it has; on a failure the
        keep-alive puts it at its next tick."""
        assert self.record is not None, "register() runs first"
        self.record = dataclasses.replace(self.record, state=state)
        self._unwritten = True
        if self.lease_id is None:
            return  # the lease is lost: the keep-alive puts the record (as it is now) again
        await self._put_record()

    async def _put_record(self) -> None:
        record = self.record
        assert record is not None and self.lease_id is not None
        client = await self.connection.client()
        await asyncio.wait_for(
            client.put(self.key(record), record.to_json().encode(), lease=self.lease_id),
            CALL_BOUND_S,
        )
        self._unwritten = self.record is not record  # changed again meanwhile

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
                    if self._unwritten:
                        await self._put_record()
                    if lost:
                        logger.info(
                            "Discovery: etcd at %s reachable again; lease %x still held",
                            self.connection.url,
                            self.lease_id,
                        )
                else:
                    record = await self._put_with_new_lease()
                    logger.info(
                        REREGISTERED_LINE, self.connection.url, self.lease_id, record.instance_id
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
