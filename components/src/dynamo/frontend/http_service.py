"""The OpenAI-compatible HTTP service: routes, request handling, streaming, error shapes.

Every failure a client can see is answered in OpenAI's error shape with a status that says whose
fault it is: 400 bad request, 404 unknown model, 503 no worker (or draining). A worker that dies
mid-stream ends the stream with an error event, never with silence.

A failed request logs one line, at WARNING: the error middleware's for a 5xx answered before the
stream started, the stream's own once the headers are gone. The code below raises, it does not
log too, so an outage does not double (or triple) the log volume per request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import AsyncGenerator

from aiohttp import web

from dynamo.common import lifecycle
from dynamo.runtime.request_plane import WorkerUnavailable

from . import openai_protocol as oai
from .chat_processor import ChatProcessor
from .model_registry import ModelRegistry
from .preprocess_pool import PreprocessPool, PreprocessPoolError
from .worker_router import NoWorkerAvailable, WorkerRouter

logger = logging.getLogger(__name__)

MODELS_PATH = "/v1/models"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
HEALTH_PATH = "/health"

_HTTP_ERROR_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


class FrontendService:
    """The request path: validate, render, tokenise, route, stream back."""

    def __init__(
        self,
        registry: ModelRegistry,
        router: WorkerRouter,
        preprocess_pool: PreprocessPool | None = None,
    ) -> None:
        self.registry = registry
        self.router = router
        self.preprocess_pool = preprocess_pool
        self.in_flight = 0  # chat requests admitted and not finished (reported when draining)

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[openai_error_middleware])
        app.router.add_get(MODELS_PATH, self.handle_models)
        app.router.add_post(CHAT_COMPLETIONS_PATH, self.handle_chat_completions)
        app.router.add_get(HEALTH_PATH, self.handle_health)
        return app

    async def handle_health(self, request: web.Request) -> web.Response:
        phase = lifecycle.current_phase()
        # A preprocess pool whose rebuild failed will never tokenise again: the pod must leave
        # the load balancer (readiness) rather than answer 503 to every request. A pool being
        # rebuilt is still ready: it is back in seconds, and its requests fail fast meanwhile.
        pool = self.preprocess_pool
        ready = phase is lifecycle.Phase.SERVING and (pool is None or pool.healthy)
        # The same shape as the worker's system server, plus the number of servable models
        # (and the pool's state when there is one).
        body = {
            "status": "ready" if ready else "notready",
            "phase": phase.value,
            "models": len(self.registry.entries()),
        }
        if pool is not None:
            body["preprocess_pool"] = pool.state
        return web.json_response(body, status=200 if ready else 503)

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            oai.model_list((entry.name, entry.created) for entry in self.registry.entries())
        )

    async def _encode(self, processor: ChatProcessor, prompt: str) -> list[int]:
        if self.preprocess_pool is None:
            return processor.encode(prompt)
        try:
            return await self.preprocess_pool.encode(prompt)
        except PreprocessPoolError as exc:  # the pool logs its own breakage, once
            raise oai.service_unavailable(str(exc), code="preprocess_unavailable") from exc

    async def handle_chat_completions(self, request: web.Request) -> web.StreamResponse:
        if lifecycle.current_phase() is lifecycle.Phase.DRAINING:
            raise oai.service_unavailable("the frontend is shutting down", code="draining")
        try:
            body = json.loads(await request.read())
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise oai.invalid_request(f"request body is not valid JSON: {exc}", code="invalid_json")
        chat = oai.parse_chat_request(body)
        self.in_flight += 1
        try:
            return await self._serve_chat(request, chat)
        finally:
            self.in_flight -= 1

    async def _serve_chat(
        self, request: web.Request, chat: oai.ChatCompletionRequest
    ) -> web.StreamResponse:
        entry = self.registry.get(chat.model)
        if entry is None:
            raise oai.model_not_found(chat.model)
        prompt_ids = await self._encode(entry.processor, entry.processor.render(chat.messages))
        completion_id = oai.new_completion_id()
        plane_request = {
            "request_id": completion_id,
            "model": chat.model,
            "token_ids": prompt_ids,
            "sampling": {"max_tokens": chat.max_tokens},  # request plane v2 (H10f: full fields)
        }
        try:
            first, stream = await self.router.open_stream(entry, plane_request)
        except NoWorkerAvailable as exc:
            raise oai.service_unavailable(str(exc), detail=exc.detail) from exc
        generation = Generation(
            chat, entry.processor, completion_id, len(prompt_ids), first, stream
        )
        try:
            if chat.stream:
                return await self._stream(request, generation)
            return await self._complete(generation)
        finally:
            # Whatever ended the handler (done, client gone, cancelled), the worker's stream is
            # closed, which closes its connection and aborts the request in the worker.
            await stream.aclose()

    async def _complete(self, generation: "Generation") -> web.Response:
        token_ids: list[int] = []
        try:
            item = generation.first
            while True:
                token_ids.extend(item.get("token_ids", ()))
                if "finish_reason" in item:
                    break
                item = await generation.stream.__anext__()
        except (WorkerUnavailable, StopAsyncIteration) as exc:  # logged by the middleware
            raise oai.service_unavailable(
                f"the worker failed during request {generation.completion_id}: {exc}"
            ) from exc
        detokenizer = generation.processor.detokenizer()
        return web.json_response(
            oai.chat_completion(
                completion_id=generation.completion_id,
                model=generation.chat.model,
                content=detokenizer.add(token_ids) + detokenizer.finish(),
                finish_reason=item["finish_reason"],
                usage=generation.usage(item, len(token_ids)),
            )
        )

    async def _stream(self, request: web.Request, generation: "Generation") -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        created = int(time.time())

        def chunk(delta: dict, finish_reason: str | None = None, **extra) -> dict:
            return oai.chat_completion_chunk(
                completion_id=generation.completion_id,
                created=created,
                model=generation.chat.model,
                delta=delta,
                finish_reason=finish_reason,
                **extra,
            )

        detokenizer = generation.processor.detokenizer()
        streamed = 0
        try:
            await send_event(response, chunk({"role": "assistant", "content": ""}))
            item = generation.first
            while True:
                token_ids = item.get("token_ids", ())
                streamed += len(token_ids)
                text = detokenizer.add(token_ids)
                if "finish_reason" in item:
                    text += detokenizer.finish()
                    if text:
                        await send_event(response, chunk({"content": text}))
                    await send_event(response, chunk({}, item["finish_reason"]))
                    if generation.chat.include_usage:
                        usage = generation.usage(item, streamed)
                        await send_event(response, chunk({}, with_choice=False, usage=usage))
                    break
                if text:
                    await send_event(response, chunk({"content": text}))
                try:
                    item = await generation.stream.__anext__()
                except (WorkerUnavailable, StopAsyncIteration) as exc:
                    # Headers are gone: the failure travels in-band, then the stream ends.
                    logger.warning(
                        "Worker failed mid-stream %s: %s", generation.completion_id, exc
                    )
                    error = oai.service_unavailable(f"the worker failed during the stream: {exc}")
                    await send_event(response, error.body())
                    break
            await send_event(response, "[DONE]")
            await response.write_eof()
        except ConnectionResetError:
            # The client closed its connection; the caller's finally aborts the worker's side.
            logger.info("Client went away mid-stream: request %s aborted", generation.completion_id)
        except asyncio.CancelledError:
            logger.info("Request %s cancelled mid-stream: aborted", generation.completion_id)
            raise
        return response


@dataclass
class Generation:
    """One admitted request: what the client asked, and the worker stream answering it."""

    chat: oai.ChatCompletionRequest
    processor: ChatProcessor
    completion_id: str
    prompt_tokens: int
    first: dict
    stream: AsyncGenerator[dict, None]

    def usage(self, final: dict, completion_tokens: int) -> dict:
        # The worker's counts when it sends them (the request plane's final item does).
        return oai.usage(
            final.get("prompt_tokens", self.prompt_tokens),
            final.get("completion_tokens", completion_tokens),
        )


async def send_event(response: web.StreamResponse, payload: dict | str) -> None:
    """One server-sent event: ``data: <json>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())


@web.middleware
async def openai_error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Answer every error in the OpenAI shape, including aiohttp's own 404/405/413."""
    try:
        return await handler(request)
    except oai.ApiError as exc:
        if exc.status >= 500:  # the one line a failed request logs (see the module docstring)
            logger.warning(
                "%s %s -> %d %s: %s",
                request.method,
                request.path,
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
    except Exception:
        logger.exception("%s %s failed", request.method, request.path)
        return web.json_response(
            oai.error_body("internal error in the frontend", type="server_error"), status=500
        )
