"""``python -m dynamo.vllm --help`` with ``--engine vllm``: vLLM's own engine arguments, listed
after the worker's (vLLM is imported only for that), the way ``vllm serve --help`` lists them:
its config groups, one line each, and how to see one. ``--help=<group>`` (``--help=CacheConfig``),
``--help=<flag>`` (``--help=max-model-len``) and ``--help=all`` print that part of vLLM's
arguments, as they do for ``vllm serve``."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import logging
import os
import select
import sys
from collections.abc import Iterator
from typing import Any

VLLM_MISSING_HINT = (
    "install it into a separate environment with scripts/setup_vllm_env.sh and run the worker "
    "from there, or run the built-in mock engine with --engine mock --model <tokenizer dir>"
)


VLLM_PROG = "python -m dynamo.vllm --engine vllm"
# The worker's own help is printed first; vLLM's part has a short usage line, as `vllm serve`
# has (argparse's own would list all ~250 of vLLM's flags in it).
VLLM_USAGE = f"{VLLM_PROG} [options]"
VLLM_DESCRIPTION = (
    "vLLM's engine arguments: everything python -m dynamo.vllm does not know goes to vLLM.\n"
    "\n"
    "Search by using: `--help=<ConfigGroup>` to explore options by section (e.g.,\n"
    "--help=CacheConfig, --help=ModelConfig)\n"
    "  Use `--help=all` to show all available flags at once.\n"
)
# vLLM's own epilog for `vllm serve`, for this command.
VLLM_EPILOG = (
    "For full list:            python -m dynamo.vllm --help=all\n"
    "For a section:            python -m dynamo.vllm --help=ModelConfig    (case-insensitive)\n"
    "For a flag:               python -m dynamo.vllm --help=max-model-len  (_ or - accepted)\n"
    "Documentation:            https://docs.vllm.ai\n"
)
HELP_SEARCH_PREFIX = "--help="


def vllm_arg_parser(*, for_help: bool = False) -> Any:
    """vLLM's own engine-argument parser, as ``vllm serve`` builds it (imports vLLM); for help,
    with ``vllm serve``'s short usage line, search hint and epilog."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM releases before the utils split
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]

    from dynamo_gc.configuration.parser import short_usage_error

    if for_help:
        parser = FlexibleArgumentParser(
            prog=VLLM_PROG,
            usage=VLLM_USAGE,
            description=VLLM_DESCRIPTION,
            epilog=VLLM_EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    else:
        parser = FlexibleArgumentParser(
            prog=VLLM_PROG,
            description="vLLM engine arguments (everything python -m dynamo.vllm does not know)",
        )
    # vLLM's usage is hundreds of lines: its error line first and alone, as the worker's own.
    parser.error = functools.partial(short_usage_error, parser)
    return AsyncEngineArgs.add_cli_args(parser)


def print_vllm_help(search: str | None = None) -> None:
    """vLLM's engine arguments (``search``: the part ``--help=<search>`` asks for, as vLLM
    prints it), or why they cannot be listed here."""
    try:
        with _quiet_vllm_import():
            importlib.import_module("vllm")
            parser = vllm_arg_parser(for_help=True)
    except ImportError as exc:
        print(
            "\nvLLM's engine arguments are not listed: vLLM is not installed in this Python "
            f"environment ({exc}); {VLLM_MISSING_HINT}"
        )
        return
    if search is None:
        print("\nEvery other argument goes to vLLM (--engine vllm):\n")
        parser.print_help()
        return
    try:
        # vLLM's own parser reads --help=<keyword> (its FlexibleArgumentParser), prints what
        # matches and exits 0: exactly what `vllm serve --help=<keyword>` prints.
        parser.parse_args([HELP_SEARCH_PREFIX + search])
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise


@contextlib.contextmanager
def _quiet_vllm_import() -> Iterator[None]:
    """vLLM's import logs WARNINGs meant for a server (on a CPU: "Triton is installed, but
    doesn't include CPU backend"); before any logging is set up they would land bare in the
    middle of the help text."""
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        vllm_logger.setLevel(level)


# How long to give a reader such as ``head`` to hang up once it has what it asked for.
READER_GRACE_MS = 100


class _Output:
    """Whether standard output still has a reader."""

    def open(self) -> bool:
        try:
            poller = select.poll()
            poller.register(sys.stdout.fileno(), 0)  # errors and hang-ups are always reported
            return not poller.poll(READER_GRACE_MS)
        except (OSError, ValueError, AttributeError):  # no poll, or stdout is not a file
            return True


@contextlib.contextmanager
def quiet_when_output_closed() -> Iterator[_Output]:
    """``--help | head``: once the reader has gone, stop writing, without a BrokenPipeError
    traceback (at the write, or at the interpreter's flush at exit)."""
    try:
        yield _Output()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere
        os.close(devnull)
