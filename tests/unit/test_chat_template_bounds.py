"""A chat template is a peer's code (issue 29): compiling it costs time and memory linear in its
source (no constant folding), and what ``*``, ``+`` and ``**`` build while rendering is bounded
before it is allocated, while what real templates do renders as before."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from dynamo.runtime.chat_template import (
    MAX_VALUE_SIZE,
    TemplateValueTooLarge,
    chat_template_environment,
)

FOLDING_BOMBS = [
    "{{ ('a' * 250000000) | length }}",
    "{{ 'a' | center(250000000) }}",
    "{% if 'a' | center(250000000) is string %}x{% endif %}",
    "{{ 'a'.center(250000000) }}",
    "{{ ([1] * 250000000) | length }}",
    "{{ 10 ** 100000000 }}",
    "{{ '%400000000s' % 'a' }}",
    "{{ '%.400000000f' % 1.0 }}",
    "{{ '%400000000s' | format('a') }}",
]


@pytest.mark.parametrize("source", FOLDING_BOMBS)
def test_compiling_a_template_folds_no_constant(source):
    tracemalloc.start()
    try:
        chat_template_environment().from_string(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024, peak  # the 250 MB value was never built


@pytest.mark.parametrize(
    "source",
    [
        "{{ ('a' * 250000000) | length }}",
        "{% set x = 'a' * (messages|length * 300000000) %}{{ x|length }}",
        "{{ ([1] * 250000000) | length }}",
        "{% set x = 'a' * 9000000 %}{{ (x + x) | length }}",
        "{{ 10 ** 100000000 }}",
        "{{ '%400000000s' % 'a' }}",
        "{{ '%.400000000f' % 1.0 }}",
        "{{ '%*s' % (messages|length * 400000000, 'a') }}",
        "{{ '%s%9000000s%9000000s' % ('a', 'b', 'c') }}",
        "{{ '%400000000s' | format('a') }}",
        "{{ '%*s' | format(400000000, 'a') }}",
    ],
)
def test_rendering_refuses_a_value_over_the_bound_before_building_it(source):
    template = chat_template_environment().from_string(source)
    started = time.perf_counter()
    with pytest.raises(TemplateValueTooLarge):
        template.render(messages=[{"role": "user", "content": "hi"}])
    assert time.perf_counter() - started < 5.0  # refused, not built then measured


def test_what_real_templates_do_renders_as_before():
    source = (
        "{{ bos }}{% for m in messages %}{{ '<|' + m.role + '|>' }}{{ m.content | trim }}"
        "{{ '\\n' * 2 }}{% endfor %}{{ [1, 2] + [3] }}{{ 2 ** 8 }}{{ 'ab' * 2 }}"
        "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
        "{{ {'k': 'v'} | tojson }}{{ 3 is odd }}"
    )
    rendered = (
        chat_template_environment()
        .from_string(source)
        .render(bos="<s>", messages=[{"role": "user", "content": " hi "}])
    )
    assert rendered == '<s><|user|>hi\n\n[1, 2, 3]256abab1{"k": "v"}True'
    assert len("a" * MAX_VALUE_SIZE) == MAX_VALUE_SIZE  # the bound itself is allowed


def test_a_generation_block_renders_its_body_as_transformers_does_for_a_prompt():
    """transformers marks the assistant's tokens with ``{% generation %}`` in training
    templates; for a prompt its body renders as it is (and it compiles: a model whose template
    has one is served)."""
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "[{{ m.content | upper }}]{% endgeneration %}{% else %}<{{ m.content }}>{% endif %}"
        "{% endfor %}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert chat_template_environment().from_string(source).render(messages=messages) == "<hi>[YO]"
    with pytest.raises(TemplateValueTooLarge):  # the bounds hold inside it too
        chat_template_environment().from_string(
            "{% generation %}{{ 'a' * 999999999 }}{% endgeneration %}"
        ).render()


@pytest.mark.parametrize(
    "source, rendered",
    [
        ("{{ '%s: %05d|%.2f|%-4s|' % ('x', 3, 1.5, 'ab') }}", "x: 00003|1.50|ab  |"),
        ("{{ '%*d' % (5, 3) }}", "    3"),
        ("{{ '%d%%' % 50 }}", "50%"),
        ("{{ '%(role)s' % {'role': 'user'} }}", "user"),
        ("{{ '%s' % messages[0].content }}", "hi"),
        ("{{ 7 % 3 }}", "1"),
        ("{{ '%s, %s' | format('a', 'b') }}", "a, b"),
        ("{{ '%(x)s' | format(x=3) }}", "3"),
    ],
)
def test_percent_formatting_within_the_bound_renders_as_jinja_does(source, rendered):
    template = chat_template_environment().from_string(source)
    assert template.render(messages=[{"role": "user", "content": "hi"}]) == rendered
