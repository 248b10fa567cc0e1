"""The Jinja environment chat templates are rendered in, shared by the frontend (which renders
them, :mod:`dynamo.frontend.processors.hf_processor`) and the worker (which checks at start-up that
its ``--chat-template`` compiles, so a broken one exits 2 instead of failing every request).

It is the one ``transformers``' ``apply_chat_template`` builds
(``transformers/utils/chat_template_utils.py``): an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, the ``{% generation %}``
block (which transformers uses to mark the assistant's tokens for training masks; rendering a
prompt, it writes its body as it is), a ``tojson`` filter that does not escape HTML, and the
``raise_exception`` and ``strftime_now`` globals.

A model's template is a peer's code (docs/security.md), so two bounds are added that do not
change what a real template renders:

* **No constant folding.** Jinja evaluates constant expressions while it compiles
  (``{{ ('a' * 250000000) | length }}`` or ``{{ 'a' | center(250000000) }}`` allocate hundreds
  of MB before any request): the optimizer is off (``optimized=False``), the growing operators
  are intercepted (which Jinja never folds) and every filter and test is wrapped to take the
  render context (which Jinja never calls at compile time either). So compiling costs time and
  memory linear in the source (at most 1 MiB), and every expression is evaluated when
  rendering, where the frontend bounds it (:mod:`dynamo.frontend.processors.template_sandbox`).
* **Bounded growth.** ``*``, ``**`` and ``+`` are intercepted (the sandbox's
  ``intercepted_binops``): a string, list or number they would make larger than
  :data:`MAX_VALUE_SIZE` is refused before it is allocated (a
  :class:`TemplateValueTooLarge`), so ``'a' * (messages|length * 300000000)`` fails at once.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The largest string or list (in items) ``*`` and ``+`` may build while rendering, and the
# largest number (in bits) ``**`` may: far above any real prompt (a request body is 1 MiB).
MAX_VALUE_SIZE = 16 * 1024 * 1024
MAX_POWER_BITS = 4096


class TemplateValueTooLarge(jinja2.exceptions.TemplateError):
    """A template expression would build a value over :data:`MAX_VALUE_SIZE`."""


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+"})

    def call_binop(self, context, operator: str, left, right):
        _check_growth(operator, left, right)
        return super().call_binop(context, operator, left, right)


def _size(value) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


def _check_growth(operator: str, left, right) -> None:
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            size = _size(seq)
            if size is not None and isinstance(times, int) and size * times > MAX_VALUE_SIZE:
                raise TemplateValueTooLarge(
                    f"the template repeats a value {times} times: over the frontend's bound "
                    f"of {MAX_VALUE_SIZE} characters or items"
                )
    elif operator == "+":
        sizes = (_size(left), _size(right))
        if None not in sizes and sum(sizes) > MAX_VALUE_SIZE:  # type: ignore[arg-type]
            raise TemplateValueTooLarge(
                f"the template joins values over the frontend's bound of {MAX_VALUE_SIZE} "
                "characters or items"
            )
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        if abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
            raise TemplateValueTooLarge(
                f"the template raises a number to a power over {MAX_POWER_BITS} bits"
            )


class _GenerationBlock(jinja2.ext.Extension):
    """transformers' ``{% generation %} ... {% endgeneration %}``: the body, rendered as it is.
    transformers records where the body lands only when asked for an assistant-token mask,
    which a prompt never is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


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
    """The Jinja environment transformers renders chat templates in (see the module docstring)."""
    env = _BoundedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        optimized=False,  # no constant folding while compiling: see the module docstring
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _at_render_time(f) for name, f in env.filters.items()}
    env.tests = {name: _at_render_time(t) for name, t in env.tests.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _at_render_time(function):
    """``function`` as a filter or test Jinja cannot call while compiling: one that takes the
    render context (Jinja never folds those), passing on what the original takes."""
    passes = jinja2.utils._PassArg.from_obj(function)

    @jinja2.pass_context
    @functools.wraps(function)
    def at_render_time(context, *args, **kwargs):
        if passes is jinja2.utils._PassArg.context:
            return function(context, *args, **kwargs)
        if passes is jinja2.utils._PassArg.eval_context:
            return function(context.eval_ctx, *args, **kwargs)
        if passes is jinja2.utils._PassArg.environment:
            return function(context.environment, *args, **kwargs)
        return function(*args, **kwargs)

    return at_render_time


def compile_problem(source: str) -> str | None:
    """Why ``source`` does not compile as a chat template (syntax, an unknown filter or test),
    or None."""
    try:
        chat_template_environment().from_string(source)
    except jinja2.exceptions.TemplateError as exc:
        line = exc.lineno if isinstance(exc, jinja2.exceptions.TemplateSyntaxError) else None
        where = f" (line {line})" if line else ""
        return f"does not compile as a Jinja template{where}: {exc.message or exc}"
    return None
