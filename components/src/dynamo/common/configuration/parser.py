"""Parse one of our launchers' surfaces: upstream Dynamo's names refused first, then the
generic parser of :mod:`dynamo_gc.configuration.parser`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Literal, overload

from dynamo_gc.configuration.options import Surface
from dynamo_gc.configuration.parser import build_parser

from . import upstream


@overload
def parse_surface(
    surface: Surface,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    allow_unknown: Literal[False] = False,
) -> argparse.Namespace: ...


@overload
def parse_surface(
    surface: Surface,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    allow_unknown: Literal[True],
) -> tuple[argparse.Namespace, list[str]]: ...


def parse_surface(
    surface: Surface,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    allow_unknown: bool = False,
) -> argparse.Namespace | tuple[argparse.Namespace, list[str]]:
    """Parse argv and env for one surface. Bad input exits 2 before anything else runs.

    Precedence: command line, then env var, then the declared default (both ways for booleans:
    ``--no-x`` beats ``X=1`` and ``--x`` beats ``X=0``).
    """
    parser = build_parser(surface)
    env_vars = dict(os.environ if env is None else env)
    # Upstream Dynamo's names that mean nothing here: exit 2 with what to use instead, before
    # argparse (or vLLM, for the worker's pass-through arguments) says only "unrecognized".
    given = sys.argv[1:] if argv is None else argv
    if not isinstance(given, str):
        problem = upstream.rejected_problem(
            surface.program, list(given), env_vars, upstream.declared_names(surface.options)
        )
        if problem is not None:
            parser.error(problem)
    if allow_unknown:
        return parser.parse_known_args(argv, env_vars=env_vars)
    return parser.parse_args(argv, env_vars=env_vars)
