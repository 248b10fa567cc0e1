"""A discovery watcher on an injected clock, polled by hand (shared by the discovery tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynamo.runtime.discovery.file_backend import DiscoveryWatcher
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
