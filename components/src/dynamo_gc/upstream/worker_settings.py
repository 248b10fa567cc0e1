"""The GC options of the upstream worker adapters (``python -m dynamo_gc.vllm`` / ``.mocker``).

The names and meanings are those of this project's own vLLM worker (``--freeze-gc-heap`` /
``--no-freeze-gc-heap`` / ``DYN_VLLM_FREEZE_GC_HEAP``, default on; ``--gc-pause-log-ms`` /
``DYN_VLLM_GC_PAUSE_LOG_MS``). The mocker stands in for the vLLM worker, so it reads the same.
They are taken out of the command line before upstream sees it (exactly our flags, nothing else:
:func:`dynamo_gc.configuration.gc_surfaces.split_gc_args`); a bad value exits 2 naming the flag and
the env var, before upstream is imported. The surfaces below are what docs/configuration/ and the
configuration tests read.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.configuration.gc_surfaces import WORKER_GC, gc_help, split_gc_args
from dynamo_gc.configuration.options import Surface
from dynamo_gc.configuration.parser import DynamoArgParser, build_parser

VLLM_PROGRAM = "python -m dynamo_gc.vllm"
MOCKER_PROGRAM = "python -m dynamo_gc.mocker"

WORKER_GC_OPTIONS = list(WORKER_GC.options)

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


def split_args(
    surface: Surface, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[GcSettings, list[str]]:
    """Our options out of ``argv`` (flags, then env vars, then defaults), and upstream's rest."""
    return split_gc_args(argv, WORKER_GC, env, prog=surface.program)


def parse_args(
    surface: Surface, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """Our options alone (no upstream argument), as the configuration tests read each program."""
    env_vars = dict(os.environ if env is None else env)
    return _parser(surface).parse_args([] if argv is None else list(argv), env_vars=env_vars)


def format_help(surface: Surface) -> str:
    """What ``--help`` shows before upstream's own help."""
    usage = f"usage: {surface.program} [GC options] <upstream's arguments>"
    return f"{usage}\n\n{surface.description}\n\n{gc_help(WORKER_GC)}"
