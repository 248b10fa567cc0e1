"""The sglang processor's options checked against each other and against SGLang's registries.

Before anything is imported, the three options exit 2 unless ``--dyn-chat-processor`` is
``sglang``; once SGLang is imported, its parser names and the chat template are checked and
turned into the processor's settings.
"""

from __future__ import annotations

from dynamo.common.configuration import Option

from . import sglang_processor
from .frontend_args import FrontendConfig
from .sglang_options import CHAT_TEMPLATE, REASONING_PARSER, SGLANG_OPTIONS, TOOL_CALL_PARSER


def given(config: FrontendConfig) -> list[Option]:
    values = (config.tool_call_parser, config.reasoning_parser, config.chat_template)
    return [
        option for option, value in zip(SGLANG_OPTIONS, values, strict=True) if value is not None
    ]


def problem_before_import(config: FrontendConfig, processor_option: Option) -> str | None:
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
    config: FrontendConfig,
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
