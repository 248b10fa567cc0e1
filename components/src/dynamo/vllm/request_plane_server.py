"""The worker's side of the request plane: the listener, its routes, its drain.

The wire format (what a request and each streamed item are, how a refusal names its field) is
:mod:`dynamo.runtime.request_plane`'s, shared with the frontend's client; this module serves
it. The listener binds before engine init (a taken port fails in milliseconds, not after a
minute of engine init) and admits nothing until the process is ``serving``; its drain ends
every request it cuts short with the in-band error line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncGenerator, Callable
from typing import Any

from aiohttp import web

from dynamo.common.admission_routes import install_admission_gate
from dynamo.common.http_server import (
    REQUEST_PLANE_MAX_BODY_BYTES,
    GuardedRunner,
    RequestBodyTimeout,
    is_malformed_http,
)
from dynamo.common.request_drain import END_BOUND_S, RequestDrain, mark_stream
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.request_plane import (
    GENERATE_PATH,
    HEALTH_PATH,
    WITHDRAWN_FIELD,
    WITHDRAWN_MESSAGE,
    BadGenerateRequest,
    GenerateRequest,
    StreamFailed,
    validate_generate_request,
)
from dynamo.vllm.engine import Engine
from dynamo_gc import lifecycle
from dynamo_gc.admission import AdmissionGate

logger = logging.getLogger(__name__)
# The lines a request causes, per cause (an abort, each exception type): whoever reaches the
# request plane can send requests, and a line per request would be theirs to multiply.
_aborts = CauseBudgets(logger, logging.INFO, lines=10, interval_s=10.0)
_failures = CauseBudgets(logger, logging.ERROR, lines=1, interval_s=60.0)

CUT_SHORT_MESSAGE = "worker draining: the request was cut short at the end of its drain"

GenerateHandler = Callable[[GenerateRequest], AsyncGenerator[dict, None]]


async def _read_json(request: web.Request) -> Any:
    """The decoded body; :class:`BadGenerateRequest` for anything that is not one JSON value
    (bad JSON or UTF-8, nesting deeper than the decoder's recursion limit, a body aiohttp cannot
    read: a broken chunked body, a Content-Encoding it cannot undo)."""
    try:
        raw = await request.read()
    except RequestBodyTimeout:
        raise
    except Exception as exc:
        if not is_malformed_http(exc):
            raise
        cause = exc.__cause__ or exc
        raise BadGenerateRequest(f"body could not be read: {cause}") from None
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadGenerateRequest("body is nested too deeply to decode") from None
    except ValueError as exc:  # bad JSON, bad UTF-8 (UnicodeDecodeError), huge integers
        raise BadGenerateRequest(f"body is not valid JSON: {exc}") from None


def _bad_request(exc: BadGenerateRequest) -> web.Response:
    body = {"error": str(exc)}
    if exc.field is not None:
        body["field"] = exc.field
    return web.json_response(body, status=400)


def add_request_plane_routes(
    app: web.Application,
    generate: GenerateHandler,
    is_healthy: Callable[[], bool],
    *,
    served_model_name: str | Callable[[], str],
    is_withdrawn: Callable[[], bool] = lambda: False,
) -> None:
    """Mount the worker side of the request plane on an aiohttp app.

    ``served_model_name`` is the name this worker serves (or a callable returning it, for a
    name known only once the engine has started); a request for any other model is a 400.
    ``generate`` may raise :class:`BadGenerateRequest` before its first item (a prompt the
    engine refuses): that is a 400 too, since nothing was streamed yet.
    """

    def served_name() -> str:
        return served_model_name() if callable(served_model_name) else served_model_name

    async def handle_generate(request: web.Request) -> web.StreamResponse:
        try:
            body = validate_generate_request(await _read_json(request))
        except BadGenerateRequest as exc:
            return _bad_request(exc)
        except RequestBodyTimeout as exc:  # the listener's body deadline (logged there, once)
            return web.json_response({"error": str(exc)}, status=408)
        if not is_healthy():
            return web.json_response({"error": "worker is draining"}, status=503)
        if body.model != served_name():
            return _bad_request(
                BadGenerateRequest(
                    f"model {body.model!r} is not served here (this worker serves "
                    f"{served_name()!r})",
                    field="model",
                )
            )
        # aclosing: an abort closes the engine's stream now, not when the GC finds it.
        async with contextlib.aclosing(generate(body)) as stream:
            first: dict | None = None
            failure: Exception | None = None
            try:
                # The first item before the response starts: a prompt the engine refuses is a
                # 400, not a 200 with an error line.
                first = await stream.__anext__()
            except BadGenerateRequest as exc:
                return _bad_request(exc)
            except StopAsyncIteration:
                pass
            except Exception as exc:  # noqa: BLE001 - reported to the caller in-band, below
                failure = exc
            response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await response.prepare(request)
            mark_stream(request, response)  # a drain that cuts it short ends it with an error line
            try:
                if failure is not None:
                    raise failure
                if first is not None:
                    await response.write(json.dumps(first).encode() + b"\n")
                    async for item in stream:
                        await response.write(json.dumps(item).encode() + b"\n")
            except asyncio.CancelledError:
                raise  # the caller hung up and aiohttp cancelled the handler: stream closed
            except StreamFailed as exc:
                await response.write(json.dumps({"error": str(exc)}).encode() + b"\n")
            except ConnectionResetError:
                # The caller hung up between two writes: the request is aborted (the stream is
                # closed on leaving this block). An expected event, not a server error worth a
                # traceback.
                _aborts.emit(
                    "aborted",
                    "Request %s aborted: the caller closed the connection",
                    body.request_id,
                )
                return response
            except Exception as exc:  # noqa: BLE001 - reported to the caller in-band
                _failures.emit(
                    type(exc).__name__,
                    "generate failed for request %s",
                    body.request_id,
                    exc_info=exc,
                )
                await response.write(json.dumps({"error": str(exc)}).encode() + b"\n")
        await response.write_eof()
        return response

    async def handle_health(request: web.Request) -> web.Response:
        # Withdrawn for a maintenance: alive (a stream in flight goes on), but not an instance
        # for a new request (the frontend's scout takes only a non-5xx answer).
        if is_withdrawn():
            return web.json_response({"status": "withdrawn"}, status=503)
        healthy = is_healthy()
        return web.json_response(
            {"status": "ok" if healthy else "draining"}, status=200 if healthy else 503
        )

    app.router.add_post(GENERATE_PATH, handle_generate)
    app.router.add_get(HEALTH_PATH, handle_health)


def withdrawn_response() -> web.Response:
    """What a worker withdrawn for a GC maintenance answers a generate request that still
    reaches it: a 503 the frontend's router tells apart (another instance, at once)."""
    return web.json_response({"error": WITHDRAWN_MESSAGE, WITHDRAWN_FIELD: True}, status=503)


