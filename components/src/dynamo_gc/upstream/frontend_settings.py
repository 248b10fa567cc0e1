"""The GC options of upstream ai-dynamo's frontend, declared once for both activation ways.

``python -m dynamo_gc.frontend`` takes them as flags (``--dyn-freeze-gc-heap``, ...) out of the
command line and hands the rest to upstream; the ``gc-freeze`` route extension, named in an
unchanged upstream command, reads the same options from their env vars (``DYN_FREEZE_GC_HEAP``,
...). The names and meanings are those of this project's own frontend, the serving-time
maintenance's included (``--dyn-gc-maintenance {off,idle}`` / ``DYN_GC_MAINTENANCE``,
``--dyn-gc-pause-budget-ms`` / ``DYN_GC_PAUSE_BUDGET_MS``, judged as our frontend judges them);
the metrics port is the adapter's own (upstream's ``/metrics`` is served by its Rust HTTP
service, which a Python extension cannot add to).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynamo_gc.configuration.gc_options import (
    MAINTENANCE_OFF,
    GcSettings,
    MaintenanceSettings,
    debug_gc_endpoint_option,
    maintenance_problem,
)
from dynamo_gc.configuration.gc_surfaces import FRONTEND_GC
from dynamo_gc.configuration.options import Surface, host_option, port_option
from dynamo_gc.configuration.parser import DynamoArgParser, build_parser
from dynamo_gc.upstream.versions import EXTENSION_NAME_IN_ERRORS

logger = logging.getLogger(__name__)

PROGRAM = "python -m dynamo_gc.frontend"
# The route-extension path's errors name what the operator ran (upstream's command, with the
# extension named in its env var or flag), and say where the options are listed: the extension
# has no --help of its own.
EXTENSION_PROGRAM = EXTENSION_NAME_IN_ERRORS
EXTENSION_HELP_POINTER = (
    "the gc-freeze route extension reads these env vars; python -m dynamo_gc.frontend --help "
    "lists them. Without gc-freeze in DYN_FRONTEND_ROUTE_EXTENSIONS upstream's frontend runs "
    "without the adapter"
)

GC_METRICS_PORT = port_option(
    "dyn-gc-metrics-port",
    "DYN_GC_METRICS_PORT",
    None,
    "Serve the dynamo_gc_* metrics (Prometheus text, GET /metrics) on this port, beside "
    "upstream's HTTP port; 0 picks a free port and logs it. Unset: not served (the freeze and "
    "the pause log work without it).",
)

GC_METRICS_HOST = host_option(
    "dyn-gc-metrics-host",
    "DYN_GC_METRICS_HOST",
    "0.0.0.0",
    "Address the dynamo_gc_* metrics port listens on (as upstream's --http-host, every "
    "interface by default, so a Prometheus in the cluster can scrape it).",
)

DEBUG_GC_ENDPOINT = debug_gc_endpoint_option(
    name="dyn-debug-gc-endpoint",
    env_var="DYN_DEBUG_GC_ENDPOINT",
    where="upstream's HTTP port",
    collect=False,  # upstream's route extensions answer JSON to GET
)

SURFACE = Surface(
    name="upstream-frontend",
    title="Upstream ai-dynamo frontend (python -m dynamo_gc.frontend, gc-freeze extension)",
    program=PROGRAM,
    description=(
        "Upstream ai-dynamo's frontend with its GC heap frozen before HTTP admits requests, and "
        "optionally its serving-time GC maintenance (idle; with --dyn-chat-processor vllm or "
        "sglang, whose requests pass through Python). Every argument not listed here is "
        "upstream's (listed after these)."
    ),
    options=[
        *FRONTEND_GC.options,
        GC_METRICS_PORT,
        GC_METRICS_HOST,
        DEBUG_GC_ENDPOINT,
    ],
)


@dataclass(frozen=True)
class FrontendGcConfig:
    """What the adapter does in upstream's frontend process."""

    gc: GcSettings
    metrics_host: str
    metrics_port: int | None
    debug_gc_endpoint: bool = False
    maintenance: MaintenanceSettings = MaintenanceSettings(MAINTENANCE_OFF, 0.0)


