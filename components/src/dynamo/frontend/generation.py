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

from collections.abc import AsyncGenerator, AsyncIterator

from dynamo.runtime.request_plane import Finish, StreamItem
from dynamo.runtime.sampling import SamplingOptions

from . import openai_protocol as oai
from .chat_processor import ChatProcessor
from .stop_strings import StopStringMatcher


class Generation:
    """One admitted request's output: the worker's ids, detokenized, within the request's
    limits (``sampling``: what the worker was asked for).

    Ids are decoded one at a time, so the completion's token count stops at the token that
    ended it (a stop string, a stop token, ``max_tokens``) even when the worker sent several in
    one item; whatever the worker sends after that is never read (the caller closes the stream,
    which aborts the request in the worker).
    """

    def __init__(
        self,
        processor: ChatProcessor,
        sampling: SamplingOptions,
        prompt_tokens: int,
        first: StreamItem,
        stream: AsyncGenerator[StreamItem, None],
    ) -> None:
        self._detokenizer = processor.detokenizer()
        self._stops = StopStringMatcher(sampling.stop)
        self._sampling = sampling
        self._stop_ids = frozenset(sampling.stop_token_ids)
        self.prompt_tokens = prompt_tokens
        self._first = first
        self._stream = stream
        self.completion_tokens = 0
        self.finish_reason: str | None = None

    async def pieces(self) -> AsyncIterator[str]:
        """The completion's text, piece by piece (an empty piece carries nothing)."""
        item = self._first
        while True:
            pieces = []
            for token_id in item.token_ids:
                self.completion_tokens += 1
                text = self._detokenizer.add((token_id,))
                # vLLM matches stop strings only in text of tokens past min_tokens.
                check = self.completion_tokens > self._sampling.min_tokens
                pieces.append(self._stops.feed(text, check=check))
                if self._stops.stopped:
                    self.finish_reason = "stop"
                    yield "".join(pieces)
                    return
                reason = self._limit(token_id)
                if reason is not None:
                    pieces.append(self._end())
                    self.finish_reason = "stop" if self._stops.stopped else reason
                    yield "".join(pieces)
                    return
            if isinstance(item, Finish):
                pieces.append(self._end())
                self.finish_reason = "stop" if self._stops.stopped else item.finish_reason
                yield "".join(pieces)
                return
            yield "".join(pieces)
            item = await self._stream.__anext__()

    def _limit(self, token_id: int) -> str | None:
        """The finish reason when the token just counted ends the completion by the request's
        limits, as vLLM checks them (``check_stop``): a stop token once ``min_tokens`` are out
        (``stop``), else ``max_tokens`` reached (``length``); None to go on."""
        if token_id in self._stop_ids and self.completion_tokens >= self._sampling.min_tokens:
            return "stop"
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
