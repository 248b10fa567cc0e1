"""What the launchers know of discovery: one interface, whichever store is behind it.

The worker gets a :class:`Registration` (``connect`` at start-up, ``register`` at
``register_model``, ``unregister`` at the start of the drain); the frontend gets a
:class:`RecordWatcher` (``on_add`` / ``on_remove`` callbacks, a ``state`` for ``/health`` and
the ``dynamo_discovery_degraded`` metric). Both come from a :class:`Discovery`, which
:func:`dynamo.runtime.discovery.open_discovery` opens from the :class:`DiscoverySettings`; that
is the one place that reads which store is configured. Everything a launcher needs to know about
the store (where it is, whether it can be used, who else can read its records) it asks the
Discovery object, never the backend's name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from dynamo.runtime.discovery.etcd_endpoints import EtcdEndpoint
from dynamo.runtime.discovery.record import DEFAULT_MAX_RECORDS, ModelRecord

# What a watcher reports: not connected yet (not ready), up to date, or cut off from the store
# (it keeps routing to what it knew).
STATE_CONNECTING = "connecting"
STATE_OK = "ok"
STATE_DEGRADED = "degraded"

RecordCallback = Callable[[ModelRecord], Awaitable[None] | None]


@dataclass(frozen=True)
class DiscoverySettings:
    """The discovery options of either launcher, as parsed (defaults applied)."""

    backend: str  # "file" or "etcd"
    directory: str  # the file store's directory
    ttl_s: float  # the lease of a record
    etcd_endpoints: tuple[EtcdEndpoint, ...]
    namespace: str  # the etcd key prefix's deployment segment
    max_records: int = DEFAULT_MAX_RECORDS  # records a watcher holds at most
    # Whether `directory` is the per-user default (no --discovery-dir): it must then be this
    # user's own, since nobody chose it (see file_store.check_private_directory).
    directory_is_default: bool = False


class DiscoverySetupError(ValueError):
    """Settings that cannot work, found before anything starts (the launchers exit 2)."""


class DiscoveryDirError(DiscoverySetupError):
    """The discovery directory cannot be used: not a directory, not creatable, not listable
    (nor writable, for a worker). The message names the path and the reason; the launcher adds
    the option that chose the directory."""


class Registration(Protocol):
    """The worker's side: its one record, kept alive while it serves."""

    async def connect(self) -> None:
        """Start-up: return once the store answers (retrying, with back-off, until then)."""

    async def register(self, record: ModelRecord) -> ModelRecord:
        """Publish ``record`` and keep it alive; returns what was published."""

    async def unregister(self) -> None:
        """Stop keeping the record alive and remove it (the frontend stops routing at once)."""

    async def set_state(self, state: str | None) -> None:
        """Publish the registered record with this routing state (``withdrawn``, or None: takes
        requests). Raises when the store cannot be written now; the record is then written with
        the state at the lease's next renewal."""

    async def close(self) -> None:
        """Release the connection; idempotent."""

    def describe_lease(self) -> str:
        """How the record is kept alive, for the "Model registered" line."""


class RecordWatcher(Protocol):
    """The frontend's side: reports records appearing and disappearing.

    ``on_add`` also reports a known record whose routing state changed (withdrawn for a GC
    maintenance, or back): the record as it now is, under the same instance id, without an
    ``on_remove`` before it.
    """

    known: dict[str, ModelRecord]

    @property
    def state(self) -> str:
        """``connecting``, ``ok`` or ``degraded`` (see the STATE_* constants)."""

    def start(self) -> object: ...

    async def stop(self) -> None: ...


class MaintenanceLock(Protocol):
    """One model's GC maintenance lock in the store: at most one instance of the model holds
    it, under a lease (a holder that dies frees it within the TTL)."""

    async def acquire(self) -> bool:
        """Take the lock; False when another instance holds it (or the store cannot say)."""

    async def held(self) -> bool:
        """Whether this instance still holds it (it took it and nobody broke it since)."""

    async def release(self) -> None:
        """Give it back (bounded; a store that cannot be reached lets its lease expire)."""

    async def close(self) -> None:
        """Release it if held, and the connection it used; idempotent."""


class Discovery(Protocol):
    """One opened store: what it is, whether it can be used, and its two sides."""

    backend: str

    def describe(self) -> str:
        """Where records live, for log lines (never a credential)."""

    def check(self, *, writer: bool) -> None:
        """Start-up check, before anything runs: raises :class:`DiscoverySetupError` when this
        process could not use the store (file: the directory cannot be created, listed, or for
        a ``writer`` written in). A store that is only unreachable is not an error: it is
        retried while the process serves."""

    def readable_beyond_host(self) -> str | None:
        """Why processes on other hosts can read the records, or None when only this host can
        (a request plane advertised on loopback is then unreachable to the frontends that find
        it). May look at the file system: call it off the event loop."""

    def registration(self) -> Registration: ...

    def watcher(
        self, *, on_add: RecordCallback, on_remove: RecordCallback, quiet: bool = False
    ) -> RecordWatcher:
        """A watcher of every record. A frontend's (the default) reports what it sees wrong
        in the store and, on the file store, deletes long-expired records; a ``quiet`` one only
        reads (a worker's view of its peers): it deletes nothing and logs at DEBUG."""

    def maintenance_lock(self, model: str, instance_id: str) -> MaintenanceLock:
        """The lock ``instance_id`` takes before it withdraws from serving ``model``."""
