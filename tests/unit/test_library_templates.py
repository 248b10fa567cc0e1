"""The ``vllm`` and ``sglang`` processors' templates in the render processes
(:mod:`dynamo.frontend.processors.library_templates`): the variables transformers gives a
template, the named template transformers picks for a request, and each template compiled by the
render processes' check before its model is served."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dynamo.frontend.processors.hf_processor import (
    ChatTemplateError,
    HfChatTemplate,
    ModelFilesError,
    RenderOptions,
)
from dynamo.frontend.processors.library_templates import (
    TemplateForms,
    template_forms,
    transformers_variables,
)

TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {}}}]


def test_the_variables_are_the_tokenizers_special_tokens_as_text():
    tokenizer = SimpleNamespace(
        special_tokens_map={"bos_token": "<s>", "eos_token": "</s>", "odd": ["<x>", 3]}
    )
    assert transformers_variables(tokenizer) == {"bos_token": "<s>", "eos_token": "</s>"}
    assert transformers_variables(SimpleNamespace()) == {}
    # transformers 4 lists its additional special tokens there too, and passes them.
    older = SimpleNamespace(
        special_tokens_map={"bos_token": "<s>", "additional_special_tokens": ["<a>", "<b>"]}
    )
    assert transformers_variables(older) == {
        "bos_token": "<s>",
        "additional_special_tokens": ["<a>", "<b>"],
    }


def test_each_named_template_is_compiled_by_the_check_before_it_is_kept():
    checked = []
    forms = template_forms(
        {"default": "D{{ bos_token }}", "tool_use": "T"},
        {"bos_token": "<s>"},
        lambda source, variables: checked.append((source, dict(variables))),
    )
    assert checked == [("D{{ bos_token }}", {"bos_token": "<s>"}), ("T", {"bos_token": "<s>"})]
    assert forms.for_request(RenderOptions()).render([]) == "D<s>"


def test_a_template_the_check_refuses_refuses_the_model():
    def refuse(source, variables):
        raise ModelFilesError("the chat template took over 5 s to compile")

    with pytest.raises(ModelFilesError, match="took over 5 s"):
        template_forms("{{ x }}", {}, refuse)


def test_a_named_template_that_is_not_text_refuses_the_model():
    with pytest.raises(ModelFilesError, match="'default' is not text"):
        template_forms({"default": 3}, {}, lambda source, variables: None)


@pytest.mark.parametrize(
    ("named", "tools", "picked"),
    [
        ({"default": "D", "tool_use": "T"}, TOOLS, "T"),
        ({"default": "D", "tool_use": "T"}, None, "D"),
        ({"default": "D"}, TOOLS, "D"),
    ],
)
def test_a_request_gets_the_named_template_transformers_picks(named, tools, picked):
    forms = TemplateForms({name: HfChatTemplate(text, {}) for name, text in named.items()})
    assert forms.for_request(RenderOptions(tools=tools)).source == picked


def test_named_templates_without_a_default_are_the_clients_400_as_on_a_thread():
    forms = TemplateForms({"tool_use": HfChatTemplate("T", {})})
    assert forms.for_request(RenderOptions(tools=TOOLS)).source == "T"
    with pytest.raises(ChatTemplateError, match=r"\(tool_use\) have no 'default'"):
        forms.for_request(RenderOptions())


def test_continue_final_message_continues_the_last_text_part_of_a_content_list():
    """SGLang hands an openai-format template its content as parts: transformers continues the
    last part that has text, so does the render processes' template."""
    template = HfChatTemplate(
        "{% for m in messages %}{% for p in m.content %}{{ p.text }}|{% endfor %}{% endfor %}", {}
    )
    parts = [
        {"type": "text", "text": "Snow on"},
        {"type": "image"},
        {"type": "text", "text": "ice"},
    ]
    messages = [{"role": "assistant", "content": parts}]
    options = RenderOptions(add_generation_prompt=False, continue_final_message=True)
    assert template.render(messages, options) == "Snow on||ice"
    assert parts[-1]["text"] == "ice"  # the request's own message is left as it was
    with pytest.raises(ChatTemplateError, match="could not find any text to continue"):
        template.render([{"role": "assistant", "content": [{"type": "image"}]}], options)
