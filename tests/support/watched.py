"""A discovery watcher on an injected clock, polled by hand, and the leased records it watches
(shared by the discovery tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.discovery.file_watcher import DiscoveryWatcher
from tests.support.clock import FakeClock

TTL_S = 10.0


class Watched:
    """A watcher on an injected clock, its adds and removes recorded, polled by hand."""

    def __init__(self, directory: Path, ttl_s: float = TTL_S, **kwargs) -> None:
        self.clock = FakeClock()
        self.added: list[str] = []
        self.removed: list[str] = []
        self.watcher = DiscoveryWatcher(
            directory,
            on_add=lambda r: self.added.append(r.instance_id),
            on_remove=lambda r: self.removed.append(r.instance_id),
            ttl_s=ttl_s,
            clock=self.clock,
            **kwargs,
        )

    def poll(self) -> None:
        asyncio.run(self.watcher.poll_once())

    def live(self) -> set[str]:
        return set(self.watcher.known)


def leased(instance_id: str = "i1", port: int = 40001, interval_s: float = 2.0) -> ModelRecord:
    """A record with a lease: heartbeat 0, renewed every ``interval_s`` by its worker."""
    return ModelRecord(
        model="m",
        endpoint=f"http://127.0.0.1:{port}",
        instance_id=instance_id,
        heartbeat=0,
        heartbeat_interval_s=interval_s,
    )


def registered_and_watched(
    directory: Path, *records: ModelRecord
) -> tuple[DiscoveryStore, Watched]:
    """``records`` registered in a store on ``directory``, and a watcher that has polled once."""
    store = DiscoveryStore(directory)
    for record in records:
        store.register(record)
    seen = Watched(directory)
    seen.poll()
    return store, seen
