"""The Jinja environment chat templates are rendered in, shared by the frontend (which renders
them, :mod:`dynamo.frontend.processors.hf_processor`) and the worker (which checks at start-up that
its ``--chat-template`` compiles, so a broken one exits 2 instead of failing every request).

It is the one ``transformers``' ``apply_chat_template`` builds
(``transformers/utils/chat_template_utils.py``): an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that
does not escape HTML, and the ``raise_exception`` and ``strftime_now`` globals.
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes <, >, & for HTML; chat templates need the text as it is.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def chat_template_environment() -> ImmutableSandboxedEnvironment:
    """The Jinja environment transformers renders chat templates in (see the module docstring).

    transformers' ``{% generation %}`` tag (assistant-token masks for training) is not
    supported: a template that uses it fails to compile with a clear message.
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def compile_problem(source: str) -> str | None:
    """Why ``source`` does not compile as a chat template (syntax, an unknown filter or test,
    transformers' unsupported ``{% generation %}`` tag), or None."""
    try:
        chat_template_environment().from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        line = exc.lineno if isinstance(exc, jinja2.exceptions.TemplateSyntaxError) else None
        where = f" (line {line})" if line else ""
        return f"does not compile as a Jinja template{where}: {exc.message or exc}"
    return None
