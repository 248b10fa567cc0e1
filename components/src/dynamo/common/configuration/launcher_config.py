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
from dynamo_gc.configuration.gc_options import maintenance_problem as gc_maintenance_problem
from dynamo_gc.configuration.options import Option

from .drain_options import drain_option
from .prerequisites import Requires
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


def budget_requirement(options: Sequence[Option], maintenance_modes: tuple[str, ...]) -> Requires:
    """The pause budget among ``options`` (a launcher's :func:`process_options`) acts only with a
    maintenance mode other than off (named from ``maintenance_modes``, the launcher's offer)."""
    by_dest = {option.dest: option for option in options}
    modes_on = " or ".join(mode for mode in maintenance_modes if mode != MAINTENANCE_OFF)
    return Requires(
        by_dest["gc_pause_budget_ms"],
        f"{by_dest['gc_maintenance'].source_label()} {modes_on}",
        lambda c: c.gc_maintenance != MAINTENANCE_OFF,
    )


def maintenance_problem(config: LauncherConfig, options: Sequence[Option]) -> str | None:
    """Why the maintenance options cannot work together with the freeze's (exit 2), or None
    (the layer's rule, :func:`dynamo_gc.configuration.gc_options.maintenance_problem`, which
    the upstream adapters apply too)."""
    by_dest = {option.dest: option for option in options}
    return gc_maintenance_problem(
        config.gc_maintenance,
        config.freeze_gc_heap,
        mode_option=by_dest["gc_maintenance"],
        freeze_option=by_dest["freeze_gc_heap"],
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
