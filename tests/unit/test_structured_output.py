"""Structured outputs in the default environment: the request fields (response_format,
structured_outputs, tool_choice required / named) validated and bounded, what the worker gets
(only when set), the forced tool calls parsed from known outputs, and a worker's refusal of the
constraint reaching the client naming the field the client sent. vLLM compiling and applying
the constraint is tests/vllm/test_structured_output_vllm.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from dynamo.frontend.openai import protocol as oai
from dynamo.frontend.parsing.forced_tool_calls import (
    ForcedToolCalls,
    forced_tool_calls,
    parse_required,
)
from dynamo.frontend.parsing.output_parser import FirstCallOnly, ParsedDelta
from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.runtime.sampling import MAX_STRUCTURED_TEXT_BYTES, SamplingOptions, StructuredOutputs
from tests.support.answers import assert_openai_error, sse_events
from tests.support.frontend_fakes import MODEL, echo_worker, frontend, refusing_worker
from tests.support.tiny_model import tiny_card

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": MODEL, "prompt": "hi"}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "g"}},
]
NAMED = {"type": "function", "function": {"name": "f"}}
# xgrammar's structural tag, as vLLM's structured_outputs.structural_tag takes it (JSON text).
TAG = json.dumps({"type": "structural_tag", "format": {
    "type": "triggered_tags", "triggers": ["<f>"], "tags": [
        {"begin": "<f>", "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": "</f>"}
    ]}})  # fmt: skip
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
}


def constraint(body: dict, base: dict = CHAT) -> tuple[str | None, StructuredOutputs | None]:
    parse = oai.parse_chat_request if "messages" in base else oai.parse_completion_request
    request = parse({**base, **body})
    return request.structured_field, request.sampling(8, [1]).structured_outputs


@pytest.mark.parametrize("base", [CHAT, COMPLETION], ids=["chat", "completion"])
@pytest.mark.parametrize(
    "body, field, expected",
    [
        ({}, None, None),
        ({"response_format": {"type": "text"}}, None, None),
        ({"response_format": {"type": "json_object"}}, "response_format", {"json_object": True}),
        ({"response_format": JSON_SCHEMA}, "response_format", {"json_schema": json.dumps(SCHEMA)}),
        ({"structured_outputs": {"json": SCHEMA}}, "structured_outputs",
         {"json_schema": json.dumps(SCHEMA)}),
        ({"structured_outputs": {"json": '{"type": "string"}'}}, "structured_outputs",
         {"json_schema": '{"type": "string"}'}),
        ({"structured_outputs": {"regex": "[0-9]+"}}, "structured_outputs", {"regex": "[0-9]+"}),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "structured_outputs",
         {"choice": ("yes", "no")}),
        ({"structured_outputs": {"grammar": 'root ::= "a"', "disable_any_whitespace": True}},
         "structured_outputs", {"grammar": 'root ::= "a"', "disable_any_whitespace": True}),
        ({"structured_outputs": {"json_object": True, "whitespace_pattern": " ?"}},
         "structured_outputs", {"json_object": True, "whitespace_pattern": " ?"}),
        ({"structured_outputs": {"structural_tag": TAG}}, "structured_outputs",
         {"structural_tag": TAG}),
    ],
)  # fmt: skip
def test_each_constraint_becomes_the_workers_structured_outputs(base, body, field, expected):
    got_field, got = constraint(body, base)
    assert got_field == field
    if expected is None:
        assert got is None
    else:
        assert got == StructuredOutputs(**expected)


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"response_format": {"type": "json_schema"}}, "response_format", "invalid_value"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
         "response_format.json_schema.name", "missing_field"),
        ({"response_format": {"type": "json_object", "extra": 1}}, "response_format.extra",
         "invalid_value"),
        ({"response_format": {"type": "structural_tag", "format": {}}}, "response_format",
         "unsupported_parameter"),
        ({"structured_outputs": {"structural_tag": "[1]"}}, "structured_outputs",
         "invalid_value"),  # vLLM's server parses it as a JSON object first
        ({"structured_outputs": {"structural_tag": "{"}}, "structured_outputs", "invalid_value"),
        ({"structured_outputs": {"structural_tag": "[" * 60_000}}, "structured_outputs",
         "invalid_value"),  # too deep for the decoder: the client's 400, never a 500
        ({"structured_outputs": {"structural_tag": {"type": "structural_tag"}}},
         "structured_outputs.structural_tag", "invalid_value"),  # text, as vLLM takes it
        ({"structured_outputs": {"structural_tag": TAG, "regex": "a"}}, "structured_outputs",
         "invalid_value"),
        ({"structured_outputs": {"structural_tag": " " * (MAX_STRUCTURED_TEXT_BYTES - 1) + "{}"}},
         "structured_outputs.structural_tag", "invalid_value"),  # the bound of the others
        ({"structured_outputs": {}}, "structured_outputs", "invalid_value"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
         "invalid_value"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "invalid_value"),
        ({"structured_outputs": {"regex": ""}}, "structured_outputs.regex", "invalid_value"),
        ({"structured_outputs": {"regex": 5}}, "structured_outputs.regex", "invalid_value"),
        ({"structured_outputs": {"backend": "x", "regex": "a"}}, "structured_outputs.backend",
         "invalid_value"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
         "response_format", "invalid_value"),
        # the bound: a schema, regex or grammar is text the worker compiles
        ({"structured_outputs": {"regex": "a" * (MAX_STRUCTURED_TEXT_BYTES + 1)}},
         "structured_outputs.regex", "invalid_value"),
        ({"response_format": {**JSON_SCHEMA, "json_schema": {
            "name": "x", "schema": {"description": "é" * MAX_STRUCTURED_TEXT_BYTES}}}},
         "response_format", "invalid_value"),
        ({"structured_outputs": {"choice": ["x"] * 1025}}, "structured_outputs.choice",
         "invalid_value"),
        ({"structured_outputs": {"choice": ["é" * 20000] * 2}}, "structured_outputs",
         "invalid_value"),  # 64 KiB in all (UTF-8 bytes)
        ({"structured_outputs": {"regex": "\ud800"}}, "structured_outputs.regex",
         "invalid_value"),  # a lone surrogate (valid JSON): pydantic's 400, no crash
    ],
)  # fmt: skip
def test_a_bad_constraint_is_a_400_naming_the_clients_field(body, param, code):
    with pytest.raises(oai.ApiError) as raised:
        oai.parse_chat_request({**CHAT, **body})
    assert raised.value.status == 400 and raised.value.param == param, raised.value.message
    assert raised.value.code == code


def test_the_constraint_reaches_the_worker_only_when_set_so_older_workers_interoperate():
    plain = SamplingOptions(max_tokens=3).model_dump(mode="json")
    assert "structured_outputs" not in plain
    assert SamplingOptions.model_validate(plain) == SamplingOptions(max_tokens=3)
    steered = SamplingOptions(max_tokens=3, structured_outputs=StructuredOutputs(regex="a"))
    wire = steered.model_dump(mode="json")
    assert wire["structured_outputs"]["regex"] == "a"
    assert SamplingOptions.model_validate(wire) == steered  # the worker's validation
    # structural_tag is newer: a worker from before it (extra="forbid") never sees the key.
    assert "structural_tag" not in wire["structured_outputs"]


def test_required_forces_an_array_of_calls_built_from_the_tools_as_vllm_builds_it():
    field, got = constraint({"tools": TOOLS, "tool_choice": "required"})
    assert field == "tool_choice" and got is not None and got.json_schema is not None
    schema = json.loads(got.json_schema)
    assert schema == {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {"properties": {"name": {"type": "string", "enum": ["f"]}, "parameters": SCHEMA},
                 "required": ["name", "parameters"]},
                {"properties": {"name": {"type": "string", "enum": ["g"]},
                                "parameters": {"type": "object", "properties": {}}},
                 "required": ["name", "parameters"]},
            ],
        },
    }  # fmt: skip
    _, one = constraint({"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False})
    assert one is not None and json.loads(one.json_schema or "")["maxItems"] == 1


def test_tool_definitions_are_lifted_to_the_top_of_the_required_schema():
    defs = {"P": {"type": "integer"}}
    params = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": defs}
    tools = [{"type": "function", "function": {"name": "h", "parameters": params}}]
    request = oai.parse_chat_request({**CHAT, "tools": tools, "tool_choice": "required"})
    sampling = request.sampling(8, [1]).structured_outputs
    assert sampling is not None
    schema = json.loads(sampling.json_schema or "")
    assert schema["$defs"] == defs and '"$defs": {' not in json.dumps(schema["items"])
    assert request.template_tools() == tools  # the client's tools are not changed
    clash = [tools[0], {"type": "function", "function": {"name": "k", "parameters": {
        **params, "$defs": {"P": {"type": "string"}}}}}]  # fmt: skip
    with pytest.raises(oai.ApiError) as raised:
        oai.parse_chat_request({**CHAT, "tools": clash, "tool_choice": "required"})
    assert raised.value.param == "tools"


def test_a_named_function_forces_its_arguments_object():
    field, got = constraint({"tools": TOOLS, "tool_choice": NAMED})
    assert field == "tool_choice" and got == StructuredOutputs(json_schema=json.dumps(SCHEMA))
    _, empty = constraint({"tools": TOOLS, "tool_choice": {**NAMED, "function": {"name": "g"}}})
    assert empty == StructuredOutputs(json_schema='{"type": "object", "properties": {}}')


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": TOOLS, "tool_choice": {**NAMED, "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
        ({"tools": TOOLS, "tool_choice": NAMED, "structured_outputs": {"regex": "a"}},
         "structured_outputs"),
        ({"tools": TOOLS, "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)  # fmt: skip
def test_forced_tool_choices_refuse_what_they_cannot_honour_by_name(body, param):
    with pytest.raises(oai.ApiError) as raised:
        oai.parse_chat_request({**CHAT, **body})
    assert raised.value.status == 400 and raised.value.param == param, raised.value.message


def test_parallel_tool_calls_asks_no_constraint_unless_the_calls_are_forced():
    for extra in ({}, {"tools": TOOLS, "tool_choice": "none"},
                  {"tools": TOOLS, "tool_choice": "auto"}):  # fmt: skip
        for parallel in (True, False):
            assert constraint({**extra, "parallel_tool_calls": parallel}) == (None, None)


class StreamsThreeCalls:
    """A tool-call parser that streams call 0 in deltas, then call 1, and ends with call 2."""

    def __init__(self) -> None:
        self.fed = 0

    def feed(self, text: str) -> ParsedDelta:
        self.fed += 1
        if self.fed == 1:
            return ParsedDelta(content=text, tool_calls=[{"index": 0, "function": {"name": "a"}}])
        if self.fed == 2:  # the end of call 0's arguments, and the start of call 1
            return ParsedDelta(tool_calls=[{"index": 0, "function": {"arguments": "{}"}},
                                           {"index": 1, "function": {"name": "b"}}])  # fmt: skip
        return ParsedDelta(tool_calls=[{"index": 1, "function": {"arguments": "{}"}}])

    def finish(self) -> ParsedDelta:
        return ParsedDelta(content="end", tool_calls=[{"index": 2, "function": {"name": "c"}}])


def test_parallel_tool_calls_false_keeps_the_first_call_only_as_vllm_filters():
    parser = FirstCallOnly(StreamsThreeCalls())
    first = parser.feed("x")
    assert first.content == "x" and first.tool_calls == [{"index": 0, "function": {"name": "a"}}]
    assert parser.feed("y").tool_calls == [{"index": 0, "function": {"arguments": "{}"}}]
    assert parser.feed("z").tool_calls == []
    end = parser.finish()
    assert end.content == "end" and end.tool_calls == []
    assert parser.calls_finish_reason == "tool_calls"
    named = forced_tool_calls(NAMED)
    assert named is not None and FirstCallOnly(named).calls_finish_reason == "stop"


# -- the forced calls' parser, on known outputs ------------------------------------------------


def test_required_output_becomes_one_call_per_item_with_json_arguments():
    calls = parse_required('[{"name": "f", "parameters": {"a": 1, "s": "é"}}, {"name": "g"}]')
    assert calls is not None
    assert [c["function"] for c in calls] == [
        {"name": "f", "arguments": '{"a": 1, "s": "é"}'},
        {"name": "g", "arguments": "{}"},
    ]
    assert [c["index"] for c in calls] == [0, 1]
    assert all(c["type"] == "function" and c["id"].startswith("chatcmpl-tool-") for c in calls)
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize(
    "text", ['[{"name": "f", "parameters"', "{}", '[{"parameters": {}}]', '["f"]',
             '[{"name": "f", "parameters": [1]}]', "[" * 10000]
)  # fmt: skip
def test_required_output_that_is_not_calls_is_not_parsed(text):
    assert parse_required(text) is None
    parser = ForcedToolCalls("required", named=False)
    parser.feed(text)
    end = parser.finish()
    assert end.tool_calls == [] and end.content == text  # the model's words, not dropped


def test_named_output_is_that_functions_arguments_streamed_or_whole():
    parser = forced_tool_calls(NAMED)
    assert parser is not None and parser.calls_finish_reason == "stop"
    assert not parser.feed('{"a"') and not parser.feed(": 1}")  # held back while it streams
    (call,) = parser.finish().tool_calls
    assert call["function"] == {"name": "f", "arguments": '{"a": 1}'}
    blank = forced_tool_calls(NAMED)
    assert blank is not None
    blank.feed("  ")
    assert not blank.finish()
    assert forced_tool_calls("auto") is None and forced_tool_calls("none") is None


# -- through the frontend ------------------------------------------------------------------------


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


def chat_through_echo(card, output_text: str, body: dict, stream: bool):
    """The frontend in front of a worker that answers ``output_text`` then EOS."""
    ids = build_chat_processor(card).tokenizer.encode(output_text, add_special_tokens=False)
    output = [*ids, *card.eos_token_ids]

    async def scenario():
        async with (
            echo_worker(output=output, chunk=3) as (engine, endpoint),
            frontend(card, endpoint) as client,
        ):
            response = await client.post(
                "/v1/chat/completions",
                json={**CHAT, "max_tokens": 200, "stream": stream, **body},
            )
            answer = await sse_events(response) if stream else await response.json()
            return response.status, answer, engine.bodies

    return asyncio.run(scenario())


REQUIRED_OUTPUT = '[{"name": "f", "parameters": {"a": 7}}]'


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "choice, output, arguments, finish",
    [("required", REQUIRED_OUTPUT, '{"a": 7}', "tool_calls"),
     (NAMED, '{"a": 7}', '{"a": 7}', "stop")],
)  # fmt: skip
def test_forced_calls_come_back_as_tool_calls_with_vllms_finish_reason(
    card, stream, choice, output, arguments, finish
):
    status, answer, bodies = chat_through_echo(
        card, output, {"tools": TOOLS, "tool_choice": choice}, stream
    )
    assert status == 200, answer
    assert json.loads(bodies[0]["sampling"]["structured_outputs"]["json_schema"])
    if stream:
        assert answer[-1] == "[DONE]"
        deltas = [e["choices"][0]["delta"] for e in answer[:-1] if e["choices"]]
        calls = [c for d in deltas for c in d.get("tool_calls", ())]
        assert not "".join(d.get("content") or "" for d in deltas)
        reason = answer[-2]["choices"][0]["finish_reason"]
    else:
        message = answer["choices"][0]["message"]
        calls, reason = message["tool_calls"], answer["choices"][0]["finish_reason"]
        assert message["content"] is None
    assert [c["function"] for c in calls] == [{"name": "f", "arguments": arguments}]
    assert reason == finish


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_answers_one_call_whatever_the_engine_wrote(card, stream):
    two = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    body = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    status, answer, bodies = chat_through_echo(card, two, body, stream)
    assert status == 200, answer
    assert json.loads(bodies[0]["sampling"]["structured_outputs"]["json_schema"])["maxItems"] == 1
    if stream:
        deltas = [e["choices"][0]["delta"] for e in answer[:-1] if e["choices"]]
        calls = [c for d in deltas for c in d.get("tool_calls", ())]
    else:
        calls = answer["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["f"]


def test_a_plain_request_sends_no_constraint(card):
    status, answer, bodies = chat_through_echo(card, "hello", {}, stream=False)
    assert status == 200 and "structured_outputs" not in bodies[0]["sampling"]
    assert "reasoning_ended" not in bodies[0]["sampling"]  # no grammar: nothing to start


@pytest.mark.parametrize(
    "body",
    [{"tools": TOOLS, "tool_choice": "required"}, {"response_format": JSON_SCHEMA}],
    ids=["forced-call", "response-format"],
)
def test_a_processor_that_parses_no_reasoning_has_the_grammar_start_at_once(card, body):
    """A worker whose engine has a reasoning parser holds a grammar back until the reasoning
    ends unless told it has: ``hf`` parses no reasoning, so the output it parses must be the
    constraint's from the first token (issue 37; vLLM's and SGLang's processors decide as their
    servers do: tests/vllm, tests/sglang)."""
    output = REQUIRED_OUTPUT if "tools" in body else '{"a": 7}'
    status, answer, bodies = chat_through_echo(card, output, body, stream=False)
    assert status == 200, answer
    assert bodies[0]["sampling"]["reasoning_ended"] is True


@pytest.mark.parametrize("value", [True, False])
def test_where_the_grammar_starts_travels_only_with_a_grammar(value):
    structured = StructuredOutputs(regex="a+")
    sent = SamplingOptions(max_tokens=4, structured_outputs=structured, reasoning_ended=value)
    assert sent.model_dump()["reasoning_ended"] is value
    assert "reasoning_ended" not in SamplingOptions(max_tokens=4).model_dump()  # a worker from
    # before the field still takes every request without it


@pytest.mark.parametrize(
    "body, param",
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    ],
)
def test_a_worker_refusing_the_constraint_is_a_400_naming_the_clients_field(card, body, param):
    """The worker's 400 names ``sampling.structured_outputs`` (vLLM did not compile the schema,
    or the mock engine does not apply it): the client's error names the field it sent."""

    async def scenario():
        async with (
            refusing_worker("sampling.structured_outputs", "Grammar error") as (endpoint, calls),
            frontend(card, endpoint) as client,
        ):
            response = await client.post("/v1/chat/completions", json={**CHAT, **body})
            return response.status, await response.json(), len(calls)

    status, answer, calls = asyncio.run(scenario())
    error = assert_openai_error(answer, status, 400, param=param)
    assert f"`{param}`" in error["message"] and "Grammar error" not in error["message"]
    assert calls == 1


