"""The options both launchers have (discovery, GC, drain, the debug endpoint), as the base of
each launcher's typed configuration (see :mod:`dynamo_gc.configuration.typed`)."""

from __future__ import annotations

from dataclasses import dataclass

from dynamo.runtime.discovery import DiscoverySettings
from dynamo.runtime.discovery.etcd_endpoints import EtcdEndpoint
from dynamo_gc.configuration.gc_options import GcSettings, gc_options
from dynamo_gc.configuration.options import Option

from .drain_options import drain_option
from .runtime_options import discovery_settings


def process_options(*, flag_prefix: str, env_prefix: str) -> list[Option]:
    """What every launcher's process reads about its own life, under the launcher's naming: the
    GC options, then the drain deadline."""
    return [
        *gc_options(flag_prefix=flag_prefix, env_prefix=env_prefix),
        drain_option(flag_prefix=flag_prefix, env_prefix=env_prefix),
    ]


@dataclass(frozen=True)
class LauncherConfig:
    discovery_backend: str
    discovery_dir: str | None
    discovery_ttl: float
    etcd_endpoints: tuple[EtcdEndpoint, ...]
    namespace: str
    discovery_max_records: int
    freeze_gc_heap: bool
    gc_pause_log_ms: float
    drain_timeout: float
    debug_gc_endpoint: bool

    @property
    def gc(self) -> GcSettings:
        return GcSettings(self.freeze_gc_heap, self.gc_pause_log_ms)

    @property
    def discovery(self) -> DiscoverySettings:
        return discovery_settings(self)
