"""``python -m dynamo.vllm --help`` with ``--engine vllm``: vLLM's own engine arguments, listed
after the worker's (vLLM is imported only for that)."""

from __future__ import annotations

import contextlib
import functools
import importlib
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


def vllm_arg_parser() -> Any:
    """vLLM's own engine-argument parser, as ``vllm serve`` builds it (imports vLLM)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM releases before the utils split
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]

    from dynamo_gc.configuration.parser import short_usage_error

    parser = FlexibleArgumentParser(
        prog=VLLM_PROG,
        description="vLLM engine arguments (everything python -m dynamo.vllm does not know)",
    )
    # vLLM's usage is hundreds of lines: its error line first and alone, as the worker's own.
    parser.error = functools.partial(short_usage_error, parser)
    return AsyncEngineArgs.add_cli_args(parser)


def print_vllm_help() -> None:
    """vLLM's engine arguments, or why they cannot be listed here."""
    try:
        importlib.import_module("vllm")
    except ImportError as exc:
        print(
            "\nvLLM's engine arguments are not listed: vLLM is not installed in this Python "
            f"environment ({exc}); {VLLM_MISSING_HINT}"
        )
        return
    print("\nEvery other argument goes to vLLM (--engine vllm):\n")
    vllm_arg_parser().print_help()


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
