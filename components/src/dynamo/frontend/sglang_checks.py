"""The sglang processor's options checked against each other and against SGLang's registries.

Before anything is imported, the three options exit 2 unless ``--dyn-chat-processor`` is
``sglang`` (the two parser names also with ``vllm``); once the processor's library is imported,
the parser names (SGLang's or vLLM's registries) and the chat template are checked and turned
into the processor's settings.
"""

from __future__ import annotations

from typing import Any

from dynamo.common.configuration import Option
from dynamo.frontend.parsing import vllm_output_parser
from dynamo.frontend.processors import sglang_processor
from dynamo.runtime.chat_template import compile_problem

from .frontend_args import FrontendConfig
from .sglang_options import CHAT_TEMPLATE, REASONING_PARSER, SGLANG_OPTIONS, TOOL_CALL_PARSER


def given(config: FrontendConfig) -> list[Option]:
    values = (config.tool_call_parser, config.reasoning_parser, config.chat_template)
    return [
        option for option, value in zip(SGLANG_OPTIONS, values, strict=True) if value is not None
    ]


def problem_before_import(config: FrontendConfig, processor_option: Option) -> str | None:
    """The sglang options with another processor (checked before anything is imported); the
    parser names also apply with ``vllm`` (vLLM's own parsers)."""
    if config.dyn_chat_processor == "sglang":
        return None
    for option in given(config):
        if config.dyn_chat_processor == "vllm" and option is not CHAT_TEMPLATE:
            continue
        processors = "sglang" if option is CHAT_TEMPLATE else "sglang or vllm"
        return (
            f"{option.source_label()} applies only with "
            f"{processor_option.source_label()} {processors} (it is "
            f"{config.dyn_chat_processor!r} here)"
        )
    return None


def settings_or_problem(
    config: FrontendConfig,
) -> tuple[sglang_processor.SglangSettings | None, str | None]:
    """The checked settings, or why not (call after the processor's library is imported: the
    names are SGLang's, or vLLM's with ``--dyn-chat-processor vllm``)."""
    library: Any = vllm_output_parser if config.dyn_chat_processor == "vllm" else sglang_processor
    tool = config.tool_call_parser
    if tool is not None:
        problem = library.tool_call_parser_problem(tool)
        if problem is not None:
            return None, f"{TOOL_CALL_PARSER.source_label()}: {problem}"
    reasoning = config.reasoning_parser
    if reasoning is not None:
        problem = library.reasoning_parser_problem(reasoning)
        if problem is not None:
            return None, f"{REASONING_PARSER.source_label()}: {problem}"
    template = None
    if config.chat_template is not None:
        try:
            template = sglang_processor.read_chat_template(config.chat_template)
        except ValueError as exc:
            return None, f"{CHAT_TEMPLATE.source_label()}: {exc}"
        problem = compile_problem(template)
        if problem is not None:
            return None, (
                f"{CHAT_TEMPLATE.source_label()} is {config.chat_template!r}: the template "
                f"{problem}"
            )
    return sglang_processor.SglangSettings(tool, reasoning, template), None
