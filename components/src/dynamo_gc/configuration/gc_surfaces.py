"""The GC options of each kind of process, for a program that also takes another's arguments.

Our launchers declare the GC options in their own surfaces (:func:`~.gc_options.gc_options`); an
adapter that wraps another program (upstream ai-dynamo's frontend or worker) cannot: the command
line is mostly the other program's, which parses it afterwards. So an adapter takes only the GC
flags out of it with :func:`split_gc_args` and hands the rest on, or, where it sees no command
line at all (a route extension loaded by upstream's frontend), reads the env vars with
:func:`gc_settings_from_env`. Both read the same declarations as our launchers, under the same
names (:data:`FRONTEND_GC`, :data:`WORKER_GC`, :data:`VLLM_WORKER_GC`), and refuse a bad value
the same way: exit 2, the flag, the env var and the value in the message, nothing applied.

A surface whose process can host the serving-time maintenance has its two options too (the mode
and the pause budget: :func:`split_surface_args`, :func:`surface_settings_from_env`), offering
the modes that process can run, and judged as our launchers judge them: a maintenance with the
freeze off exits 2 naming both options; a budget given on the command line with the maintenance
off exits 2, set through its env var only it is ignored with one WARNING.

A word is ours only when it is exactly one of our flags (``--x``, ``--no-x`` for the boolean,
``--x VALUE`` or ``--x=VALUE``): never an abbreviation, never a flag that merely starts like
ours, and nothing after a ``--``. Every other word is left in place, in order (``--help``
included: the adapter shows :func:`gc_help` beside the other program's help).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from .gc_options import (
    FRONTEND_MAINTENANCE_MODES,
    MAINTENANCE_IDLE,
    MAINTENANCE_OFF,
    GcSettings,
    MaintenanceSettings,
    gc_options,
    maintenance_options,
    maintenance_problem,
)
from .options import Option
from .parser import DynamoArgParser, HelpFormatter
from .values import parse_bool_word, undecodable_problem

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcSurface:
    """The GC options under one kind of process's naming, and the maintenance's where that
    process can host it (the mode, then the pause budget)."""

    name: str  # "frontend" or "worker"
    freeze: Option  # the negatable boolean: --x / --no-x
    pause_log_ms: Option
    maintenance: tuple[Option, ...] = ()

    @property
    def options(self) -> tuple[Option, ...]:
        return (self.freeze, self.pause_log_ms, *self.maintenance)

    @property
    def value_options(self) -> tuple[Option, ...]:
        """The options that take a value (every one but the freeze's boolean)."""
        return (self.pause_log_ms, *self.maintenance)

    def flags(self) -> tuple[str, ...]:
        return tuple(flag for option in self.options for flag in option.flags())


@dataclass(frozen=True)
class SurfaceSettings:
    """What a surface's options say: the GC settings, and the maintenance's (``off`` on a
    surface without it)."""

    gc: GcSettings
    maintenance: MaintenanceSettings


def gc_surface(
    name: str, *, flag_prefix: str, env_prefix: str, maintenance_modes: tuple[str, ...] = ()
) -> GcSurface:
    """The GC options of ``name`` under its launcher's prefixes (see :func:`gc_options`), and
    the maintenance's offering ``maintenance_modes`` (none: no maintenance options)."""
    freeze, pause_log_ms = gc_options(flag_prefix=flag_prefix, env_prefix=env_prefix)
    maintenance: tuple[Option, ...] = ()
    if maintenance_modes:
        maintenance = tuple(
            maintenance_options(
                flag_prefix=flag_prefix, env_prefix=env_prefix, modes=maintenance_modes
            )
        )
    return GcSurface(name, freeze, pause_log_ms, maintenance)


# The frontend's: --dyn-freeze-gc-heap / DYN_FREEZE_GC_HEAP, --dyn-gc-pause-log-ms /
# DYN_GC_PAUSE_LOG_MS (upstream's frontend flags all start with --dyn-), and --dyn-gc-maintenance
# {off,idle} / DYN_GC_MAINTENANCE, --dyn-gc-pause-budget-ms / DYN_GC_PAUSE_BUDGET_MS.
FRONTEND_GC = gc_surface(
    "frontend", flag_prefix="dyn-", env_prefix="DYN_", maintenance_modes=FRONTEND_MAINTENANCE_MODES
)
# The mocker's (it stands in for the vLLM worker): --freeze-gc-heap / DYN_VLLM_FREEZE_GC_HEAP,
# --gc-pause-log-ms / DYN_VLLM_GC_PAUSE_LOG_MS. No maintenance: its requests never reach Python.
WORKER_GC = gc_surface("worker", flag_prefix="", env_prefix="DYN_VLLM_")
# Upstream's vLLM worker's: the same, and --gc-maintenance {off,idle} / DYN_VLLM_GC_MAINTENANCE,
# --gc-pause-budget-ms / DYN_VLLM_GC_PAUSE_BUDGET_MS (no withdraw: docs/ai-dynamo.md says why).
VLLM_WORKER_GC = gc_surface(
    "worker",
    flag_prefix="",
    env_prefix="DYN_VLLM_",
    maintenance_modes=(MAINTENANCE_OFF, MAINTENANCE_IDLE),
)


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
    for option in surface.value_options:
        text = env.get(option.env_var)
        if text is not None and option.dest not in given:
            values[option.dest] = _value(option, text, prog)
    return values


def _settings(surface: GcSurface, values: Mapping[str, Any]) -> SurfaceSettings:
    def value(option: Option) -> Any:
        return values.get(option.dest, option.default)

    gc = GcSettings(
        freeze_gc_heap=value(surface.freeze), gc_pause_log_ms=float(value(surface.pause_log_ms))
    )
    if not surface.maintenance:
        return SurfaceSettings(gc, MaintenanceSettings(MAINTENANCE_OFF, 0.0))
    mode, budget = surface.maintenance
    return SurfaceSettings(gc, MaintenanceSettings(value(mode), float(value(budget))))


def _judged(
    surface: GcSurface, settings: SurfaceSettings, given: Mapping[str, Any], prog: str
) -> SurfaceSettings:
    """``settings``, once the maintenance's options are found to work together (see the
    module docstring); exit 2 otherwise."""
    if not surface.maintenance:
        return settings
    mode, budget = surface.maintenance
    problem = maintenance_problem(
        settings.maintenance.mode,
        settings.gc.freeze_gc_heap,
        mode_option=mode,
        freeze_option=surface.freeze,
    )
    if problem is not None:
        _fail(prog, problem)
    if not settings.maintenance.enabled and budget.dest in given:
        _fail(prog, f"{budget.source_label()} acts only with {mode.source_label()} set")
    return settings


def gc_settings_from_env(
    surface: GcSurface, environ: Mapping[str, str] | None = None, *, prog: str | None = None
) -> GcSettings:
    """The GC settings from the env vars alone (defaults where unset). A bad value exits 2
    naming the flag, the env var and the value."""
    return surface_settings_from_env(surface, environ, prog=prog).gc


def surface_settings_from_env(
    surface: GcSurface, environ: Mapping[str, str] | None = None, *, prog: str | None = None
) -> SurfaceSettings:
    """:func:`gc_settings_from_env`, with the maintenance's settings on a surface that has
    them (judged: see the module docstring)."""
    env = os.environ if environ is None else environ
    prog = prog or _default_prog()
    settings = _settings(surface, _from_env(surface, env, prog))
    return _warn_unused_budget(surface, _judged(surface, settings, {}, prog), env)


def _warn_unused_budget(
    surface: GcSurface, settings: SurfaceSettings, env: Mapping[str, str]
) -> SurfaceSettings:
    if surface.maintenance and not settings.maintenance.enabled:
        mode, budget = surface.maintenance
        if env.get(budget.env_var) is not None:
            logger.warning(
                "%s=%s ignored: it acts only with %s set",
                budget.env_var,
                env[budget.env_var],
                mode.source_label(),
            )
    return settings


def split_gc_args(
    argv: Sequence[str],
    surface: GcSurface,
    environ: Mapping[str, str] | None = None,
    *,
    prog: str | None = None,
) -> tuple[GcSettings, list[str]]:
    """Take this surface's GC flags out of ``argv``; return the settings and the other words
    (see :func:`split_surface_args`, whose GC settings these are)."""
    settings, rest = split_surface_args(argv, surface, environ, prog=prog)
    return settings.gc, rest


def split_surface_args(
    argv: Sequence[str],
    surface: GcSurface,
    environ: Mapping[str, str] | None = None,
    *,
    prog: str | None = None,
) -> tuple[SurfaceSettings, list[str]]:
    """Take this surface's flags out of ``argv``; return the settings and the other words.

    Precedence as on our launchers: the command line, then the env var, then the default (the
    last of repeated flags wins; an option given on the command line does not read its env var,
    as our launchers' parser does not). A bad value, a value given to the boolean (``--x=0``), a
    missing value, or a bad env value that is read exits 2 before anything is applied, naming
    the flag and the env var; so do maintenance options that cannot work together.
    """
    env = os.environ if environ is None else environ
    prog = prog or _default_prog()
    freeze = surface.freeze
    by_flag = {option.flag: option for option in surface.value_options}
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
        elif flag in by_flag:
            option = by_flag[flag]
            if not has_value:
                if i + 1 >= len(words) or words[i + 1] == "--":
                    _fail(prog, f"{option.source_label()}: expected one value ({option.metavar})")
                i += 1
                value = words[i]
            given[option.dest] = _value(option, value, prog)
        else:
            rest.append(word)
        i += 1
    values = _from_env(surface, env, prog, given=given)
    values.update(given)
    settings = _judged(surface, _settings(surface, values), given, prog)
    return _warn_unused_budget(surface, settings, env), rest


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
