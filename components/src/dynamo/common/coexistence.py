"""Refuse to start our launchers where ai-dynamo is installed.

Both install a top-level ``dynamo`` package. In an environment that has ai-dynamo, ours would run
over a mix of both trees (and installing ours there overwrites upstream's files). The GC layer
plugs into upstream's own launchers instead, through its adapters, so our launchers exit 2 at
once, naming what was found and what to run. Checked from installed distribution metadata
(``importlib.metadata``), before anything heavy is imported: this module imports only the
standard library.
"""

from __future__ import annotations

import importlib.metadata
import sys

# The distributions that own upstream's ``dynamo`` package (the Python launchers, and the runtime
# wheel that ships ``dynamo.runtime`` and ``dynamo.llm``).
UPSTREAM_DISTRIBUTIONS = ("ai-dynamo", "ai-dynamo-runtime")
DOCS_PAGE = "docs/ai-dynamo.md"

# What to run instead of each of our launchers.
ADAPTERS = {
    "python -m dynamo.frontend": (
        "python -m dynamo_gc.frontend <upstream's arguments>, or upstream's own "
        "python -m dynamo.frontend with DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze"
    ),
    "python -m dynamo.vllm": "python -m dynamo_gc.vllm <upstream's arguments>",
    "icebox": (
        "upstream's frontend and mocker through python -m dynamo_gc.frontend and "
        "python -m dynamo_gc.mocker"
    ),
}


def installed_upstream() -> list[tuple[str, str]]:
    """``(distribution, version)`` of each ai-dynamo distribution installed here."""
    found = []
    for name in UPSTREAM_DISTRIBUTIONS:
        try:
            found.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def upstream_problem(program: str) -> str | None:
    """Why ``program`` must not start here, or ``None`` when no ai-dynamo is installed."""
    found = installed_upstream()
    if not found:
        return None
    names = ", ".join(f"{name} {version}" for name, version in found)
    return (
        f"ai-dynamo is installed in this environment ({names}); this project's own launchers "
        "share its top-level `dynamo` package and would run over a mix of both. Run upstream's "
        f"launchers with the GC layer instead: {ADAPTERS[program]} "
        "(python -m dynamo_gc.frontend / python -m dynamo_gc.vllm / python -m dynamo_gc.mocker; "
        f"see {DOCS_PAGE}). An ai-dynamo environment needs only the dynamo-gc distribution."
    )


def refuse_beside_upstream(program: str) -> None:
    """Exit 2 with :func:`upstream_problem`'s message when ai-dynamo is installed."""
    problem = upstream_problem(program)
    if problem is not None:
        sys.stderr.write(f"{program}: error: {problem}\n")
        raise SystemExit(2)
