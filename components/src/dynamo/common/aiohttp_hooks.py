"""The one module that reaches into aiohttp's private parts; everything else uses its public API.

The listeners' bounds (:mod:`dynamo.common.http_server`) need what aiohttp's public API has no
hook for: a connection's accept and loss, the moment a request's head is parsed (with its body's
stream), closing a connection from outside, and the answer aiohttp gives on its own to a request
it cannot parse. They are here, each a small function over aiohttp's low-level ``web.Server``
and its per-connection ``RequestHandler``:

* :func:`hook_connections`: wraps the server's ``connection_made``, ``connection_lost`` and
  ``request_factory`` (attributes of the one server object: nothing else aiohttp runs is
  touched);
* :func:`close_connection`: the handler's ``force_close``;
* :func:`replace_error_answer`: each connection's handler becomes an instance of a subclass
  whose ``handle_error`` keeps aiohttp's logging and status and replaces the body (the handler
  class has ``__slots__``, so no instance attribute can stand in for the method);
* :data:`MALFORMED_HTTP`: the exceptions aiohttp raises on a client's bad bytes.

pyproject.toml pins aiohttp to the minor release these were written against, and
tests/unit/test_aiohttp_hooks.py checks every name and signature used here, so a release that
changes one fails there, by name, before any listener misbehaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

# A request aiohttp could not parse: its request line, headers or chunked body.
MALFORMED_HTTP: tuple[type[BaseException], ...] = (HttpProcessingError, web.RequestPayloadError)

# Called with the connection's handler (its identity for the connection's life) and more.
Accepted = Callable[[RequestHandler, asyncio.Transport], None]
Lost = Callable[[RequestHandler], None]
HeadParsed = Callable[[RequestHandler, Any], None]  # the handler, the body's StreamReader
# The body of aiohttp's own answer: status, the exception (or None), aiohttp's message.
ErrorAnswer = Callable[[int, BaseException | None, str | None], web.StreamResponse]


def hook_connections(
    server: web.Server, *, accepted: Accepted, lost: Lost, head_parsed: HeadParsed
) -> None:
    """``accepted`` after aiohttp has set a connection up, ``lost`` before it tears one down,
    ``head_parsed`` once a request's head is parsed (a malformed head too), before aiohttp
    builds the request."""
    made, gone, factory = server.connection_made, server.connection_lost, server.request_factory

    def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
        made(handler, transport)
        accepted(handler, transport)

    def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
        lost(handler)
        gone(handler, exc)

    def request_factory(message, payload, protocol, *args, **kwargs):  # type: ignore[no-untyped-def]
        head_parsed(protocol, payload)
        return factory(message, payload, protocol, *args, **kwargs)

    server.connection_made = connection_made  # type: ignore[method-assign]
    server.connection_lost = connection_lost  # type: ignore[method-assign]
    server.request_factory = request_factory


def close_connection(handler: RequestHandler) -> None:
    """Close a connection now, whatever it is doing."""
    handler.force_close()


def replace_error_answer(server: web.Server, answer: ErrorAnswer) -> None:
    """What aiohttp answers on its own (a malformed request: 400; an error outside every
    handler: 500) becomes ``answer(status, exc, message)``; aiohttp still logs it."""
    made = server.connection_made
    shaped: dict[type, type] = {}

    def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
        made(handler, transport)
        base = type(handler)
        if base not in shaped:
            shaped[base] = _answering_class(base, answer)
        handler.__class__ = shaped[base]

    server.connection_made = connection_made  # type: ignore[method-assign]


def _answering_class(base: type, answer: ErrorAnswer) -> type:
    def handle_error(self, request, status=500, exc=None, message=None):  # type: ignore[no-untyped-def]
        base.handle_error(self, request, status, exc, message)  # logs; raises if it began
        return answer(status, exc, message)

    return type(f"Shaped{base.__name__}", (base,), {"__slots__": (), "handle_error": handle_error})