def _nested_schema_text(depth: int) -> str:
    """A schema nested ``depth`` objects deep (twice as many JSON levels), as text: written
    without json.dumps, which would recurse as deep."""
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


@pytest.mark.parametrize("depth", [200, 300, 400, 450])
@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_a_deeply_nested_tool_schema_is_sent_or_refused_by_name_never_a_500(card, choice, depth):
    """A client's tool parameters nested as deep as the body decoder takes: the forced schema
    is built without a RecursionError (a 500), sent, or refused naming ``tool_choice``."""
    schema = _nested_schema_text(depth)
    head = json.dumps({**CHAT, "max_tokens": 8, "tool_choice": choice})
    data = head[:-1] + ', "tools": [{"type": "function", "function": {"name": "f", "parameters": '
    data += schema + "}}]}"

    async def scenario():
        async with echo_worker() as (engine, endpoint), frontend(card, endpoint) as client:
            response = await client.post(
                "/v1/chat/completions", data=data, headers={"Content-Type": "application/json"}
            )
            return response.status, await response.text(), engine.bodies

    status, text, bodies = asyncio.run(scenario())
    if status == 400:
        assert_openai_error(json.loads(text), status, 400, param="tool_choice")
    else:
        assert status == 200, text
        assert json.loads(bodies[0]["sampling"]["structured_outputs"]["json_schema"])


@pytest.mark.parametrize("defs", [[1, 2], "x", 5, True, None])
def test_required_with_defs_that_are_not_an_object_is_a_400_naming_tools(card, defs):
    """``tool_choice`` required lifts each function's ``$defs`` into the forced schema: defs
    that are not an object were an AttributeError (a 500)."""
    params = {"type": "object", "$defs": defs}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    status, answer, bodies = chat_through_echo(
        card, "[]", {"tools": tools, "tool_choice": "required"}, stream=False
    )
    if defs is None:  # absent, as vLLM reads it
        assert status == 200, answer
        return
    assert_openai_error(answer, status, 400, param="tools")
    assert "$defs" in answer["error"]["message"] and not bodies
