"""Tests with SGLang's frontend modules: skipped, with the reason, where SGLang is not installed.

SGLang (with torch) is large, so it lives in its own virtual environment
(``scripts/setup_sglang_env.sh`` makes ``.venv-sglang``); the default ``.venv-3.X`` environments
skip every test marked ``sglang`` here. Tests in this folder without the marker (what the
frontend does where SGLang is missing) run everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.support.tiny_model import tiny_tokenizer_dir

# CI sets this where it has just built .venv-sglang: a missing SGLang is then an error, not a skip.
REQUIRE_SGLANG_ENV = "DYNAMO_REQUIRE_SGLANG"
SGLANG_MISSING_REASON = (
    "SGLang is not installed in this Python environment ({python}); create its environment "
    "with scripts/setup_sglang_env.sh and run .venv-sglang/bin/python -m pytest -m sglang "
    "tests/sglang"
)


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def pytest_collection_modifyitems(config, items):
    if sglang_installed():
        return
    if os.environ.get(REQUIRE_SGLANG_ENV) == "1":
        raise pytest.UsageError(
            f"{REQUIRE_SGLANG_ENV}=1 but " + SGLANG_MISSING_REASON.format(python=sys.executable)
        )
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=SGLANG_MISSING_REASON.format(python=sys.executable))
    for item in items:
        if item.get_closest_marker("sglang") is not None and here in Path(item.path).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> str:
    """The tiny model's tokenizer directory (what the mock worker serves)."""
    return tiny_tokenizer_dir()
