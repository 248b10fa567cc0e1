"""The ``vllm`` and ``sglang`` processors' chat templates, in the template render processes.

Both processors render a model's template with transformers' ``apply_chat_template`` (through
vLLM's or SGLang's tokenizer, as ``vllm serve`` and SGLang do), which compiles it in its own
Jinja environment and renders it on the calling thread: nothing bounds a template's time or
memory there, and a peer's template is code (docs/security.md). So when the frontend has render
processes (:mod:`.template_sandbox`), these processors' templates render there too, in the
environment :mod:`dynamo.runtime.chat_template` builds, which is transformers' own
(``transformers/utils/chat_template_utils.py``) with the bounds added, given what transformers
gives a template besides the request's variables: the tokenizer's ``special_tokens_map``.

A tokenizer may carry named templates (``{"default": ..., "tool_use": ...}``): transformers
renders ``tool_use`` for a request with tools when there is one, else ``default``
(``get_chat_template``); :meth:`TemplateForms.for_request` picks the same way. Each named
template is compiled once, in a render process under the render bounds, when the model is
registered (the ``template_check``), before the model is served.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .hf_processor import ChatTemplateError, HfChatTemplate, ModelFilesError, RenderOptions

# Checks that a template compiles, in a bounded place (the template render processes' check):
# raises ModelFilesError when it does not, or breaks a bound while compiling.
TemplateCheck = Callable[[str, Mapping[str, Any]], None]

# transformers' names for the templates of a tokenizer that carries several.
DEFAULT_TEMPLATE = "default"
TOOL_USE_TEMPLATE = "tool_use"


def transformers_variables(tokenizer: Any) -> dict[str, Any]:
    """What transformers' ``apply_chat_template`` passes every template besides the request's
    variables: the tokenizer's special tokens (``bos_token``, ``eos_token``, ...), as text, and
    on transformers 4 the list of its ``additional_special_tokens`` too."""
    found = getattr(tokenizer, "special_tokens_map", None) or {}
    variables: dict[str, Any] = {}
    for name, value in dict(found).items():
        if isinstance(value, str):
            variables[str(name)] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            variables[str(name)] = list(value)
    return variables


class TemplateForms:
    """A model's template (or named templates) as the render processes render it."""

    def __init__(self, templates: Mapping[str, HfChatTemplate]) -> None:
        self._templates = dict(templates)

    @classmethod
    def single(cls, template: HfChatTemplate) -> TemplateForms:
        return cls({DEFAULT_TEMPLATE: template})

    def for_request(self, options: RenderOptions) -> HfChatTemplate:
        """The template transformers would render for this request (see the module
        docstring); raises ChatTemplateError (the client's 400, as transformers' ValueError is
        on a thread) when the named ones have no ``default`` for it."""
        if options.tools and TOOL_USE_TEMPLATE in self._templates:
            return self._templates[TOOL_USE_TEMPLATE]
        template = self._templates.get(DEFAULT_TEMPLATE)
        if template is None:
            names = ", ".join(sorted(self._templates))
            raise ChatTemplateError(
                f"the model's named chat templates ({names}) have no '{DEFAULT_TEMPLATE}' one, "
                "and this request does not pick one"
            )
        return template


def template_forms(
    source: str | Mapping[str, Any], variables: Mapping[str, Any], check: TemplateCheck
) -> TemplateForms:
    """The forms of ``source`` (one template's text, or a tokenizer's named templates), each
    compiled by ``check`` first, under the render bounds; raises ModelFilesError."""
    if isinstance(source, str):
        named: dict[str, Any] = {DEFAULT_TEMPLATE: source}
    else:
        named = dict(source)
    templates = {}
    for name, text in named.items():
        if not isinstance(text, str):
            raise ModelFilesError(f"the model's chat template {str(name)!r} is not text")
        check(text, variables)
        templates[str(name)] = HfChatTemplate(text, variables, compiled=False)
    return TemplateForms(templates)
