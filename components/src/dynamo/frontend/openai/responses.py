"""The OpenAI response shapes of one request: whole, or streamed as server-sent events.

A :class:`Responder` knows one endpoint's shapes (``chat.completion`` / ``text_completion`` and
their chunks); the service hands it the text and the finish reason, and :func:`send_event`
frames each chunk as ``data: <json>`` and a blank line. Each choice has its ``index`` (``n`` > 1:
:mod:`dynamo.frontend.serving.choices`); the fields an output parser adds (``tool_calls``,
``reasoning_content``) and ``logprobs`` (:mod:`.logprobs`) extend these shapes.
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

    # Where vLLM puts ``prompt_token_ids`` / ``prompt_text``: True, the body's (chat); False,
    # each choice's (completions).
    PROMPT_AT_TOP = False

    def __init__(self, model: str, completion_id: str) -> None:
        self.model = model
        self.completion_id = completion_id
        self.created = int(time.time())
        self._prompt_fields: dict = {}  # return_token_ids / return_prompt_text asked for them
        self._prompt_shown: set[int] = set()  # the choices whose first body had them
        self.echo = ""  # a chat's echo: the last message's content, first in each choice's

    def return_prompt(self, token_ids: list[int] | None, text: str | None = None) -> None:
        """Put the prompt's ids (``return_token_ids``) and text (``return_prompt_text``) where
        vLLM puts them, on each choice's first body (the whole one, or its first chunk)."""
        fields = {"prompt_token_ids": token_ids, "prompt_text": text}
        self._prompt_fields = {k: v for k, v in fields.items() if v is not None}

    def _with_prompt(self, body: dict) -> dict:
        first = [c for c in body["choices"] if c["index"] not in self._prompt_shown]
        if not self._prompt_fields or not first:
            return body
        self._prompt_shown.update(c["index"] for c in first)
        for into in [body] if self.PROMPT_AT_TOP else first:
            into.update(self._prompt_fields)
        return body

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
        if self.echo and object_type != self.CHUNK_OBJECT:  # whole: first in each message
            for choice in choices:
                choice["message"]["content"] = self.echo + (choice["message"]["content"] or "")
        return self._with_prompt(body)

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

    def openings(self, choices: int) -> list[dict]:
        """The chunks sent before any text: each choice's opening, then (chat's ``echo``) each
        choice's echoed content, as vLLM sends them."""
        chunks = [self.opening(index) for index in range(choices)]
        if self.echo:
            chunks += [self.piece(self.echo, index) for index in range(choices)]
        return [chunk for chunk in chunks if chunk is not None]

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
    PROMPT_AT_TOP = True

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
            "index": index, "text": text or "", "logprobs": None, "finish_reason": finish_reason,
            "stop_reason": None,  # vLLM sets it on every completion chunk: null until the end
        }  # fmt: skip


async def send_event(response: web.StreamResponse, payload: dict | str) -> None:
    """One server-sent event: ``data: <json>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    await response.write(f"data: {data}\n\n".encode())
