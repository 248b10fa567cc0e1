"""A discovery watcher on an injected clock, polled by hand (shared by the discovery tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynamo.runtime.discovery.file_watcher import DiscoveryWatcher

TTL_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


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
