"""Which option to blame when a listener cannot bind."""

from __future__ import annotations

import errno
import socket

# CPython 3.13's asyncio skips an address whose bind fails with EADDRNOTAVAIL (it takes it for
# a disabled address family, bpo-30945) and, when that leaves no socket, raises a bare OSError
# with this text and no errno. Every address was then "not an address of this machine".
_ALL_ADDRESSES_UNAVAILABLE = "could not bind on any address"


def is_host_error(exc: OSError) -> bool:
    """Whether a failed bind is the host's fault (unknown name, not an address of this machine)
    rather than the port's (taken, or privileged)."""
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return True
    return exc.errno is None and str(exc).startswith(_ALL_ADDRESSES_UNAVAILABLE)
