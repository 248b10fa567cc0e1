"""Options of ``python -m dynamo.frontend``."""

from __future__ import annotations

import argparse
from typing import Mapping, Sequence

from dynamo.common.configuration import (
    Choice,
    IntRange,
    Option,
    Surface,
    Text,
    gc_options,
    parse_surface,
)
from dynamo.common.configuration.runtime_options import (
    DISCOVERY_DIR,
    DISCOVERY_TTL,
    default_discovery_dir,
)

OPTIONS = [
    Option(
        name="http-host",
        env_var="DYN_HTTP_HOST",
        default="0.0.0.0",
        kind=Text("host"),
        metavar="HOST",
        help="Address the OpenAI-compatible HTTP service listens on",
    ),
    Option(
        name="http-port",
        env_var="DYN_HTTP_PORT",
        default=8000,
        kind=IntRange(0, 65535),
        metavar="PORT",
        help="Port of the HTTP service (0 picks a free port and logs it)",
    ),
    DISCOVERY_DIR,
    DISCOVERY_TTL,
    Option(
        name="dyn-preprocess-workers",
        env_var="DYN_PREPROCESS_WORKERS",
        default=0,
        kind=IntRange(0, 1024),
        metavar="N",
        help=(
            "Tokenise in a pool of N processes (each freezes its own heap at the end of its "
            "initializer); 0 tokenises in the frontend process"
        ),
    ),
    Option(
        name="router-mode",
        env_var="DYN_ROUTER_MODE",
        default="round-robin",
        kind=Choice(("round-robin",)),
        metavar="{round-robin}",
        help=(
            "How requests are spread over a model's workers: round-robin (upstream Dynamo's "
            "default; its other modes, such as kv, are not available here)"
        ),
    ),
    *gc_options(flag_prefix="dyn-", env_prefix="DYN_"),
    Option(
        name="dyn-debug-gc-endpoint",
        env_var="DYN_DEBUG_GC_ENDPOINT",
        default=False,
        dest="debug_gc_endpoint",  # the worker's attribute too, so shared code reads one name
        help=(
            "Serve POST /debug/gc/collect on the HTTP port: one full gc.collect() in this "
            "process, which pauses it for the collection (for tests and diagnosis; keep off in "
            "production)"
        ),
    ),
]

SURFACE = Surface(
    name="frontend",
    title="Frontend (`python -m dynamo.frontend`)",
    program="python -m dynamo.frontend",
    description=(
        "OpenAI-compatible HTTP frontend. It discovers workers, tokenises and routes requests, "
        "and freezes its GC heap once before it admits the first request."
    ),
    options=OPTIONS,
)


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> argparse.Namespace:
    config = parse_surface(SURFACE, argv, env)
    if config.discovery_dir is None:
        config.discovery_dir = default_discovery_dir()
    return config
