"""The two GC options of each kind of process, for a program that also takes another's arguments.

Our launchers declare the GC options in their own surfaces (:func:`~.gc_options.gc_options`); an
adapter that wraps another program (upstream ai-dynamo's frontend or worker) cannot: the command
line is mostly the other program's, which parses it afterwards. So an adapter takes only the GC
flags out of it with :func:`split_gc_args` and hands the rest on, or, where it sees no command
line at all (a route extension loaded by upstream's frontend), reads the env vars with
:func:`gc_settings_from_env`. Both read the same declarations as our launchers, under the same
names (:data:`FRONTEND_GC`, :data:`WORKER_GC`), and refuse a bad value the same way: exit 2, the
flag, the env var and the value in the message, nothing applied.

A word is ours only when it is exactly one of our flags (``--x``, ``--no-x`` for the boolean,
``--x VALUE`` or ``--x=VALUE``): never an abbreviation, never a flag that merely starts like
ours, and nothing after a ``--``. Every other word is left in place, in order (``--help``
included: the adapter shows :func:`gc_help` beside the other program's help).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from .gc_options import GcSettings, gc_options
from .options import Option
from .parser import DynamoArgParser, HelpFormatter
from .values import parse_bool_word, undecodable_problem


@dataclass(frozen=True)
class GcSurface:
    """The GC options under one kind of process's naming."""

    name: str  # "frontend" or "worker"
    freeze: Option  # the negatable boolean: --x / --no-x
    pause_log_ms: Option

    @property
    def options(self) -> tuple[Option, Option]:
        return (self.freeze, self.pause_log_ms)

    def flags(self) -> tuple[str, ...]:
        return tuple(flag for option in self.options for flag in option.flags())


def gc_surface(name: str, *, flag_prefix: str, env_prefix: str) -> GcSurface:
    """The GC options of ``name`` under its launcher's prefixes (see :func:`gc_options`)."""
    freeze, pause_log_ms = gc_options(flag_prefix=flag_prefix, env_prefix=env_prefix)
    return GcSurface(name, freeze, pause_log_ms)


# The frontend's: --dyn-freeze-gc-heap / DYN_FREEZE_GC_HEAP, --dyn-gc-pause-log-ms /
# DYN_GC_PAUSE_LOG_MS (upstream's frontend flags all start with --dyn-).
FRONTEND_GC = gc_surface("frontend", flag_prefix="dyn-", env_prefix="DYN_")
# The vLLM worker's: --freeze-gc-heap / DYN_VLLM_FREEZE_GC_HEAP, --gc-pause-log-ms /
# DYN_VLLM_GC_PAUSE_LOG_MS.
WORKER_GC = gc_surface("worker", flag_prefix="", env_prefix="DYN_VLLM_")


def _fail(prog: str, message: str) -> NoReturn:
    """Exit 2 as our launchers do: the error first and alone, then where the options are."""
    sys.stderr.write(f"{prog}: error: {message}\n(run {prog} --help for the options)\n")
    raise SystemExit(2)


def _default_prog() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def _bool_from_env(option: Option, text: str, prog: str) -> bool:
    try:
        problem = undecodable_problem(text)
        if problem is not None:
            raise ValueError(problem)
        return parse_bool_word(text)
    except ValueError as exc:
        _fail(prog, f"invalid value {text!r} for {option.source_label()}: {exc}")


def _value(option: Option, text: str, prog: str) -> Any:
    try:
        return option.type_callable()(text)
    except argparse.ArgumentTypeError as exc:
        _fail(prog, str(exc))


def _from_env(
    surface: GcSurface, env: Mapping[str, str], prog: str, *, given: Mapping[str, Any] = {}
) -> dict[str, Any]:
    """The env vars of the options the command line did not give (those it gave win, and their
    env var is not read at all, as in our launchers' parser)."""
    values: dict[str, Any] = {}
    freeze_text = env.get(surface.freeze.env_var)
    if freeze_text is not None and surface.freeze.dest not in given:
        values[surface.freeze.dest] = _bool_from_env(surface.freeze, freeze_text, prog)
    pause_text = env.get(surface.pause_log_ms.env_var)
    if pause_text is not None and surface.pause_log_ms.dest not in given:
        values[surface.pause_log_ms.dest] = _value(surface.pause_log_ms, pause_text, prog)
    return values


def _settings(surface: GcSurface, values: Mapping[str, Any]) -> GcSettings:
    return GcSettings(
        freeze_gc_heap=values.get(surface.freeze.dest, surface.freeze.default),
        gc_pause_log_ms=float(values.get(surface.pause_log_ms.dest, surface.pause_log_ms.default)),
    )


def gc_settings_from_env(
    surface: GcSurface, environ: Mapping[str, str] | None = None, *, prog: str | None = None
) -> GcSettings:
    """The GC settings from the env vars alone (defaults where unset). A bad value exits 2
    naming the flag, the env var and the value."""
    env = os.environ if environ is None else environ
    prog = prog or _default_prog()
    return _settings(surface, _from_env(surface, env, prog))


def split_gc_args(
    argv: Sequence[str],
    surface: GcSurface,
    environ: Mapping[str, str] | None = None,
    *,
    prog: str | None = None,
) -> tuple[GcSettings, list[str]]:
    """Take this surface's GC flags out of ``argv``; return the settings and the other words.

    Precedence as on our launchers: the command line, then the env var, then the default (the
    last of repeated flags wins; an option given on the command line does not read its env var,
    as our launchers' parser does not). A bad value, a value given to the boolean (``--x=0``), a
    missing value, or a bad env value that is read exits 2 before anything is applied, naming
    the flag and the env var.
    """
    env = os.environ if environ is None else environ
    prog = prog or _default_prog()
    freeze, pause = surface.freeze, surface.pause_log_ms
    given: dict[str, Any] = {}
    rest: list[str] = []
    words = list(argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":  # the other program's: everything after it is an operand
            rest.extend(words[i:])
            break
        flag, has_value, value = word.partition("=")
        if flag in (freeze.flag, "--no-" + freeze.name):
            if has_value:
                _fail(
                    prog,
                    f"invalid value {value!r} for {freeze.source_label()}: {flag} takes no "
                    f"value; write {freeze.flag} or --no-{freeze.name}, or set "
                    f"{freeze.env_var}=1/0 (true/false, yes/no, on/off)",
                )
            given[freeze.dest] = flag == freeze.flag
        elif flag == pause.flag:
            if not has_value:
                if i + 1 >= len(words) or words[i + 1] == "--":
                    _fail(prog, f"{pause.source_label()}: expected one value ({pause.metavar})")
                i += 1
                value = words[i]
            given[pause.dest] = _value(pause, value, prog)
        else:
            rest.append(word)
        i += 1
    values = _from_env(surface, env, prog, given=given)
    values.update(given)
    return _settings(surface, values), rest


def gc_help(surface: GcSurface, *, title: str = "GC heap options (dynamo_gc)") -> str:
    """The help block of this surface's GC options, as our launchers' ``--help`` shows them
    (flags, env vars, defaults), for an adapter to print beside the other program's help."""
    parser = DynamoArgParser(
        prog=_default_prog(),
        usage=argparse.SUPPRESS,
        add_help=False,
        options=surface.options,
        formatter_class=HelpFormatter,
        auto_env_var_prefix=None,
        args_for_setting_config_path=[],
    )
    group = parser.add_argument_group(title)
    for option in surface.options:
        option.add_to(group)
    return parser.format_help().strip("\n") + "\n"
