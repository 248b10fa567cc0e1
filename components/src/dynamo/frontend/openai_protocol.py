"""The OpenAI chat-completions wire format: request validation and response shapes.

Only what the frontend serves: ``/v1/models``, ``/v1/chat/completions`` (whole and streamed),
and the error shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable

from .chat_template import ROLES, ChatMessage

DEFAULT_MAX_TOKENS = 128
MAX_TOKENS_LIMIT = 65536


class ApiError(Exception):
    """An error answered to the client in the OpenAI shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        param: str | None = None,
        code: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.detail = detail  # for the log only (instances tried, their errors); None: message

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_request(message: str, *, param: str | None = None, code: str = "invalid_value"):
    return ApiError(400, message, type="invalid_request_error", param=param, code=code)


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model `{model}` does not exist or has no worker registered.",
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


def service_unavailable(
    message: str, *, code: str = "worker_unavailable", detail: str | None = None
) -> ApiError:
    return ApiError(503, message, type="service_unavailable_error", code=code, detail=detail)


@dataclass(frozen=True)
class ChatCompletionRequest:
    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int
    stream: bool = False
    include_usage: bool = False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _message_text(content: Any, index: int) -> str:
    param = f"messages[{index}].content"
    if isinstance(content, str):
        return content
    if content is None:
        return ""  # an assistant turn that only called tools
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise invalid_request(
                    "content parts must be objects {\"type\": \"text\", \"text\": string}",
                    param=param,
                )
            texts.append(part["text"])
        return "".join(texts)
    raise invalid_request("content must be a string or a list of text parts", param=param)


def _parse_messages(messages: Any) -> tuple[ChatMessage, ...]:
    if messages is None:
        raise invalid_request("`messages` is required", param="messages", code="missing_field")
    if not isinstance(messages, list) or not messages:
        raise invalid_request("`messages` must be a non-empty list", param="messages")
    parsed = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid_request("each message must be an object", param=f"messages[{index}]")
        role = message.get("role")
        if role not in ROLES:
            raise invalid_request(
                f"role must be one of {', '.join(ROLES)}", param=f"messages[{index}].role"
            )
        parsed.append(ChatMessage(role=role, content=_message_text(message.get("content"), index)))
    return tuple(parsed)


def _parse_max_tokens(body: dict) -> int:
    # The newer name wins when both are given, as in OpenAI's API.
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or not 1 <= value <= MAX_TOKENS_LIMIT:
            raise invalid_request(
                f"`{name}` must be an integer between 1 and {MAX_TOKENS_LIMIT}", param=name
            )
        return value
    return DEFAULT_MAX_TOKENS


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded JSON body; raises :class:`ApiError` (400) naming the bad field."""
    if not isinstance(body, dict):
        raise invalid_request("request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise invalid_request("`model` is required", param="model", code="missing_field")
    if not isinstance(model, str) or not model:
        raise invalid_request("`model` must be a non-empty string", param="model")
    messages = _parse_messages(body.get("messages"))
    max_tokens = _parse_max_tokens(body)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid_request("`stream` must be a boolean", param="stream")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise invalid_request("only `n` = 1 is supported", param="n")
    include_usage = False
    stream_options = body.get("stream_options")
    if stream_options is not None:
        if not isinstance(stream_options, dict) or not isinstance(
            stream_options.get("include_usage", False), bool
        ):
            raise invalid_request(
                "`stream_options` must be an object with a boolean `include_usage`",
                param="stream_options",
            )
        include_usage = stream_options.get("include_usage", False)
    return ChatCompletionRequest(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
    )


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(
    *, completion_id: str, model: str, content: str, finish_reason: str, usage: dict
) -> dict:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
    }


def chat_completion_chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: dict,
    finish_reason: str | None = None,
    usage: dict | None = None,
    with_choice: bool = True,
) -> dict:
    chunk = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": (
            [{"index": 0, "delta": delta, "finish_reason": finish_reason}] if with_choice else []
        ),
    }
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def model_list(models: Iterable[tuple[str, int]]) -> dict:
    """``GET /v1/models`` for (name, created) pairs."""
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "dynamo"}
            for name, created in models
        ],
    }
