"""One admitted request's output: the worker's token ids turned into the completion's text.

This is where the frontend reads what a worker streams, one request-plane item at a time: the
ids are detokenized with the model's own tokenizer, the text is cut at the first stop string
(the frontend is authoritative for those), and the finish reason and token counts are settled.
What a worker sends is a peer's data: checking each item, and what the frontend does about one
that breaks the request's limits, belongs here, as does a per-request output parser (tool calls,
reasoning) fed with the text pieces this yields.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from . import openai_protocol as oai
from .chat_processor import ChatProcessor
from .stop_strings import StopStringMatcher


class Generation:
    """One admitted request's output: the worker's ids, detokenized, cut at a stop string.

    Ids are decoded one at a time, so the completion's token count stops at the token that
    completed a stop string even when the worker sent several in one item.
    """

    def __init__(
        self,
        processor: ChatProcessor,
        stops: tuple[str, ...],
        prompt_tokens: int,
        first: dict,
        stream: AsyncGenerator[dict, None],
    ) -> None:
        self._detokenizer = processor.detokenizer()
        self._stops = StopStringMatcher(stops)
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
            for token_id in item.get("token_ids", ()):
                self.completion_tokens += 1
                pieces.append(self._stops.feed(self._detokenizer.add((token_id,))))
                if self._stops.stopped:
                    self.finish_reason = "stop"
                    yield "".join(pieces)
                    return
            if "finish_reason" in item:
                pieces.append(self._stops.feed(self._detokenizer.finish()))
                pieces.append(self._stops.flush())
                self.finish_reason = "stop" if self._stops.stopped else item["finish_reason"]
                # The worker's count when it sends one (it counts what it generated).
                self.completion_tokens = item.get("completion_tokens", self.completion_tokens)
                yield "".join(pieces)
                return
            yield "".join(pieces)
            item = await self._stream.__anext__()

    def usage(self) -> dict:
        return oai.usage(self.prompt_tokens, self.completion_tokens)
