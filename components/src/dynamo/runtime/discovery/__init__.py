"""Model discovery: workers publish records, the frontend watches them (see interface.py)."""

from dynamo.runtime.discovery.interface import (
    STATE_CONNECTING,
    STATE_DEGRADED,
    STATE_OK,
    Discovery,
    DiscoveryDirError,
    DiscoverySettings,
    DiscoverySetupError,
    MaintenanceLock,
    RecordCallback,
    RecordWatcher,
    Registration,
)
from dynamo.runtime.discovery.opening import open_discovery
from dynamo.runtime.discovery.record import (
    DEFAULT_LEASE_TTL_S,
    MAX_RECORD_BYTES,
    STATE_WITHDRAWN,
    ModelRecord,
)

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "MAX_RECORD_BYTES",
    "STATE_CONNECTING",
    "STATE_DEGRADED",
    "STATE_OK",
    "STATE_WITHDRAWN",
    "Discovery",
    "DiscoveryDirError",
    "DiscoverySettings",
    "DiscoverySetupError",
    "MaintenanceLock",
    "ModelRecord",
    "RecordCallback",
    "RecordWatcher",
    "Registration",
    "open_discovery",
]
