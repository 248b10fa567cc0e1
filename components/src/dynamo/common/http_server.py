"""The settings every aiohttp listener of ours shares: the frontend's HTTP service, the worker's
request plane and its system port.

What they bound, and why (docs/operator-guide.md lists them for operators):

* **Request head timeout** (:data:`HEADER_TIMEOUT_S`): a connection must deliver its first
  complete request line and headers within this time of being accepted, and every later request
  head on a kept-alive connection within this time of its first byte, or it is closed (what
  nginx's ``client_header_timeout`` does). aiohttp has no such bound (older versions never close
  a connection that sends nothing; 3.14 waits for its keep-alive timeout), so a client that
  opens connections and trickles header bytes (a "slowloris") would hold them, and their file
  descriptors, for as long as it likes.
* **Request body timeout** (:data:`BODY_TIMEOUT_S`): a request's body must arrive within this
  time of its head. aiohttp has no such setting (its ``read_timeout`` is the client's); past it
  the body read raises :class:`RequestBodyTimeout`, answered 408, and the connection is closed.
  A whole-body bound, stricter than nginx's ``client_body_timeout`` between two reads: a client
  sending one byte every few seconds is still cut at the bound.
* **Keep-alive timeout** (:data:`KEEPALIVE_TIMEOUT_S`): an idle connection is closed this long
  after its last response.
* **Malformed HTTP** (a bad request line, bad headers, a header line too long, a broken chunked
  body) is answered 400 by aiohttp, as before, but logged as one INFO line without a traceback:
  it is the client's mistake (or a scanner's), not the server's. Both kinds of line are rate
  limited, so a flood of bad clients cannot flood the log. An exception in our own code keeps
  its traceback.
* **Transfer codings** other than chunked (``Transfer-Encoding: gzip, chunked``) are answered
  501 and the connection closed (RFC 9112, 6.1): aiohttp's parser reads such a body as if the
  other codings were not there.
* **A request marked close** is answered, and whatever follows it on the connection is never
  read (RFC 9112, 9.6; :mod:`.request_framing`): aiohttp answered 400 in its place when a client
  pipelined after it in the same packet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from dynamo.common import aiohttp_hooks
from dynamo.common.request_framing import RequestFraming
from dynamo.runtime import peer_text

logger = logging.getLogger(__name__)

# The largest request body the frontend's HTTP service reads (aiohttp's default, made explicit).
FRONTEND_MAX_BODY_BYTES = 1024**2
# The request plane carries what the frontend made of such a body: the prompt's token ids (at
# most about one token per body byte, each id up to 8 JSON bytes with its separator) plus the
# sampling fields copied from the body (at most 3x when re-escaped). So the worker accepts 16x
# the frontend's limit: anything the frontend accepts reaches the worker, never a 413 blamed on
# a worker as "no worker reachable".
REQUEST_PLANE_MAX_BODY_BYTES = 16 * FRONTEND_MAX_BODY_BYTES

HEADER_TIMEOUT_S = 20.0
# A request body must arrive within this long of its head: the frontend's largest (1 MiB) at
# ~52 kB/s, the request plane's on a cluster network in well under a second.
BODY_TIMEOUT_S = 20.0
KEEPALIVE_TIMEOUT_S = 75.0
# A rate-limited line is logged at most once per this many seconds; the lines it held back are
# counted in the next one.
LOG_EVERY_S = 60.0


class RateLimitedLine:
    """One log line, at most once per :data:`LOG_EVERY_S`; held-back occurrences are counted."""

    def __init__(self, log: logging.Logger, level: int = logging.INFO) -> None:
        self._log = log
        self._level = level
        self._next_at = 0.0
        self._held_back = 0

    def emit(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now < self._next_at:
            self._held_back += 1
            return
        self._next_at = now + LOG_EVERY_S
        if self._held_back:
            message += " (%d more like it in the last %g s)"
            args = (*args, self._held_back, LOG_EVERY_S)
            self._held_back = 0
        self._log.log(self._level, message, *args)


def is_malformed_http(exc: BaseException | None) -> bool:
    """Whether aiohttp failed on the client's bytes (request line, headers, chunked body)."""
    return isinstance(exc, aiohttp_hooks.MALFORMED_HTTP)


