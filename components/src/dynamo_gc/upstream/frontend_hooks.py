"""The symbols of upstream ai-dynamo's frontend that the adapter relies on, checked up front.

A version whose hook is missing or changed is an exit 2 naming the version found and the symbol,
never a launcher that runs without freezing.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn

FRONTEND_MAIN = "dynamo.frontend.main"
ROUTE_GROUP = "dynamo.frontend.routes"
SUPPORTED = ("1.6.1",)


def installed_version() -> str:
    try:
        return version("ai-dynamo")
    except PackageNotFoundError:
        return "not installed"


def _refuse(symbol: str, problem: str) -> NoReturn:
    print(
        f"dynamo_gc.frontend: error: ai-dynamo {installed_version()}: {symbol} {problem}; "
        f"this adapter supports ai-dynamo {', '.join(SUPPORTED)}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(2)


def _frontend_main_module() -> Any:
    try:
        return importlib.import_module(FRONTEND_MAIN)
    except ImportError as exc:
        _refuse(FRONTEND_MAIN, f"cannot be imported ({exc})")


def checked_frontend_main() -> Any:
    """Upstream's frontend module, once every symbol the freeze point depends on is there."""
    module = _frontend_main_module()
    for name in ("main", "parse_args", "load_frontend_route_extensions"):
        if not callable(getattr(module, name, None)):
            _refuse(f"{FRONTEND_MAIN}.{name}", "is missing")
    group = getattr(module, "FRONTEND_ROUTE_ENTRYPOINT_GROUP", None)
    if group != ROUTE_GROUP:
        _refuse(
            f"{FRONTEND_MAIN}.FRONTEND_ROUTE_ENTRYPOINT_GROUP",
            f"is {group!r}, not {ROUTE_GROUP!r}",
        )
    return module


def upstream_frontend_main() -> Callable[[], None]:
    return checked_frontend_main().main


def upstream_frontend_parse_args() -> Callable[[], Any]:
    return checked_frontend_main().parse_args