def _parser(program: str) -> DynamoArgParser:
    parser = build_parser(SURFACE)
    parser.prog = program
    if program == EXTENSION_PROGRAM:
        parser.help_pointer = EXTENSION_HELP_POINTER
    return parser


def _config(
    namespace: argparse.Namespace,
    program: str,
    env: Mapping[str, str],
    argv: Sequence[str] = (),
) -> FrontendGcConfig:
    """The options as a config, once the maintenance's work together (our frontend's rules: a
    maintenance with the freeze off, or a budget given on the command line with the maintenance
    off, exit 2 naming the options; a budget set through its env var only is ignored with one
    WARNING)."""
    config = FrontendGcConfig(
        gc=GcSettings(
            freeze_gc_heap=namespace.freeze_gc_heap, gc_pause_log_ms=namespace.gc_pause_log_ms
        ),
        metrics_host=namespace.dyn_gc_metrics_host,
        metrics_port=namespace.dyn_gc_metrics_port,
        debug_gc_endpoint=namespace.debug_gc_endpoint,
        maintenance=MaintenanceSettings(namespace.gc_maintenance, namespace.gc_pause_budget_ms),
    )
    mode, budget = FRONTEND_GC.maintenance
    problem = maintenance_problem(
        config.maintenance.mode,
        config.gc.freeze_gc_heap,
        mode_option=mode,
        freeze_option=FRONTEND_GC.freeze,
    )
    if problem is not None:
        _parser(program).error(problem)
    if not config.maintenance.enabled:
        if any(word.partition("=")[0] == budget.flag for word in argv):
            _parser(program).error(
                f"{budget.source_label()} acts only with {mode.source_label()} set"
            )
        if budget.env_var in env:
            logger.warning(
                "%s=%s ignored: it acts only with %s set",
                budget.env_var,
                env[budget.env_var],
                mode.source_label(),
            )
    return config


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """Our options alone (no upstream argument), as the configuration tests read each program."""
    env_vars = dict(os.environ if env is None else env)
    return _parser(PROGRAM).parse_args([] if argv is None else list(argv), env_vars=env_vars)


def from_env(env: Mapping[str, str] | None = None) -> FrontendGcConfig:
    """The options from their env vars; a bad value exits 2 naming the env var and the flag."""
    env_vars = dict(os.environ if env is None else env)
    namespace = _parser(EXTENSION_PROGRAM).parse_args([], env_vars=env_vars)
    return _config(namespace, EXTENSION_PROGRAM, env_vars)


def split_args(
    argv: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[FrontendGcConfig, list[str]]:
    """Our options out of ``argv`` (flags, then env vars, then defaults), and upstream's rest.

    A bad value exits 2 naming the flag and the env var, before upstream is imported.
    """
    env_vars = dict(os.environ if env is None else env)
    namespace, rest = _parser(PROGRAM).parse_known_args(list(argv), env_vars=env_vars)
    given = [word for word in argv if word not in rest]
    return _config(namespace, PROGRAM, env_vars, given), rest


# The options that are the adapter's alone (upstream's own GC-freeze change has none of them: no
# metrics port, no debug route, no serving-time maintenance).
ADAPTER_ONLY_OPTIONS = [
    *FRONTEND_GC.maintenance,
    GC_METRICS_PORT,
    GC_METRICS_HOST,
    DEBUG_GC_ENDPOINT,
]


def without_adapter_options(argv: Sequence[str]) -> list[str]:
    """``argv`` without the adapter's own options (their values already checked), the GC flags
    left in place: what an upstream that freezes by itself, with the same flag names, is given."""
    surface = Surface(
        name="upstream-frontend-own",
        title="",
        program=PROGRAM,
        description="",
        options=ADAPTER_ONLY_OPTIONS,
    )
    _, rest = build_parser(surface).parse_known_args(list(argv), env_vars={})
    return rest


def format_help() -> str:
    """The adapter's options, as ``--help`` shows them before upstream's own help."""
    return _parser(PROGRAM).format_help()
