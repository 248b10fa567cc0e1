"""etcd's GC maintenance lock: one key per model, created in a transaction under a lease.

``dynamo-gc/<namespace>/maintenance/<digest of the model name>``, its value the holder's
instance id. Taking it is one transaction: "if the key has never been created (create revision
0), put it with my lease", so of two workers exactly one gets it. The holder keeps the lease
alive every third of the TTL; releasing it revokes the lease, which deletes the key. A holder
that dies stops the keep-alives and etcd deletes the key after the TTL: no peer waits longer.

Every await on etcd is bounded (:data:`~dynamo.runtime.discovery.etcd_client.CALL_BOUND_S`,
the release :data:`~dynamo.runtime.discovery.etcd_client.REVOKE_TIMEOUT_S`); a store that
cannot be reached means "not taken" (the maintenance waits), never a hang.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

from dynamo.runtime.discovery.etcd_client import (
    CALL_BOUND_S,
    KEY_ROOT,
    REVOKE_TIMEOUT_S,
    EtcdConnection,
    describe_error,
    lease_ttl_for,
)

logger = logging.getLogger(__name__)


def lock_key(namespace: str, model: str) -> bytes:
    digest = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{KEY_ROOT}/{namespace}/maintenance/{digest}".encode()


class EtcdMaintenanceLock:
    """The lock of one model, taken by one instance (see the module docstring)."""

    def __init__(
        self, connection: EtcdConnection, namespace: str, model: str, instance_id: str, ttl_s: float
    ) -> None:
        self.connection = connection
        self.key = lock_key(namespace, model)
        self.instance_id = instance_id
        self.lease_ttl_s = lease_ttl_for(ttl_s)
        self.lease_id: int | None = None
        self._lost = False
        self._task: asyncio.Task | None = None

    async def acquire(self) -> bool:
        try:
            return await self._acquire()
        except Exception as exc:  # noqa: BLE001 - unreachable: not taken, tried again later
            logger.warning(
                "GC maintenance lock in etcd at %s cannot be taken: %s",
                self.connection.url,
                describe_error(exc),
            )
            await self.connection.reset()
            return False

    async def _acquire(self) -> bool:
        client = await self.connection.client()
        lease = await asyncio.wait_for(client.lease(self.lease_ttl_s), CALL_BOUND_S)
        txn = client.transactions
        taken, _ = await asyncio.wait_for(
            client.transaction(
                compare=[txn.create(self.key) == 0],
                success=[txn.put(self.key, self.instance_id.encode(), lease=lease.id)],
                failure=[],
            ),
            CALL_BOUND_S,
        )
        if not taken:
            await self._revoke(lease.id)
            return False
        self.lease_id = lease.id
        self._lost = False
        self._task = asyncio.get_running_loop().create_task(
            self._keep_alive(lease.id), name="gc-maintenance-lock"
        )
        return True

    async def _keep_alive(self, lease_id: int) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl_s / 3)
            try:
                client = await self.connection.client()
                reply = await asyncio.wait_for(client.refresh_lease(lease_id), CALL_BOUND_S)
                if reply is None or reply.TTL <= 0:
                    self._lost = True  # expired: etcd deleted the key, a peer may hold it now
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the lease may still hold: try again
                logger.debug("GC maintenance lock keep-alive failed: %s", describe_error(exc))

    async def held(self) -> bool:
        return self.lease_id is not None and not self._lost

    async def release(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        lease_id, self.lease_id = self.lease_id, None
        if lease_id is not None:
            await self._revoke(lease_id)

    async def _revoke(self, lease_id: int) -> None:
        async def revoke() -> None:
            client = await self.connection.client()
            await client.revoke_lease(lease_id)

        try:
            await asyncio.wait_for(revoke(), REVOKE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the lease expires by itself within its TTL
            logger.warning(
                "GC maintenance lock: cannot revoke lease %x at %s (%s); it expires within %d s",
                lease_id,
                self.connection.url,
                describe_error(exc),
                self.lease_ttl_s,
            )

    async def close(self) -> None:
        await self.release()
        await self.connection.close()
