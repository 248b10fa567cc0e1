"""Logging for every process of the project: frontend, preprocess workers, vLLM worker, ranks.

One format everywhere, and every line carries the pid: a frontend and its spawned preprocess
workers, or a worker and its rank processes, share one stderr, and an operator (or a test) must
tell their freeze and pause lines apart.

Levels come from ``DYN_LOG``, upstream Dynamo's variable, in its syntax: a default level and
per-target levels, comma-separated, e.g. ``DYN_LOG=debug`` or
``DYN_LOG=info,dynamo_gc.bench_policy=debug``. Upstream's targets are Rust module paths
(``dynamo_runtime::system_status_server``); here a target is a Python logger name, and ``::``
is read as ``.``, so ``dynamo::vllm::gc_policy`` and ``dynamo.vllm.gc_policy`` are the same
logger, and a target covers the loggers under it (``dynamo.frontend`` covers
``dynamo.frontend.main``), as a Rust module path covers its submodules. Levels are Rust's
``error``, ``warn``, ``info``, ``debug``, ``trace`` and ``off``, in any case (Python's
``warning`` and ``critical`` too); Python has no TRACE, so ``trace`` is DEBUG, as upstream maps it
for its Python loggers. A word that is no level, or a span filter (``target[span]=level``), is
refused: the launchers exit 2 naming ``DYN_LOG``. Child processes (preprocess workers, rank
processes) get their parent's levels through :func:`current_log_levels`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

logger = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s pid=%(process)d %(name)s: %(message)s"
DYN_LOG = "DYN_LOG"
DEFAULT_SPEC = "info"
OFF = logging.CRITICAL + 10  # above every level Python logs at

# Rust's level words (upstream's DYN_LOG), plus Python's own spellings.
LEVEL_WORDS = {
    "off": OFF,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": logging.DEBUG,
}
_LEVEL_LIST = "error, warn, info, debug, trace or off"

# Marks the handler we installed, so a second call (a test calling main twice, a pool
# initializer) does not stack handlers and print every line twice.
_HANDLER_MARK = "_dynamo_handler"


@dataclass(frozen=True)
class LogLevels:
    """A parsed ``DYN_LOG``: the default level and per-logger levels (picklable for children)."""

    default: int = logging.INFO
    targets: tuple[tuple[str, int], ...] = ()
    spec: str = DEFAULT_SPEC  # as the operator wrote it, for log lines


def _level(word: str, directive: str) -> int:
    level = LEVEL_WORDS.get(word.strip().lower())
    if level is None:
        where = "" if word.strip() == directive else f" in {directive!r}"
        raise ValueError(f"{word.strip()!r}{where} is not a level ({_LEVEL_LIST})")
    return level


def _target(text: str, directive: str) -> str:
    name = text.strip().replace("::", ".")
    parts = name.split(".")
    if not all(part.replace("-", "_").isidentifier() for part in parts):
        raise ValueError(
            f"{text.strip()!r} in {directive!r} is not a logger name (a dotted module path)"
        )
    return name


def parse_dyn_log(text: str) -> LogLevels:
    """``DYN_LOG``'s value -> :class:`LogLevels`; ``ValueError`` says what is wrong.

    A directive without ``=`` is the default level (the last one wins); ``target=level`` sets
    one logger and those under it. Empty or blank means ``info``.
    """
    default = logging.INFO
    targets: dict[str, int] = {}
    for raw in text.split(","):
        directive = raw.strip()
        if not directive:
            continue
        if "[" in directive or "{" in directive:
            raise ValueError(f"span filters such as {directive!r} are not supported here")
        target, has_level, word = directive.partition("=")
        if has_level:
            targets[_target(target, directive)] = _level(word, directive)
        else:
            default = _level(directive, directive)
    return LogLevels(default, tuple(targets.items()), text.strip() or DEFAULT_SPEC)


def log_levels_from_env(environ: Mapping[str, str] | None = None) -> LogLevels:
    """``DYN_LOG`` from the environment (unset: ``info``); ``ValueError`` when it is bad."""
    env = os.environ if environ is None else environ
    return parse_dyn_log(env.get(DYN_LOG, ""))


def log_levels_or_exit(prog: str, environ: Mapping[str, str] | None = None) -> LogLevels:
    """:func:`log_levels_from_env`, with a bad value ending the program like a bad flag (2)."""
    env = os.environ if environ is None else environ
    try:
        return log_levels_from_env(env)
    except ValueError as exc:
        print(f"{prog}: error: invalid value {env.get(DYN_LOG)!r} for {DYN_LOG}: {exc}",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2) from None


def log_format(label: str | None = None) -> str:
    """:data:`LOG_FORMAT`, with ``[label]`` after the pid when given (e.g. ``rank 0``)."""
    if not label:
        return LOG_FORMAT
    return LOG_FORMAT.replace("pid=%(process)d ", f"pid=%(process)d [{label}] ")


_current: LogLevels | None = None  # None: configure_logging has not run in this process
_targets_set: list[str] = []  # loggers whose level we set, reset on the next configure
_root_level_before: int | None = None  # the root's level before our first configure


def configure_logging(levels: int | LogLevels = logging.INFO, *, label: str | None = None) -> None:
    """Send records at ``levels`` to stderr in the project's format; idempotent.

    ``levels`` is a level number or a parsed ``DYN_LOG`` (:class:`LogLevels`). ``label`` names a
    process that has no name of its own in the pid (a rank: ``rank 0``). Handlers others
    installed (pytest's capture, an embedding application) are left alone.
    """
    global _current
    if isinstance(levels, int):
        levels = LogLevels(levels, (), logging.getLevelName(levels).lower())
    global _root_level_before
    root = logging.getLogger()
    if _current is None:
        _root_level_before = root.level
    root.setLevel(levels.default)
    for name in _targets_set:
        logging.getLogger(name).setLevel(logging.NOTSET)
    _targets_set[:] = [name for name, _ in levels.targets]
    for name, level in levels.targets:
        logging.getLogger(name).setLevel(level)
    _current = levels
    if not any(getattr(handler, _HANDLER_MARK, False) for handler in root.handlers):
        # No level on the handler: a target set to debug under an info default must get through.
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(log_format(label)))
        setattr(handler, _HANDLER_MARK, True)
        root.addHandler(handler)
    logger.debug(
        "Logging configured from %s=%r: default %s%s",
        DYN_LOG,
        levels.spec,
        logging.getLevelName(levels.default),
        "".join(f", {name}={logging.getLevelName(level)}" for name, level in levels.targets),
    )


def current_log_levels() -> LogLevels:
    """What :func:`configure_logging` last set, to hand to a child process (before any set-up:
    the root logger's effective level)."""
    if _current is None:
        level = logging.getLogger().getEffectiveLevel()
        return LogLevels(level, (), logging.getLevelName(level).lower())
    return _current


def ensure_logging(*, label: str | None = None) -> None:
    """Configure logging from ``DYN_LOG`` in a process nobody configured it for (a vLLM rank).

    A no-op where our handler is installed. A bad ``DYN_LOG`` here (the parent already refused
    it, so only a hand-made environment) logs a WARNING and ``info`` is used.
    """
    if any(getattr(h, _HANDLER_MARK, False) for h in logging.getLogger().handlers):
        return
    try:
        levels = log_levels_from_env()
    except ValueError as exc:
        configure_logging(logging.INFO, label=label)
        logger.warning("Ignoring %s=%r (%s); using info", DYN_LOG, os.environ.get(DYN_LOG), exc)
        return
    configure_logging(levels, label=label)


def warn_unmatched_targets(levels: LogLevels) -> list[str]:
    """WARN about targets naming no Python package here (upstream's Rust crates, typos).

    Such a target is harmless but has no effect; saying so beats ignoring it silently. Returns
    the targets warned about.
    """
    unmatched = []
    for name, _ in levels.targets:
        top = name.split(".", 1)[0]
        if top not in sys.modules and importlib.util.find_spec(top) is None:
            unmatched.append(name)
            logger.warning(
                "%s target %r names no Python package in this process (upstream's Rust targets "
                "such as dynamo_runtime do not exist here): it has no effect",
                DYN_LOG,
                name,
            )
    return unmatched


def remove_logging_handler() -> None:
    """Undo :func:`configure_logging` (tests that run ``main`` in-process): its handler and
    levels."""
    global _current
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(handler)
    for name in _targets_set:
        logging.getLogger(name).setLevel(logging.NOTSET)
    _targets_set.clear()
    if _current is not None and _root_level_before is not None:
        root.setLevel(_root_level_before)
    _current = None
