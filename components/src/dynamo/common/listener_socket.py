"""A listener's sockets, bound at start-up but listening only once the process admits requests.

Binding early makes a taken port or a host that is no address of this machine fail at once,
before the GC freeze and before anything says it serves; listening late keeps the quiescent
point quiescent (the kernel accepts no connection before ``listen``).
"""

from __future__ import annotations

import socket


def bound_sockets(host: str, port: int) -> list[socket.socket]:
    """One TCP socket per address ``host`` resolves to, each bound to ``port`` (0: the first
    gets a free port, the others the same one), as asyncio's ``create_server`` would bind them.
    Raises OSError (``socket.gaierror`` for a host that does not resolve) with none left open."""
    infos = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_ADDRCONFIG
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
            (info[0], info[1], info[2], info[3], info[4]) for info in infos
        ):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
