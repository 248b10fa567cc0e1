"""The configargparse parser every surface uses, with strict env-var booleans."""

from __future__ import annotations

import argparse
import os
from typing import Mapping, Sequence

import configargparse

from .options import Option, Surface
from .values import parse_bool_word


class DynamoArgParser(configargparse.ArgParser):
    """configargparse with our boolean env rule.

    configargparse maps a boolean env var to ``--x`` / ``--no-x`` itself, but its error for a bad
    value names only the env var. Ours names the flag too, and accepts exactly the spellings in
    the project's conventions whatever configargparse version is installed.
    """

    def __init__(self, *args, options: Sequence[Option] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self._bool_options = {o.env_var: o for o in options if o.is_bool}

    def convert_item_to_command_line_arg(self, action, key, value):
        option = self._bool_options.get(key)
        if option is None or not isinstance(value, str):
            return super().convert_item_to_command_line_arg(action, key, value)
        try:
            enabled = parse_bool_word(value)
        except ValueError as exc:
            self.error(f"invalid value {value!r} for {option.flag} / {option.env_var}: {exc}")
        return [option.flag if enabled else "--no-" + option.name]


def build_parser(surface: Surface, *, extra_options: Sequence[Option] = ()) -> DynamoArgParser:
    options = list(surface.options) + list(extra_options)
    parser = DynamoArgParser(
        prog=surface.program,
        description=surface.description,
        options=options,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # Only explicit env_var= options read the environment: no silent auto prefix.
        auto_env_var_prefix=None,
        args_for_setting_config_path=[],
        ignore_unknown_config_file_keys=False,
    )
    for option in options:
        option.add_to(parser)
    return parser


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
    if allow_unknown:
        return parser.parse_known_args(argv, env_vars=env_vars)
    return parser.parse_args(argv, env_vars=env_vars)
