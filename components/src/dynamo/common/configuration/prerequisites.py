"""Options that only act together with another one: what happens when that one is missing.

An option whose prerequisite is missing would be silently ignored (``--debug-gc-endpoint``
without ``--system-port`` serves no endpoint; ``--mock-token-ms`` with ``--engine vllm`` paces
nothing). The rule, the same for every such option of both launchers:

* given **on the command line**: exit 2 naming both options (flags and env vars). A flag is
  written for this one run, so a flag that does nothing is a mistake in that run;
* set only **through its env var**: one WARNING naming both, and the process starts. Env vars
  are often set for a whole fleet or a shell session (a ConfigMap shared by workers of both
  engines, the GC policy's variables that the ranks read too), where exiting would turn a
  harmless leftover into an outage.

An option counts as given when its value differs from its default (``--no-x`` for an option
that is off anyway is not given).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynamo_gc.configuration.options import Option, Surface
from dynamo_gc.configuration.parser import build_parser


@dataclass(frozen=True)
class Requires:
    """``option`` acts only when ``met(config)``; ``prerequisite`` says what that needs, naming
    the other option's flag and env var (e.g. ``--system-port / DYN_SYSTEM_PORT set``)."""

    option: Option
    prerequisite: str
    met: Callable[[Any], bool]

    def message(self) -> str:
        return f"{self.option.source_label()} acts only with {self.prerequisite}"


def on_command_line(option: Option, argv: Sequence[str]) -> bool:
    """Whether ``argv`` (before a ``--``) gives ``option`` (``--x``, ``--x=V``, ``--no-x``)."""
    for word in argv:
        if word == "--":
            return False
        if word.partition("=")[0] in option.flags():
            return True
    return False


def _parsed_default(option: Option) -> Any:
    """The default as the parser delivers it (argparse runs a text default through ``type``)."""
    if isinstance(option.default, str) and option.kind is not None:
        return option.kind.parse(option.default)
    return option.default


def unmet(requirements: Iterable[Requires], config: Any) -> list[Requires]:
    """The requirements whose option is given (differs from its default) but not met."""
    return [
        r
        for r in requirements
        if getattr(config, r.option.dest) != _parsed_default(r.option) and not r.met(config)
    ]


def command_line_problem(
    requirements: Iterable[Requires], config: Any, argv: Sequence[str]
) -> str | None:
    """The first unmet requirement of an option given on the command line (exit 2), or None."""
    for requirement in unmet(requirements, config):
        if on_command_line(requirement.option, argv):
            return f"{requirement.message()}: give both, or neither"
    return None


def refuse_command_line_problem(
    surface: Surface, requirements: Iterable[Requires], config: Any, argv: Sequence[str]
) -> None:
    """Exit 2, the surface's parser saying why, at :func:`command_line_problem`'s answer."""
    problem = command_line_problem(requirements, config, argv)
    if problem is not None:
        build_parser(surface).error(problem)


def env_warnings(
    requirements: Iterable[Requires],
    config: Any,
    argv: Sequence[str],
    env: Mapping[str, str],
) -> list[str]:
    """WARNING lines for unmet requirements of options set through their env var only."""
    return [
        f"{requirement.message()}; {requirement.option.env_var} is set in the environment without "
        "it and is ignored"
        for requirement in unmet(requirements, config)
        if not on_command_line(requirement.option, argv) and requirement.option.env_var in env
    ]
