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
from dataclasses import dataclass

from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.configuration.gc_surfaces import WORKER_GC, gc_help, split_gc_args
from dynamo_gc.configuration.options import Surface, host_option, port_option
from dynamo_gc.configuration.parser import DynamoArgParser, HelpFormatter, build_parser

VLLM_PROGRAM = "python -m dynamo_gc.vllm"
MOCKER_PROGRAM = "python -m dynamo_gc.mocker"

GC_METRICS_PORT = port_option(
    "gc-metrics-port",
    "DYN_VLLM_GC_METRICS_PORT",
    None,
    "Serve the dynamo_gc_* metrics (Prometheus text, GET /metrics) on this port; 0 picks a free "
    "port and logs it. Unset: not served (the freeze and the pause log work without it).",
)

GC_METRICS_HOST = host_option(
    "gc-metrics-host",
    "DYN_VLLM_GC_METRICS_HOST",
    "0.0.0.0",
    "Address the dynamo_gc_* metrics port listens on (every interface by default, so a "
    "Prometheus in the cluster can scrape it).",
)

# The metrics port is the adapter's own: upstream's worker /metrics is served by its Rust
# runtime from its own registry.
METRICS_OPTIONS = [GC_METRICS_PORT, GC_METRICS_HOST]
WORKER_GC_OPTIONS = [*WORKER_GC.options, *METRICS_OPTIONS]

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


@dataclass(frozen=True)
class WorkerGcConfig:
    """What the adapter does in upstream's worker process."""

    gc: GcSettings
    metrics_host: str
    metrics_port: int | None


def _parser(surface: Surface) -> DynamoArgParser:
    return build_parser(surface)


def _metrics_parser(surface: Surface) -> DynamoArgParser:
    """The metrics options alone, without -h (``--help`` is the adapter's, before upstream's)."""
    parser = DynamoArgParser(
        prog=surface.program,
        usage=argparse.SUPPRESS,
        add_help=False,
        options=METRICS_OPTIONS,
        formatter_class=HelpFormatter,
        auto_env_var_prefix=None,
        args_for_setting_config_path=[],
    )
    group = parser.add_argument_group("GC metrics port (dynamo_gc)")
    for option in METRICS_OPTIONS:
        option.add_to(group)
    return parser


def split_args(
    surface: Surface, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[WorkerGcConfig, list[str]]:
    """Our options out of ``argv`` (flags, then env vars, then defaults), and upstream's rest.

    The GC options with the layer's splitter (exactly our flags); the metrics port and host
    with the strict parser, from what is left. A bad value exits 2 naming flag and env var.
    """
    env_vars = dict(os.environ if env is None else env)
    gc, rest = split_gc_args(argv, WORKER_GC, env_vars, prog=surface.program)
    namespace, rest = _metrics_parser(surface).parse_known_args(rest, env_vars=env_vars)
    return WorkerGcConfig(gc, namespace.gc_metrics_host, namespace.gc_metrics_port), rest


def without_metrics_options(surface: Surface, argv: Sequence[str]) -> list[str]:
    """``argv`` without the adapter's metrics options (their values already checked), the GC
    flags left in place: what an upstream that freezes by itself, with the same flag names, is
    given."""
    _, rest = _metrics_parser(surface).parse_known_args(list(argv), env_vars={})
    return rest


def parse_args(
    surface: Surface, argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """Our options alone (no upstream argument), as the configuration tests read each program:
    through :func:`split_args`, the path the adapter runs, so what they check is what runs
    (``--help`` too: the adapter's own part of it)."""
    args = [] if argv is None else list(argv)
    if "--help" in args or "-h" in args:
        print(format_help(surface))
        raise SystemExit(0)
    config, rest = split_args(surface, args, env)
    if rest:
        _parser(surface).error(f"unrecognized arguments: {' '.join(rest)}")
    return argparse.Namespace(
        freeze_gc_heap=config.gc.freeze_gc_heap,
        gc_pause_log_ms=config.gc.gc_pause_log_ms,
        gc_metrics_host=config.metrics_host,
        gc_metrics_port=config.metrics_port,
    )


def format_help(surface: Surface) -> str:
    """What ``--help`` shows before upstream's own help."""
    usage = f"usage: {surface.program} [GC options] <upstream's arguments>"
    # the parser closes every help with its precedence note, which gc_help's block already has
    metrics = _metrics_parser(surface).format_help().split("\n\n In general")[0].strip("\n")
    return f"{usage}\n\n{surface.description}\n\n{gc_help(WORKER_GC)}\n{metrics}\n"
