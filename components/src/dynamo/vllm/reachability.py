"""Is the worker's advertised request-plane address one that its readers can reach?

A worker publishes its request-plane URL in its discovery record. The default request-plane host
is 127.0.0.1: right when the frontend runs on the same host, useless when the record is read
from other hosts, whose frontend would find the worker and then fail to connect to it. Nothing
fails at start-up in that case, so the worker logs one WARNING (:func:`unreachable_reason`).

Who can read the record is the discovery store's to say
(:meth:`~dynamo.runtime.discovery.Discovery.readable_beyond_host`: a file store's directory on a
network file system, an etcd endpoint that is not loopback); whether the advertised address is
loopback is this module's.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from dynamo.runtime.discovery import Discovery


def host_of(endpoint: str) -> str | None:
    """The host part of ``http://h:p``, ``h:p``, ``[v6]:p`` or a bare host."""
    text = endpoint.strip()
    if not text:
        return None
    if "://" not in text:
        text = "//" + text
    try:
        return urlsplit(text).hostname
    except ValueError:
        return None


def is_loopback_host(host: str | None, *, resolve: bool = False) -> bool:
    """An address (or ``localhost``) only this host reaches. With ``resolve``, a host name that
    resolves to loopback addresses only counts too (Debian maps the host's own name to
    127.0.1.1)."""
    if not host:
        return False
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    if not resolve:
        return False
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def unreachable_reason(advertised_endpoint: str, discovery: Discovery) -> str | None:
    """The WARNING to log when the advertised request plane is loopback but the discovery
    record is readable from other hosts, or ``None``. May resolve the advertised host name and
    read the mount table: call it off the event loop."""
    host = host_of(advertised_endpoint)
    if not is_loopback_host(host, resolve=True):
        return None
    why = discovery.readable_beyond_host()
    if why is None:
        return None
    return (
        f"The request plane is advertised at {advertised_endpoint}, a loopback address, but "
        f"this worker's discovery record can be read from other hosts ({discovery.backend} "
        f"backend: {why}): a frontend on another host would find this worker and fail to "
        "connect to it. Set --request-plane-host / DYN_VLLM_REQUEST_PLANE_HOST to an address "
        "other hosts reach (in Kubernetes, the pod IP)"
    )
