"""Discovery on etcd: one key per record, held by the worker's lease, watched by the frontend.

Keys: ``dynamo-gc/<namespace>/models/<instance_id>``, the value the record's JSON. The worker
grants a lease of ``--discovery-ttl`` seconds (rounded up), puts its record with it at
``register_model`` and keeps it alive every third of the TTL (as etcd's own clients do); at the
start of the drain it revokes the lease, which deletes the key at once. A worker that dies
(SIGKILL included) stops the keep-alives and etcd deletes the key after the TTL: no code of
ours is involved, unlike the file backend's expiry by the watchers.

The frontend lists the prefix (in pages, at one revision) and watches from the next revision,
so no change between the list and the watch is lost. A compacted revision or a broken stream
makes it list again and reconcile (records gone are removed, new ones added), then watch again.

Outages: everything retries with back-off (0.25 s doubling to 5 s) and nothing exits. While
etcd is unreachable the worker keeps serving and the frontend keeps routing to the instances it
knew (a discovery outage is not a serving outage); each logs one WARNING per outage and one INFO
on recovery, never a traceback. A worker whose lease expired meanwhile grants a new one and puts
its record again.

The client is aetcd (asyncio, gRPC): every call is a coroutine on the event loop, nothing
blocks it, and there is no thread of ours. A user and password come from ``ETCD_AUTH_USERNAME``
/ ``ETCD_AUTH_PASSWORD`` (upstream Dynamo's names) and are never logged; aetcd opens plain-text
channels only, so upstream's TLS variables (``ETCD_AUTH_CA`` ...) are refused rather than
ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from dynamo.runtime.discovery.etcd_client import (
    KEY_ROOT,
    EtcdConnection,
    EtcdCredentials,
)
from dynamo.runtime.discovery.etcd_endpoints import EtcdEndpoint
from dynamo.runtime.discovery.etcd_lock import EtcdMaintenanceLock
from dynamo.runtime.discovery.etcd_registration import EtcdRegistration
from dynamo.runtime.discovery.etcd_watcher import EtcdWatcher
from dynamo.runtime.discovery.interface import (
    DiscoverySettings,
    RecordCallback,
)
from dynamo.runtime.discovery.record import DEFAULT_LEASE_TTL_S, DEFAULT_MAX_RECORDS

logger = logging.getLogger(__name__)


@dataclass
class EtcdDiscovery:
    endpoints: tuple[EtcdEndpoint, ...]
    namespace: str
    credentials: EtcdCredentials = field(default_factory=EtcdCredentials)
    ttl_s: float = DEFAULT_LEASE_TTL_S
    max_records: int = DEFAULT_MAX_RECORDS
    backend: str = "etcd"

    @classmethod
    def from_settings(
        cls, settings: DiscoverySettings, env: Mapping[str, str] | None = None
    ) -> EtcdDiscovery:
        """Raises :class:`EtcdSettingsError` for credentials in ``env`` that cannot work."""
        credentials = EtcdCredentials.from_env(env)
        return cls(
            settings.etcd_endpoints,
            settings.namespace,
            credentials,
            settings.ttl_s,
            settings.max_records,
        )

    @property
    def prefix(self) -> str:
        return f"{KEY_ROOT}/{self.namespace}/models/"

    def describe(self) -> str:
        urls = ",".join(e.url for e in self.endpoints)
        user = f" as user {self.credentials.username!r}" if self.credentials.username else ""
        return f"etcd {urls} prefix {self.prefix}{user}"

    def check(self, *, writer: bool) -> None:
        return None  # an unreachable etcd is retried while the process serves, not an error

    def readable_beyond_host(self) -> str | None:
        remote = [e.url for e in self.endpoints if not e.is_loopback]
        if not remote:
            return None
        return f"its etcd endpoint(s) {', '.join(remote)} are reachable from other hosts"

    def connection(self) -> EtcdConnection:
        return EtcdConnection(self.endpoints, self.credentials)

    def registration(self) -> EtcdRegistration:
        return EtcdRegistration(self.connection(), self.prefix, self.ttl_s)

    def maintenance_lock(self, model: str, instance_id: str) -> EtcdMaintenanceLock:
        return EtcdMaintenanceLock(
            self.connection(), self.namespace, model, instance_id, self.ttl_s
        )

    def watcher(
        self, *, on_add: RecordCallback, on_remove: RecordCallback, quiet: bool = False
    ) -> EtcdWatcher:
        return EtcdWatcher(
            self.connection(),
            self.prefix,
            on_add=on_add,
            on_remove=on_remove,
            max_records=self.max_records,
            quiet=quiet,
        )
