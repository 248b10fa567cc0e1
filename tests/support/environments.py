"""Test suites that need a separate environment (vLLM, SGLang): skipped with the reason and the
set-up command where the package is missing, an error where CI says it must be there."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest


def package_gate(package: str, suite: Path, require_env: str, missing_reason: str):
    """A ``pytest_collection_modifyitems`` hook for a suite: its tests marked ``package`` are
    skipped when ``package`` cannot be imported (``missing_reason`` says how to get it,
    ``{python}`` naming this interpreter), and the run stops when ``require_env`` is 1 (CI
    built the environment)."""

    def hook(config, items) -> None:
        if importlib.util.find_spec(package) is not None:
            return
        reason = missing_reason.format(python=sys.executable)
        if os.environ.get(require_env) == "1":
            raise pytest.UsageError(f"{require_env}=1 but {reason}")
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if item.get_closest_marker(package) is not None and suite in Path(item.path).parents:
                item.add_marker(skip)

    return hook
