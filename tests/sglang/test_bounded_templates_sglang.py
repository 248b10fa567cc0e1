"""``--dyn-chat-processor sglang`` renders a peer's template in the frontend's render processes
(bounded, docs/security.md), and what they render is what SGLang's own path renders (SGLang's
normalising of content parts, then transformers' ``apply_chat_template`` on SGLang's tokenizer):
content parts joined or kept as the template's format asks, ``continue_final_message`` on a
content list, a tokenizer's named templates (``tool_use`` for a request with tools). And the
issue-29 bombs through a real ``sglang``-processor frontend process."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from dynamo.frontend.openai.protocol import parse_chat_request
from dynamo.frontend.processors.chat_processor import (
    build_chat_processor,
    import_processor_libraries,
)
from dynamo.vllm.mock_model import load_mock_model
from tests.support.template_bombs import (
    assert_renders_match,
    bounded_renders,
    check_template_bombs,
    started_sandbox,
)
from tests.support.template_failures import check_template_answers, template_answers

pytestmark = pytest.mark.sglang

PARTS = [{"type": "text", "text": "Hello,"}, {"type": "text", "text": "frozen heap! ❄"}]
# An openai-format template: it iterates the content's parts itself.
OPENAI_FORMAT = (
    "{% for m in messages %}<{{ m.role }}>{% for p in m.content %}{% if p.type == 'text' %}"
    "{{ p.text }}{% endif %};{% endfor %}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
BODIES = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PARTS}]},
    {"messages": [{"role": "user", "content": "plain"}], "tools": TOOLS},
    {
        "messages": [
            {"role": "user", "content": "Write"},
            {"role": "assistant", "content": [{"type": "text", "text": "Snow on the  "}]},
        ],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
]


@pytest.fixture(scope="module")
def sglang():
    import_processor_libraries("sglang")


def named_templates_dir(tiny_tokenizer, tmp_path) -> str:
    """The tiny tokenizer with transformers' named templates: ``default`` and ``tool_use``."""
    directory = tmp_path / "named"
    shutil.copytree(tiny_tokenizer, directory)
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = [
        {"name": "default", "template": "D:{% for m in messages %}{{ m.content }}{% endfor %}"},
        {"name": "tool_use", "template": "T:{{ tools | length }}:{{ messages[0].content }}"},
    ]
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return str(directory)


@pytest.mark.parametrize("name", ["own", "openai-format", "named"])
def test_the_render_processes_render_what_sglang_renders(sglang, tiny_tokenizer, tmp_path, name):
    tokenizer_dir = tiny_tokenizer
    template_path = None
    if name == "openai-format":
        template_path = tmp_path / "openai.jinja"
        template_path.write_text(OPENAI_FORMAT, encoding="utf-8")
    elif name == "named":
        tokenizer_dir = named_templates_dir(tiny_tokenizer, tmp_path)
    card = load_mock_model(tokenizer_dir, served_model_name="tiny").card
    if template_path is not None:
        card = card.model_copy(update={"chat_template_path": str(template_path)})
    on_a_thread = build_chat_processor(card, "sglang")
    requests = [parse_chat_request({"model": "tiny", **body}) for body in BODIES]
    with started_sandbox(1, timeout_s=30.0) as sandbox:
        bounded = build_chat_processor(card, "sglang", template_check=sandbox.check_compiles)
        got = bounded_renders(bounded, sandbox, requests)
    # SGLang's own path (on a thread) is the reference: a refusal of its must be ours too.
    assert_renders_match(requests, got, on_a_thread.render_chat)
    if name == "named":
        assert got[1] == "T:1:plain" and str(got[0]).startswith("D:")


@pytest.mark.integration
def test_template_bombs_through_an_sglang_processor_frontend(sglang, tmp_path):
    check_template_bombs(tmp_path, "--dyn-chat-processor", "sglang")


@pytest.mark.parametrize("processes", [1, 0], ids=["render processes", "threads"])
def test_failing_templates_are_the_models_502_and_a_refusal_the_clients_400(
    sglang, tiny_tokenizer, tmp_path, caplog, processes
):
    """Issue 37 through the ``sglang`` processor: SGLang's path (transformers' environment) on a
    thread, the bounded one in a render process; the same answers
    (tests/unit/test_template_failures.py)."""
    caplog.set_level(logging.INFO)
    answers = template_answers(tiny_tokenizer, tmp_path, "sglang", processes=processes, repeat=2)
    check_template_answers(answers, caplog.text)
