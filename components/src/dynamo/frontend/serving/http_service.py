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
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from aiohttp import web

from dynamo.common.http_server import FRONTEND_MAX_BODY_BYTES
from dynamo.common.request_drain import mark_stream
from dynamo.frontend.openai import protocol as oai
from dynamo.frontend.openai.fields import FieldRefused, UnknownFieldLog
from dynamo.frontend.openai.prompt_budget import (
    completion_budget,
    prompt_within_context,
    refused_param,
    token_ids_within_vocabulary,
    truncated_prompt,
)
from dynamo.frontend.openai.request_body import expect_handler, read_json_body
from dynamo.frontend.openai.responses import (
    ChatResponder,
    CompletionResponder,
    Responder,
    send_event,
)
from dynamo.frontend.openai.tools import check_tool_choice
from dynamo.frontend.parsing.output_parser import OutputParser
from dynamo.frontend.parsing.parsed_output import (
    adjust_for_parsers,
    decide_grammar_start,
    output_parser,
)
from dynamo.frontend.processors.chat_processor import (
    ChatTemplateError,
    NoChatTemplate,
    OutOfVocabulary,
)
from dynamo.frontend.processors.hf_processor import ChatTemplateFailed
from dynamo.frontend.processors.preprocess_pool import PreprocessPool
from dynamo.frontend.processors.preprocessing import Preprocessing
from dynamo.frontend.processors.template_sandbox import TemplateLimitExceeded, TemplateSandbox
from dynamo.frontend.routing.model_registry import ModelEntry, ModelRegistry
from dynamo.frontend.routing.worker_router import LOG_INTERVAL_S, NoWorkerAvailable, WorkerRouter
from dynamo.runtime import peer_text
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.request_plane import (
    GenerateRequest,
    RequestRefused,
    StreamItem,
    WorkerUnavailable,
)
from dynamo.runtime.sampling import SamplingOptions
from dynamo_gc import lifecycle

from . import request_metrics as rm
from .choices import (
    Choice,
    child_sampling,
    choice_chunks,
    close_all,
    merged,
    new_choice,
    open_all,
    usage,
    whole_body,
)
from .generation import Generation
from .http_surface import (
    TEMPLATE_ERROR_LIMIT,
    bad_worker_response,
    failure_log,
    openai_errors,
    template_failed,
    worker_failure,
)
from .probes import Probes
from .request_metrics import RequestMetrics, RequestTrack

logger = logging.getLogger(__name__)


