"""One declaration per option.

An :class:`Option` holds everything an operator can know about a setting: flag, env var, value
kind, default and meaning. The configargparse argument, its help line (with ``[env var: X]`` and
the default) and the row of the configuration table in docs/ are all derived from it, so they
cannot drift apart.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .values import (
    MAX_WAIT_MS,
    MAX_WAIT_REASON,
    MAX_WAIT_S,
    Choice,
    FiniteFloat,
    Host,
    IntRange,
    Text,
    undecodable_problem,
)


class ValueKind(Protocol):
    def parse(self, text: str) -> Any: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Option:
    """A command-line flag with its env var.

    ``kind=None`` declares a negatable boolean: ``--name`` / ``--no-name``, with the env var
    accepting 1/0/true/false/yes/no/on/off. Booleans get long names only: with a short alias
    configargparse silently ignores a false env value.
    """

    name: str  # the long flag without its leading dashes, e.g. "freeze-gc-heap"
    env_var: str
    default: Any
    help: str
    kind: ValueKind | None = None
    dest: str = ""
    metavar: str | None = None

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.name.replace("-", "_"))

    @property
    def flag(self) -> str:
        return "--" + self.name

    @property
    def is_bool(self) -> bool:
        return self.kind is None

    def flags(self) -> tuple[str, ...]:
        return (self.flag, "--no-" + self.name) if self.is_bool else (self.flag,)

    def renamed(self, *, name: str, env_var: str) -> Option:
        """The same option under another flag and env var (one declaration, two surfaces); its
        ``dest`` stays, so every surface fills the same field."""
        return replace(self, name=name, env_var=env_var)

    def source_label(self) -> str:
        return f"{self.flag} / {self.env_var}"

    def render_default(self) -> str:
        if self.is_bool:
            return "on" if self.default else "off"
        if self.default is None:
            return "unset"
        if isinstance(self.default, float) and self.default.is_integer():
            return str(int(self.default))
        return str(self.default)

    def describe_value(self) -> str:
        return "on/off" if self.kind is None else self.kind.describe()

    def type_callable(self):
        """The argparse ``type=``: our kind's parse, with a message naming flag, env var, value."""
        kind = self.kind
        label = self.source_label()

        def convert(text: str) -> Any:
            try:
                problem = undecodable_problem(text)
                if problem is not None:
                    raise ValueError(problem)
                return kind.parse(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(
                    f"invalid value {text!r} for {label}: {exc}"
                ) from None

        convert.__name__ = self.dest  # argparse names the type in some messages
        return convert

    def add_to(self, parser) -> argparse.Action:
        help_text = f"{self.help} (default: {self.render_default()})".replace("%", "%%")
        if self.is_bool:
            action = parser.add_argument(
                self.flag,
                dest=self.dest,
                action=argparse.BooleanOptionalAction,
                default=self.default,
                env_var=self.env_var,
                help=help_text,
            )
            # BooleanOptionalAction appends its own "(default: True)" on 3.10-3.12; ours says
            # on/off, the words operators use in the env var.
            action.help = help_text
            return action
        return parser.add_argument(
            self.flag,
            dest=self.dest,
            type=self.type_callable(),
            default=self.default,
            env_var=self.env_var,
            metavar=self.metavar,
            help=help_text,
        )


@dataclass(frozen=True)
class Surface:
    """A set of options that one program (or one subsystem of it) reads."""

    name: str  # e.g. "frontend"
    title: str  # heading of its docs page
    program: str  # how operators start it, e.g. "python -m dynamo.frontend"
    description: str
    options: Sequence[Option]


# Factories for the families of options: each fixes the value kind and the metavar of its family,
# so a declaration says only what is its own (flag, env var, default, meaning, bounds).


def host_option(name: str, env_var: str, default: str, help: str) -> Option:
    """An address a listener binds (checked, and a name resolved, at parse time)."""
    return Option(name, env_var, default, help, Host(), metavar="HOST")


def port_option(name: str, env_var: str, default: int | None, help: str) -> Option:
    """A listener's TCP port (0: a free one, which the listener logs)."""
    return Option(name, env_var, default, help, IntRange(0, 65535), metavar="PORT")


def count_option(
    name: str,
    env_var: str,
    default: int | None,
    help: str,
    *,
    low: int,
    high: int,
    metavar: str = "N",
) -> Option:
    """A whole number from ``low`` to ``high`` (both included)."""
    return Option(name, env_var, default, help, IntRange(low, high), metavar=metavar)


def seconds_option(
    name: str,
    env_var: str,
    default: float,
    help: str,
    *,
    minimum: float = 0.0,
    maximum: float = MAX_WAIT_S,
) -> Option:
    """A duration in seconds: a finite number, by default at most what ``threading`` waits."""
    reason = MAX_WAIT_REASON if maximum == MAX_WAIT_S else None
    kind = FiniteFloat(minimum, maximum, reason)
    return Option(name, env_var, default, help, kind, metavar="SECONDS")


def milliseconds_option(
    name: str,
    env_var: str,
    default: float,
    help: str,
    *,
    maximum: float = MAX_WAIT_MS,
    maximum_reason: str = MAX_WAIT_REASON,
) -> Option:
    """A duration in milliseconds, from 0 to what ``threading`` waits unless ``maximum`` says
    less (with ``maximum_reason``: why, in words the error and the docs show)."""
    kind = FiniteFloat(0.0, maximum, maximum_reason)
    return Option(name, env_var, default, help, kind, metavar="MS")


def text_option(name: str, env_var: str, help: str, *, what: str, metavar: str) -> Option:
    """A name or a path, unset by default (``what`` names it in errors and in docs)."""
    return Option(name, env_var, None, help, Text(what), metavar=metavar)


def choice_option(
    name: str, env_var: str, default: str, help: str, *, kind: Choice, metavar: str | None = None
) -> Option:
    """One word out of ``kind``'s; the metavar lists them (``{a,b}``) as argparse's choices do."""
    if metavar is None:
        metavar = "{" + ",".join(kind.words) + "}"
    return Option(name, env_var, default, help, kind, metavar=metavar)
