"""The GC options of the upstream worker adapters (``python -m dynamo_gc.vllm`` / ``.mocker``).

The names and meanings are those of this project's own vLLM worker (``--freeze-gc-heap`` /
``--no-freeze-gc-heap`` / ``DYN_VLLM_FREEZE_GC_HEAP``, default on; ``--gc-pause-log-ms`` /
``DYN_VLLM_GC_PAUSE_LOG_MS``). The mocker stands in for the vLLM worker, so it reads the same.
They are taken out of the command line before upstream sees it; a bad value exits 2 naming the
flag and the env var, before upstream is imported.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from dynamo_gc.configuration.gc_options import GcSettings, gc_options
from dynamo_gc.configuration.options import Surface
from dynamo_gc.configuration.parser import DynamoArgParser, build_parser

VLLM_PROGRAM = "python -m dynamo_gc.vllm"
MOCKER_PROGRAM = "python -m dynamo_gc.mocker"

WORKER_GC_OPTIONS = gc_options(flag_prefix="", env_prefix="DYN_VLLM_")

VLLM_SURFACE = Surface(
    name="upstream-vllm",
    title="Upstream ai-dynamo vLLM worker (python -m dynamo_gc.vllm)",
    program=VLLM_PROGRAM,
    description=(
        "Upstream ai-dynamo's vLLM worker with its GC heap frozen after engine init, before the "
        "model is registered. Every argument not listed here is upstream's (listed after these)."
    ),
    options=WORKER_GC_OPTIONS,
)

MOCKER_SURFACE = Surface(
    name="upstream-mocker",
    title="Upstream ai-dynamo mock engine (python -m dynamo_gc.mocker)",
    program=MOCKER_PROGRAM,
    description=(
        "Upstream ai-dynamo's mock engine with its GC heap frozen after make_engine, before "
        "run_input serves it. Every argument not listed here is upstream's (listed after these)."
    ),
    options=WORKER_GC_OPTIONS,
)


def _parser(surface: Surface) -> DynamoArgParser:
    return build_parser(surface)


def _settings(namespace: argparse.Namespace) -> GcSettings:
    return GcSettings(
        freeze_gc_heap=namespace.freeze_gc_heap, gc_pause_log_ms=namespace.gc_pause_log_ms
    )


def split_args(
    surface: Surface, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[GcSettings, list[str]]:
    """Our options out of ``argv`` (flags, then env vars, then defaults), and upstream's rest."""
    env_vars = dict(os.environ if env is None else env)
    namespace, rest = _parser(surface).parse_known_args(list(argv), env_vars=env_vars)
    return _settings(namespace), rest


def format_help(surface: Surface) -> str:
    return _parser(surface).format_help()
