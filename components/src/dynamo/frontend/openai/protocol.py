"""The OpenAI wire format: request models (pydantic) and response shapes.

What the frontend serves: ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions``
(whole and streamed); the error shape ``{"error": {"message", "type", "param", "code"}}`` is
:mod:`.errors`' (the names are read here too, as ``oai.invalid_request`` and so on, by
the request path).

The request models take the sampling fields vLLM's OpenAI server takes, with vLLM's ranges (they
are :class:`~dynamo.runtime.sampling.SamplingOptions`' own, so a request accepted here is one the
worker and vLLM accept). A bad value is a 400 naming the field in ``param``. Every other field
of vLLM's request models is classified in :mod:`.fields` (refused by name, or accepted
without effect), which the models read before they validate; a field vLLM does not know either
is accepted and logged (:attr:`_SamplingRequest.unknown_fields`), or refused in strict mode.
Numbers are strict: ``"5"`` is not 5, ``true`` is not 1, and ``NaN``/``Infinity`` are refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dynamo.runtime.sampling import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS_TOKENS,
    MinTokens,
    SamplerFields,
    SamplingOptions,
    StopText,
    StructuredOutputs,
    TokenCount,
    TokenId,
)

from . import fields as openai_fields
from . import structured_output
from .choice_fields import ChoicesFields

# Re-exported: the request path reads the errors as oai.invalid_request and so on.
from .errors import (  # noqa: F401 - re-exported (see above)
    ApiError,
    error_body,
    invalid_request,
    model_not_found,
    service_unavailable,
)
from .logprobs import ChatLogprobs, CompletionLogprobs
from .output_fields import OutputFields
from .tools import NamedToolChoice, TemplateVariables, Tool, check_tool_choice_shape

# The roles a chat message may have (vLLM's, plus OpenAI's "developer", passed to the template).
ROLES = ("system", "developer", "user", "assistant", "tool")
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


# -- requests -------------------------------------------------------------------------------

# Numbers are strict (a JSON number, an integer too; never a string or a boolean), with vLLM's
# ranges: the field types are the request plane's own (dynamo.runtime.sampling).

MAX_STOP_TOKEN_IDS = 64


class StreamOptions(BaseModel):
    # vLLM's two fields; anything else is a 400 naming it (never dropped quietly).
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool | None = None

    @field_validator("continuous_usage_stats")
    @classmethod
    def _no_continuous_usage(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("usage in every chunk is not supported by this server")
        return value


class _SamplingRequest(OutputFields, SamplerFields):
    """Fields /v1/chat/completions and /v1/completions share. Only the fields
    :mod:`.fields` says are applied are declared here; the rest are screened by that
    table before validation, and unknown ones kept (their names only) as extras."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    ENDPOINT: ClassVar[str]

    model: Annotated[StrictStr, Field(min_length=1)]
    max_tokens: TokenCount | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=64)] | None = None
    ignore_eos: StrictBool | None = False
    # Ids that end the completion too (finish_reason "stop", the id's text not in the output),
    # as in vLLM; with the model's EOS ids unless ignore_eos. Checked against the vocabulary.
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    min_tokens: MinTokens | None = 0
    # {"token id": bias}, as OpenAI and vLLM take it; biases clamped to [-100, 100] as vLLM does.
    logit_bias: (
        Annotated[dict[Annotated[StrictStr, Field(pattern=r"^[0-9]{1,10}$")], StrictFloat],
                  Field(max_length=MAX_LOGIT_BIAS_TOKENS)] | None
    ) = None  # fmt: skip
    allowed_token_ids: Annotated[list[TokenId], Field(max_length=MAX_ALLOWED_TOKEN_IDS)] | None = (
        None
    )
    bad_words: Annotated[list[StopText], Field(max_length=MAX_BAD_WORDS)] | None = None
    # Keep this many prompt tokens (-1: all the context allows), from the truncation_side.
    truncate_prompt_tokens: Annotated[StrictInt, Field(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    # Whether the tokenizer adds its special tokens (None: false for chat, true for completions).
    add_special_tokens: StrictBool | None = None
    # Stop strings and tokens are the frontend's to match: true keeps them in the output.
    include_stop_str_in_output: StrictBool | None = None
    # Decoding is the frontend's: false shows special tokens in the text, as vLLM does.
    skip_special_tokens: StrictBool | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    # vLLM's structured outputs (.structured_output); _structured: (client field, constraint).
    response_format: structured_output.ResponseFormat | None = None
    structured_outputs: structured_output.StructuredOutputsRequest | None = None
    _structured: tuple[str, StructuredOutputs] | None = None
    # Where the constraint's grammar starts (SamplingOptions.reasoning_ended): the processor's.
    _reasoning_ended: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _screen_fields(cls, data: Any, info: ValidationInfo) -> Any:
        """Refused fields that ask for something raise :class:`openai_fields.FieldRefused`
        (not a ValueError: it passes through pydantic to :func:`parse_request`)."""
        if not isinstance(data, dict):
            return data
        strict = bool(info.context and info.context.get("strict_fields"))
        return openai_fields.screen(cls.ENDPOINT, data, strict=strict)

    @model_validator(mode="after")
    def _structured_output(self) -> _SamplingRequest:
        self._structured = structured_output.constraint(self)
        return self

    @property
    def structured_field(self) -> str | None:  # the field a refusal of the constraint names
        return self._structured[0] if self._structured else None

    def force_constraint(self, field: str, structured: StructuredOutputs | None) -> None:
        """The constraint the model's parsers force instead of the one derived here (vLLM's
        ``adjust_request``: a forced tool call's structural tag), set by ``field``."""
        self._structured = (field, structured) if structured is not None else None

    def grammar_starts(self, reasoning_ended: bool | None) -> None:
        """Where the constraint's grammar starts, as the processor's engine server decides it
        (``SamplingOptions.reasoning_ended``; parsed_output.decide_grammar_start)."""
        self._reasoning_ended = reasoning_ended

    @property
    def unknown_fields(self) -> tuple[str, ...]:
        """The names of the fields neither this server nor vLLM knows (accepted, not read)."""
        return tuple(self.model_extra or ())

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
        stop_ids = (() if ignore_eos else tuple(eos_token_ids)) + tuple(self.stop_token_ids or ())
        return SamplingOptions(
            **self.sampler_settings(),
            max_tokens=max_tokens,
            min_tokens=self.min_tokens or 0,
            stop=self.stop_strings,
            stop_token_ids=tuple(dict.fromkeys(stop_ids)),
            ignore_eos=ignore_eos,
            logit_bias=self.logit_bias_pairs(),
            allowed_token_ids=tuple(self.allowed_token_ids or ()),
            bad_words=tuple(self.bad_words or ()),
            logprobs=self.logprobs_asked(),  # type: ignore[attr-defined]  # each endpoint's mixin
            prompt_logprobs=self.prompt_logprobs_asked(),  # type: ignore[attr-defined]  # idem
            structured_outputs=self._structured[1] if self._structured else None,
            reasoning_ended=self._reasoning_ended if self._structured else None,
        )

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple(
            (int(token), min(100.0, max(-100.0, float(bias))))
            for token, bias in (self.logit_bias or {}).items()
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


class ChatCompletionRequest(ChatLogprobs, ChoicesFields, _SamplingRequest):
    ENDPOINT = openai_fields.CHAT

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: TokenCount | None = None
    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None
    documents: Annotated[list[dict[StrictStr, StrictStr]], Field(max_length=64)] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # false: one call at most (with required)
    # Extra variables of the chat template (e.g. enable_thinking), as vLLM passes them.
    chat_template_kwargs: TemplateVariables | None = None
    # vLLM 0.32's values; the template reads it (and enable_thinking), as vLLM renders it.
    reasoning_effort: ReasoningEffort | None = None
    include_reasoning: StrictBool | None = None  # false: no reasoning_content, as vLLM
    return_prompt_text: StrictBool | None = None  # the rendered prompt in the response
    echo: StrictBool | None = None  # the last message's content first (echoed_content)

    def template_variables(self) -> dict[str, Any]:
        """The template's extra variables as vLLM's ``build_chat_params`` merges them: the
        client's ``chat_template_kwargs``, then ``reasoning_effort`` and, unless the client set
        it, ``enable_thinking`` (false for ``none``)."""
        variables = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            variables["reasoning_effort"] = self.reasoning_effort
            variables.setdefault("enable_thinking", self.reasoning_effort != "none")
        return variables

    @property
    def response_role(self) -> str:
        """The answer's role: the assistant's, or without a generation prompt the last
        message's (vLLM's ``get_chat_request_role``)."""
        return self.messages[-1].role if self.add_generation_prompt is False else "assistant"

    @property
    def requested_max_tokens(self) -> tuple[str, int] | None:
        # The newer name wins when both are given, as in OpenAI's and vLLM's servers.
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return super().requested_max_tokens

    @model_validator(mode="after")
    def _choices_honoured(self) -> ChatCompletionRequest:
        """A ``tool_choice`` needs tools (whether the model's processor can honour it is
        known once the model is: :func:`~dynamo.frontend.openai.tools.check_tool_choice`). A
        final message is continued only without a generation prompt (vLLM's rule)."""
        check_tool_choice_shape(self.tools, self.tool_choice)
        if self.continue_final_message and self.add_generation_prompt is not False:
            raise openai_fields.FieldRefused(
                "continue_final_message",
                "`continue_final_message` needs `add_generation_prompt` false",
                "invalid_value",
            )
        return self

    def echoed_content(self) -> str:
        """``echo``: the last message's content if the answer continues its role (vLLM's: the
        assistant's with a generation prompt, else the last message's); else nothing."""
        last = self.messages[-1]
        role = "assistant" if self.add_generation_prompt is not False else last.role
        return str(last.for_template()["content"]) if self.echo and last.role == role else ""

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the client sent them (what the template renders), or None."""
        return [tool.model_dump() for tool in self.tools] if self.tools else None

    def template_messages(self) -> list[dict[str, Any]]:
        return [message.for_template() for message in self.messages]

    def messages_as_sent(self) -> list[dict[str, Any]]:
        return [message.as_sent() for message in self.messages]


class CompletionRequest(CompletionLogprobs, ChoicesFields, _SamplingRequest):
    ENDPOINT = openai_fields.COMPLETION

    # A text, or the prompt's token ids (as vLLM takes them); a list of one text is that text.
    prompt: (
        StrictStr
        | Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
        | Annotated[list[StrictStr], Field(min_length=1, max_length=1)]
    )
    echo: StrictBool | None = None
    # 0 with echo: the prompt alone (its logprobs, for scoring), as vLLM answers it.
    max_tokens: Annotated[StrictInt, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            self.prompt = self.prompt[0]
        if self.max_tokens == 0 and not self.echo:
            raise openai_fields.FieldRefused(
                "max_tokens", "`max_tokens` must be at least 1 (0 only with echo)", "invalid_value"
            )
        return self

    @property
    def echo_only(self) -> bool:
        """The prompt alone is answered; the engine generates one token (vLLM's way)."""
        return bool(self.echo) and self.max_tokens == 0

    @property
    def requested_max_tokens(self) -> tuple[str, int] | None:
        return ("max_tokens", 1) if self.echo_only else super().requested_max_tokens


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


# ("function" is not one: a tool's `function` is a field; validator tags are "function-after[...]".)
_UNION_TAGS = ("str", "int", "float", "bool", "list", "literal", "constrained")


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


def parse_request(model: type[_SamplingRequest], body: Any, *, strict_fields: bool = False) -> Any:
    """Validate a decoded JSON body; raises :class:`ApiError` (400) naming the bad field (or
    the refused one, or with ``strict_fields`` the unknown one)."""
    if not isinstance(body, dict):
        raise invalid_request("request body must be a JSON object")
    try:
        return model.model_validate(body, context={"strict_fields": strict_fields})
    except openai_fields.FieldRefused as exc:
        raise invalid_request(exc.message, param=exc.param, code=exc.code) from None
    except ValidationError as exc:
        param, message = _first_error(exc)
        code = "missing_field" if exc.errors()[0]["type"] == "missing" else "invalid_value"
        raise invalid_request(message, param=param, code=code) from None


def parse_chat_request(body: Any, *, strict_fields: bool = False) -> ChatCompletionRequest:
    return parse_request(ChatCompletionRequest, body, strict_fields=strict_fields)


def parse_completion_request(body: Any, *, strict_fields: bool = False) -> CompletionRequest:
    return parse_request(CompletionRequest, body, strict_fields=strict_fields)


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