class RequestPlaneServer:
    """The worker's request-plane listener (aiohttp), counting the requests in flight.

    ``gate`` (serving-time maintenance on): generate requests go through it, so a maintenance
    can hold them or answer them as withdrawn (:mod:`dynamo.common.admission_routes`).
    """

    def __init__(
        self,
        engine: Engine,
        host: str,
        port: int,
        *,
        drain_grace_s: float,
        gate: AdmissionGate | None = None,
    ) -> None:
        self._engine = engine
        self._host = host
        self._port = port
        self.drain_grace_s = drain_grace_s
        self.endpoint: str | None = None
        self.in_flight = 0
        self.finished = 0
        self.aborted = 0
        self._closed = False
        self.gate = gate
        app = web.Application(client_max_size=REQUEST_PLANE_MAX_BODY_BYTES)
        add_request_plane_routes(
            app,
            self._generate,
            self._admitting,
            served_model_name=engine.served_model_name,
            is_withdrawn=lambda: gate is not None and gate.withdrawn,
        )
        # Our drain (one deadline; a cut stream ends with an in-band error line) finishes every
        # request before aiohttp's cleanup, whose timeout then only bounds closing connections.
        # What a request cut short is told: the drain's message, or why the engine died.
        self.cut_message = CUT_SHORT_MESSAGE
        self.drain = RequestDrain(
            what="request plane", end_stream=self._end_cut_stream, refuse=self._refuse_cut_request
        )
        self.drain.install(app)
        if gate is not None:
            install_admission_gate(
                app,
                gate,
                gated=lambda request: request.path == GENERATE_PATH,
                withdrawn=withdrawn_response,
            )
        self._runner = GuardedRunner(app, what="request plane", shutdown_timeout=END_BOUND_S / 2)

    @staticmethod
    def _admitting() -> bool:
        # Nothing is admitted before the phase is `serving` (see run_worker) nor while draining.
        return lifecycle.serving()

    async def _generate(self, request: GenerateRequest) -> AsyncGenerator[dict, None]:
        self.in_flight += 1
        finished = False
        try:
            # aclosing: when the client goes away, the engine's stream is closed (= aborted)
            # right now, not whenever the garbage collector gets to it.
            async with contextlib.aclosing(self._engine.generate(request)) as stream:
                async for item in stream:
                    finished = finished or "finish_reason" in item
                    yield item
        finally:
            self.in_flight -= 1
            if finished:
                self.finished += 1
            else:
                self.aborted += 1

    def fail(self, message: str) -> None:
        """The engine died: every request still running is cut short now (no grace period),
        each told ``message`` (in-band, or a 503 before its stream started)."""
        self.cut_message = message
        self.drain.start(0.0)

    async def _end_cut_stream(self, response: web.StreamResponse) -> None:
        # The request plane's in-band failure line (see dynamo.runtime.request_plane).
        await response.write(json.dumps({"error": self.cut_message}).encode() + b"\n")
        await response.write_eof()

    def _refuse_cut_request(self) -> web.Response:
        return web.json_response({"error": self.cut_message}, status=503)

    async def open(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.endpoint = f"http://{_advertised_host(self._host)}:{port}"
        logger.info("Request plane listening on %s", self.endpoint)
        return self.endpoint

    async def close(self) -> None:
        """Stop listening and drain (bounded by the grace period); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.endpoint is None or lifecycle.current_phase() is lifecycle.Phase.STARTING:
            # Never listened, or start-up failed or was cancelled before anything was admitted:
            # nothing to drain, and nothing to report.
            await self._runner.cleanup()
            return
        if self.cut_message == CUT_SHORT_MESSAGE:
            logger.info(
                "Draining: %d request(s) in flight; waiting up to %g s before aborting them",
                self.in_flight,
                self.drain_grace_s,
            )
        else:
            logger.info("Ending the %d request(s) in flight: the engine died", self.in_flight)
        for site in list(self._runner.sites):
            await site.stop()  # the listener closes first
        self.drain.start(self.drain_grace_s)  # no-op when the signal already set the deadline
        await self.drain.wait()
        await self._runner.cleanup()
        logger.info(
            "Request plane closed: requests finished=%d aborted=%d", self.finished, self.aborted
        )


def _advertised_host(host: str) -> str:
    """The host part of the URL others use to reach a listener bound to ``host``."""
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()  # a wildcard bind is reachable under the host's name
    return f"[{host}]" if ":" in host else host
