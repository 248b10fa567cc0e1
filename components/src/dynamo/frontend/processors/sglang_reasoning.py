"""Whether a request's output starts inside the reasoning block, as SGLang's server decides it
per request (``TemplateManager.force_reasoning or OpenAIServingChat._get_reasoning_from_request``):
the template's own reasoning pattern and toggle, read once per model, and the request's
``chat_template_kwargs`` and ``reasoning_effort`` as the client sent them. Imported only where
SGLang is (``--dyn-chat-processor sglang``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReasoningDefaults:
    """What SGLang's server reads off a model's template and reasoning parser once, to decide
    per request whether the output starts inside the reasoning block: the template opens it
    itself (``TemplateManager.force_reasoning``), its toggle (``reasoning_config``: which
    ``chat_template_kwargs`` key, on or off by default) and, for a template without one, the
    parser's own default (its detector's ``reasoning_default``)."""

    parser_name: str
    template_forces: bool = False
    config: Any = None
    detector_default: str | None = None

    @classmethod
    def detect(cls, parser_name: str, template: str) -> ReasoningDefaults:
        from sglang.srt.parser.reasoning_parser import ReasoningParser
        from sglang.srt.parser.template_detection import detect_reasoning_pattern

        forced, config = detect_reasoning_pattern(template or None)
        default = None
        if config is None:
            default = ReasoningParser(model_type=parser_name).detector.reasoning_default
        return cls(parser_name, bool(forced), config, default)

    def force_reasoning(self, fields: Mapping[str, Any]) -> bool:
        """SGLang's ``TemplateManager.force_reasoning or
        OpenAIServingChat._get_reasoning_from_request(request)`` for a request with these
        fields (the client's ``chat_template_kwargs`` as sent, and ``reasoning_effort``)."""
        return self.template_forces or self._from_request(
            fields.get("chat_template_kwargs"), fields.get("reasoning_effort")
        )

    def _from_request(self, kwargs: Mapping[str, Any] | None, effort: str | None) -> bool:
        name = self.parser_name
        if name == "iquest_q1":
            from sglang.srt.parser.reasoning_parser import IQuestQ1ReasoningDetector

            return bool(IQuestQ1ReasoningDetector.thinking_enabled(dict(kwargs or {})))
        if name == "minimax-m3":
            return (kwargs or {}).get("thinking_mode") == "enabled"
        config = self.config
        if name == "hunyuan":
            if getattr(config, "special_case", None) == "hunyuan_effort":
                return effort not in ("none", "no_think")
            return effort not in (None, "none", "no_think")
        if config is None:
            return _default_thinks(self.detector_default, kwargs, effort)
        if config.special_case == "always":
            return True
        if config.special_case == "mistral":
            return effort is not None and effort != "none"
        if config.toggle_param is None or config.default_enabled is None:
            return False
        if config.default_enabled:
            return not kwargs or kwargs.get(config.toggle_param) is not False
        return kwargs is not None and kwargs.get(config.toggle_param) is True


def _default_thinks(mode: str | None, kwargs: Mapping[str, Any] | None, effort: Any) -> bool:
    """SGLang's fallback to the parser's ``reasoning_default`` (a template without a toggle)."""
    if mode == "always":
        return True
    if mode == "mistral":
        return effort is not None and effort != "none"
    if mode in ("thinking", "enable_thinking"):
        return not kwargs or kwargs.get(mode) is not False
    if mode in ("explicit_thinking", "explicit_enable_thinking"):
        toggle = mode.replace("explicit_", "")
        return kwargs is not None and kwargs.get(toggle) is True
    return False


def default_force_reasoning(parser_name: str, template: str) -> bool:
    """Whether a request without ``chat_template_kwargs`` / ``reasoning_effort`` starts inside
    the reasoning block, as SGLang's server decides it (:class:`ReasoningDefaults`)."""
    return ReasoningDefaults.detect(parser_name, template).force_reasoning({})
