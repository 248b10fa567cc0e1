"""aiohttp's private parts that dynamo.common.aiohttp_hooks uses, checked by name and signature.

pyproject.toml pins aiohttp to one minor release because of them. A release that renames,
removes or re-signs one fails here, naming it, rather than as a listener that silently stops
bounding slow clients or shaping its 400s (the behaviour itself is tested in
tests/unit/test_http_server_deadlines.py and the frontend's HTTP tests).
"""

from __future__ import annotations

import asyncio
import inspect
from importlib.metadata import version

import aiohttp.streams
import aiohttp.web_protocol
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from dynamo.common import aiohttp_hooks


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_installed_aiohttp_is_the_pinned_minor():
    major, minor = (int(part) for part in version("aiohttp").split(".")[:2])
    assert (major, minor) == (3, 14), (
        f"aiohttp {version('aiohttp')}: dynamo.common.aiohttp_hooks was written against 3.14; "
        "check every private part it uses (this module) before moving the pin"
    )


def test_the_servers_per_connection_hooks_are_there_as_used():
    assert parameters(web.Server.connection_made) == ["self", "handler", "transport"]
    assert parameters(web.Server.connection_lost) == ["self", "handler", "exc"]
    assert "request_factory" in parameters(web.Server.__init__)

    async def handler(request):  # never called
        raise AssertionError

    async def build() -> web.Server:
        return web.Server(handler)

    server = asyncio.run(build())
    # An attribute of the instance, called by the handler with (message, payload, protocol,
    # writer, task): what hook_connections wraps.
    assert callable(server.request_factory)
    assert parameters(server.request_factory)[:3] == ["message", "payload", "protocol"]


def test_the_request_handler_has_what_the_hooks_call():
    handler = aiohttp.web_protocol.RequestHandler
    assert parameters(handler.handle_error) == ["self", "request", "status", "exc", "message"]
    assert callable(handler.force_close)
    # __slots__: why replace_error_answer swaps the class instead of setting an attribute.
    assert "__slots__" in handler.__dict__
    for method in ("data_received", "eof_received", "connection_lost", "pause_writing"):
        assert callable(getattr(handler, method)), method  # what _Watched hands on


def test_the_body_stream_has_what_the_deadlines_call():
    reader = aiohttp.streams.StreamReader
    for method in ("is_eof", "on_eof", "set_exception"):
        assert callable(getattr(reader, method)), method
    assert parameters(reader.on_eof) == ["self", "callback"]


def test_malformed_http_is_the_parsers_exceptions():
    assert aiohttp_hooks.MALFORMED_HTTP == (HttpProcessingError, web.RequestPayloadError)
    assert issubclass(aiohttp.http_exceptions.BadHttpMessage, HttpProcessingError)
