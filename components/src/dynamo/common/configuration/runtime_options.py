"""Options that the frontend and the worker share (they must agree on them)."""

from __future__ import annotations

import re

from dynamo.runtime.discovery import DEFAULT_LEASE_TTL_S, MAX_RECORD_BYTES, DiscoverySettings
from dynamo.runtime.discovery.etcd_endpoints import (
    DEFAULT_ETCD_ENDPOINTS,
    EtcdEndpoint,
    parse_endpoints,
)
from dynamo.runtime.discovery.file_backend import HEARTBEATS_PER_TTL
from dynamo.runtime.discovery.file_store import default_discovery_dir
from dynamo.runtime.discovery.record import DEFAULT_MAX_RECORDS
from dynamo_gc.configuration.options import (
    Option,
    choice_option,
    count_option,
    seconds_option,
    text_option,
)
from dynamo_gc.configuration.values import Choice

from .prerequisites import Requires

DISCOVERY_DIR = text_option(
    "discovery-dir",
    "DYN_DISCOVERY_DIR",
    (
        "--discovery-backend file: directory where workers publish one JSON record per "
        "registered model and the frontend watches for them (unset: "
        "$XDG_RUNTIME_DIR/dynamo/discovery, else <tmpdir>/dynamo-<user>/discovery)"
    ),
    what="directory",
    metavar="DIR",
)

# An hour: a dead worker keeps its traffic for up to one TTL, so anything longer is a typo. (etcd
# refuses leases over 9e9 s, and aetcd cannot even encode one over 2**63: without a bound, such a
# TTL left the worker retrying a registration that could never succeed, not ready forever.)
MAX_DISCOVERY_TTL_S = 3600.0

DISCOVERY_TTL = seconds_option(
    "discovery-ttl",
    "DYN_DISCOVERY_TTL",
    DEFAULT_LEASE_TTL_S,
    (
        "Lease of a discovery record, in seconds. file: a worker rewrites its record every 1/"
        f"{HEARTBEATS_PER_TTL} of this, and the frontend treats a record unchanged for longer "
        "as a dead worker and stops routing to it (give the frontend and its workers the same "
        "value). etcd: the TTL of the worker's lease (rounded up to whole seconds), which etcd "
        "deletes with the record unless the worker keeps it alive"
    ),
    minimum=1.0,
    maximum=MAX_DISCOVERY_TTL_S,
)


class DiscoveryBackendKind(Choice):
    """``file`` or ``etcd``; upstream's other backends are refused by name, not as a typo."""

    def parse(self, text: str) -> str:
        word = text.strip()
        if word in UPSTREAM_ONLY_BACKENDS:
            raise ValueError(
                f"upstream Dynamo's {word!r} backend is not implemented here; choose file "
                "(one machine) or etcd (several)"
            )
        return super().parse(text)


UPSTREAM_ONLY_BACKENDS = ("kubernetes", "mem")


class EtcdEndpointsKind:
    def parse(self, text: str) -> tuple[EtcdEndpoint, ...]:
        return parse_endpoints(text)

    def describe(self) -> str:
        return "comma-separated URLs (`http://host:port`)"


class NamespaceKind:
    """A key-prefix segment: letters, digits, ``.``, ``_``, ``-`` (no ``/``, nothing empty)."""

    _pattern = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

    def parse(self, text: str) -> str:
        # ASCII blanks around the value are forgiven, as for every other option (a ConfigMap's
        # trailing newline); fullmatch, since "$" would also match before a final newline and
        # let "dyn\n" become a key prefix that no process without the newline ever reads.
        name = text.strip(" \t\r\n")
        if not (name.isascii() and self._pattern.fullmatch(name)):
            raise ValueError(
                "must be 1-63 ASCII letters, digits, '.', '_' or '-', starting with a letter or "
                "digit"
            )
        return name

    def describe(self) -> str:
        return "name (letters, digits, `.`, `_`, `-`)"


DISCOVERY_BACKEND = choice_option(
    "discovery-backend",
    "DYN_DISCOVERY_BACKEND",
    "file",
    (
        "Where workers publish their records and the frontend finds them: file (a directory "
        "shared by the processes of one machine, --discovery-dir) or etcd (a key per record "
        "with a lease of --discovery-ttl, for deployments beyond one machine, --etcd-endpoints)"
    ),
    kind=DiscoveryBackendKind(("file", "etcd")),
)

ETCD_ENDPOINTS = Option(
    name="etcd-endpoints",
    env_var="ETCD_ENDPOINTS",
    default=DEFAULT_ETCD_ENDPOINTS,
    kind=EtcdEndpointsKind(),
    metavar="URLS",
    help=(
        "etcd cluster for --discovery-backend etcd: comma-separated client URLs, tried in turn "
        "(plain-text gRPC; TLS is not supported). A user and password come from "
        "ETCD_AUTH_USERNAME / ETCD_AUTH_PASSWORD, never from a flag"
    ),
)

NAMESPACE = Option(
    name="namespace",
    env_var="DYN_NAMESPACE",
    default="dynamo",
    kind=NamespaceKind(),
    metavar="NAME",
    help=(
        "Deployment namespace: on etcd, records live under a key prefix of their own "
        "(dynamo-gc/<namespace>/models/), so deployments sharing one etcd never see each "
        "other's workers (give the frontend and its workers the same value)"
    ),
)

DISCOVERY_MAX_RECORDS = count_option(
    "discovery-max-records",
    "DYN_DISCOVERY_MAX_RECORDS",
    DEFAULT_MAX_RECORDS,
    (
        "Most discovery records the frontend holds (each at most "
        f"{MAX_RECORD_BYTES // 1024} KiB): whoever can write records cannot make it hold more. "
        "Records past the limit (the last by file name or key) are ignored, with one WARNING a "
        "minute. Give every frontend of a deployment the same value"
    ),
    low=1,
    high=1_000_000,
)

# Every option both launchers read for discovery, in the order their help lists them.
DISCOVERY_OPTIONS = [
    DISCOVERY_BACKEND,
    DISCOVERY_DIR,
    DISCOVERY_TTL,
    ETCD_ENDPOINTS,
    NAMESPACE,
    DISCOVERY_MAX_RECORDS,
]

# Each backend's own options: ignored (a WARNING, or exit 2 on the command line) with the other.
DISCOVERY_REQUIREMENTS = [
    Requires(
        DISCOVERY_DIR,
        f"{DISCOVERY_BACKEND.source_label()} file",
        lambda config: config.discovery_backend == "file",
    ),
    *(
        Requires(
            option,
            f"{DISCOVERY_BACKEND.source_label()} etcd",
            lambda config: config.discovery_backend == "etcd",
        )
        for option in (ETCD_ENDPOINTS, NAMESPACE)
    ),
]


def discovery_settings(values) -> DiscoverySettings:
    """The parsed discovery options as the store's settings (the default directory applied)."""
    return DiscoverySettings(
        backend=values.discovery_backend,
        directory=values.discovery_dir or default_discovery_dir(),
        directory_is_default=values.discovery_dir is None,
        max_records=values.discovery_max_records,
        ttl_s=values.discovery_ttl,
        etcd_endpoints=tuple(values.etcd_endpoints),
        namespace=values.namespace,
    )
