"""A request's choices (``n``): each one a request-plane request of its own, as vLLM's parallel
sampling makes ``n`` child requests (``vllm/v1/engine/parallel_sampling.py``).

Child ``i`` gets the request's sampling options with the seed ``seed + i`` when a seed was
given (vLLM's rule), and is routed like any request (the router may send the children to
different instances of the model: each is a complete request on its own). Every choice has
its own text, stop handling, finish reason, parsed output and logprobs; the usage counts the
prompt once and sums the completion tokens, as vLLM does. The first child to fail fails the
request, as a single request's failure would; leaving (done, failed, client gone) closes every
child's stream, which aborts it in its worker.

``n`` is bounded (:data:`dynamo.frontend.openai.choice_fields.MAX_N`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Coroutine,
    Iterable,
    Sequence,
)
from dataclasses import dataclass
from typing import Any

from dynamo.frontend.openai import protocol as oai
from dynamo.frontend.openai.logprobs import LogprobsFormatter, attach, formatter, prompt_logprobs
from dynamo.frontend.openai.responses import ChatResponder, Responder
from dynamo.frontend.parsing.output_parser import OutputParser
from dynamo.frontend.parsing.parsed_output import ParsedOutput
from dynamo.runtime.request_plane import StreamItem
from dynamo.runtime.sampling import SamplingOptions

from .generation import Generation


def child_sampling(sampling: SamplingOptions, index: int) -> SamplingOptions:
    """Choice ``index``'s sampling options: the seed ``seed + index``, as vLLM's children."""
    if sampling.seed is None or index == 0:
        return sampling
    return sampling.model_copy(update={"seed": sampling.seed + index})


@dataclass
class Choice:
    index: int
    generation: Generation
    stream: AsyncGenerator[StreamItem, None]
    parsed: ParsedOutput | None
    logprobs: LogprobsFormatter | None
    pieces: list[str]
    # vLLM's prompt_logprobs (a whole response's, when asked for).
    prompt: list[dict[str, dict[str, Any]] | None] | None = None
    finished: bool = False  # its stream's finishing chunk was sent

    def shown_logprobs(self) -> dict[str, Any] | None:
        """The logprobs of the tokens counted since the last call, in the endpoint's shape."""
        if self.logprobs is None:
            return None
        return self.logprobs.format(self.generation.take_logprobs())


async def close_all(streams: Sequence[AsyncGenerator[StreamItem, None]]) -> None:
    """Close every stream (each close aborts its request in the worker), all of them even when
    the caller is cancelled meanwhile (the closing goes on, shielded) or one close fails."""
    await _finish(_close_each(streams))


async def open_all(
    opens: Iterable[Awaitable[tuple[StreamItem, AsyncGenerator[StreamItem, None]]]],
) -> list[tuple[StreamItem, AsyncGenerator[StreamItem, None]]]:
    """Every choice's stream, opened together (each waits for its first item). The first
    failure is the request's: the choices still opening are cancelled (each closes its own
    stream) and those already open are closed, at once; so are they all when the caller is
    cancelled (a client gone) while they open."""
    tasks = [asyncio.ensure_future(open_) for open_ in opens]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failures = [task.exception() for task in tasks if task in done]  # in index order
        failure = next((f for f in failures if f is not None), None)
        if failure is not None:
            raise failure
        return [task.result() for task in tasks]
    except BaseException:
        for task in tasks:
            task.cancel()
        await _finish(_discard(tasks))
        raise


async def _close_each(streams: Sequence[AsyncGenerator[StreamItem, None]]) -> None:
    results = await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _discard(tasks: Sequence[asyncio.Future]) -> None:
    """Wait for every opening to end (cancelled ones close their own stream), then close the
    streams that did open."""
    await asyncio.gather(*tasks, return_exceptions=True)
    opened = [t.result()[1] for t in tasks if not t.cancelled() and t.exception() is None]
    await _close_each(opened)


_finishing: set[asyncio.Future] = set()  # closings in flight (the loop holds tasks weakly)


async def _finish(closing: Coroutine[Any, Any, None]) -> None:
    """Run ``closing`` to its end even if the caller is cancelled while waiting for it."""
    task = asyncio.ensure_future(closing)
    _finishing.add(task)
    task.add_done_callback(_finishing.discard)
    await asyncio.shield(task)


@contextlib.asynccontextmanager
async def merged(
    choices: Sequence[Choice],
) -> AsyncIterator[AsyncIterator[tuple[Choice, str | None, bool]]]:
    """The choices' text pieces as they come, ``(choice, piece, last)`` (``last``: the output
    ends with this piece), with ``(choice, None, True)`` once a choice is done; the first
    failure (WorkerUnavailable, a stream that ended) is raised. Leaving the context stops every
    reader before the caller closes the streams."""
    if len(choices) == 1:  # no reader task: the one stream is read where it is consumed
        async with contextlib.aclosing(_single(choices[0])) as single:
            yield single
        return
    queue: asyncio.Queue[tuple[Choice, str | None, bool, Exception | None]] = asyncio.Queue(
        maxsize=2 * len(choices)
    )

    async def read(choice: Choice) -> None:
        try:
            async for piece in choice.generation.pieces():
                # Whether it is the last is read now: the reader runs ahead of the consumer.
                await queue.put((choice, piece, _ended(choice), None))
        except Exception as exc:  # noqa: BLE001 - the consumer raises it (see the docstring)
            await queue.put((choice, None, True, exc))
        else:
            await queue.put((choice, None, True, None))

    async def consume() -> AsyncGenerator[tuple[Choice, str | None, bool], None]:
        done = 0
        while done < len(choices):
            choice, piece, last, failure = await queue.get()
            if failure is not None:
                raise failure
            done += piece is None
            yield choice, piece, last

    readers = [asyncio.ensure_future(read(choice)) for choice in choices]
    try:
        async with contextlib.aclosing(consume()) as pieces:
            yield pieces
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def _single(choice: Choice) -> AsyncGenerator[tuple[Choice, str | None, bool], None]:
    async for piece in choice.generation.pieces():
        yield choice, piece, _ended(choice)
    yield choice, None, True


