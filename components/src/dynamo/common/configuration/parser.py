"""The configargparse parser every surface uses, with strict env-var booleans."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Literal, overload

import configargparse

from . import upstream
from .options import Option, Surface
from .values import FiniteFloat, IntRange, parse_bool_word

# Value kinds whose bad input often starts with '-' (``-inf``, ``-1``): see _glue_dash_values.
NUMERIC_KINDS = (FiniteFloat, IntRange)


class DynamoArgParser(configargparse.ArgParser):
    """configargparse with our boolean env rule, and no abbreviated flags.

    configargparse maps a boolean env var to ``--x`` / ``--no-x`` itself, but its error for a bad
    value names only the env var. Ours names the flag too, and accepts exactly the spellings in
    the project's conventions whatever configargparse version is installed.

    Abbreviations are off (``allow_abbrev=False``): ``--dyn-gc 5`` would otherwise silently mean
    ``--dyn-gc-pause-log-ms 5``, and the worker, which hands every argument it does not know to
    vLLM, would take an abbreviation meant for vLLM (``--tensor-parallel``) as its own.
    """

    def __init__(self, *args, options: Sequence[Option] = (), **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._bool_options = {o.env_var: o for o in options if o.is_bool}
        self._bool_flags = {
            flag: option for option in options if option.is_bool for flag in option.flags()
        }
        self._numeric_flags = {o.flag for o in options if isinstance(o.kind, NUMERIC_KINDS)}

    def parse_known_args(self, args=None, namespace=None, **kwargs):
        if args is None:
            args = sys.argv[1:]
        if not isinstance(args, str):  # configargparse also takes one string; leave that alone
            args = self._glue_dash_values(list(args))
            self._refuse_valued_booleans(args)
        return super().parse_known_args(args, namespace, **kwargs)

    def _glue_dash_values(self, args: list[str]) -> list[str]:
        """``--x -inf`` -> ``--x=-inf`` for our numeric options.

        argparse takes a word that starts with '-' and is not a plain negative number for an
        option, so ``--gc-pause-log-ms -inf`` failed with "expected one argument", naming neither
        the env var nor the value. Glued to its flag, the word reaches our ``type=``, whose
        message names all three. Only numeric options: a number never legitimately starts with
        a letter after its '-', whereas gluing to a text option would make ``--model -x`` a
        model named "-x" and send ``--model --max-model-len 256``'s 256 to vLLM. A word that is
        one of our flags stays a flag. (``--model=-x`` still says it explicitly.)
        """
        glued: list[str] = []
        i = 0
        while i < len(args):
            word = args[i]
            if word == "--":
                glued.extend(args[i:])
                break
            value = args[i + 1] if i + 1 < len(args) else None
            if (
                word in self._numeric_flags
                and value is not None
                and len(value) > 1
                and value.startswith("-")
                and not self._looks_like_our_flag(value)
            ):
                glued.append(f"{word}={value}")
                i += 2
                continue
            glued.append(word)
            i += 1
        return glued

    def _refuse_valued_booleans(self, args: list[str]) -> None:
        """``--x=0`` for a negatable boolean: an error naming the flags, the env var and the value.

        argparse's own message ("ignored explicit argument '0'") names the flag only, and an
        operator who wrote ``--x=0`` most likely meant the env var's spelling.
        """
        for word in args:
            if word == "--":
                return
            flag, has_value, value = word.partition("=")
            option = self._bool_flags.get(flag)
            if option is None or not has_value:
                continue
            self.error(
                f"invalid value {value!r} for {option.flag} / {option.env_var}: {flag} takes no "
                f"value; write {option.flag} or --no-{option.name}, or set "
                f"{option.env_var}=1/0 (true/false, yes/no, on/off)"
            )

    def _looks_like_our_flag(self, word: str) -> bool:
        return word.split("=", 1)[0] in self._option_string_actions

    def convert_item_to_command_line_arg(self, action, key, value):
        option = self._bool_options.get(key)
        if option is None or not isinstance(value, str):
            return super().convert_item_to_command_line_arg(action, key, value)
        try:
            enabled = parse_bool_word(value)
        except ValueError as exc:
            self.error(f"invalid value {value!r} for {option.flag} / {option.env_var}: {exc}")
        return [option.flag if enabled else "--no-" + option.name]


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help lines wrapped at spaces only: a flag or a value such as ``round-robin`` is never
    split at its hyphen across two lines (operators copy them from --help)."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser(surface: Surface, *, extra_options: Sequence[Option] = ()) -> DynamoArgParser:
    options = list(surface.options) + list(extra_options)
    parser = DynamoArgParser(
        prog=surface.program,
        description=surface.description,
        options=options,
        formatter_class=_HelpFormatter,
        # Only explicit env_var= options read the environment: no silent auto prefix.
        auto_env_var_prefix=None,
        args_for_setting_config_path=[],
        ignore_unknown_config_file_keys=False,
    )
    for option in options:
        option.add_to(parser)
    return parser


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
