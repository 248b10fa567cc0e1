"""The frontend's HTTP surface outside the request path: its listener, and every error in the
OpenAI shape.

* :func:`http_runner`: the listener of the HTTP service: the bounds every listener has
  (:mod:`dynamo.common.http_server`), aiohttp's own errors (a request it cannot parse) in the
  OpenAI shape too, and request bodies never decompressed (a compressed one is refused, 415, by
  :mod:`dynamo.frontend.openai.request_body`: it can cost no more memory than its own bytes).
* :func:`openai_errors`: the middleware that answers every error a route raises, aiohttp's
  404/405/413 included, in the OpenAI shape; a 5xx logs one WARNING, budgeted per cause.
* :func:`worker_failure`: a worker's failure as a client sees it: generic (no instance, address
  or worker text: docs/security.md), the detail for the log line; and :func:`template_failed`,
  a model's chat template that failed.
* A route that raises anything else (a bug of the frontend's) is a 500 whose traceback is logged
  once per exception type a minute, the next line counting those held back.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from dynamo.common.http_server import GuardedRunner
from dynamo.frontend.openai import protocol as oai
from dynamo.frontend.routing.worker_router import LOG_INTERVAL_S
from dynamo.runtime import peer_text
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.request_plane import WorkerProtocolError

logger = logging.getLogger(__name__)

# How much of a chat template's error (its raise_exception text, or what it failed with) a
# client's answer quotes.
TEMPLATE_ERROR_LIMIT = 500


def failure_log() -> CauseBudgets:
    """The WARNING of a failed request, budgeted per cause (its status and code)."""
    return CauseBudgets(logger, lines=1, interval_s=LOG_INTERVAL_S)


_HTTP_ERROR_CODES = {
    400: "malformed_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    501: "unsupported_transfer_encoding",
}


def http_runner(app: web.Application, **kwargs: Any) -> GuardedRunner:
    """The HTTP service's listener: the bounds every listener has, aiohttp's own errors (a
    request it cannot parse) in the OpenAI shape too, and no decompression of request bodies (a
    compressed one is refused, 415: it can cost no more memory than its own bytes)."""
    return GuardedRunner(
        app,
        what="HTTP service",
        error_body=protocol_error_body,
        auto_decompress=False,
        **kwargs,
    )


def protocol_error_body(status: int, message: str) -> dict:
    """An error aiohttp answers before any route runs (a request it cannot parse), in the
    OpenAI shape (the listener's ``error_body``)."""
    # 501: a transfer coding the client chose and this server does not decode (its request).
    kind = "invalid_request_error" if status < 500 or status == 501 else "server_error"
    return oai.error_body(message, type=kind, code=_HTTP_ERROR_CODES.get(status))


def worker_failure(exc: BaseException, completion_id: str) -> oai.ApiError:
    """A worker's failure after its first item, as the client sees it (generic: no instance,
    address or worker text) with the detail for the log: 502 when its answer broke the wire
    format, else 503 (it went away, or failed and said so)."""
    detail = f"request {completion_id}: {exc or 'the stream ended early'}"
    if isinstance(exc, WorkerProtocolError):
        return bad_worker_response(
            "the model's worker sent an invalid answer; the request was ended", detail
        )
    return oai.service_unavailable("the model's worker failed during the request", detail=detail)


def template_failed(model: str, exc: BaseException) -> oai.ApiError:
    """502 ``chat_template_failed``: the model's chat template failed on these messages (it
    raised something other than its ``raise_exception``, or rendered no text): the model's
    fault, not the request's. The error quotes what it failed with, escaped and bounded like
    any peer text."""
    error = peer_text.escape(exc, limit=TEMPLATE_ERROR_LIMIT)
    return oai.ApiError(
        502,
        f"the chat template of model `{model}` failed rendering these messages: {error}",
        type="server_error",
        code="chat_template_failed",
        detail=f"the chat template of model {peer_text.escape(model)} failed: {error}",
    )


def bad_worker_response(message: str, detail: str) -> oai.ApiError:
    """502: a worker answered, but not in the request plane's wire format."""
    return oai.ApiError(
        502, message, type="server_error", code="bad_worker_response", detail=detail
    )


def openai_errors(failures: CauseBudgets | None = None):
    """The middleware that answers every error in the OpenAI shape, including aiohttp's own
    404/405/413; ``failures`` budgets the WARNING of a 5xx (see the module docstring)."""
    failures = failures or failure_log()
    # A bug's traceback, once per exception type a minute: whatever the bug, a peer or a client
    # that finds it cannot flood the log with it.
    bugs = CauseBudgets(logger, logging.ERROR, lines=1, interval_s=LOG_INTERVAL_S)

    @web.middleware
    async def openai_error_middleware(request: web.Request, handler) -> web.StreamResponse:
        return await _answer_errors(request, handler, failures, bugs)

    return openai_error_middleware


async def _answer_errors(request: web.Request, handler, failures: CauseBudgets, bugs: CauseBudgets):
    try:
        return await handler(request)
    except oai.ApiError as exc:
        if exc.status >= 500:  # the one line a failed request logs (see the module docstring)
            failures.emit(
                (exc.status, exc.code),
                "%s %s -> %d %s: %s",
                request.method,
                peer_text.escape(request.path),
                exc.status,
                exc.code,
                exc.detail or exc.message,
            )
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response(
            oai.error_body(
                exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason,
                type="invalid_request_error",
                code=_HTTP_ERROR_CODES.get(exc.status),
            ),
            status=exc.status,
            headers=headers,
        )
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # noqa: BLE001 - a bug of ours: a 500, its traceback budgeted
        bugs.emit(
            type(exc).__name__,
            "%s %s failed",
            request.method,
            peer_text.escape(request.path),
            exc_info=exc,
        )
        return web.json_response(
            oai.error_body("internal error in the frontend", type="server_error"), status=500
        )
