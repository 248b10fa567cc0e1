"""The frontend's `hf` rendering equals transformers' apply_chat_template, text and token ids.

transformers is in the vLLM venv only, so this file is marked ``vllm``. Three templates: the
tiny model's own, a ChatML one (Qwen-style, with a default system prompt and tool calls), and a
Llama-3 style one (``bos_token``, ``raise_exception`` on a bad role order, ``strip``, ``loop``).
The `vllm` processor is checked against the same reference.
"""

from __future__ import annotations

import pytest

from dynamo.frontend.processors.chat_processor import ChatTemplateError, build_chat_processor
from dynamo.frontend.processors.hf_processor import RenderOptions
from dynamo.runtime.model_card import ModelCard

pytestmark = pytest.mark.vllm

CHATML = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}{% continue %}{% endif %}
    {%- if message.tool_calls is defined and message.tool_calls %}
        {{- '<|im_start|>assistant\\n' }}
        {%- for call in message.tool_calls %}
            {{- '<tool_call>' + (call.function | tojson) + '</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3 = """{{- bos_token }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) and message['role'] != 'system' %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""  # noqa: E501 - Llama 3's template as it ships

CONVERSATIONS = [
    [{"role": "user", "content": "Hello 🧊, how are you?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  What is 2+2?  "},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And <b>3+3</b> in 世界?"},
    ],
    [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": "{}"}}],
        },
        {"role": "user", "content": "thanks"},
    ],
]


@pytest.fixture(scope="module")
def reference(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def card(tiny_model, template_path=None) -> ModelCard:
    return ModelCard(
        served_model_name="tiny",
        model_path=tiny_model,
        tokenizer_path=tiny_model,
        context_length=256,
        eos_token_ids=(1,),
        chat_template_path=template_path,
    )


@pytest.fixture(params=["tiny", "chatml", "llama3"])
def template_path(request, tmp_path):
    source = {"tiny": None, "chatml": CHATML, "llama3": LLAMA3}[request.param]
    if source is None:
        return None
    path = tmp_path / f"{request.param}.jinja"
    path.write_text(source, encoding="utf-8")
    return str(path)


def expected(reference, template_path, messages):
    source = None if template_path is None else open(template_path, encoding="utf-8").read()
    text = reference.apply_chat_template(
        messages, chat_template=source, tokenize=False, add_generation_prompt=True
    )
    ids = reference.apply_chat_template(
        messages, chat_template=source, tokenize=True, add_generation_prompt=True,
        return_dict=False,
    )  # fmt: skip
    return text, list(ids)


@pytest.mark.parametrize("kind", ["hf", "vllm"])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_rendering_and_ids_equal_transformers(
    reference, tiny_model, template_path, kind, conversation
):
    messages = CONVERSATIONS[conversation]
    processor = build_chat_processor(card(tiny_model, template_path), kind)
    try:
        want_text, want_ids = expected(reference, template_path, messages)
    except Exception as exc:  # noqa: BLE001 - any refusal of the reference's must be ours too
        with pytest.raises(ChatTemplateError, match="alternate"):
            processor.render(messages)
        assert "alternate" in str(exc)
        return
    text = processor.render(messages)
    assert text == want_text
    assert processor.encode_chat(text) == want_ids


def test_the_llama3_template_raises_on_a_bad_role_order(reference, tiny_model, tmp_path):
    path = tmp_path / "llama3.jinja"
    path.write_text(LLAMA3, encoding="utf-8")
    messages = [{"role": "assistant", "content": "first"}]
    with pytest.raises(Exception, match="must alternate"):
        reference.apply_chat_template(messages, chat_template=LLAMA3, tokenize=False)
    with pytest.raises(ChatTemplateError, match="must alternate"):
        build_chat_processor(card(tiny_model, str(path))).render(messages)


def test_decoding_equals_transformers_decode(reference, tiny_model):
    text = "Hello 🧊 世界, the quick brown fox"
    ids = reference.encode(text, add_special_tokens=False) + [1]
    for kind in ("hf", "vllm"):
        detokenizer = build_chat_processor(card(tiny_model), kind).detokenizer()
        streamed = "".join(detokenizer.add([i]) for i in ids) + detokenizer.finish()
        assert streamed == reference.decode(ids, skip_special_tokens=True)


def test_both_processors_bound_prompt_ids_by_the_vocabulary_vllm_checks(reference, tiny_model):
    from vllm.tokenizers import get_tokenizer

    largest = get_tokenizer(tiny_model).max_token_id  # what vLLM's own check compares with
    assert largest == max(reference.get_vocab().values())
    for kind in ("hf", "vllm"):
        processor = build_chat_processor(card(tiny_model), kind)
        assert processor.tokenizer.max_token_id == largest, kind
        processor.check_token_ids([0, largest])
        with pytest.raises(ValueError, match=f"Token id {largest + 1} is out of vocabulary"):
            processor.check_token_ids([3, largest + 1])


@pytest.mark.parametrize("kind", ["hf", "vllm"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_request_template_variables_render_as_transformers_renders_them(
    reference, tiny_model, tmp_path, kind, add_generation_prompt
):
    """``add_generation_prompt`` and ``chat_template_kwargs`` (a new variable, and one that
    overrides the model's ``bos_token``) reach the template as apply_chat_template's kwargs."""
    path = tmp_path / "variables.jinja"
    path.write_text(
        "{{ bos_token }}{{ greeting | default('none') }}|{{ messages[0].content }}"
        "{% for doc in documents or [] %}|{{ doc.title }}:{{ doc.text }}{% endfor %}"
        "{% for tool in tools or [] %}|{{ tool.function.name }}={{ tool.function.parameters "
        "| tojson }}{% endfor %}{% if add_generation_prompt %}|GEN{% endif %}",
        encoding="utf-8",
    )
    messages = CONVERSATIONS[0]
    variables = {"greeting": "hi", "bos_token": "B:"}
    tools = [{"type": "function", "function": {"name": "get", "parameters": {"b": [1, "é"]}}}]
    documents = [{"title": "T", "text": "snow"}]
    want = reference.apply_chat_template(
        messages, chat_template=path.read_text(encoding="utf-8"), tokenize=False,
        add_generation_prompt=add_generation_prompt, tools=tools, documents=documents,
        **variables,
    )  # fmt: skip
    processor = build_chat_processor(card(tiny_model, str(path)), kind)
    options = RenderOptions(add_generation_prompt, variables, tools, documents)
    got = processor.render(messages, options)
    assert got == want and got.startswith("B:hi|") and "|get=" in got and "|T:snow" in got


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_continue_final_message_renders_as_transformers_renders_it(
    reference, tiny_model, template_path, kind
):
    messages = [
        {"role": "user", "content": "Write a haiku"},
        {"role": "assistant", "content": "Snow on the frozen  "},
    ]
    source = None if template_path is None else open(template_path, encoding="utf-8").read()
    want = reference.apply_chat_template(
        messages, chat_template=source, tokenize=False, add_generation_prompt=False,
        continue_final_message=True,
    )  # fmt: skip
    processor = build_chat_processor(card(tiny_model, template_path), kind)
    options = RenderOptions(add_generation_prompt=False, continue_final_message=True)
    got = processor.render(messages, options)
    assert got == want and got.rstrip().endswith("Snow on the frozen")


@pytest.mark.parametrize("kind", ["hf", "vllm"])
@pytest.mark.parametrize(
    "fields",
    [
        {"reasoning_effort": "high"},
        {"reasoning_effort": "none"},
        {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
        {"reasoning_effort": "max", "chat_template_kwargs": {"reasoning_effort": "low"}},
        {"chat_template_kwargs": {"reasoning_effort": "low"}},
    ],
)
def test_reasoning_effort_renders_as_vllms_chat_params_render_it(
    reference, tiny_model, tmp_path, kind, fields
):
    """The template variables of a request with ``reasoning_effort`` are vLLM's own
    (``ChatCompletionRequest.build_chat_params``), and render as transformers renders them."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest as VllmChatRequest,
    )

    from dynamo.frontend.openai.protocol import parse_chat_request

    path = tmp_path / "effort.jinja"
    path.write_text(
        "{{ messages[0].content }}|{{ reasoning_effort | default('unset') }}|"
        "{{ enable_thinking | default('unset') }}",
        encoding="utf-8",
    )
    body = {"model": "m", "messages": CONVERSATIONS[0], **fields}
    vllm_kwargs = (
        VllmChatRequest.model_validate(body).build_chat_params(None, "auto").chat_template_kwargs
    )
    want = reference.apply_chat_template(
        CONVERSATIONS[0], chat_template=path.read_text(encoding="utf-8"), tokenize=False,
        **vllm_kwargs,
    )  # fmt: skip
    request = parse_chat_request(body)
    processor = build_chat_processor(card(tiny_model, str(path)), kind)
    assert processor.render_chat(request) == want
    effort = fields.get("reasoning_effort")
    assert f"|{effort or 'low'}|" in want  # the template saw it
