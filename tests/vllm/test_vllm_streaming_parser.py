"""``--dyn-chat-processor vllm`` streams what vLLM's parsers find as the text comes
(:class:`~dynamo.frontend.parsing.vllm_output_parser.VllmStreamingParser`): joined, a stream's
content, reasoning and tool calls are what the whole text parses to, wherever the pieces were cut.

Real tokenizers only: the tiny model's (``<think>`` / ``<tool_call>`` are spelt out in ordinary
tokens there, so a piece can end inside a tag) and the same with Qwen's markers added as tokens
of their own (as Qwen3's tokenizer has them: added, not special, so the detokenizer keeps them),
which deepseek_r1 needs and where a marker always arrives whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from dynamo.frontend.parsing.output_parser import ParsedDelta
from dynamo.frontend.parsing.vllm_output_parser import (
    VllmOutputParser,
    VllmStreamingParser,
    vllm_output_parsers,
)
from tests.support.tiny_model import build_tiny_tokenizer, tiny_tokenizer_dir

pytestmark = pytest.mark.vllm

MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]


def tool(name: str, **properties: str) -> dict:
    schema = {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


TOOLS = [tool("get_weather", city="string", units="object"), tool("get_time", zone="string")]


def call(name: str, arguments: dict) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


OUTPUTS = {
    "reasoning, content, a call": "<think>The user wants the weather. </think>Let me look."
    + call("get_weather", {"city": "Paris"}),
    "two calls, nested and non-ASCII arguments": "<think>Two lookups.</think>"
    + call("get_weather", {"city": "São Paulo", "units": {"deg": "C", "wind": [1, 2]}})
    + "\n"
    + call("get_time", {"zone": "America/Sao_Paulo"}),
    "reasoning and content, no call": "<think>Nothing to call.\nSo: answer.</think>It is 20°C.",
    "content only": "Plain words, no markup at all.",
}


@pytest.fixture(scope="module")
def tiny():
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(tiny_tokenizer_dir())


@pytest.fixture(scope="module")
def qwen_markers(tmp_path_factory):
    """The tiny tokenizer with Qwen3's ``<think>`` / ``<tool_call>`` added tokens."""
    from tokenizers import AddedToken, Tokenizer
    from vllm.tokenizers import get_tokenizer

    directory = build_tiny_tokenizer(tmp_path_factory.mktemp("qwen-markers") / "tokenizer")
    path = directory / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    tokenizer.save(str(path))
    loaded = get_tokenizer(str(directory))
    assert all(len(loaded.encode(m, add_special_tokens=False)) == 1 for m in MARKERS)
    return loaded


def factory(tokenizer, tool_parser, reasoning_parser):
    parsers = vllm_output_parsers("model", tokenizer, tool_parser, reasoning_parser)
    assert parsers is not None
    return parsers


def whole(parsers, text: str, tools=TOOLS, tool_choice="auto") -> ParsedDelta:
    parser = parsers(tools, tool_choice, [], False)
    assert isinstance(parser, VllmOutputParser)
    assert not parser.feed(text)  # a whole completion is parsed at the end
    return parser.finish()


def streamed(parsers, pieces: list[str], tools=TOOLS, tool_choice="auto") -> list[ParsedDelta]:
    parser = parsers(tools, tool_choice, [], True)
    assert isinstance(parser, VllmStreamingParser)
    return [parser.feed(piece) for piece in pieces] + [parser.finish()]


