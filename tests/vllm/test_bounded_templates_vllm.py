"""``--dyn-chat-processor vllm`` renders a peer's template in the frontend's render processes
(bounded in time and memory, docs/security.md), and what they render is what transformers'
``apply_chat_template`` renders on vLLM's tokenizer: the same text for every template and
request shape (tools, documents, request variables, ``continue_final_message``, the
``{% generation %}`` block of training templates), through real render processes. And the
issue-29 bombs through a real ``vllm``-processor frontend process: 503s naming their models
while a healthy model answers."""

from __future__ import annotations

import logging

import pytest

from dynamo.frontend.openai.protocol import parse_chat_request
from dynamo.frontend.processors.chat_processor import build_chat_processor
from tests.support.template_bombs import (
    assert_renders_match,
    bounded_renders,
    check_template_bombs,
    started_sandbox,
)
from tests.support.template_failures import check_template_answers, template_answers
from tests.vllm.test_chat_template_parity import CHATML, CONVERSATIONS, LLAMA3, card

pytestmark = pytest.mark.vllm

GENERATION = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
    "<a>{{ m.content }}</a>{% endgeneration %}{% else %}<{{ m.role }}>{{ m.content }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
)
VARIABLES = (
    "{{ bos_token }}{{ greeting | default('none') }}|{{ messages[-1].content }}"
    "{% for doc in documents or [] %}|{{ doc.title }}:{{ doc.text }}{% endfor %}"
    "{% for tool in tools or [] %}|{{ tool.function.name }}={{ tool.function.parameters "
    "| tojson }}{% endfor %}{% if add_generation_prompt %}|GEN{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"b": [1, "é"]}}}]
BODIES = [
    *({"messages": conversation} for conversation in CONVERSATIONS),
    {"messages": CONVERSATIONS[1], "chat_template_kwargs": {"greeting": "hi", "bos_token": "B:"}},
    {"messages": CONVERSATIONS[0], "tools": TOOLS, "documents": [{"title": "T", "text": "s"}]},
    {
        "messages": [
            {"role": "user", "content": "Write a haiku"},
            {"role": "assistant", "content": "Snow on the frozen  "},
        ],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
]


@pytest.fixture(scope="module")
def reference(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def transformers_renders(reference, source, processor, request) -> str:
    """The prompt transformers' apply_chat_template renders for what the processor gives any
    render (its messages and options), on the thread path's library."""
    messages, options = processor.render_inputs(request)
    return reference.apply_chat_template(
        list(messages), chat_template=source, tokenize=False,
        continue_final_message=options.continue_final_message, **options.template_kwargs(),
    )  # fmt: skip


@pytest.mark.parametrize("name", ["tiny", "chatml", "llama3", "generation", "variables"])
def test_the_render_processes_render_what_transformers_renders(
    reference, tiny_model, tmp_path, name
):
    source = {
        "tiny": None, "chatml": CHATML, "llama3": LLAMA3, "generation": GENERATION,
        "variables": VARIABLES,
    }[name]  # fmt: skip
    path = None
    if source is not None:
        path = tmp_path / f"{name}.jinja"
        path.write_text(source, encoding="utf-8")
    requests = [parse_chat_request({"model": "tiny", **body}) for body in BODIES]
    with started_sandbox(1, timeout_s=30.0) as sandbox:
        processor = build_chat_processor(
            card(tiny_model, None if path is None else str(path)), "vllm",
            template_check=sandbox.check_compiles,
        )  # fmt: skip
        got = bounded_renders(processor, sandbox, requests)
    assert_renders_match(
        requests, got, lambda request: transformers_renders(reference, source, processor, request)
    )


def test_without_render_processes_the_vllm_template_renders_on_a_thread(tiny_model):
    processor = build_chat_processor(card(tiny_model), "vllm")
    request = parse_chat_request({"model": "tiny", "messages": CONVERSATIONS[0]})
    assert processor.bounded_render_inputs(request) is None
    assert processor.render_chat(request)


@pytest.mark.integration
def test_template_bombs_through_a_vllm_processor_frontend(tmp_path):
    check_template_bombs(tmp_path, "--dyn-chat-processor", "vllm")


@pytest.mark.parametrize("processes", [1, 0], ids=["render processes", "threads"])
def test_failing_templates_are_the_models_502_and_a_refusal_the_clients_400(
    tiny_model, tmp_path, caplog, processes
):
    """Issue 37 through the ``vllm`` processor: transformers' environment on a thread, the
    bounded one in a render process; the same answers (tests/unit/test_template_failures.py)."""
    caplog.set_level(logging.INFO)
    answers = template_answers(tiny_model, tmp_path, "vllm", processes=processes, repeat=2)
    check_template_answers(answers, caplog.text)
