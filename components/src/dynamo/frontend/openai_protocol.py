"""The OpenAI wire format: request models (pydantic), response shapes, the error shape.

What the frontend serves: ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions``
(whole and streamed), and the error shape ``{"error": {"message", "type", "param", "code"}}``.

The request models take the sampling fields vLLM's OpenAI server takes, with vLLM's ranges (they
are :class:`~dynamo.runtime.sampling.SamplingOptions`' own, so a request accepted here is one the
worker and vLLM accept). A bad value is a 400 naming the field in ``param``; unknown fields are
ignored, as vLLM and OpenAI's servers do. Numbers are strict: ``"5"`` is not 5, ``true`` is not
1, and ``NaN``/``Infinity`` are refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from dynamo.runtime.sampling import (
    MinTokens,
    SamplerFields,
    SamplingOptions,
    StopText,
    TokenCount,
)

# The roles a chat message may have (vLLM's, plus OpenAI's "developer", passed to the template).
ROLES = ("system", "developer", "user", "assistant", "tool")


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


# -- requests -------------------------------------------------------------------------------

# Numbers are strict (a JSON number, an integer too; never a string or a boolean), with vLLM's
# ranges: the field types are the request plane's own (dynamo.runtime.sampling).


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: StrictBool = False


class _SamplingRequest(SamplerFields):
    """Fields /v1/chat/completions and /v1/completions share."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: Annotated[StrictStr, Field(min_length=1)]
    max_tokens: TokenCount | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=64)] | None = None
    # Strict like every number here (a Literal[1] would take 1.0 and true); 1 only, for now.
    n: Annotated[StrictInt, Field(ge=1, le=1)] | None = 1
    ignore_eos: StrictBool | None = False
    min_tokens: MinTokens | None = 0
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None

    @property
    def requested_max_tokens(self) -> tuple[str, int] | None:
        """(field name, value) of the completion limit the client set, if any."""
        return ("max_tokens", self.max_tokens) if self.max_tokens is not None else None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def sampling(self, max_tokens: int, eos_token_ids: Iterable[int]) -> SamplingOptions:
        """What the worker gets; ``max_tokens`` already fits the model's context."""
        ignore_eos = bool(self.ignore_eos)
        return SamplingOptions(
            **self.sampler_settings(),
            max_tokens=max_tokens,
            min_tokens=self.min_tokens or 0,
            stop=self.stop_strings,
            stop_token_ids=() if ignore_eos else tuple(eos_token_ids),
            ignore_eos=ignore_eos,
        )


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    """One message; what the template sees is :meth:`for_template`."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal[ROLES]  # type: ignore[valid-type]
    # None: an assistant turn that only called tools.
    content: StrictStr | list[TextPart] | None = None

    def for_template(self) -> dict[str, Any]:
        """A plain dict as chat templates expect (``message['content']`` a string), with the
        other fields the client sent (``name``, ``tool_calls``, ...) as they came."""
        message = dict(self.model_extra or {})
        message["role"] = self.role
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message["content"] = "" if content is None else content
        return message

    def as_sent(self) -> dict[str, Any]:
        """The message as the client sent it: content parts (``{"type": "text", ...}``) kept,
        for a processor that joins them its own way (SGLang joins them with a space)."""
        message = self.for_template()
        if isinstance(self.content, list):
            message["content"] = [part.model_dump() for part in self.content]
        return message


class ChatCompletionRequest(_SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: TokenCount | None = None

    @property
    def requested_max_tokens(self) -> tuple[str, int] | None:
        # The newer name wins when both are given, as in OpenAI's and vLLM's servers.
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return super().requested_max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        return [message.for_template() for message in self.messages]

    def messages_as_sent(self) -> list[dict[str, Any]]:
        return [message.as_sent() for message in self.messages]


class CompletionRequest(_SamplingRequest):
    # A text, or the prompt's token ids (as vLLM takes them); a list of one text is that text.
    prompt: (
        StrictStr
        | Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
        | Annotated[list[StrictStr], Field(min_length=1, max_length=1)]
    )

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            self.prompt = self.prompt[0]
        return self


def _param(loc: tuple) -> str | None:
    """``messages[0].content`` from pydantic's ('messages', 0, 'content', ...) location.

    Union branches add their type names (``'str'``, ``'list[...]'``) to the location; those are
    not fields, so the path stops at the first one.
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            path += f".{part}" if path else part
        else:
            break
    return path or None


_UNION_TAGS = ("str", "int", "float", "bool", "list", "literal", "function", "constrained")


def _first_error(exc: ValidationError) -> tuple[str | None, str]:
    errors = exc.errors(include_url=False)
    error = errors[0]
    loc = tuple(
        part
        for part in error["loc"]
        if not (isinstance(part, str) and part.split("[")[0].lower() in _UNION_TAGS)
    )
    param = _param(loc)
    message = error["msg"]
    if error["type"] == "missing" and len(errors) == 1:
        return param, f"`{param}` is required"
    if param and param.startswith("messages[") and param.endswith("].content"):
        return param, (
            f'`{param}` must be a string or a list of text parts {{"type": "text", "text": string}}'
        )
    if len(errors) > 1 and all(_param(e["loc"][:1]) == _param(loc[:1]) for e in errors):
        # One field failing every branch of a union (e.g. stop: a string or a list).
        message = "; or ".join(dict.fromkeys(e["msg"] for e in errors))
    return param, f"`{param}`: {message}" if param else message


def parse_request(model: type[_SamplingRequest], body: Any) -> Any:
    """Validate a decoded JSON body; raises :class:`ApiError` (400) naming the bad field."""
    if not isinstance(body, dict):
        raise invalid_request("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        param, message = _first_error(exc)
        code = "missing_field" if exc.errors()[0]["type"] == "missing" else "invalid_value"
        if param == "n":
            message = "only `n` = 1 is supported"
        raise invalid_request(message, param=param, code=code) from None


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, body)


def parse_completion_request(body: Any) -> CompletionRequest:
    return parse_request(CompletionRequest, body)


def context_length_exceeded(*, context_length: int, prompt_tokens: int, param: str) -> ApiError:
    # vLLM's wording (renderers/params.py), so clients that parse it keep working.
    return invalid_request(
        f"This model's maximum context length is {context_length} tokens. However, your "
        f"prompt contains {prompt_tokens} input tokens, which exceeds this limit even without "
        "any output tokens. Please reduce the length of the input prompt.",
        param=param,
        code="context_length_exceeded",
    )


def completion_too_long(
    *, context_length: int, prompt_tokens: int, max_tokens: int, param: str
) -> ApiError:
    return invalid_request(
        f"This model's maximum context length is {context_length} tokens. However, you "
        f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
        f"{max_tokens} for the completion). Please reduce the length of the prompt or "
        f"`{param}`.",
        param=param,
        code="context_length_exceeded",
    )


# -- responses ------------------------------------------------------------------------------


def new_completion_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_list(models: Iterable[tuple[str, int]]) -> dict:
    """``GET /v1/models`` for (name, created) pairs."""
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "dynamo"}
            for name, created in models
        ],
    }
