"""Open the discovery store the settings name: the one place that reads the backend's name."""

from __future__ import annotations

from collections.abc import Mapping

from dynamo.runtime.discovery.file_backend import FileDiscovery
from dynamo.runtime.discovery.interface import Discovery, DiscoverySettings


def open_discovery(settings: DiscoverySettings, env: Mapping[str, str] | None = None) -> Discovery:
    """The store ``settings`` select. For etcd this imports the etcd client (gRPC and aetcd,
    ~19k objects): the launchers call it before their start-up freeze, so the freeze covers it.

    Raises :class:`~dynamo.runtime.discovery.DiscoverySetupError` for settings that cannot work
    (etcd credentials in the environment that aetcd cannot use); the launchers exit 2 on it.
    """
    if settings.backend == "etcd":
        from dynamo.runtime.discovery.etcd_backend import EtcdDiscovery

        return EtcdDiscovery.from_settings(settings, env)
    return FileDiscovery.from_settings(settings)
