"""The OpenAI response shapes of one request: whole, or streamed as server-sent events.

A :class:`Responder` knows one endpoint's shapes (``chat.completion`` / ``text_completion`` and
their chunks); the service hands it the text and the finish reason, and :func:`send_event`
frames each chunk as ``data: <json>`` and a blank line. Each choice has its ``index`` (``n`` > 1:
:mod:`.choices`); the fields an output parser adds (``tool_calls``, ``reasoning_content``) and
``logprobs`` (:mod:`.logprobs`) extend these shapes.
"""

from __future__ import annotations

import json
import time

from aiohttp import web


class Responder:
    """The OpenAI response shapes of one endpoint, for one request.

    Every body has the same envelope (``id``, ``object``, ``created``, ``model``, ``choices``
    and, where there is one, ``usage``); a subclass names its two objects (the whole response's
    and a chunk's) and says what one choice holds.
    """

    ID_PREFIX = "cmpl"
    OBJECT = ""
    CHUNK_OBJECT = ""
    # A chat answer's role: the request's ChatCompletionRequest.response_role (vLLM's rule).
    role = "assistant"

    def __init__(self, model: str, completion_id: str) -> None:
        self.model = model
        self.completion_id = completion_id
        self.created = int(time.time())

    def _body(self, object_type: str, choices: list[dict], usage: dict | None = None) -> dict:
        body = {
            "id": self.completion_id,
            "object": object_type,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return body

    def envelope(self, object_type: str, choices: list[dict], usage: dict | None = None) -> dict:
        """A body in this request's envelope, for choices shaped elsewhere (parsed output)."""
        return self._body(object_type, choices, usage)

    def whole_choice(self, text: str, finish_reason: str, index: int = 0) -> dict:
        raise NotImplementedError

    def chunk_choice(self, text: str | None, finish_reason: str | None, index: int = 0) -> dict:
        raise NotImplementedError

    def opening(self, index: int = 0) -> dict | None:
        """A first chunk sent before any text (chat: the assistant's role), or None."""
        return None

    def piece(self, text: str, index: int = 0) -> dict:
        return self._body(self.CHUNK_OBJECT, [self.chunk_choice(text, None, index)])

    def finish(self, finish_reason: str, index: int = 0) -> dict:
        return self._body(self.CHUNK_OBJECT, [self.chunk_choice(None, finish_reason, index)])

    def usage(self, usage: dict) -> dict:
        """The last chunk of a stream with ``stream_options.include_usage``: no choice."""
        return self._body(self.CHUNK_OBJECT, [], usage)


class ChatResponder(Responder):
    ID_PREFIX = "chatcmpl"
    OBJECT = "chat.completion"
    CHUNK_OBJECT = "chat.completion.chunk"

    def whole_choice(self, text: str, finish_reason: str, index: int = 0) -> dict:
        message = {"role": self.role, "content": text}
        return {"index": index, "message": message, "finish_reason": finish_reason}

    def chunk_choice(self, text: str | None, finish_reason: str | None, index: int = 0) -> dict:
        delta = {} if text is None else {"content": text}
        return {"index": index, "delta": delta, "finish_reason": finish_reason}

    def opening(self, index: int = 0) -> dict:
        delta = {"role": self.role, "content": ""}
        choice = {"index": index, "delta": delta, "finish_reason": None}
        return self._body(self.CHUNK_OBJECT, [choice])


class CompletionResponder(Responder):
    ID_PREFIX = "cmpl"
    OBJECT = CHUNK_OBJECT = "text_completion"

    def whole_choice(self, text: str, finish_reason: str, index: int = 0) -> dict:
        # A chunk has the whole response's shape.
        return self.chunk_choice(text, finish_reason, index)

    def chunk_choice(self, text: str | None, finish_reason: str | None, index: int = 0) -> dict:
        return {
            "index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason
        }  # fmt: skip


async def send_event(response: web.StreamResponse, payload: dict | str) -> None:
    """One server-sent event: ``data: <json>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())