def joined(deltas: list[ParsedDelta]) -> tuple[str, str, list[tuple[str, str, str]]]:
    """Content, reasoning and the calls (id, name, arguments) as a client assembles them."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        indexes = [piece["index"] for piece in delta.tool_calls]
        assert len(set(indexes)) == len(indexes), "one entry per call in a chunk"
        for piece in delta.tool_calls:
            into = calls.setdefault(piece["index"], {"id": "", "name": "", "arguments": ""})
            if "id" in piece:
                assert not into["id"], "a call's id comes once, in its first delta"
                assert piece["type"] == "function"
                into["id"] = piece["id"]
            into["name"] += piece["function"].get("name") or ""
            into["arguments"] += piece["function"].get("arguments") or ""
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning_content for d in deltas)
    return content, reasoning, [(c["id"], c["name"], c["arguments"]) for c in calls.values()]


def same(deltas: list[ParsedDelta], reference: ParsedDelta) -> None:
    content, reasoning, calls = joined(deltas)
    assert (content, reasoning) == (reference.content, reference.reasoning_content)
    assert [(name, json.loads(args)) for _, name, args in calls] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in reference.tool_calls
    ]
    assert all(call_id for call_id, _, _ in calls)
    assert [c["index"] for c in reference.tool_calls] == list(range(len(calls)))


def token_cuts(tokenizer, text: str) -> list[int]:
    """The character offsets between the model's tokens: where the frontend's pieces can end
    (each piece is the text of whole tokens; a cut inside a character is never one)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    cuts: list[int] = []
    for n in range(1, len(ids)):
        prefix = tokenizer.decode(ids[:n])
        if text.startswith(prefix) and prefix and (not cuts or len(prefix) > cuts[-1]):
            cuts.append(len(prefix))
    return cuts


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def splits(tokenizer, text: str) -> Iterator[list[str]]:
    """Every way to cut the text in two at a token boundary, then one token per piece, and
    pieces of two, three and seven tokens."""
    cuts = token_cuts(tokenizer, text)
    for cut in cuts:
        yield pieces(text, [cut])
    for step in (1, 2, 3, 7):
        yield pieces(text, cuts[step - 1 :: step])


@pytest.mark.parametrize("name", OUTPUTS)
@pytest.mark.parametrize(
    ("tool_parser", "reasoning_parser"),
    [("hermes", "qwen3"), ("hermes", "deepseek_r1"), ("hermes", None), (None, "deepseek_r1")],
)
def test_a_stream_joins_to_what_the_whole_text_parses_to(
    qwen_markers, name, tool_parser, reasoning_parser
):
    parsers = factory(qwen_markers, tool_parser, reasoning_parser)
    text = OUTPUTS[name]
    reference = whole(parsers, text)
    for cut in splits(qwen_markers, text):
        same(streamed(parsers, cut), reference)


@pytest.mark.parametrize("name", OUTPUTS)
def test_pieces_cut_inside_a_tag_join_to_the_same(tiny, name):
    """The tiny tokenizer spells the tags in ordinary tokens: pieces end inside ``<tool_call>``,
    ``</think>`` and the JSON arguments."""
    parsers = factory(tiny, "hermes", "qwen3")
    text = OUTPUTS[name]
    reference = whole(parsers, text)
    inside_a_tag = any("<" in p and ">" not in p for p in pieces(text, token_cuts(tiny, text)))
    assert inside_a_tag == ("<" in text)
    for cut in splits(tiny, text):
        same(streamed(parsers, cut), reference)


def test_each_part_arrives_while_the_model_writes_it(qwen_markers):
    """One token per piece: the reasoning, the content and the call (its name, then its
    arguments piece by piece) come from the pieces that carry them, not at the end."""
    parsers = factory(qwen_markers, "hermes", "qwen3")
    text = OUTPUTS["reasoning, content, a call"]
    deltas = streamed(parsers, pieces(text, token_cuts(qwen_markers, text)))
    fed = deltas[:-1]
    with_reasoning = [i for i, d in enumerate(fed) if d.reasoning_content]
    with_content = [i for i, d in enumerate(fed) if d.content]
    with_call = [i for i, d in enumerate(fed) if d.tool_calls]
    assert len(with_reasoning) > 1 and len(with_content) > 1 and len(with_call) > 1
    assert max(with_reasoning) < min(with_content) < max(with_content) < min(with_call)
    assert fed[with_call[0]].tool_calls[0]["function"]["name"] == "get_weather"
    # Only what the parser held back is left for the end (here: nothing but, at most, the
    # call's last arguments).
    assert not deltas[-1].content and not deltas[-1].reasoning_content


