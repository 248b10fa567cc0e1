"""``--dyn-chat-processor sglang``'s processor against SGLang itself: the prompt ids are what
SGLang's own template and tokenizer give, the detokenizer gives what a whole decode gives, and
the option checks take their names from SGLang's registries."""

from __future__ import annotations

import pytest

from dynamo.frontend.openai.protocol import parse_chat_request
from dynamo.frontend.processors.chat_processor import (
    build_chat_processor,
    import_processor_libraries,
)
from dynamo.frontend.processors.hf_processor import ModelFilesError
from dynamo.vllm.mock_model import load_mock_model
from tests.sglang.sglang_reference import sglang_prompt_ids

pytestmark = pytest.mark.sglang

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Hello,"}, {"type": "text", "text": "frozen heap! ❄"}],
    },
]


@pytest.fixture(scope="module")
def sglang():
    import_processor_libraries("sglang")
    from dynamo.frontend.processors import sglang_processor

    return sglang_processor


@pytest.fixture(scope="module")
def card(tiny_tokenizer):
    return load_mock_model(tiny_tokenizer, served_model_name="tiny").card


def test_prompt_ids_are_sglangs_own_template_and_tokenizer(sglang, card):
    processor = build_chat_processor(card, "sglang")
    chat = parse_chat_request({"model": "tiny", "messages": MESSAGES})
    prompt = processor.render_chat(chat)
    assert "Hello, frozen heap! ❄" in prompt  # SGLang joins content parts with a space
    assert processor.encode_chat(prompt) == sglang_prompt_ids(card.tokenizer_path, MESSAGES)


def test_the_streamed_text_is_the_whole_decode(sglang, card):
    processor = build_chat_processor(card, "sglang")
    ids = processor.encode_chat(processor.render(MESSAGES))
    detokenizer = processor.detokenizer()
    pieces = [detokenizer.add([token]) for token in ids] + [detokenizer.finish()]
    assert "".join(pieces) == processor.tokenizer.decode(ids)
    assert all("\ufffd" not in piece for piece in pieces)  # ❄ is three bytes, never split


def test_a_worker_chat_template_from_the_card_is_rendered(sglang, card, tmp_path):
    template = tmp_path / "override.jinja"
    template.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    processor = build_chat_processor(
        card.model_copy(update={"chat_template_path": str(template)}), "sglang"
    )
    assert processor.render([{"role": "user", "content": "hi"}]) == "[hi]"


def test_the_frontend_chat_template_wins_over_the_cards(sglang, card, tmp_path):
    worker = tmp_path / "worker.jinja"
    worker.write_text("worker")
    frontend = tmp_path / "frontend.jinja"
    frontend.write_text("{{ messages[0]['content'] }}!")
    settings = sglang.SglangSettings(chat_template=sglang.read_chat_template(str(frontend)))
    processor = build_chat_processor(
        card.model_copy(update={"chat_template_path": str(worker)}), "sglang", settings
    )
    assert processor.render([{"role": "user", "content": "hi"}]) == "hi!"


def test_a_missing_tokenizer_is_a_model_files_error(sglang, card, tmp_path):
    with pytest.raises(ModelFilesError, match="SGLang cannot load the tokenizer"):
        build_chat_processor(card.model_copy(update={"tokenizer_path": str(tmp_path)}), "sglang")


def test_parser_names_come_from_sglangs_registries(sglang):
    from sglang.srt.function_call.function_call_parser import FunctionCallParser
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    assert sglang.tool_call_parser_names() == sorted(FunctionCallParser.ToolCallParserEnum)
    assert sglang.reasoning_parser_names() == sorted(ReasoningParser.DetectorMap)
    assert sglang.tool_call_parser_problem("qwen25") is None
    assert sglang.reasoning_parser_problem("deepseek-r1") is None
    problem = sglang.tool_call_parser_problem("qwen99")
    assert "'qwen99'" in problem and "hermes" in problem and "qwen25" in problem
    problem = sglang.reasoning_parser_problem("nope")
    assert "'nope'" in problem and "deepseek-r1" in problem and "qwen3" in problem
    # In the registry, but it needs SGLang's server-side response template.
    assert "cannot be used here" in sglang.tool_call_parser_problem("response_template")


def test_chat_template_files_follow_upstreams_rules(sglang, tmp_path):
    with pytest.raises(ValueError, match="built-in chat template names"):
        sglang.read_chat_template("chatml")
    with pytest.raises(ValueError, match="is not a file"):
        sglang.read_chat_template(str(tmp_path / "missing.jinja"))
    text_file = tmp_path / "template.txt"
    text_file.write_text("{{ messages }}")
    with pytest.raises(ValueError, match="not a .jinja file"):
        sglang.read_chat_template(str(text_file))


def test_the_sglang_heap_benchmark_runs(tmp_path):
    """scripts/bench_sglang_heap.py --smoke (docs/benchmarks.md quotes its full run)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_sglang_heap.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--sglang-python", sys.executable,
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "sglang_heap-smoke.json").read_text())
    assert [step["step"] for step in result["steps"]][-2:] == ["+ sglang", "+ model"]
    assert result["frozen_objects"] > 0 and result["stock_ms_median"] > 0
