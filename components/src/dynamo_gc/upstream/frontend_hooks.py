"""The symbols of upstream ai-dynamo's frontend that ``python -m dynamo_gc.frontend`` relies on,
checked before upstream starts.

The freeze point is upstream's route-extension hook: ``async_main`` calls
``load_frontend_route_extensions`` after ``make_engine`` and before ``run_input`` starts HTTP, and
resolves names in the ``dynamo.frontend.routes`` entry-point group. A version where any of that is
missing or changed is an exit 2 naming the version found and the symbol (:mod:`.versions`), never
a launcher that runs without freezing. Both activation ways run these checks: the launcher before
it starts upstream, the ``gc-freeze`` provider (upstream's own command) when upstream calls it.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from dynamo_gc.upstream.hooks import looks_up_global
from dynamo_gc.upstream.versions import (
    EXTENSION_NAME_IN_ERRORS,
    ROUTE_EXTENSIONS_SINCE,
    refuse,
    warn_if_unchecked,
)

PROGRAM = "python -m dynamo_gc.frontend"
# The name refusals and warnings carry when upstream's own command reached the provider: what
# the operator ran, and how the adapter got into it.
EXTENSION_PROGRAM = EXTENSION_NAME_IN_ERRORS
FRONTEND_MAIN = "dynamo.frontend.main"
FRONTEND_ARGS = "dynamo.frontend.frontend_args"
ROUTE_GROUP = "dynamo.frontend.routes"
ROUTE_HOOK = "load_frontend_route_extensions"
# The functions of upstream's frontend module the adapter relies on (the launcher calls main and
# parse_args; async_main calls the route hook, where the freeze runs).
FRONTEND_FUNCTIONS = ("main", "parse_args", "async_main", ROUTE_HOOK)
# The options of upstream's FrontendArgGroup the adapter reads, by dest: its modes without HTTP
# (no route extension there) and the sglang processor's preprocess pool.
FRONTEND_OPTIONS = {
    "interactive": "--interactive",
    "kserve_grpc_server": "--kserve-grpc-server",
    "chat_processor": "--dyn-chat-processor",
    "preprocess_workers": "--dyn-preprocess-workers",
}


def checked_frontend_main(program: str = PROGRAM) -> Any:
    """Upstream's frontend module, once every symbol the freeze point depends on is there.

    A missing or changed symbol is an exit 2 (``SystemExit``) naming ``program``, the installed
    version and the symbol; a version the adapter was not checked with, a WARNING.
    """
    try:
        module = importlib.import_module(FRONTEND_MAIN)
    except ImportError as exc:
        refuse(program, FRONTEND_MAIN, f"cannot be imported ({type(exc).__name__}: {exc})")
    for name in FRONTEND_FUNCTIONS:
        if not callable(getattr(module, name, None)):
            since = f" (upstream's frontend has route extensions since {ROUTE_EXTENSIONS_SINCE})"
            refuse(program, f"{FRONTEND_MAIN}.{name}", "is missing" + since * (name == ROUTE_HOOK))
    if not looks_up_global(module.async_main, ROUTE_HOOK):
        refuse(
            program,
            f"{FRONTEND_MAIN}.async_main",
            f"no longer calls {ROUTE_HOOK} (the freeze point would never be reached)",
        )
    group = getattr(module, "FRONTEND_ROUTE_ENTRYPOINT_GROUP", None)
    if group != ROUTE_GROUP:
        refuse(
            program,
            f"{FRONTEND_MAIN}.FRONTEND_ROUTE_ENTRYPOINT_GROUP",
            f"is {group!r}, not {ROUTE_GROUP!r}",
        )
    warn_if_unchecked(program)
    return module


def upstream_frontend_parse_args() -> Callable[[], Any]:
    return checked_frontend_main().parse_args


def upstream_frontend_options(upstream_args: Sequence[str], program: str = PROGRAM) -> Any:
    """Upstream's frontend options as upstream reads them: its own argument group, so its env
    vars (``DYN_INTERACTIVE``, ``DYN_CHAT_PROCESSOR``, ...) and their words mean here exactly what
    they mean to upstream. Arguments it does not declare are left alone (upstream's own parser
    judges them)."""
    try:
        group = importlib.import_module(FRONTEND_ARGS).FrontendArgGroup
    except (ImportError, AttributeError) as exc:
        refuse(program, f"{FRONTEND_ARGS}.FrontendArgGroup", f"is missing ({exc})")
    # As upstream's own parse_args builds it (argparse's defaults, abbreviations included), so
    # `--dyn-preprocess 2` means here what it means to upstream.
    parser = argparse.ArgumentParser(add_help=False)
    group().add_arguments(parser)
    parsed, _ = parser.parse_known_args(list(upstream_args))
    return parsed


def _declared(parsed: Any, dest: str, flag: str, program: str) -> Any:
    if not hasattr(parsed, dest):
        refuse(program, f"{FRONTEND_ARGS}.FrontendArgGroup", f"no longer declares {flag}")
    return getattr(parsed, dest)


def non_http_mode(upstream_args: Sequence[str]) -> str | None:
    """The mode flag when upstream will serve no HTTP (``--interactive``, ``--kserve-grpc-server``),
    which upstream refuses a route extension in."""
    parsed = upstream_frontend_options(upstream_args)
    for dest in ("interactive", "kserve_grpc_server"):
        if _declared(parsed, dest, FRONTEND_OPTIONS[dest], PROGRAM):
            return FRONTEND_OPTIONS[dest]
    return None


def chat_processor(upstream_args: Sequence[str], program: str) -> str:
    """The chat processor upstream's frontend will run (``--dyn-chat-processor`` /
    ``DYN_CHAT_PROCESSOR``, upstream's default when unset), as upstream reads it."""
    parsed = upstream_frontend_options(upstream_args, program)
    return str(_declared(parsed, "chat_processor", "--dyn-chat-processor", program))


def preprocess_pool_requested(upstream_args: Sequence[str], program: str) -> int:
    """How many ``--dyn-preprocess-workers`` upstream's ``sglang`` processor will start (0 with
    another processor, which has no pool in 1.6.1): the pool the adapter must find and wrap."""
    parsed = upstream_frontend_options(upstream_args, program)
    processor = _declared(parsed, "chat_processor", FRONTEND_OPTIONS["chat_processor"], program)
    workers = _declared(
        parsed, "preprocess_workers", FRONTEND_OPTIONS["preprocess_workers"], program
    )
    return int(workers or 0) if processor == "sglang" else 0
