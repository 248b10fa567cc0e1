"""``python -m dynamo.vllm --help`` with ``--engine vllm``: vLLM's own engine arguments, listed
after the worker's (vLLM is imported only for that)."""

from __future__ import annotations

import importlib
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

    parser = FlexibleArgumentParser(
        prog=VLLM_PROG,
        description="vLLM engine arguments (everything python -m dynamo.vllm does not know)",
    )
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
