"""Structured output (vLLM's guided decoding) from an OpenAI request: ``response_format``,
``structured_outputs`` and the forced tool calls of ``tool_choice`` ``required`` or a named
function, as vLLM's OpenAI server derives them (``structured_outputs_from_response_format``,
``get_json_schema_from_tools``).

What comes out is one :class:`~dynamo.runtime.sampling.StructuredOutputs`, bounded and
validated here and again by the worker, whose vLLM compiles it into a grammar (an invalid schema
is vLLM's 400, which the client gets naming the field it sent: :func:`client_field`). The mock
engine does not sample, so it refuses it by name. ``structured_outputs.structural_tag`` (JSON
text of xgrammar's structural tag, as vLLM takes it) is carried with the same bounds (64 KiB),
checked here to be a JSON object and compiled by the worker's vLLM (an invalid tag is vLLM's
400 naming the field); ``response_format`` of type ``structural_tag`` is refused by name (its
legacy ``structures`` / ``triggers`` shape is vLLM's own conversion, not implemented here).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)

from dynamo.runtime.sampling import MAX_CHOICES, StructuredOutputs, StructuredText

from .fields import FieldRefused


class JsonSchemaSpec(BaseModel):
    """``response_format.json_schema``: OpenAI's fields, as vLLM takes them."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[StrictStr, Field(min_length=1, max_length=256)]
    description: StrictStr | None = None
    # "schema" in the wire format (pydantic's BaseModel has a schema attribute).
    json_schema: dict[StrictStr, Any] = Field(alias="schema")
    strict: StrictBool | None = None


def _no_structural_tag(field: str, asked: bool) -> None:
    """Raises :class:`FieldRefused` (which passes through pydantic) for a structural tag."""
    if asked:
        raise FieldRefused(
            field,
            f"`{field}`: a structural tag is taken in `structured_outputs.structural_tag` "
            "(JSON text, as vLLM takes it), not as a response_format type, by this server",
            "unsupported_parameter",
        )


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _screen(cls, data: Any) -> Any:
        _no_structural_tag(
            "response_format", isinstance(data, dict) and data.get("type") == "structural_tag"
        )
        return data

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StructuredOutputsRequest(BaseModel):
    """A client's ``structured_outputs``: vLLM's ``StructuredOutputsParams`` fields."""

    model_config = ConfigDict(extra="forbid", strict=True)

    json_: dict[StrictStr, Any] | StructuredText | None = Field(None, alias="json")
    regex: StructuredText | None = None
    choice: Annotated[list[StructuredText], Field(min_length=1, max_length=MAX_CHOICES)] | None = (
        None
    )
    grammar: StructuredText | None = None
    json_object: StrictBool | None = None
    disable_any_whitespace: StrictBool = False
    disable_additional_properties: StrictBool = False
    whitespace_pattern: StructuredText | None = None
    # xgrammar's structural tag as JSON text (vLLM's field): bounded as the other texts.
    structural_tag: StructuredText | None = None

    @model_validator(mode="after")
    def _tag_is_an_object(self) -> StructuredOutputsRequest:
        """vLLM's server parses the tag as a JSON object before xgrammar compiles it; the
        same check here, so a malformed one is the client's 400 before any worker sees it."""
        if self.structural_tag is not None:
            try:
                tag = json.loads(self.structural_tag)
            except (ValueError, RecursionError):
                tag = None
            if not isinstance(tag, dict):
                raise FieldRefused(
                    "structured_outputs",
                    "`structured_outputs.structural_tag` must be the JSON text of an object",
                    "invalid_value",
                )
        return self


def _schema_text(schema: dict[str, Any] | str, field: str) -> StructuredOutputs:
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
    except RecursionError:  # the body decoder's depth, a few levels deeper inside a schema
        raise FieldRefused(
            field, f"`{field}`: the schema is nested too deeply", "invalid_value"
        ) from None
    return _wire(field, json_schema=text)


def from_json_schema(schema: dict[str, Any], field: str) -> StructuredOutputs:
    """A JSON schema a parser library forces (SGLang's for a forced call), as the request plane
    carries it, with the same bounds as a client's (a 400 naming ``field``)."""
    return _schema_text(schema, field)


def _wire(field: str, **constraint: Any) -> StructuredOutputs:
    try:
        return StructuredOutputs(**constraint)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        raise FieldRefused(field, f"`{field}`: {error['msg']}", "invalid_value") from None


