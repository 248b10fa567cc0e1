"""The OpenAI-compatible HTTP service: routes, request handling, streaming, error shapes.

Every failure a client can see is answered in OpenAI's error shape with a status that says whose
fault it is: 400 bad request, 404 unknown model, 503 no worker (or draining; also a model that
is known but has no live instance right now), 502 a worker whose answer broke the request
plane's wire format. A worker that dies mid-stream ends the stream with an error event, never
with silence. What a client is told about a worker's failure is generic: it names no instance
or address and quotes no worker text (docs/security.md); the log line has the detail.

A failed request logs at most one line, at WARNING: the error middleware's for a 5xx answered
before the stream started, the stream's own once the headers are gone. The code below raises, it
does not log too; and those lines are budgeted per cause (one per :data:`LOG_INTERVAL_S`, the
next counting those held back), so an outage costs a few lines a minute, not one per request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

from dynamo.common import lifecycle
from dynamo.common.http_server import FRONTEND_MAX_BODY_BYTES
from dynamo.common.request_drain import mark_stream
from dynamo.runtime import peer_text
from dynamo.runtime.discovery import RecordWatcher
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.model_card import ModelCard
from dynamo.runtime.request_plane import (
    GenerateRequest,
    RequestRefused,
    WorkerUnavailable,
)

from . import openai_protocol as oai
from .chat_processor import (
    ChatTemplateError,
    ModelFilesError,
    NoChatTemplate,
    OutOfVocabulary,
)
from .generation import Generation
from .http_surface import bad_worker_response, failure_log, openai_errors, worker_failure
from .model_registry import ModelEntry, ModelRegistry
from .preprocess_pool import PreprocessPool, PreprocessPoolError
from .request_body import expect_handler, read_json_body
from .responses import ChatResponder, CompletionResponder, Responder, send_event
from .worker_router import LOG_INTERVAL_S, NoWorkerAvailable, WorkerRouter

logger = logging.getLogger(__name__)


MODELS_PATH = "/v1/models"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
HEALTH_PATH = "/health"
LIVE_PATH = "/live"
# Threads that render chat templates and tokenise in this process (tokenising goes to the
# preprocess pool instead when there is one): never the event loop, so /health and the streams
# in flight are served while a 1 MB prompt is processed. Bounded: more requests wait their turn.
PREPROCESS_THREADS = 4
# What a client is told when the model's preprocessing cannot run, by the pool's state (the
# detail, which may name a path on this host or a library's words, goes to the log).
PREPROCESS_UNAVAILABLE = {
    "rebuilding": "the model's preprocessing is being rebuilt after a process died; retry shortly",
    "failed": "the model's preprocessing is down",
}
PREPROCESS_UNAVAILABLE_OTHERWISE = "the model's preprocessing is unavailable right now; retry later"

T = TypeVar("T")


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
        self.in_flight = 0  # completion requests admitted and not finished (logged when draining)
        self.failures = failure_log()
        # A request a worker refused (the client's 400): the worker's words go to the log only.
        self.refusals = CauseBudgets(logger, logging.INFO, lines=1, interval_s=LOG_INTERVAL_S)
        # Clients hanging up mid-stream: normal one at a time, and a flood must not flood the log.
        self.hangups = CauseBudgets(logger, logging.INFO, lines=1, interval_s=LOG_INTERVAL_S)
        # The discovery watcher (set by main): /health reports its state, and is not ready
        # before its first look at the store.
        self.discovery_watcher: RecordWatcher | None = None
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=PREPROCESS_THREADS, thread_name_prefix="preprocess"
        )

    def close(self) -> None:
        """Stop the preprocessing threads (work queued and not started is dropped)."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _off_loop(self, work: Callable[..., T], *args) -> T:
        """``work(*args)`` on a preprocessing thread (see :data:`PREPROCESS_THREADS`)."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, work, *args)

    def build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[openai_errors(self.failures)], client_max_size=FRONTEND_MAX_BODY_BYTES
        )
        app.router.add_get(MODELS_PATH, self.handle_models)
        app.router.add_post(
            CHAT_COMPLETIONS_PATH, self.handle_chat_completions, expect_handler=expect_handler
        )
        app.router.add_post(
            COMPLETIONS_PATH, self.handle_completions, expect_handler=expect_handler
        )
        app.router.add_get(HEALTH_PATH, self.handle_health)
        app.router.add_get(LIVE_PATH, self.handle_live)
        return app

    async def handle_live(self, request: web.Request) -> web.Response:
        """Liveness, as upstream Dynamo's frontend serves it on its HTTP port: 200 whenever the
        process answers, whatever the phase (``/health`` is readiness). An upstream manifest
        whose liveness probe asks the frontend for ``/live`` must not restart it in a loop."""
        return web.json_response({"status": "live", "phase": lifecycle.current_phase().value})

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
        watcher = self.discovery_watcher
        if watcher is not None and watcher.state != "ok":
            # Said only when it matters. "degraded" stays ready: the instances known are still
            # served; "connecting" (never reached the store yet) is not ready.
            body["discovery"] = watcher.state
            if watcher.state == "connecting":
                ready = False
                body["status"] = "notready"
        return web.json_response(body, status=200 if ready else 503)

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            oai.model_list((entry.name, entry.created) for entry in self.registry.entries())
        )

    async def _encode(self, entry: ModelEntry, prompt: str, *, chat: bool) -> list[int]:
        processor = entry.processor
        if self.preprocess_pool is None:
            encode = processor.encode_chat if chat else processor.encode_completion
            return await self._off_loop(encode, prompt)
        try:
            return await self.preprocess_pool.encode(
                processor.card, prompt, add_special_tokens=not chat
            )
        except PreprocessPoolError as exc:  # the pool logs its own breakage, once
            message = PREPROCESS_UNAVAILABLE.get(
                self.preprocess_pool.state, PREPROCESS_UNAVAILABLE_OTHERWISE
            )
            raise oai.service_unavailable(
                message, code="preprocess_unavailable", detail=str(exc)
            ) from exc
        except ModelFilesError as exc:  # the frontend loaded them: this host's files changed?
            # The detail names a path on this host and a library's words: the log's, not the
            # client's (docs/security.md).
            raise oai.service_unavailable(
                PREPROCESS_UNAVAILABLE_OTHERWISE,
                code="preprocess_unavailable",
                detail=f"a preprocess worker cannot load the tokenizer of "
                f"{peer_text.escape(processor.model)}: {exc}",
            ) from exc

    def _admit(self) -> None:
        if lifecycle.current_phase() is lifecycle.Phase.DRAINING:
            raise oai.service_unavailable("the frontend is shutting down", code="draining")

    def _entry(self, model: str) -> ModelEntry:
        entry = self.registry.get(model)
        if entry is None:
            if self.registry.known(model):  # being loaded, or its last instance just went
                raise oai.service_unavailable(
                    f"the model `{model}` has no live worker instance right now"
                )
            raise oai.model_not_found(model)
        return entry

    async def handle_chat_completions(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        chat = oai.parse_chat_request(await read_json_body(request))
        entry = self._entry(chat.model)
        try:
            prompt = await self._off_loop(entry.processor.render_chat, chat)
        except NoChatTemplate as exc:
            raise oai.invalid_request(str(exc), param="messages", code="no_chat_template") from None
        except ChatTemplateError as exc:
            raise oai.invalid_request(
                f"the model's chat template rejected the messages: {exc}",
                param="messages",
                code="chat_template_error",
            ) from None
        prompt_ids = await self._encode(entry, prompt, chat=True)
        return await self._serve(request, entry, chat, prompt_ids, "messages", ChatResponder)

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        self._admit()
        completion = oai.parse_completion_request(await read_json_body(request))
        entry = self._entry(completion.model)
        if isinstance(completion.prompt, str):
            prompt_ids = await self._encode(entry, completion.prompt, chat=False)
        else:
            prompt_ids = [int(token_id) for token_id in completion.prompt]  # ids, as validated
            try:
                entry.processor.check_token_ids(prompt_ids)
            except OutOfVocabulary as exc:
                raise oai.invalid_request(str(exc), param="prompt") from None
        return await self._serve(
            request, entry, completion, prompt_ids, "prompt", CompletionResponder
        )

    async def _serve(
        self,
        request: web.Request,
        entry: ModelEntry,
        req: oai._SamplingRequest,
        prompt_ids: list[int],
        prompt_param: str,
        responder_class: type[Responder],
    ) -> web.StreamResponse:
        max_tokens = completion_budget(req, entry.card, len(prompt_ids), prompt_param)
        responder = responder_class(req.model, oai.new_completion_id(responder_class.ID_PREFIX))
        sampling = req.sampling(max_tokens, entry.card.eos_token_ids)
        # Built, not validated again: the ids are the tokenizer's (or checked against the
        # vocabulary), the sampling options a validated model.
        plane_request = GenerateRequest.model_construct(
            request_id=responder.completion_id,
            model=entry.card.served_model_name,
            token_ids=prompt_ids,
            sampling=sampling,
        )
        self.in_flight += 1
        try:
            try:
                first, stream = await self.router.open_stream(
                    entry, plane_request, max_token_id=entry.processor.max_token_id
                )
            except NoWorkerAvailable as exc:
                if exc.bad_answers:
                    raise bad_worker_response(str(exc), exc.detail) from exc
                raise oai.service_unavailable(str(exc), detail=exc.detail) from exc
            except RequestRefused as exc:  # the engine's own check: the client's 400
                param = refused_param(exc.field, prompt_param)
                self.refusals.emit(
                    "refused",
                    "Request %s refused by a worker of model %s (field %s): %s",
                    responder.completion_id,
                    peer_text.escape(entry.name),
                    peer_text.escape(exc.field),
                    exc,
                )
                raise oai.invalid_request(
                    f"the model's engine refused the request's `{param}`"
                    if param
                    else "the model's engine refused the request's sampling fields",
                    param=param,
                ) from None
            generation = Generation(entry.processor, sampling, len(prompt_ids), first, stream)
            try:
                if req.stream:
                    return await self._stream(request, responder, generation, req.include_usage)
                return await self._complete(responder, generation)
            finally:
                # Whatever ended the handler (done, a stop string, the request's limits, client
                # gone, cancelled), the worker's stream is closed, which closes its connection
                # and aborts the request in the worker.
                await stream.aclose()
        finally:
            self.in_flight -= 1

    async def _complete(self, responder: Responder, generation: Generation) -> web.Response:
        try:
            text = "".join([piece async for piece in generation.pieces()])
        except (WorkerUnavailable, StopAsyncIteration) as exc:  # logged by the middleware
            raise worker_failure(exc, responder.completion_id) from exc
        return web.json_response(
            responder.whole(text, generation.finish_reason or "stop", generation.usage())
        )

    async def _stream(
        self,
        request: web.Request,
        responder: Responder,
        generation: Generation,
        include_usage: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        mark_stream(request, response)  # a drain that cuts it short ends it with an error event
        try:
            opening = responder.opening()
            if opening is not None:
                await send_event(response, opening)
            try:
                async for piece in generation.pieces():
                    if piece:
                        await send_event(response, responder.piece(piece))
                await send_event(response, responder.finish(generation.finish_reason or "stop"))
                if include_usage:
                    await send_event(response, responder.usage(generation.usage()))
            except (WorkerUnavailable, StopAsyncIteration) as exc:
                # Headers are gone: the failure travels in-band, then the stream ends.
                error = worker_failure(exc, responder.completion_id)
                self.failures.emit(
                    ("mid-stream", error.status),
                    "Worker failed mid-stream %s (ended in-band as %d %s): %s",
                    responder.completion_id,
                    error.status,
                    error.code,
                    error.detail,
                )
                await send_event(response, error.body())
            await send_event(response, "[DONE]")
            await response.write_eof()
        except ConnectionResetError:
            # The client closed its connection; the caller's finally aborts the worker's side.
            self.hangups.emit(
                "went away",
                "Client went away mid-stream: request %s aborted",
                responder.completion_id,
            )
        except asyncio.CancelledError:
            self.hangups.emit(
                "cancelled", "Request %s cancelled mid-stream: aborted", responder.completion_id
            )
            raise
        return response


def refused_param(field: str, prompt_param: str) -> str | None:
    """The OpenAI field a worker's refusal is about: ``token_ids...`` is the prompt (or the
    messages it was rendered from), ``sampling.top_k`` is ``top_k`` (the request plane uses
    the OpenAI names), bare ``sampling`` is the sampling fields together (no one field)."""
    head, _, rest = field.partition(".")
    if head == "token_ids":
        return prompt_param
    return rest.split(".", 1)[0] or None


def completion_budget(
    req: oai._SamplingRequest, card: ModelCard, prompt_tokens: int, prompt_param: str
) -> int:
    """The ``max_tokens`` the worker gets: what the client asked for, or what is left of the
    model's context; a 400 (vLLM's wording) when the prompt, or prompt + max_tokens, does not
    fit."""
    context = card.context_length
    if prompt_tokens == 0:
        raise oai.invalid_request("the prompt is empty", param=prompt_param)
    if prompt_tokens >= context:
        raise oai.context_length_exceeded(
            context_length=context, prompt_tokens=prompt_tokens, param=prompt_param
        )
    room = context - prompt_tokens
    requested = req.requested_max_tokens
    if requested is None:
        max_tokens = room
    else:
        name, max_tokens = requested
        if max_tokens > room:
            raise oai.completion_too_long(
                context_length=context,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                param=name,
            )
    min_tokens = req.min_tokens or 0
    if min_tokens > max_tokens:
        raise oai.invalid_request(
            f"`min_tokens` ({min_tokens}) must be at most `max_tokens` ({max_tokens})",
            param="min_tokens",
        )
    return max_tokens
