"""The settings every aiohttp listener of ours shares: the frontend's HTTP service, the worker's
request plane and its system port.

What they bound, and why (docs/operator-guide.md lists them for operators):

* **Request head timeout** (:data:`HEADER_TIMEOUT_S`): a connection must deliver its first
  complete request line and headers within this time of being accepted, or it is closed. aiohttp
  has no such bound (older versions never close a connection that sends nothing; 3.14 waits for
  its keep-alive timeout), so a client that opens connections and trickles header bytes (a
  "slowloris") would hold them, and their file descriptors, for as long as it likes.
* **Keep-alive timeout** (:data:`KEEPALIVE_TIMEOUT_S`): an idle connection is closed this long
  after its last response. It also bounds the head of every later request on that connection
  (aiohttp closes a connection still waiting for a request when it fires).
* **Malformed HTTP** (a bad request line, bad headers, a header line too long, a broken chunked
  body) is answered 400 by aiohttp, as before, but logged as one INFO line without a traceback:
  it is the client's mistake (or a scanner's), not the server's. Both kinds of line are rate
  limited, so a flood of bad clients cannot flood the log. An exception in our own code keeps
  its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

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
    return isinstance(exc, (HttpProcessingError, RequestPayloadError))


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

    def exception(self, msg, *args, exc_info=True, **kwargs) -> None:  # noqa: D401
        if is_malformed_http(exc_info if isinstance(exc_info, BaseException) else None):
            peer = args[0] if args else "?"
            self._malformed.emit(
                "Malformed HTTP request to the %s from %s answered 400: %s",
                self.what,
                peer,
                getattr(exc_info, "message", None) or exc_info,
            )
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)


class HeaderDeadline:
    """Closes a connection that has not delivered a complete request head in time.

    Installed on the runner's low-level server between ``setup()`` and the first site's
    ``start()``: it wraps the server's public per-connection hooks (``connection_made``,
    ``connection_lost``) and its ``request_factory``, which aiohttp calls once a request's line
    and headers are parsed (a malformed head too, so its 400 is not cut short).
    """

    def __init__(self, what: str, timeout_s: float = HEADER_TIMEOUT_S) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self.closed = 0
        self._timers: dict[Any, asyncio.TimerHandle] = {}
        self._line = RateLimitedLine(logger)

    def install(self, server: web.Server) -> None:
        made, lost, factory = server.connection_made, server.connection_lost, server.request_factory
        loop = asyncio.get_running_loop()

        def connection_made(handler, transport) -> None:
            made(handler, transport)
            self._timers[handler] = loop.call_later(self.timeout_s, self._expire, handler, transport)

        def connection_lost(handler, exc=None) -> None:
            self._disarm(handler)
            lost(handler, exc)

        def request_factory(message, payload, protocol, *args, **kwargs):
            self._disarm(protocol)  # the head is complete
            return factory(message, payload, protocol, *args, **kwargs)

        server.connection_made = connection_made
        server.connection_lost = connection_lost
        server.request_factory = request_factory

    def _disarm(self, handler) -> None:
        timer = self._timers.pop(handler, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, handler, transport) -> None:
        if self._timers.pop(handler, None) is None:
            return
        self.closed += 1
        peer = transport.get_extra_info("peername")
        self._line.emit(
            "Closed a connection to the %s from %s: no complete request head within %g s",
            self.what,
            peer[0] if isinstance(peer, tuple) else peer,
            self.timeout_s,
        )
        handler.force_close()


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` with the settings above (and no access log)."""

    def __init__(self, app: web.Application, *, what: str, **kwargs: Any) -> None:
        kwargs.setdefault("access_log", None)
        kwargs.setdefault("keepalive_timeout", KEEPALIVE_TIMEOUT_S)
        kwargs.setdefault("logger", ProtocolLogger(what))
        super().__init__(app, **kwargs)
        self.header_deadline = HeaderDeadline(what)

    async def setup(self) -> None:
        await super().setup()
        self.header_deadline.install(self.server)