MODELS_PATH = "/v1/models"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class FrontendService:
    """The request path: validate, render, tokenise, route, stream back."""

    def __init__(
        self,
        registry: ModelRegistry,
        router: WorkerRouter,
        preprocess_pool: PreprocessPool | None = None,
        request_metrics: RequestMetrics | None = None,
        *,
        template_sandbox: TemplateSandbox | None = None,
        ready_min_models: int = 1,
        strict_request_fields: bool = False,
    ) -> None:
        self.registry = registry
        # dynamo_frontend_*: on the process's registry when given (served on /metrics).
        self.request_metrics = request_metrics or RequestMetrics()
        # Unknown request fields: a 400 naming them, or accepted with a budgeted WARNING.
        self.strict_request_fields = strict_request_fields
        self.unknown_fields = UnknownFieldLog()
        self.router = router
        self.preprocess_pool = preprocess_pool
        # /live and /health; main hands it the discovery watcher once there is one.
        self.probes = Probes(registry, preprocess_pool, ready_min_models)
        self.in_flight = 0  # completion requests admitted and not finished (logged when draining)
        self.failures = failure_log()
        # A request a worker refused (the client's 400): the worker's words go to the log only.
        self.refusals = CauseBudgets(logger, logging.INFO, lines=1, interval_s=LOG_INTERVAL_S)
        # Clients hanging up mid-stream: normal one at a time, and a flood must not flood the log.
        self.hangups = CauseBudgets(logger, logging.INFO, lines=1, interval_s=LOG_INTERVAL_S)
        # Rendering and tokenising, never on the event loop.
        self.preprocessing = Preprocessing(preprocess_pool, template_sandbox)
        self._off_loop = self.preprocessing.run

    def close(self) -> None:
        self.preprocessing.close()

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
        self.probes.add_routes(app)
        return app

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            oai.model_list((entry.name, entry.created) for entry in self.registry.entries())
        )

    async def _encode(
        self, entry: ModelEntry, prompt: str, req: oai._SamplingRequest, *, chat: bool
    ) -> list[int]:
        """The prompt's ids; special tokens added as the request says (vLLM's defaults: not
        for a chat, whose template wrote them, but for a completion's text)."""
        special = req.add_special_tokens if req.add_special_tokens is not None else not chat
        param = "messages" if chat else "prompt"
        prompt_within_context(prompt, entry.card.context_length, param=param, chat=chat)
        return await self.preprocessing.encode(entry.processor, prompt, add_special_tokens=special)

    def _entry(self, model: str, track: RequestTrack) -> ModelEntry:
        entry = self.registry.get(model)
        if entry is not None:
            track.served(entry.name)  # the registry's name, never the client's string
        else:
            if self.registry.known(model):  # being loaded, or its last instance just went
                raise oai.service_unavailable(
                    f"the model `{model}` has no live worker instance right now"
                )
            raise oai.model_not_found(model)
        return entry

    def _label_by_body(self, body: Any, track: RequestTrack) -> None:
        """Count a request refused before its model was looked up under that model, if the
        body names one the registry serves (never the client's raw string)."""
        model = body.get("model") if isinstance(body, dict) else None
        entry = self.registry.get(model) if isinstance(model, str) else None
        if entry is not None:
            track.served(entry.name)

    async def _admitted(
        self, request: web.Request, parse: Callable[..., Any], endpoint: str, track: RequestTrack
    ) -> tuple[Any, ModelEntry]:
        """The request, parsed (its unknown fields refused or logged), and its model's entry
        (not while draining)."""
        if lifecycle.current_phase() is lifecycle.Phase.DRAINING:
            raise oai.service_unavailable("the frontend is shutting down", code="draining")
        body = await read_json_body(request)
        try:
            parsed = parse(body, strict_fields=self.strict_request_fields)
        except oai.ApiError:
            # A 400 from the field rules (n=2 with temperature 0, say) counts under the model
            # the body names, when the registry serves it, as every later 400 does.
            self._label_by_body(body, track)
            raise
        self.unknown_fields.seen(endpoint, parsed.unknown_fields)
        track.stream = bool(parsed.stream)
        return parsed, self._entry(parsed.model, track)

    async def handle_chat_completions(self, request: web.Request) -> web.StreamResponse:
        with self.request_metrics.request(rm.ENDPOINT_CHAT) as track:
            chat, entry = await self._admitted(request, oai.parse_chat_request, "chat", track)
            try:
                check_tool_choice(
                    chat.tools,
                    chat.tool_choice,
                    parses_tool_calls=entry.processor.parses_tool_calls,
                )
                if hasattr(entry.processor.output_parser, "adjusted"):
                    # vLLM's parsers build a grammar here: off the loop, as rendering is.
                    await self._off_loop(adjust_for_parsers, entry.processor.output_parser, chat)
            except FieldRefused as exc:
                raise oai.invalid_request(exc.message, param=exc.param, code=exc.code) from None
            try:
                prompt = await self.preprocessing.render_chat(entry.processor, chat)
            except TemplateLimitExceeded as exc:
                raise oai.service_unavailable(str(exc), code="chat_template_limit") from None
            except NoChatTemplate as exc:
                raise oai.invalid_request(
                    str(exc), param="messages", code="no_chat_template"
                ) from None
            except ChatTemplateError as exc:
                # The text is the peer template's (raise_exception) or a library's: bounded and
                # escaped like any peer text, so a template cannot answer megabytes.
                raise oai.invalid_request(
                    "the model's chat template rejected the messages: "
                    + peer_text.escape(exc, limit=TEMPLATE_ERROR_LIMIT),
                    param="messages",
                    code="chat_template_error",
                ) from None
            except ChatTemplateFailed as exc:
                raise template_failed(entry.name, exc) from None
            prompt_ids = await self._encode(entry, prompt, chat, chat=True)
            if chat.structured_field is not None:
                # Whether its grammar waits for the reasoning to end (vLLM's parsers are built
                # for it: off the loop).
                await self._off_loop(
                    decide_grammar_start, entry.processor.output_parser, chat, prompt_ids
                )
            # One parser per choice: each parses its own text (it is given the prompt's ids,
            # as vLLM's server gives its parsers).
            parsers = [
                output_parser(entry.processor.output_parser, chat, prompt_ids)
                for _ in range(chat.choices)
            ]
            return await self._serve(
                request, entry, chat, prompt_ids, "messages", ChatResponder, track, parsers, prompt
            )

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        with self.request_metrics.request(rm.ENDPOINT_COMPLETIONS) as track:
            completion, entry = await self._admitted(
                request, oai.parse_completion_request, "completion", track
            )
            if isinstance(completion.prompt, str):
                prompt_ids = await self._encode(entry, completion.prompt, completion, chat=False)
            else:
                prompt_ids = [int(token_id) for token_id in completion.prompt]  # as validated
                try:
                    entry.processor.check_token_ids(prompt_ids)
                except OutOfVocabulary as exc:
                    raise oai.invalid_request(str(exc), param="prompt") from None
            return await self._serve(
                request, entry, completion, prompt_ids, "prompt", CompletionResponder, track
            )

    async def _serve(
        self,
        request: web.Request,
        entry: ModelEntry,
        req: oai._SamplingRequest,
        prompt_ids: list[int],
        prompt_param: str,
        responder_class: type[Responder],
        track: RequestTrack,
        parsers: Sequence[OutputParser | None] = (),
        prompt_text: str = "",
    ) -> web.StreamResponse:
        sent = prompt_ids
        prompt_ids = truncated_prompt(req, prompt_ids, entry.card.context_length)
        echo = ""
        if isinstance(req, oai.CompletionRequest) and req.echo:  # the prompt as sent, if text
            text = req.prompt if isinstance(req.prompt, str) and prompt_ids is sent else None
            echo = entry.processor.tokenizer.decode(prompt_ids) if text is None else text
        max_tokens = completion_budget(req, entry.card, len(prompt_ids), prompt_param)
        token_ids_within_vocabulary(req, entry.processor.max_token_id)
        responder = responder_class(req.model, oai.new_completion_id(responder_class.ID_PREFIX))
        responder.return_prompt(*req.returned_prompt(prompt_ids, prompt_text))
        responder.echo = req.echoed_content() if isinstance(req, oai.ChatCompletionRequest) else ""
        responder.role = getattr(req, "response_role", responder.role)  # a chat's: its role
        sampling = req.sampling(max_tokens, entry.card.eos_token_ids)
        self.in_flight += 1
        track.sent(len(prompt_ids))
        choices: list[Choice] = []
        streams: list[AsyncGenerator[StreamItem, None]] = []
        try:
            try:
                opened = await open_all(
                    self._open(entry, req, responder, prompt_ids, prompt_param, sampling, index)
                    for index in range(req.choices)  # type: ignore[attr-defined]  # ChoicesFields
                )
                streams = [stream for _, stream in opened]
                for index, (first, stream) in enumerate(opened):
                    parser = parsers[index] if index < len(parsers) else None
                    generation = Generation(
                        entry.processor, sampling, len(prompt_ids), first, stream,
                        skip_special_tokens=req.skip_special_tokens is not False,
                        spaces_between_special_tokens=req.spaces_between_special_tokens,
                        include_stop_str_in_output=req.include_stop_str_in_output is True,
                        echo=echo, prompt_ids=prompt_ids, eos_ids=entry.card.eos_token_ids,
                        keep_token_ids=req.returns_token_ids(parser is not None),
                        echo_only=getattr(req, "echo_only", False),
                    )  # fmt: skip
                    choices.append(
                        new_choice(
                            index, req, entry.processor, responder, generation, stream, parser
                        )
                    )
                if req.stream:
                    return await self._stream(request, responder, choices, req.include_usage, track)
                return await self._complete(responder, choices, track)
            finally:
                # Whatever ended the handler (done, a stop string, the request's limits, client
                # gone, cancelled), every worker's stream is closed, which closes its
                # connection and aborts the request in the worker.
                await close_all(streams)
        finally:
            self.in_flight -= 1

    async def _open(
        self,
        entry: ModelEntry,
        req: oai._SamplingRequest,
        responder: Responder,
        prompt_ids: list[int],
        prompt_param: str,
        sampling: SamplingOptions,
        index: int,
    ) -> tuple[StreamItem, AsyncGenerator[StreamItem, None]]:
        """Choice ``index``'s stream, opened (its first item read)."""
        # Built, not validated again: the ids are the tokenizer's (or checked against the
        # vocabulary), the sampling options a validated model.
        plane_request = GenerateRequest.model_construct(
            request_id=responder.completion_id + (f"-{index}" if index else ""),
            model=entry.card.served_model_name,
            token_ids=prompt_ids,
            sampling=child_sampling(sampling, index),
        )
        try:
            return await self.router.open_stream(
                entry, plane_request, max_token_id=entry.processor.max_token_id
            )
        except NoWorkerAvailable as exc:
            if exc.bad_answers:
                raise bad_worker_response(str(exc), exc.detail) from exc
            raise oai.service_unavailable(str(exc), detail=exc.detail) from exc
        except RequestRefused as exc:  # the engine's own check: the client's 400
            param = refused_param(exc.field, prompt_param)
            if param == "structured_outputs":  # set by response_format, tool_choice, ...
                param = req.structured_field or param
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

    async def _complete(
        self, responder: Responder, choices: list[Choice], track: RequestTrack
    ) -> web.Response:
        try:
            async with merged(choices) as pieces:
                async for choice, piece, _ in pieces:
                    track.tokens(sum(c.generation.completion_tokens for c in choices))
                    if piece is not None:
                        choice.pieces.append(piece)
        except (WorkerUnavailable, StopAsyncIteration) as exc:  # logged by the middleware
            raise worker_failure(exc, responder.completion_id) from exc
        return web.json_response(whole_body(responder, choices))

    async def _stream(
        self,
        request: web.Request,
        responder: Responder,
        choices: list[Choice],
        include_usage: bool,
        track: RequestTrack,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        mark_stream(request, response)  # a drain that cuts it short ends it with an error event
        try:
            for opening in responder.openings(len(choices)):
                await send_event(response, opening)
            try:
                async with merged(choices) as pieces:
                    async for choice, piece, last in pieces:
                        track.tokens(sum(c.generation.completion_tokens for c in choices))
                        for chunk in choice_chunks(responder, choice, piece, last):
                            await send_event(response, chunk)
                if include_usage:
                    await send_event(response, responder.usage(usage(choices)))
            except (WorkerUnavailable, StopAsyncIteration) as exc:
                # Headers are gone: the failure travels in-band, then the stream ends.
                error = worker_failure(exc, responder.completion_id)
                track.fail(rm.error_type(error.status))
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
            track.answered = True
        except ConnectionResetError:
            # The client closed its connection; the caller's finally aborts the worker's side.
            track.fail(rm.CANCELLED)
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