def test_tool_choice_none_streams_the_call_as_content(qwen_markers):
    parsers = factory(qwen_markers, "hermes", "qwen3")
    text = OUTPUTS["reasoning, content, a call"]
    reference = whole(parsers, text, tool_choice="none")
    assert not reference.tool_calls and "<tool_call>" in reference.content
    for cut in splits(qwen_markers, text):
        same(streamed(parsers, cut, tool_choice="none"), reference)


def test_without_tools_a_tool_parser_alone_parses_nothing(qwen_markers):
    parsers = factory(qwen_markers, "hermes", None)
    assert parsers(None, "auto", [], True) is None
    assert parsers(TOOLS, "none", [], True) is None


@pytest.mark.integration
def test_the_openai_client_gets_each_part_streamed_before_the_finish(tmp_path):
    """The real processes: a mock worker started with --dyn-tool-call-parser hermes and
    --dyn-reasoning-parser qwen3, a frontend with --dyn-chat-processor vllm, the official
    ``openai`` client with ``stream=True``. The mock engine answers with its prompt, one token
    a step, so a user message carrying reasoning, words and a hermes call comes back as the
    completion (the tiny model never writes one itself); the parts arrive in many chunks before
    the finish chunk and join to the non-streamed answer's."""
    import openai

    from tests.support.pair import CLIENT_TIMEOUT_S
    from tests.support.processes import listening_url, start_frontend, start_worker

    model = "streamed-parsers"
    discovery = tmp_path / "discovery"
    worker = start_worker(
        "worker", tmp_path, discovery, model,
        "--dyn-tool-call-parser", "hermes", "--dyn-reasoning-parser", "qwen3",
        mock_token_ms=1,
    )  # fmt: skip
    frontend = start_frontend("frontend", tmp_path, discovery, "--dyn-chat-processor", "vllm")
    try:
        url = listening_url(frontend, deadline_s=240.0)
        frontend.wait_for_log(rf"Model added: model={model} ", deadline_s=120.0)
        http = openai.DefaultHttpx2Client(trust_env=False, timeout=CLIENT_TIMEOUT_S)
        with openai.OpenAI(
            base_url=url + "/v1", api_key="unused", http_client=http, max_retries=0
        ) as api:
            request = {
                "model": model,
                "messages": [{"role": "user", "content": OUTPUTS["reasoning, content, a call"]}],
                "tools": [TOOLS[0]],
                "max_tokens": 256,
            }
            answer = api.chat.completions.create(**request).choices[0]
            chunks = list(api.chat.completions.create(**request, stream=True))
    finally:
        codes = {"frontend": frontend.stop(), "worker": worker.stop()}
    assert codes == {"frontend": 0, "worker": 0}, (codes, frontend.log())

    assert answer.finish_reason == "tool_calls"
    message = answer.message
    reasoning = (message.model_extra or {}).get("reasoning")
    assert "The user wants the weather." in reasoning and message.content == "Let me look."
    choices = [(i, c.choices[0]) for i, c in enumerate(chunks) if c.choices]
    (finish,) = [i for i, choice in choices if choice.finish_reason is not None]
    assert choices[-1][1].finish_reason == "tool_calls"

    def carrying(part) -> list[int]:
        return [i for i, choice in choices if part(choice.delta)]

    for part in (
        lambda d: (d.model_extra or {}).get("reasoning"),
        lambda d: d.content,
        lambda d: d.tool_calls,
    ):
        where = carrying(part)
        assert len(where) > 1 and max(where) < finish, where
    deltas = [choice.delta for _, choice in choices]
    assert "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == message.content
    calls = [c for d in deltas for c in d.tool_calls or ()]
    assert {c.index for c in calls} == {0} and calls[0].id and calls[0].type == "function"
    assert "".join(c.function.name or "" for c in calls) == message.tool_calls[0].function.name
    arguments = "".join(c.function.arguments or "" for c in calls)
    assert json.loads(arguments) == json.loads(message.tool_calls[0].function.arguments)


