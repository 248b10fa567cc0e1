"""Options that the frontend and the worker share (they must agree on them)."""

from __future__ import annotations

import getpass
import os
import tempfile

from dynamo.runtime.discovery import DEFAULT_LEASE_TTL_S, HEARTBEATS_PER_TTL

from .options import Option
from .values import FiniteFloat, Text


def default_discovery_dir() -> str:
    """Per user, so two users on one host never see each other's workers."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return os.path.join(runtime_dir, "dynamo", "discovery")
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = str(os.getuid())
    return os.path.join(tempfile.gettempdir(), f"dynamo-{user}", "discovery")


DISCOVERY_DIR = Option(
    name="discovery-dir",
    env_var="DYN_DISCOVERY_DIR",
    default=None,
    kind=Text("directory"),
    metavar="DIR",
    help=(
        "Directory where workers publish one JSON record per registered model and the frontend "
        "watches for them (unset: $XDG_RUNTIME_DIR/dynamo/discovery, else "
        "<tmpdir>/dynamo-<user>/discovery)"
    ),
)

DISCOVERY_TTL = Option(
    name="discovery-ttl",
    env_var="DYN_DISCOVERY_TTL",
    default=DEFAULT_LEASE_TTL_S,
    kind=FiniteFloat(minimum=1.0),
    metavar="SECONDS",
    help=(
        "Lease of a discovery record: a worker rewrites its record every 1/"
        f"{HEARTBEATS_PER_TTL} of this, and the frontend treats a record unchanged for longer "
        "as a dead worker and stops routing to it (give the frontend and its workers the same "
        "value)"
    ),
)
