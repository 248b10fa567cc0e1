"""Which option a failed bind blames, whatever CPython's asyncio made of the error."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest

from dynamo.common.bind_errors import is_host_error


@pytest.mark.parametrize(
    "exc",
    [
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
        OSError(errno.EADDRNOTAVAIL, "error while attempting to bind on address"),
        OSError("could not bind on any address out of [('192.0.2.1', 0)]"),  # CPython 3.13
    ],
)
def test_the_host_is_at_fault(exc: OSError) -> None:
    assert is_host_error(exc)


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.EADDRINUSE, "address already in use"),
        OSError(errno.EACCES, "permission denied"),
        OSError("something else went wrong"),
    ],
)
def test_the_port_is_at_fault(exc: OSError) -> None:
    assert not is_host_error(exc)


def test_this_pythons_own_error_for_an_address_of_no_interface_blames_the_host() -> None:
    async def bind() -> OSError:
        try:
            server = await asyncio.get_running_loop().create_server(
                asyncio.Protocol,
                "192.0.2.1",
                0,  # TEST-NET-1: never an address of this machine
            )
        except OSError as exc:
            return exc
        server.close()
        pytest.skip("192.0.2.1 is an address of this machine")

    assert is_host_error(asyncio.run(bind()))
