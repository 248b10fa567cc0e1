"""The options both launchers have (discovery, GC, maintenance, drain, the debug endpoint), as
the base of each launcher's typed configuration (see :mod:`dynamo_gc.configuration.typed`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dynamo.runtime.discovery import DiscoverySettings
from dynamo.runtime.discovery.etcd_endpoints import EtcdEndpoint
from dynamo_gc.configuration.gc_options import (
    MAINTENANCE_OFF,
    GcSettings,
    MaintenanceSettings,
    gc_options,
    maintenance_options,
)
from dynamo_gc.configuration.options import Option

from .drain_options import drain_option
from .runtime_options import discovery_settings


def process_options(
    *, flag_prefix: str, env_prefix: str, maintenance_modes: tuple[str, ...]
) -> list[Option]:
    """What every launcher's process reads about its own life, under the launcher's naming: the
    GC options, the serving-time maintenance's (offering ``maintenance_modes``), then the drain
    deadline."""
    return [
        *gc_options(flag_prefix=flag_prefix, env_prefix=env_prefix),
        *maintenance_options(
            flag_prefix=flag_prefix, env_prefix=env_prefix, modes=maintenance_modes
        ),
        drain_option(flag_prefix=flag_prefix, env_prefix=env_prefix),
    ]


def maintenance_problem(config: LauncherConfig, options: Sequence[Option]) -> str | None:
    """Why the maintenance options cannot work together with the freeze's (exit 2), or None:
    a maintenance freezes again what the start-up freeze began, and with the freeze off there
    is no frozen heap to keep small, only stock CPython to keep."""
    if config.gc_maintenance == MAINTENANCE_OFF or config.freeze_gc_heap:
        return None
    by_dest = {option.dest: option for option in options}
    mode, freeze = by_dest["gc_maintenance"], by_dest["freeze_gc_heap"]
    return (
        f"{mode.source_label()} is {config.gc_maintenance!r}, which needs the start-up GC "
        f"freeze, and {freeze.source_label()} is off (--no-{freeze.name} or "
        f"{freeze.env_var}=0): set the maintenance to off, or the freeze on"
    )


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
    gc_maintenance: str
    gc_pause_budget_ms: float
    drain_timeout: float
    debug_gc_endpoint: bool

    @property
    def gc(self) -> GcSettings:
        return GcSettings(self.freeze_gc_heap, self.gc_pause_log_ms)

    @property
    def maintenance(self) -> MaintenanceSettings:
        return MaintenanceSettings(self.gc_maintenance, self.gc_pause_budget_ms)

    @property
    def discovery(self) -> DiscoverySettings:
        return discovery_settings(self)
