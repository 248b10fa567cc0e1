"""The etcd endpoint list as operators write it (``ETCD_ENDPOINTS``), parsed and checked.

Comma-separated URLs, as upstream Dynamo reads ``ETCD_ENDPOINTS``: ``http://host:port`` or a
bare ``host:port``. The port defaults to etcd's 2379. ``https://`` is refused with the reason: the
asyncio etcd client this project uses (aetcd) opens plain-text gRPC channels only, and silently
speaking plain text to an endpoint the operator wrote as TLS would be worse than an error.
Parsed at argument-parsing time, so a malformed list exits 2 before anything runs; no etcd
client is imported here (that happens only when the etcd backend is selected).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_ETCD_PORT = 2379
DEFAULT_ETCD_ENDPOINTS = f"http://localhost:{DEFAULT_ETCD_PORT}"
# RFC 1123 host names; IP literals are checked by ipaddress.
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True)
class EtcdEndpoint:
    host: str  # a name or an IP literal, without IPv6 brackets
    port: int

    @property
    def target(self) -> str:
        """The gRPC target (``host:port``, IPv6 in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    @property
    def is_loopback(self) -> bool:
        if self.host.lower() in _LOOPBACK_NAMES:
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def _check_host(host: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if not host.isascii():
        raise ValueError(f"host {host!r} is not ASCII (write an IDN in its xn-- form)")
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        raise ValueError(f"{host!r} is not a valid host name or IP address")
    last_label = name.rsplit(".", 1)[-1]
    if last_label.isdigit() or last_label.lower().startswith("0x"):
        # As the Host kind says: resolvers read "1.2.3" and "0x7f.1" as IPv4 addresses.
        raise ValueError(
            f"{host!r} is not a valid IP address, nor a host name (no top-level domain is numeric)"
        )


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def parse_endpoint(text: str) -> EtcdEndpoint:
    item = text.strip()
    if not item:
        raise ValueError("empty endpoint")
    if _CONTROL.search(item):
        # urlsplit would silently drop a tab or newline inside the URL ("loc\nalhost" would
        # become localhost): a pasted control character is a mistake, not part of a name.
        raise ValueError(f"endpoint {item!r} must not contain control characters")
    if "://" not in item:
        item = "http://" + item
    parts = urlsplit(item)
    scheme = parts.scheme.lower()
    if scheme == "https":
        raise ValueError(
            f"endpoint {text.strip()!r}: TLS (https) is not supported by this project's etcd "
            "client; use http (with ETCD_AUTH_USERNAME / ETCD_AUTH_PASSWORD) on a trusted "
            "network, or a TLS-terminating proxy next to each process"
        )
    if scheme != "http":
        raise ValueError(f"endpoint {text.strip()!r}: scheme must be http")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"endpoint {text.strip()!r}: only scheme://host:port, no path")
    if parts.username is not None or parts.password is not None:
        # Never in a URL: it would end up in logs and process listings.
        raise ValueError(
            f"endpoint {parts.hostname or ''!r}: credentials do not belong in the URL "
            "(set ETCD_AUTH_USERNAME and ETCD_AUTH_PASSWORD)"
        )
    host = parts.hostname
    if not host:
        raise ValueError(f"endpoint {text.strip()!r} has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"endpoint {text.strip()!r}: port must be between 1 and 65535") from None
    port_text = parts.netloc.rsplit("]", 1)[-1].rpartition(":")[2] if parts.port else ""
    if port_text and not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"endpoint {text.strip()!r}: port must be ASCII digits")
    if port == 0:
        raise ValueError(f"endpoint {text.strip()!r}: port must be between 1 and 65535")
    _check_host(host)
    return EtcdEndpoint(host=host, port=port or DEFAULT_ETCD_PORT)


def parse_endpoints(text: str) -> tuple[EtcdEndpoint, ...]:
    """``ETCD_ENDPOINTS`` as a tuple (order kept, duplicates dropped); ValueError if malformed."""
    items = text.split(",")
    endpoints: list[EtcdEndpoint] = []
    for item in items:
        endpoint = parse_endpoint(item)
        if endpoint not in endpoints:
            endpoints.append(endpoint)
    return tuple(endpoints)
