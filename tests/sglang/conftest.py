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

# DYNAMO_REQUIRE_SGLANG=1 (CI, where it has just built .venv-sglang): a missing SGLang is an error.
pytest_collection_modifyitems = package_gate("sglang", "SGLang", Path(__file__).parent)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> str:
    """The tiny model's tokenizer directory (what the mock worker serves)."""
    return tiny_tokenizer_dir()
