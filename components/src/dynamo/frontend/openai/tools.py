"""What a chat request gives its template beyond the messages: its tools (OpenAI's and vLLM's
shapes) and its ``chat_template_kwargs``.

What this server honours of ``tool_choice``: the tools always reach the chat template; ``none``
stops there; ``auto`` (the default when tools are given, as in vLLM) needs the model's processor
to parse tool calls out of the output (a tool-call parser: ``--tool-call-parser`` or the
worker's ``--dyn-tool-call-parser``); ``required`` and a named function force the output into
calls: as the processor's engine forces and parses them when its parsers do (vLLM's tool
parser's structural tag, SGLang's JSON array: :func:`~dynamo.frontend.parsing.parsed_output.
adjust_for_parsers`), else with vLLM's JSON schema from the tools (:mod:`.structured_output`),
parsed by :mod:`dynamo.frontend.parsing.forced_tool_calls` with no tool-call parser. Template
variables that would bypass a request field are refused too."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

from .fields import FieldRefused

# chat_template_kwargs that would bypass a request field (or the server's own template).
RESERVED_TEMPLATE_VARIABLES = frozenset(
    ("messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
     "chat_template", "tokenize")
)  # fmt: skip


def _no_reserved_variables(value: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES & set(value))
    if reserved:
        raise ValueError(
            f"`{reserved[0]}` cannot be set through chat_template_kwargs (use the request "
            "field, where there is one)"
        )
    return value


# Extra variables of the chat template (e.g. enable_thinking), as vLLM passes them.
TemplateVariables = Annotated[
    dict[StrictStr, Any], Field(max_length=64), AfterValidator(_no_reserved_variables)
]


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: Annotated[StrictStr, Field(min_length=1)]


class Tool(BaseModel):
    """A tool as OpenAI and vLLM take it; the template gets it as the client sent it."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["function"]
    function: FunctionSpec


class NamedToolChoice(Tool):
    model_config = ConfigDict(extra="forbid", strict=True)


def check_tool_choice_shape(
    tools: list[Tool] | None, tool_choice: str | NamedToolChoice | None
) -> None:
    """Raises :class:`FieldRefused` naming ``tool_choice`` when it names a choice without
    tools (what can be known from the request alone)."""
    if not tools and tool_choice not in (None, "none", "auto"):
        raise FieldRefused("tool_choice", "`tool_choice` needs `tools` to be set", "invalid_value")


def check_tool_choice(
    tools: list[Tool] | None,
    tool_choice: str | NamedToolChoice | None,
    *,
    parses_tool_calls: bool,
) -> None:
    """Raises :class:`FieldRefused` naming ``tool_choice`` when the model's processor cannot
    honour it (see the module docstring)."""
    if not tools or tool_choice == "none":
        return
    if tool_choice in (None, "auto"):
        if parses_tool_calls:
            return
        shown = "auto (the default with tools)" if tool_choice is None else "auto"
        raise FieldRefused(
            "tool_choice",
            f"`tool_choice` {shown} needs a tool-call parser, which this model is served "
            "without (--tool-call-parser, or the worker's --dyn-tool-call-parser); "
            '`tool_choice` "none" renders the tools into the prompt without parsing calls',
            "unsupported_parameter",
        )
    # required, or a named function: the output is forced into calls (structured outputs,
    # see .structured_output) and parsed by .forced_tool_calls, with no tool-call parser.