def _ended(choice: Choice) -> bool:
    """Whether the piece the choice's generation just yielded is its output's last (it sets
    its finish reason before yielding that one)."""
    return choice.generation.finish_reason is not None


def usage(choices: Sequence[Choice]) -> dict:
    """vLLM's usage of n choices: the prompt once, the completion tokens summed."""
    return oai.usage(
        choices[0].generation.prompt_tokens, sum(c.generation.completion_tokens for c in choices)
    )


def new_choice(
    index: int,
    req: Any,
    processor: Any,
    responder: Responder,
    generation: Generation,
    stream: AsyncGenerator[StreamItem, None],
    parser: OutputParser | None,
) -> Choice:
    """Choice ``index`` of a request, reading ``generation`` (its stream's)."""
    parsed = None
    # Tool calls and reasoning parsed out of a chat's text (ChatResponder only).
    if parser is not None and isinstance(responder, ChatResponder):
        field = getattr(processor, "reasoning_field", "reasoning_content")
        choice = getattr(req, "tool_choice", None)
        parsed = ParsedOutput(
            parser,
            responder,
            index,
            reasoning_field=field,
            vllm_message=getattr(processor, "answers_as_vllm", False),
            forced=bool(getattr(req, "tools", None)) and choice not in (None, "none", "auto"),
        )
    logprobs = formatter(req, processor, chat=isinstance(responder, ChatResponder))
    if parsed is not None and getattr(req, "include_reasoning", None) is False:
        logprobs = None  # vLLM hides them with the reasoning (their token strings would show it)
    if logprobs is not None:
        logprobs.prompt_positions = generation.echoed_positions()
    prompt = None
    positions, ranks = generation.prompt_logprobs()
    if positions is not None and not req.stream:  # vLLM streams none
        prompt = prompt_logprobs(processor, positions, ranks)
    return Choice(index, generation, stream, parsed, logprobs, [], prompt)


def whole_body(responder: Responder, choices: Sequence[Choice]) -> dict:
    """The non-streamed response of every choice, read whole."""
    bodies = []
    for choice in choices:
        text, reason = "".join(choice.pieces), choice.generation.finish_reason or "stop"
        if choice.parsed is not None:
            body = choice.parsed.whole_choice(text, reason)
        else:
            body = responder.whole_choice(text, reason, choice.index)
        if choice.logprobs is not None:
            body["logprobs"] = choice.shown_logprobs()
        chat = isinstance(responder, ChatResponder)
        if choice.prompt is not None and not chat:  # vLLM: each completion choice's
            body["prompt_logprobs"] = choice.prompt
        if choice.generation.token_ids is not None:  # return_token_ids
            body["token_ids"] = choice.generation.token_ids
        body["stop_reason"] = choice.generation.stop_reason  # vLLM's, null when none
        bodies.append(body)
    whole = responder.envelope(responder.OBJECT, bodies, usage(choices))
    if choices[0].prompt is not None and isinstance(responder, ChatResponder):
        whole["prompt_logprobs"] = choices[0].prompt  # vLLM: the response's, once
    return whole


def choice_chunks(
    responder: Responder, choice: Choice, piece: str | None, last: bool = False
) -> list[dict]:
    """The chunks of one choice's piece of text (``last``: the output ends with it; None: the
    choice is done). The output's end (what the parser held back, then the finish reason and
    stop reason) rides the last piece's chunk, as vLLM sends it; a chunk of its own when that
    piece showed nothing."""
    if choice.finished:
        return []
    chunks = [] if piece is None else _piece_chunks(responder, choice, piece)
    if piece is not None and not last:
        return chunks
    choice.finished = True
    parsed, generation = choice.parsed, choice.generation
    if parsed is not None:
        chunks += parsed.closing_chunks()
    reason = generation.finish_reason or "stop"
    if parsed is not None:
        reason = parsed.finish_reason(reason)
    if not chunks:
        chunks = [with_ids(responder.finish(reason, choice.index), generation)]
    ending = chunks[-1]["choices"][0]
    ending["finish_reason"], ending["stop_reason"] = reason, generation.stop_reason
    return chunks


def _piece_chunks(responder: Responder, choice: Choice, piece: str) -> list[dict]:
    shown = choice.shown_logprobs()
    ids = choice.generation.take_token_ids()  # None unless return_token_ids
    if not piece and not shown and not ids:
        return []
    parsed = choice.parsed
    chunk = responder.piece(piece, choice.index) if parsed is None else parsed.chunk(piece)
    if chunk is None and (shown or ids):  # held back by the parser: they go all the same
        chunk = responder.piece("", choice.index)
    return [] if chunk is None else [with_ids(attach(chunk, shown), choice.generation, ids)]


def with_ids(chunk: dict, generation: Generation, ids: list[int] | None = None) -> dict:
    """The chunk with its choice's ``token_ids`` (those since the last chunk), as vLLM's
    ``return_token_ids`` puts them; as it was when they are not returned."""
    ids = generation.take_token_ids() if ids is None else ids
    if ids is not None:
        chunk["choices"][0]["token_ids"] = ids
    return chunk