class ProtocolLogger(logging.LoggerAdapter):
    """The logger aiohttp's connection handler writes to: malformed HTTP without a traceback.

    aiohttp logs every request it cannot parse with ``logger.exception`` (a full traceback per
    bad request, at ERROR). Here that becomes one rate-limited INFO line naming the peer and
    what was wrong; any other exception is logged as aiohttp would.
    """

    def __init__(self, what: str) -> None:
        super().__init__(logging.getLogger("aiohttp.server"), {})
        self.what = what
        self._malformed = RateLimitedLine(logger)

    def exception(self, msg, *args, exc_info=True, **kwargs) -> None:
        if isinstance(exc_info, ConnectionResetError):
            # The client went away while aiohttp wrote to it (a 100 Continue, a response):
            # nothing to answer and nobody's fault worth a traceback at ERROR.
            logger.debug("The client of the %s went away: %s", self.what, exc_info)
            return
        if is_malformed_http(exc_info if isinstance(exc_info, BaseException) else None):
            peer = args[0] if args else "?"
            self._malformed.emit(
                "Malformed HTTP request to the %s from %s answered 400: %s",
                self.what,
                peer,
                peer_text.escape(getattr(exc_info, "message", None) or exc_info),
            )
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


class RequestBodyTimeout(asyncio.TimeoutError):
    """A request body that did not arrive within :data:`BODY_TIMEOUT_S` of its head.

    Raised by the body read (``request.read()``, ``request.json()``); a handler answers it 408.
    A subclass of ``asyncio.TimeoutError``, so aiohttp's own read of an unread body after the
    response ("lingering") takes it as a timeout and closes the connection, without a traceback.
    """


class _Watched(asyncio.Protocol):
    """Stands between a connection's transport and aiohttp's handler (``set_protocol``, public
    asyncio API): sees each chunk of bytes as it arrives, then hands it on, unchanged but for
    what follows a request marked close (never handed on: :mod:`.request_framing`)."""

    def __init__(self, handler: asyncio.Protocol, on_data) -> None:
        self._handler = handler
        self._on_data = on_data
        self._framing = RequestFraming()

    def data_received(self, data: bytes) -> None:
        for piece in self._framing.split(data):
            self._on_data(piece)
            self._handler.data_received(piece)

    def eof_received(self):
        return self._handler.eof_received()

    def connection_lost(self, exc) -> None:
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()


class _Connection:
    """One connection's deadline state."""

    __slots__ = ("transport", "awaiting_head", "head_started", "tail", "head_timer", "body_timer")

    def __init__(self, transport) -> None:
        self.transport = transport
        # True until a request head is complete, and again once that request's body is.
        self.awaiting_head = True
        # Whether a byte other than CR or LF of the awaited head has arrived: blank lines before
        # a request line are skipped by the parser (RFC 9112, 2.2), so their CRLFs never end a
        # head, but they do start its clock.
        self.head_started = False
        self.tail = b""  # the last bytes of a head still arriving (its end may span chunks)
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        for timer in (self.head_timer, self.body_timer):
            if timer is not None:
                timer.cancel()
        self.head_timer = self.body_timer = None


