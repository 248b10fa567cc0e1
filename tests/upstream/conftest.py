"""Tests on upstream ai-dynamo's real wheels: skipped, with the reason, where they are missing.

ai-dynamo installs its own top-level ``dynamo`` package, which this repository's launchers also
use, so these tests run in an environment of their own (``scripts/setup_upstream_env.sh`` makes
``.venv-upstream``: ai-dynamo 1.6.1 and ai-dynamo-runtime 1.6.1 from PyPI with the ``dynamo-gc``
layer beside them). Everywhere else every test marked ``upstream`` here is skipped with that
command; ``DYNAMO_REQUIRE_UPSTREAM=1`` (CI, where it has just built the environment) turns the
skip into an error.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

REQUIRE_ENV = "DYNAMO_REQUIRE_UPSTREAM"
SUITE = Path(__file__).parent


def missing_upstream() -> str | None:
    """Why this Python cannot run the upstream tests, or ``None`` when it can."""
    try:
        found = version("ai-dynamo")
    except PackageNotFoundError:
        return "ai-dynamo is not installed"
    try:
        version("dynamo-gc")
    except PackageNotFoundError:
        return f"ai-dynamo {found} is installed but the dynamo-gc layer is not"
    return None


def pytest_collection_modifyitems(config, items) -> None:
    problem = missing_upstream()
    if problem is None:
        return
    reason = (
        f"{problem} in this Python environment ({sys.executable}); create it with "
        "scripts/setup_upstream_env.sh and run .venv-upstream/bin/python -m pytest -m upstream "
        "tests/upstream"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        raise pytest.UsageError(f"{REQUIRE_ENV}=1 but {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("upstream") is not None and SUITE in Path(item.path).parents:
            item.add_marker(skip)