def from_request(
    response_format: ResponseFormat | None, structured: StructuredOutputsRequest | None
) -> StructuredOutputs | None:
    """The constraint a request's ``response_format`` or ``structured_outputs`` sets, or None.
    Both at once is a 400 naming ``response_format`` (vLLM would merge them into two
    constraints and refuse that too)."""
    asks = response_format is not None and response_format.type != "text"
    if asks and structured is not None:
        raise FieldRefused(
            "response_format",
            "`response_format` cannot be combined with `structured_outputs`: use one",
            "invalid_value",
        )
    if response_format is not None and asks:
        if response_format.type == "json_object":
            return _wire("response_format", json_object=True)
        if response_format.json_schema is None:
            raise FieldRefused(
                "response_format",
                "`response_format` of type json_schema needs its `json_schema` field",
                "invalid_value",
            )
        return _schema_text(response_format.json_schema.json_schema, "response_format")
    if structured is None:
        return None
    options = {
        "disable_any_whitespace": structured.disable_any_whitespace,
        "disable_additional_properties": structured.disable_additional_properties,
        "whitespace_pattern": structured.whitespace_pattern,
        "regex": structured.regex,
        "choice": tuple(structured.choice) if structured.choice is not None else None,
        "grammar": structured.grammar,
        # vLLM counts a set json_object as a constraint, true or false; false asks nothing.
        "json_object": True if structured.json_object else None,
        "structural_tag": structured.structural_tag,
    }
    if structured.json_ is not None:
        json_text = structured.json_
        if not isinstance(json_text, str):
            json_text = json.dumps(json_text, ensure_ascii=False)
        options["json_schema"] = json_text
    return _wire("structured_outputs", **options)


def from_vllm(params: Any, field: str) -> StructuredOutputs | None:
    """vLLM's ``StructuredOutputsParams`` (what its parsers' ``adjust_request`` set) as the
    request plane carries it, with the same bounds as a client's (a 400 naming ``field``)."""
    if params is None:
        return None
    options: dict[str, Any] = {
        name: getattr(params, name, None)
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern")
    }
    schema = getattr(params, "json", None)
    if schema is not None:
        options["json_schema"] = schema if isinstance(schema, str) else json.dumps(schema)
    choice = getattr(params, "choice", None)
    options["choice"] = tuple(choice) if choice is not None else None
    options["json_object"] = True if getattr(params, "json_object", None) else None
    for flag in ("disable_any_whitespace", "disable_additional_properties"):
        options[flag] = bool(getattr(params, flag, False))
    return _wire(field, **options)


# -- forced tool calls ------------------------------------------------------------------------


def _params_or_empty_object(params: Any) -> dict[str, Any]:
    # vLLM's rule: missing or empty parameters still constrain the arguments to a JSON object.
    return params if params else {"type": "object", "properties": {}}


def _required_schema(
    functions: list[dict[str, Any]], parallel_tool_calls: bool | None
) -> dict[str, Any]:
    """vLLM's ``_get_json_schema_from_tools``: an array of ``{name, parameters}``, one of the
    tools each; one call at most when ``parallel_tool_calls`` is false; ``$defs`` lifted."""
    defs: dict[str, Any] = {}
    alternatives = []
    for function in functions:
        # A shallow copy: only its top-level $defs is taken out (a deep copy recursed in
        # Python, four frames a level: a RecursionError, a 500, at half the body's depth).
        params = dict(function.get("parameters") or {}) or None
        if isinstance(params, dict):
            lifted = params.pop("$defs", None) or {}
            if not isinstance(lifted, dict):
                raise FieldRefused(
                    "tools", "`tools`: a function's parameters `$defs` must be an object",
                    "invalid_value",
                )  # fmt: skip
            for name, definition in lifted.items():
                if name in defs and defs[name] != definition:
                    raise FieldRefused(
                        "tools",
                        f"`tools`: the definition {json.dumps(name)} has several schemas, "
                        "which is not supported",
                        "invalid_value",
                    )
                defs[name] = definition
        alternatives.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [function["name"]]},
                    "parameters": _params_or_empty_object(params),
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": alternatives},
    }
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def forced_tool_schema(
    tools: list[dict[str, Any]], tool_choice: Any, parallel_tool_calls: bool | None
) -> StructuredOutputs | None:
    """The JSON schema a ``required`` or named ``tool_choice`` forces on the output (vLLM's
    ``get_json_schema_from_tools``), or None for any other choice."""
    functions = [tool["function"] for tool in tools if tool.get("type") == "function"]
    if tool_choice == "required":
        return _schema_text(_required_schema(functions, parallel_tool_calls), "tool_choice")
    if isinstance(tool_choice, dict):
        wanted = tool_choice["function"]["name"]
        for function in functions:
            if function["name"] == wanted:
                params = _params_or_empty_object(function.get("parameters"))
                return _schema_text(params, "tool_choice")
        raise FieldRefused(
            "tool_choice",
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            "invalid_value",
        )
    return None


def constraint(request: Any) -> tuple[str, StructuredOutputs] | None:
    """(the client's field that set it, the constraint) of a request that forces its output's
    shape, or None. A ``required`` or named ``tool_choice`` forces the output into calls, with
    no other constraint beside it (vLLM would override one, or refuse the pair)."""
    own = from_request(request.response_format, request.structured_outputs)
    field = "structured_outputs" if request.structured_outputs else "response_format"
    tools, choice = getattr(request, "tools", None), getattr(request, "tool_choice", None)
    if not tools or choice in (None, "none", "auto"):
        return (field, own) if own is not None else None
    shown = choice if isinstance(choice, str) else "a named function"
    if own is not None:
        raise FieldRefused(
            field, f"`{field}` cannot be combined with `tool_choice` {shown}", "invalid_value"
        )
    named = choice if isinstance(choice, str) else choice.model_dump()
    tool_dicts = [tool.model_dump() for tool in tools]
    forced = forced_tool_schema(tool_dicts, named, request.parallel_tool_calls)
    return ("tool_choice", forced) if forced is not None else None
