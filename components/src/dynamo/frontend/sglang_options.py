"""The frontend's options for ``--dyn-chat-processor sglang`` (upstream Dynamo's flag names).

Upstream's frontend takes ``--tool-call-parser``, ``--reasoning-parser`` and ``--chat-template``
in sglang mode; here they are declared once like every other option (with env mirrors, a docs
row), and checked at start-up, after SGLang is imported, against SGLang's own registries:

* given with another processor: exit 2 (only the sglang processor applies them here; silently
  ignoring a parser would hand a client plain text where it expects parsed calls);
* a parser name SGLang does not have: exit 2 naming the flag and env var, listing SGLang's names;
* a ``--chat-template`` that is one of SGLang's built-in names, not a file, or not ``.jinja``:
  exit 2, as upstream refuses it.

The model card does not carry the worker's parser names yet; when it does, the flags here
override it, as upstream's do.
"""

from __future__ import annotations

import argparse

from dynamo.common.configuration import Option, Text

from . import sglang_processor

TOOL_CALL_PARSER = Option(
    name="tool-call-parser",
    env_var="DYN_TOOL_CALL_PARSER",
    default=None,
    kind=Text("parser name"),
    metavar="NAME",
    help=(
        "With --dyn-chat-processor sglang: SGLang's tool-call parser, which finds the tool "
        "calls in the model's output (qwen25, hermes, llama3, ...: any name of SGLang's "
        "FunctionCallParser registry). Unset: no tool-call parsing"
    ),
)

REASONING_PARSER = Option(
    name="reasoning-parser",
    env_var="DYN_REASONING_PARSER",
    default=None,
    kind=Text("parser name"),
    metavar="NAME",
    help=(
        "With --dyn-chat-processor sglang: SGLang's reasoning parser, which splits the "
        "model's reasoning from its answer (deepseek-r1, qwen3, ...: any name of SGLang's "
        "ReasoningParser registry). Unset: no reasoning parsing"
    ),
)

CHAT_TEMPLATE = Option(
    name="chat-template",
    env_var="DYN_CHAT_TEMPLATE",
    default=None,
    kind=Text("path"),
    metavar="PATH",
    help=(
        "With --dyn-chat-processor sglang: a .jinja chat template that every model is rendered "
        "with instead of its own (and of its worker's --chat-template); SGLang's built-in "
        "template names are refused, as upstream"
    ),
)

SGLANG_OPTIONS = [TOOL_CALL_PARSER, REASONING_PARSER, CHAT_TEMPLATE]


def given(config: argparse.Namespace) -> list[Option]:
    return [option for option in SGLANG_OPTIONS if getattr(config, option.dest) is not None]


def problem_before_import(config: argparse.Namespace, processor_option: Option) -> str | None:
    """The sglang options with another processor (checked before anything is imported)."""
    if config.dyn_chat_processor == "sglang":
        return None
    for option in given(config):
        return (
            f"{option.source_label()} applies only with "
            f"{processor_option.source_label()} sglang (it is "
            f"{config.dyn_chat_processor!r} here)"
        )
    return None


def settings_or_problem(
    config: argparse.Namespace,
) -> tuple[sglang_processor.SglangSettings | None, str | None]:
    """The checked settings, or why not (call after SGLang is imported)."""
    tool = config.tool_call_parser
    if tool is not None:
        problem = sglang_processor.tool_call_parser_problem(tool)
        if problem is not None:
            return None, f"{TOOL_CALL_PARSER.source_label()}: {problem}"
    reasoning = config.reasoning_parser
    if reasoning is not None:
        problem = sglang_processor.reasoning_parser_problem(reasoning)
        if problem is not None:
            return None, f"{REASONING_PARSER.source_label()}: {problem}"
    template = None
    if config.chat_template is not None:
        try:
            template = sglang_processor.read_chat_template(config.chat_template)
        except ValueError as exc:
            return None, f"{CHAT_TEMPLATE.source_label()}: {exc}"
    return sglang_processor.SglangSettings(tool, reasoning, template), None