class RequestDeadlines:
    """Every request head, and every request body, must arrive within its bound.

    * A head: within :data:`HEADER_TIMEOUT_S` of the connection's accept (the first request)
      or of its first byte (every later request on a kept-alive connection; an idle connection
      is the keep-alive timeout's business). Past it the connection is closed.
    * A body: within :data:`BODY_TIMEOUT_S` of its head. Past it the body read raises
      :class:`RequestBodyTimeout`, which the handler answers 408 (the frontend in the OpenAI
      error shape); aiohttp then closes the connection, as the rest of the body is unread.

    Installed on the runner's low-level server between ``setup()`` and the first site's
    ``start()``, through :func:`dynamo.common.aiohttp_hooks.hook_connections` (a connection's
    accept and loss, and each request's head once parsed, a malformed one too, so its 400 is
    not cut short, with the body's stream).
    A head is complete at its blank line (seen in the bytes) or at ``request_factory``,
    whichever comes first, so a pipelined head waiting behind a long response is not cut.
    """

    def __init__(
        self,
        what: str,
        head_timeout_s: float = HEADER_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.what = what
        self.head_timeout_s = head_timeout_s
        self.body_timeout_s = body_timeout_s
        self.closed = 0  # connections closed for a slow head
        self.timed_out_bodies = 0
        self._connections: dict[Any, _Connection] = {}
        self._head_line = RateLimitedLine(logger)
        self._body_line = RateLimitedLine(logger)

    def install(self, server: web.Server) -> None:
        loop = asyncio.get_running_loop()

        def accepted(handler, transport) -> None:
            connection = _Connection(transport)
            self._connections[handler] = connection
            connection.head_timer = loop.call_later(
                self.head_timeout_s, self._head_expired, handler
            )
            transport.set_protocol(_Watched(handler, lambda data: self._data(handler, data)))

        def lost(handler) -> None:
            connection = self._connections.pop(handler, None)
            if connection is not None:
                connection.cancel()

        def head_parsed(handler, payload) -> None:
            connection = self._connections.get(handler)
            if connection is not None:
                self._head_complete(connection)
                self._watch_body(loop, handler, connection, payload)

        aiohttp_hooks.hook_connections(
            server, accepted=accepted, lost=lost, head_parsed=head_parsed
        )

    def _data(self, handler, data: bytes) -> None:
        connection = self._connections.get(handler)
        if connection is None or not connection.awaiting_head:
            return  # a body's bytes
        if connection.head_timer is None:  # the first byte of a later request's head
            connection.head_timer = asyncio.get_running_loop().call_later(
                self.head_timeout_s, self._head_expired, handler
            )
        if not connection.head_started:
            # Leading blank lines: the clock runs (it started above, or at the accept), but
            # their CRLFs are no head's end; one that were would stop the clock for good.
            data = data.lstrip(b"\r\n")
            if not data:
                return
            connection.head_started = True
        seen = connection.tail + data
        if b"\r\n\r\n" in seen:
            self._head_complete(connection)
        else:
            connection.tail = seen[-3:]

    @staticmethod
    def _head_complete(connection: _Connection) -> None:
        connection.awaiting_head = False
        connection.head_started = False
        connection.tail = b""
        if connection.head_timer is not None:
            connection.head_timer.cancel()
            connection.head_timer = None

    def _watch_body(self, loop, handler, connection: _Connection, payload) -> None:
        def body_complete() -> None:
            if connection.body_timer is not None:
                connection.body_timer.cancel()
                connection.body_timer = None
            connection.awaiting_head = True  # what comes next is the next request's head

        if payload.is_eof():  # no body
            body_complete()
            return
        if connection.body_timer is not None:
            connection.body_timer.cancel()
        connection.body_timer = loop.call_later(
            self.body_timeout_s, self._body_expired, handler, connection, payload
        )
        payload.on_eof(body_complete)

    def _head_expired(self, handler) -> None:
        connection = self._connections.get(handler)
        if connection is None or connection.head_timer is None:
            return
        connection.head_timer = None
        self.closed += 1
        self._head_line.emit(
            "Closed a connection to the %s from %s: no complete request head within %g s",
            self.what,
            _peer(connection.transport),
            self.head_timeout_s,
        )
        aiohttp_hooks.close_connection(handler)

    def _body_expired(self, handler, connection: _Connection, payload) -> None:
        connection.body_timer = None
        if payload.is_eof() or handler not in self._connections:
            return
        self.timed_out_bodies += 1
        self._body_line.emit(
            "Request body to the %s from %s not complete within %g s: answered 408 and closed",
            self.what,
            _peer(connection.transport),
            self.body_timeout_s,
        )
        payload.set_exception(
            RequestBodyTimeout(f"the request body did not arrive within {self.body_timeout_s:g} s")
        )


def _peer(transport) -> Any:
    peer = transport.get_extra_info("peername")
    return peer[0] if isinstance(peer, tuple) else peer


# The body of an error answered before any handler runs (a request aiohttp cannot parse), from
# its status and a message: a listener whose errors have a shape of their own (the frontend's
# OpenAI shape) gives one to GuardedRunner.
ErrorBody = Callable[[int, str], dict]


def shape_protocol_errors(server: web.Server, error_body: ErrorBody) -> None:
    """Answer what aiohttp answers itself (a malformed request line or header: 400; an error
    outside every handler: 500) as JSON shaped by ``error_body`` instead of plain text.

    aiohttp still logs the error (through :class:`ProtocolLogger`) and keeps its status
    (:func:`dynamo.common.aiohttp_hooks.replace_error_answer`). The message names what was
    wrong (aiohttp's words about the client's own bytes, escaped and bounded), never a
    traceback.
    """

    def answer(status: int, exc: BaseException | None, message: str | None) -> web.Response:
        if status >= 500:
            text = "internal error in the server"
        else:
            reason = getattr(exc, "message", None) or message or HTTPStatus(status).phrase
            text = f"malformed HTTP request: {peer_text.escape(reason)}"
        response = web.json_response(error_body(status, text), status=status)
        response.force_close()
        return response

    aiohttp_hooks.replace_error_answer(server, answer)


# The one transfer coding aiohttp's parser decodes.
TRANSFER_CODINGS = frozenset({"chunked"})


def unknown_transfer_coding(request: web.BaseRequest) -> str | None:
    """The first transfer coding of the request's that this server does not decode, if any
    (a coding's parameters aside; the client's text, escaped and bounded)."""
    for value in request.headers.getall("Transfer-Encoding", ()):
        for coding in value.split(","):
            name = coding.split(";", 1)[0].strip().lower()
            if name and name not in TRANSFER_CODINGS:
                return peer_text.escape(name, 64)
    return None


def refuse_transfer_codings(error_body: ErrorBody | None):
    """The middleware that answers a request with a transfer coding other than chunked 501
    (RFC 9112, 6.1), its body unread and its connection closed, in ``error_body``'s shape
    (None: ``{"error": message}``, the request plane's)."""

    @web.middleware
    async def transfer_codings(request: web.Request, handler) -> web.StreamResponse:
        coding = unknown_transfer_coding(request)
        if coding is None:
            return await handler(request)
        message = f"Transfer-Encoding {coding} is not implemented by this server (only chunked is)"
        body = error_body(501, message) if error_body else {"error": message}
        response = web.json_response(body, status=501)
        response.force_close()  # its body is unread, and unreadable
        return response

    return transfer_codings


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` with the settings above (and no access log); ``error_body`` shapes
    the errors aiohttp answers itself (see :func:`shape_protocol_errors`)."""

    def __init__(
        self,
        app: web.Application,
        *,
        what: str,
        error_body: ErrorBody | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("access_log", None)
        kwargs.setdefault("keepalive_timeout", KEEPALIVE_TIMEOUT_S)
        kwargs.setdefault("logger", ProtocolLogger(what))
        # Outermost: before any route or other middleware reads the body.
        app.middlewares.insert(0, refuse_transfer_codings(error_body))
        super().__init__(app, **kwargs)
        self.deadlines = RequestDeadlines(what)
        self._error_body = error_body

    async def setup(self) -> None:
        await super().setup()
        assert self.server is not None, "setup() built the server"
        self.deadlines.install(self.server)
        if self._error_body is not None:
            shape_protocol_errors(self.server, self._error_body)
