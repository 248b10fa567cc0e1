"""What a chat request gives its template beyond the messages: its tools (OpenAI's and vLLM's
shapes) and its ``chat_template_kwargs``.

What this server honours of ``tool_choice``: the tools reach the chat template; their calls are
not parsed out of the output yet (a tool-call parser), so with tools only ``none`` is honoured,
and ``auto`` (the default when tools are given, as in vLLM), ``required`` and a named function
are refused by name. Template variables that would bypass a request field are refused too."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

from .openai_fields import FieldRefused

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


def check_tool_choice(tools: list[Tool] | None, tool_choice: str | NamedToolChoice | None) -> None:
    """Raises :class:`FieldRefused` naming ``tool_choice`` when it asks for what is not
    honoured (see the module docstring), or names a choice without tools."""
    choice = tool_choice
    if not tools:
        if choice is None or choice in ("none", "auto"):
            return
        raise FieldRefused("tool_choice", "`tool_choice` needs `tools` to be set", "invalid_value")
    if choice != "none":
        if choice is None:
            shown = "auto (the default with tools)"
        else:
            shown = choice if isinstance(choice, str) else "a named function"
        raise FieldRefused(
            "tool_choice",
            f"`tool_choice` {shown} "
            "needs a tool-call parser, which this server does not run yet; `tool_choice` "
            '"none" renders the tools into the prompt without parsing calls',
            "unsupported_parameter",
        )
