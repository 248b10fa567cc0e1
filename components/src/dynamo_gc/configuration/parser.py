"""The configargparse parser every surface uses, with strict env-var booleans.

Generic: it knows options and surfaces, not any program. A launcher that must also refuse
another program's option names (ours: upstream Dynamo's) does so before calling it.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from typing import NoReturn

import configargparse

from .options import Option, Surface
from .values import FiniteFloat, IntRange, parse_bool_word, undecodable_problem

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

    # Where an error sends the reader instead of ``run PROG --help`` (a program that has no
    # --help of its own: the gc-freeze route extension inside upstream's frontend).
    help_pointer: str | None = None

    def __init__(self, *args, options: Sequence[Option] = (), **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._bool_options = {o.env_var: o for o in options if o.is_bool}
        self._bool_flags = {
            flag: option for option in options if option.is_bool for flag in option.flags()
        }
        self._numeric_flags = {o.flag for o in options if isinstance(o.kind, NUMERIC_KINDS)}
        self._options = list(options)
        self._by_flag = {flag: option for option in options for flag in option.flags()}

    def error(self, message: str):  # type: ignore[override]  # argparse's: NoReturn
        """Bad input: exit 2 with the error first and alone (see :func:`short_usage_error`)."""
        short_usage_error(self, message)

    def parse_known_args(self, args=None, namespace=None, **kwargs):
        if args is None:
            args = sys.argv[1:]
        if not isinstance(args, str):  # configargparse also takes one string; leave that alone
            self._refuse_undecodable_args(list(args))
            args = self._glue_dash_values(list(args))
            self._refuse_valued_booleans(args)
        return super().parse_known_args(args, namespace, **kwargs)

    def _refuse_undecodable_args(self, args: list[str]) -> None:
        """A command-line word that is not UTF-8: exit 2 naming the option it belongs to (ours:
        flag and env var), whoever would read it, us or vLLM."""
        previous: str | None = None
        for word in args:
            problem = undecodable_problem(word)
            if problem is not None:
                flag, glued, value = word.partition("=")
                if not word.startswith("-"):
                    flag, value = previous or "", word
                option = self._by_flag.get(flag)
                if option is not None:
                    shown = value if glued or not word.startswith("-") else word
                    problem = undecodable_problem(shown) or problem
                    self.error(f"invalid value {shown!r} for {option.source_label()}: {problem}")
                named = f" (for {flag})" if flag and flag != word else ""
                self.error(f"invalid argument {word!r}{named}: {problem}")
            previous = word if word.startswith("-") else None

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
            problem = undecodable_problem(value)
            if problem is not None:
                raise ValueError(problem)
            enabled = parse_bool_word(value)
        except ValueError as exc:
            self.error(f"invalid value {value!r} for {option.flag} / {option.env_var}: {exc}")
        return [option.flag if enabled else "--no-" + option.name]


def short_usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """Exit 2 with ``prog: error: message`` and a pointer to ``--help``, without the usage text.

    argparse prints its usage first, then the error: the worker's usage is 30 lines and vLLM's
    several hundred, so the one line that says what is wrong ended up below a screenful nobody
    reads (or cut off by ``| head`` and log viewers that show the first lines). The error comes
    first and alone; ``--help`` lists every option.
    """
    pointer = getattr(parser, "help_pointer", None) or f"run {parser.prog} --help for the options"
    parser.exit(2, f"{parser.prog}: error: {message}\n({pointer})\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
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
        formatter_class=HelpFormatter,
        # Only explicit env_var= options read the environment: no silent auto prefix.
        auto_env_var_prefix=None,
        args_for_setting_config_path=[],
        ignore_unknown_config_file_keys=False,
    )
    for option in options:
        option.add_to(parser)
    return parser
