"""One admitted request's output: the worker's token ids turned into the completion's text.

This is where the frontend reads what a worker streams, one request-plane item at a time. Each
item was validated by the request plane's client (:func:`dynamo.runtime.request_plane.generate`:
a typed item, its ids within the model's vocabulary); here the ids are detokenized with the
model's own tokenizer, and the request's own limits are enforced, whatever the worker does:
the completion ends at the first stop string or stop token id generated once ``min_tokens`` are
out (the frontend is authoritative for stop strings), and at ``max_tokens``
(:meth:`Generation._limit`).
The finish reason and token counts are the frontend's own: a worker's counts are not trusted.
A per-request output parser (tool calls, reasoning) is fed with the text pieces this yields.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

from dynamo.frontend.openai import protocol as oai
from dynamo.frontend.processors.chat_processor import ChatProcessor
from dynamo.runtime.request_plane import (
    Finish,
    LogprobPosition,
    StreamItem,
    WorkerProtocolError,
    WorkerUnavailable,
)
from dynamo.runtime.sampling import SamplingOptions

from .stop_strings import StopStringMatcher

# How long the end of a worker's stream may take after its finish line (the chunked answer's
# last bytes, sent at once by a worker that is done).
FINISH_END_S = 1.0


class Generation:
    """One admitted request's output: the worker's ids, detokenized, within the request's
    limits (``sampling``: what the worker was asked for).

    Ids are decoded one at a time, so the completion's token count stops at the token that
    ended it (a stop string, a stop token, ``max_tokens``) even when the worker sent several in
    one item; whatever the worker sends after that is never read (the caller closes the stream,
    which aborts the request in the worker). A finish line is the worker's end: nothing may
    follow it but the stream's end (:meth:`_stream_ends`).
    """

    def __init__(
        self,
        processor: ChatProcessor,
        sampling: SamplingOptions,
        prompt_tokens: int,
        first: StreamItem,
        stream: AsyncGenerator[StreamItem, None],
        *,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool | None = True,  # None: vLLM's default, true
        include_stop_str_in_output: bool = False,
        echo: str = "",
        prompt_ids: Sequence[int] = (),
        keep_token_ids: bool = False,
        echo_only: bool = False,
        eos_ids: Sequence[int] = (),
    ) -> None:
        self._echo = echo  # the prompt's text, first in the output (a completion's ``echo``)
        # echo with max_tokens 0: the generated token is counted, not shown (vLLM's answer).
        self._echo_only = echo_only
        self._prompt_ids = prompt_ids  # the echoed prompt's ids (for its logprobs)
        self._detokenizer = processor.detokenizer(
            skip_special_tokens=skip_special_tokens,
            spaces_between_special_tokens=spaces_between_special_tokens is not False,
        )
        self._stops = StopStringMatcher(sampling.stop, include=include_stop_str_in_output)
        self._include_stop = include_stop_str_in_output
        self._sampling = sampling
        self._stop_ids = frozenset(sampling.stop_token_ids)
        # The model's own end-of-sequence id (the card's first EOS id, the tokenizer's), which
        # vLLM checks before the stop ids: ending on it gives no stop_reason.
        self._eos_id = None if sampling.ignore_eos or not eos_ids else eos_ids[0]
        self.prompt_tokens = prompt_tokens
        self._first = first
        self._stream = stream
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        # vLLM's stop_reason: the stop string or the request's stop token id that ended the
        # output (None for the end-of-sequence token and for length).
        self.stop_reason: str | int | None = None
        # The logprobs of the tokens counted since the last take_logprobs (when asked for):
        # every counted token's, the stop token's too, as vLLM reports them.
        self._logprobs: list[tuple[int, LogprobPosition | None]] = []
        # Every counted token's id, the stop token's too (``return_token_ids``), when kept.
        self.token_ids: list[int] | None = [] if keep_token_ids else None
        self._ids_taken = 0

    def prompt_logprobs(self) -> tuple[Any, Any]:
        """The prompt's logprobs and ranks the worker sent on its first item (None, None when
        the request asked for none); validated: one per prompt id, the first None."""
        return (
            getattr(self._first, "prompt_logprobs", None),
            getattr(self._first, "prompt_ranks", None),
        )

    def echoed_positions(self) -> int:
        """How many of the logprobs positions taken first are the echoed prompt's."""
        if self._echo and getattr(self._first, "prompt_logprobs", None) is not None:
            return len(self._prompt_ids)
        return 0

    def take_logprobs(self) -> list[tuple[int, LogprobPosition | None]]:
        """The logprobs of the tokens counted since the last call (none unless asked for)."""
        taken, self._logprobs = self._logprobs, []
        return taken

    def take_token_ids(self) -> list[int] | None:
        """The ids counted since the last call, or None when they are not returned."""
        if self.token_ids is None:
            return None
        taken, self._ids_taken = self.token_ids[self._ids_taken :], len(self.token_ids)
        return taken

    async def pieces(self) -> AsyncIterator[str]:
        """The completion's text, piece by piece (an empty piece carries nothing), after the
        echoed prompt if the request asked for it."""
        if self._echo_only:  # its token counted first: the echo is the last piece (vLLM's)
            async for _ in self._generated():
                pass
        if self._echo:
            prompt = getattr(self._first, "prompt_logprobs", None)  # validated: one per id
            if prompt is not None:
                self._logprobs.extend(zip(self._prompt_ids, prompt, strict=True))
            yield self._echo
        if not self._echo_only:
            async for piece in self._generated():
                yield piece

    async def _generated(self) -> AsyncIterator[str]:
        item = self._first
        while True:
            pieces = []
            for index, token_id in enumerate(item.token_ids):
                self.completion_tokens += 1
                if self.token_ids is not None and not self._echo_only:
                    self.token_ids.append(token_id)
                if item.logprobs is not None and not self._echo_only:  # one per id
                    self._logprobs.append((token_id, item.logprobs[index]))
                if self._stop_token(token_id):  # its text is in the output only if asked
                    if self._include_stop:  # and then checked for stop strings (vLLM's)
                        text = self._detokenizer.add((token_id,))
                        check = self.completion_tokens > self._sampling.min_tokens
                        pieces.append(self._stops.feed(text, check=check))
                    pieces.append(self._end())
                    self.finish_reason = "stop"
                    self.stop_reason = None if token_id == self._eos_id else token_id
                    self._stopped_by_string()  # a stop string in its text wins, as in vLLM
                    yield "".join(pieces)
                    return
                text = self._detokenizer.add((token_id,))
                # vLLM matches stop strings only in text of tokens past min_tokens.
                check = self.completion_tokens > self._sampling.min_tokens
                pieces.append(self._stops.feed(text, check=check))
                if self._stops.stopped:
                    self._stopped_by_string()
                    yield "".join(pieces)
                    return
                reason = self._limit()
                if reason is not None:
                    pieces.append(self._end())
                    self.finish_reason = reason
                    self._stopped_by_string()
                    yield "".join(pieces)
                    return
            if isinstance(item, Finish):
                await self._stream_ends()
                pieces.append(self._end())
                self.finish_reason = item.finish_reason
                self._stopped_by_string()
                yield "".join(pieces)
                return
            yield "".join(pieces)
            item = await self._stream.__anext__()

    async def _stream_ends(self) -> None:
        """After the finish line, the stream's end: a worker that sends anything more (but
        blank lines) is broken, and its answer is not the client's (a 502, or an error event
        mid-stream). The end must come within :data:`FINISH_END_S`; a worker that keeps its
        connection open past it is hung up on, its answer whole."""
        try:
            await asyncio.wait_for(self._stream.__anext__(), FINISH_END_S)
        except (StopAsyncIteration, asyncio.TimeoutError):
            return
        except WorkerProtocolError:
            raise  # a line after the finish line (request_plane.generate)
        except WorkerUnavailable:
            return  # gone after its finish line (no chunked end): the answer is whole
        raise WorkerProtocolError("worker sent an item after its finish line")

    def _stopped_by_string(self) -> None:
        """A stop string found in the text (the one held back, at the end, too) ends the output
        whatever else did: ``stop``, the string its reason."""
        if self._stops.stopped:
            self.finish_reason, self.stop_reason = "stop", self._stops.matched

    def _stop_token(self, token_id: int) -> bool:
        """Whether the token just counted is a stop token that ends the completion, as vLLM
        checks it (``check_stop``): one of the stop ids, once ``min_tokens`` are out."""
        return token_id in self._stop_ids and self.completion_tokens >= self._sampling.min_tokens

    def _limit(self) -> str | None:
        """The finish reason when the token just counted ends the completion by the request's
        limits: ``max_tokens`` reached (``length``); None to go on."""
        if self.completion_tokens >= self._sampling.max_tokens:
            return "length"
        return None

    def _end(self) -> str:
        """The text still held: a character left incomplete, a partial stop string that was not
        one after all."""
        text = self._stops.feed(self._detokenizer.finish())
        return text + self._stops.flush()

    def usage(self) -> dict:
        return oai.usage(self.prompt_tokens, self.completion_tokens)
