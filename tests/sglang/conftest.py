"""Tests with SGLang's frontend modules: skipped, with the reason, where SGLang is not installed.

SGLang (with torch) is large, so it lives in its own virtual environment
(``scripts/setup_sglang_env.sh`` makes ``.venv-sglang``); the default ``.venv-3.X`` environments
skip every test marked ``sglang`` here. Tests in this folder without the marker (what the
frontend does where SGLang is missing) run everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.environments import package_gate
from tests.support.tiny_model import tiny_tokenizer_dir

# CI sets this where it has just built .venv-sglang: a missing SGLang is then an error, not a skip.
REQUIRE_SGLANG_ENV = "DYNAMO_REQUIRE_SGLANG"
SGLANG_MISSING_REASON = (
    "SGLang is not installed in this Python environment ({python}); create its environment "
    "with scripts/setup_sglang_env.sh and run .venv-sglang/bin/python -m pytest -m sglang "
    "tests/sglang"
)


pytest_collection_modifyitems = package_gate(
    "sglang", Path(__file__).parent, REQUIRE_SGLANG_ENV, SGLANG_MISSING_REASON
)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> str:
    """The tiny model's tokenizer directory (what the mock worker serves)."""
    return tiny_tokenizer_dir()