def _with_added(tmp_path, name: str, added: list[str]):
    from tokenizers import AddedToken, Tokenizer
    from vllm.tokenizers import get_tokenizer

    directory = build_tiny_tokenizer(tmp_path / name)
    path = directory / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in added])
    tokenizer.save(str(path))
    return get_tokenizer(str(directory))


def test_a_tokenizer_with_thousands_of_added_tokens_costs_a_piece_its_length(tmp_path):
    """A card's tokenizer is a peer's file: 40000 added tokens beside Qwen's markers. A 64 KiB
    piece (a stream line's bound) is cut at the markers at the cost of the markers alone (a
    pattern of every added token took ten times as long: seconds), and the stream still joins
    to the whole parse."""
    import random
    import string
    import time

    rng = random.Random(0)
    others = sorted({"".join(rng.choices(string.ascii_letters, k=8)) for _ in range(40000)})
    piece = "<think>" + "x " * 32768 + "</think>"
    elapsed = {}
    for name, added in [("few", MARKERS), ("many", [*MARKERS, *others])]:
        parsers = factory(_with_added(tmp_path, name, added), "hermes", "qwen3")
        text = OUTPUTS["reasoning, content, a call"]
        same(streamed(parsers, [text[:20], text[20:]]), whole(parsers, text))
        parser = parsers(TOOLS, "auto", [], True)
        started = time.perf_counter()
        delta = parser.feed(piece)
        elapsed[name] = time.perf_counter() - started
        assert delta.reasoning_content == "x " * 32768
    assert elapsed["many"] < 3 * elapsed["few"] + 0.1, elapsed


def _thinks(parsers, stream: bool, **context) -> ParsedDelta:
    text = OUTPUTS["reasoning and content, no call"]
    parser = parsers(None, "auto", [], stream, **context)
    deltas = [parser.feed(text[:9]), parser.feed(text[9:]), parser.finish()]
    return ParsedDelta(
        content="".join(d.content for d in deltas),
        reasoning_content="".join(d.reasoning_content for d in deltas),
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_reasoning_parser_reads_the_requests_template_variables_as_vllm_gives_them(
    qwen_markers, stream
):
    """vLLM builds each request's parser with its chat_template_kwargs (reasoning_effort and
    enable_thinking merged in): qwen3's asked not to think parses no reasoning."""
    parsers = factory(qwen_markers, None, "qwen3")
    thinking = _thinks(parsers, stream)
    assert thinking.reasoning_content == "Nothing to call.\nSo: answer."
    assert thinking.content == "It is 20°C."
    told_not_to = _thinks(parsers, stream, variables={"enable_thinking": False})
    assert told_not_to.reasoning_content == ""
    assert "It is 20°C." in told_not_to.content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_parser_is_given_the_prompts_ids_as_vllm_gives_them(qwen_markers, stream, mocker):
    """vLLM's server gives a whole completion's parser the prompt's ids before ``parse`` and a
    stream's every ``parse_delta`` (a template that closed the reasoning in the prompt)."""
    parsers = factory(qwen_markers, None, "qwen3")
    prompt = qwen_markers.encode("hi<think>", add_special_tokens=False)
    method = "parse_delta" if stream else "set_prompt_token_ids"
    seen = mocker.spy(parsers._parser_cls, method)
    parser = parsers(None, "auto", [], stream, prompt_ids=prompt)
    parser.feed("abc")
    parser.finish()
    assert seen.call_args_list, method
    for call_ in seen.call_args_list:
        given = call_.args[4] if stream else call_.args[1]  # (self, text, ids, request, prompt)
        assert list(given) == prompt, call_
