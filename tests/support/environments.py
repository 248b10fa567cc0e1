"""Test suites that need a separate environment (vLLM, SGLang): skipped with the reason and the
set-up command where the package is missing, an error where CI says it must be there."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest


def package_gate(package: str, label: str, suite: Path):
    """A ``pytest_collection_modifyitems`` hook for the suite of a package with an environment
    of its own (``scripts/setup_<package>_env.sh`` makes ``.venv-<package>``): its tests marked
    ``package`` are skipped when ``package`` cannot be imported (the reason says how to make that
    environment), and the run stops when ``DYNAMO_REQUIRE_<PACKAGE>`` is 1 (CI, where it has just
    built the environment: a missing package is then an error, not a skip)."""
    require_env = f"DYNAMO_REQUIRE_{package.upper()}"

    def hook(config, items) -> None:
        if importlib.util.find_spec(package) is not None:
            return
        reason = (
            f"{label} is not installed in this Python environment ({sys.executable}); create its "
            f"environment with scripts/setup_{package}_env.sh and run .venv-{package}/bin/python "
            f"-m pytest -m {package} tests/{package}"
        )
        if os.environ.get(require_env) == "1":
            raise pytest.UsageError(f"{require_env}=1 but {reason}")
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if item.get_closest_marker(package) is not None and suite in Path(item.path).parents:
                item.add_marker(skip)

    return hook
