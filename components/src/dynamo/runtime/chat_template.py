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

* **No constant folding that can grow.** Jinja evaluates constant expressions while it compiles
  (``{{ ('a' * 250000000) | length }}``, ``{{ 'a' | center(250000000) }}`` or
  ``{{ '%400000000s' % 'a' }}`` allocate hundreds of MB before any request; its code generator
  folds output expressions even with the optimizer off): the optimizer is off
  (``optimized=False``), the operators that can build a large value (``*``, ``**``, ``+``,
  ``%``) are intercepted (which Jinja never folds) and every filter and test is wrapped to take
  the render context (which Jinja never calls at compile time either). What Jinja may still
  fold (``~`` of literals, comparisons, ``-``, ``/``, literals themselves) makes a value no larger
  than the source's own text, so a template's constants cost memory linear in the source (at
  most 1 MiB); everything else is evaluated when rendering, where the frontend bounds it
  (:mod:`dynamo.frontend.processors.template_sandbox`).
* **Bounded growth.** ``*``, ``**``, ``+`` and ``%`` are intercepted (the sandbox's
  ``intercepted_binops``), and the ``format`` filter checked the same way: a string, list or
  number they would make larger than :data:`MAX_VALUE_SIZE` is refused before it is allocated
  (a :class:`TemplateValueTooLarge`), so ``'a' * (messages|length * 300000000)`` or
  ``'%400000000s' % 'a'`` fails at once. What else can grow a value (``~`` in a loop, filters
  such as ``center`` or ``join``, string methods such as ``ljust``) is bounded only by the
  render process's memory limit.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.filters
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
    intercepted_binops = frozenset({"*", "**", "+", "%"})

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
    elif operator == "%" and isinstance(left, str):
        _check_format(left, right)
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        if abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
            raise TemplateValueTooLarge(
                f"the template raises a number to a power over {MAX_POWER_BITS} bits"
            )


# A printf-style conversion: its mapping key, width and precision (digits or ``*``).
_CONVERSION = re.compile(r"%(\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.DOTALL)


def _check_format(fmt: str, args) -> None:
    """Refuse ``fmt % args`` when its widths and precisions (digits, or ``*`` taken from
    ``args``) would pad the result over :data:`MAX_VALUE_SIZE`: ``'%400000000s' % 'a'``
    allocates 400 MB otherwise. What the arguments bring themselves is bounded when they were
    built."""
    positional = list(args) if isinstance(args, tuple) else [args]
    position = 0
    padding = 0
    for match in _CONVERSION.finditer(fmt):
        key, width, precision, kind = match.groups()
        if kind == "%" and not (key or width or precision):
            continue
        for spec in (width, precision):
            if spec == "*":
                star = positional[position] if position < len(positional) else 0
                position += 1
                padding += abs(star) if isinstance(star, int) else 0
            elif spec:
                padding += int(spec)
        position += key is None
        if padding + len(fmt) > MAX_VALUE_SIZE:
            raise TemplateValueTooLarge(
                f"the template formats a value wider than the frontend's bound of "
                f"{MAX_VALUE_SIZE} characters"
            )


def _bounded_format(value, *args, **kwargs):
    """Jinja's ``format`` filter (``value % args``) with the ``%`` operator's bound."""
    text = str(value)
    _check_format(text, kwargs or (args[0] if len(args) == 1 else tuple(args)))
    return jinja2.filters.do_format(value, *args, **kwargs)


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
    env.filters["format"] = _bounded_format
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
