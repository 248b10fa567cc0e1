"""The GC options of the upstream worker adapters (``python -m dynamo_gc.vllm`` / ``.mocker``).

The names and meanings are those of this project's own vLLM worker (``--freeze-gc-heap`` /
``--no-freeze-gc-heap`` / ``DYN_VLLM_FREEZE_GC_HEAP``, default on; ``--gc-pause-log-ms`` /
``DYN_VLLM_GC_PAUSE_LOG_MS``; for the vLLM worker ``--gc-maintenance {off,idle}`` /
``DYN_VLLM_GC_MAINTENANCE`` and ``--gc-pause-budget-ms`` / ``DYN_VLLM_GC_PAUSE_BUDGET_MS``).
The mocker stands in for the vLLM worker, so it reads the same GC options, but not the
maintenance's: its requests are served in Rust, where nothing could count them in flight.
They are taken out of the command line before upstream sees it (exactly our flags, nothing else:
:func:`dynamo_gc.configuration.gc_surfaces.split_surface_args`); a bad value exits 2 naming the
flag and the env var, before upstream is imported. The surfaces below are what
docs/configuration/ and the configuration tests read."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynamo_gc.configuration.gc_options import MAINTENANCE_OFF, GcSettings, MaintenanceSettings
from dynamo_gc.configuration.gc_surfaces import (
    VLLM_WORKER_GC,
    WORKER_GC,
    GcSurface,
    gc_help,
    split_surface_args,
)
from dynamo_gc.configuration.options import Option, Surface, host_option, port_option
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
# The vLLM worker's requests pass through Python (its handlers' generate), so it can host the
# serving-time maintenance (idle); the mocker's are served in Rust, so it cannot.
VLLM_GC_OPTIONS = [*VLLM_WORKER_GC.options, *METRICS_OPTIONS]
WORKER_GC_OPTIONS = [*WORKER_GC.options, *METRICS_OPTIONS]

VLLM_SURFACE = Surface(
    name="upstream-vllm",
    title="Upstream ai-dynamo vLLM worker (python -m dynamo_gc.vllm)",
    program=VLLM_PROGRAM,
    description=(
        "Upstream ai-dynamo's vLLM worker with its GC heap frozen after engine init, before the "
        "model is registered, and optionally its serving-time GC maintenance (idle). Every "
        "argument not listed here is upstream's (listed after these)."
    ),
    options=VLLM_GC_OPTIONS,
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
    maintenance: MaintenanceSettings = MaintenanceSettings(MAINTENANCE_OFF, 0.0)


def gc_surface_of(surface: Surface) -> GcSurface:
    """The GC options a worker adapter's surface declares (with the maintenance's or not)."""
    return VLLM_WORKER_GC if surface.name == VLLM_SURFACE.name else WORKER_GC


def _parser(surface: Surface) -> DynamoArgParser:
    return build_parser(surface)


def _options_parser(surface: Surface, options: Sequence[Option], title: str) -> DynamoArgParser:
    """``options`` alone, without -h (``--help`` is the adapter's, before upstream's)."""
    parser = DynamoArgParser(
        prog=surface.program,
        usage=argparse.SUPPRESS,
        add_help=False,
        options=list(options),
        formatter_class=HelpFormatter,
        auto_env_var_prefix=None,
        args_for_setting_config_path=[],
    )
    group = parser.add_argument_group(title)
    for option in options:
        option.add_to(group)
    return parser


def _metrics_parser(surface: Surface) -> DynamoArgParser:
    return _options_parser(surface, METRICS_OPTIONS, "GC metrics port (dynamo_gc)")


def split_args(
    surface: Surface, argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[WorkerGcConfig, list[str]]:
    """Our options out of ``argv`` (flags, then env vars, then defaults), and upstream's rest.

    The GC options with the layer's splitter (exactly our flags); the metrics port and host
    with the strict parser, from what is left. A bad value exits 2 naming flag and env var.
    """
    env_vars = dict(os.environ if env is None else env)
    settings, rest = split_surface_args(
        argv, gc_surface_of(surface), env_vars, prog=surface.program
    )
    namespace, rest = _metrics_parser(surface).parse_known_args(rest, env_vars=env_vars)
    config = WorkerGcConfig(
        settings.gc, namespace.gc_metrics_host, namespace.gc_metrics_port, settings.maintenance
    )
    return config, rest


def without_adapter_options(surface: Surface, argv: Sequence[str]) -> list[str]:
    """``argv`` without the adapter's own options (metrics, maintenance; their values already
    checked), the GC flags upstream shares left in place: what an upstream that freezes by
    itself, with the same flag names, is given."""
    # the options upstream's own GC-freeze change does not have
    options = [*gc_surface_of(surface).maintenance, *METRICS_OPTIONS]
    parser = _options_parser(surface, options, "the adapter's own options")
    _, rest = parser.parse_known_args(list(argv), env_vars={})
    return rest


def not_served(config: WorkerGcConfig) -> list[str]:
    """The adapter's own settings in ``config`` that nothing serves once it stands down."""
    lost = []
    if config.metrics_port is not None:
        lost.append(f"--gc-metrics-port / DYN_VLLM_GC_METRICS_PORT ({config.metrics_port})")
    if config.maintenance.enabled:
        lost.append(f"--gc-maintenance / DYN_VLLM_GC_MAINTENANCE ({config.maintenance.mode})")
    return lost


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
    parsed = argparse.Namespace(
        freeze_gc_heap=config.gc.freeze_gc_heap,
        gc_pause_log_ms=config.gc.gc_pause_log_ms,
        gc_metrics_host=config.metrics_host,
        gc_metrics_port=config.metrics_port,
    )
    if gc_surface_of(surface).maintenance:
        parsed.gc_maintenance = config.maintenance.mode
        parsed.gc_pause_budget_ms = config.maintenance.pause_budget_ms
    return parsed


def format_help(surface: Surface) -> str:
    """What ``--help`` shows before upstream's own help."""
    usage = f"usage: {surface.program} [GC options] <upstream's arguments>"
    # the parser closes every help with its precedence note, which gc_help's block already has
    metrics = _metrics_parser(surface).format_help().split("\n\n In general")[0].strip("\n")
    gc_block = gc_help(gc_surface_of(surface))
    return f"{usage}\n\n{surface.description}\n\n{gc_block}\n{metrics}\n"
