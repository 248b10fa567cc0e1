"""Tests with the real vLLM engine: skipped, with the reason, where vLLM is not installed.

vLLM is large, so it lives in its own virtual environment (``scripts/setup_vllm_env.sh`` makes
``.venv-vllm``); the default ``.venv-3.X`` environments skip every test marked ``vllm`` here.
Tests in this folder without the marker (argument handling that needs no vLLM) run everywhere.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from bench_common import OFFLINE_ENV, VLLM_ARGS, built_model_dir

from tests.support.environments import package_gate
from tests.support.thinking_model import build_with

# OFFLINE_ENV (nothing may come from a hub: the model is built locally) and VLLM_ARGS (the real
# engine's small footprint) are the benchmarks' own (scripts/bench_common.py), re-exported here.
__all__ = ["OFFLINE_ENV", "VLLM_ARGS"]

REPO = Path(__file__).resolve().parents[2]
MAKE_TINY_MODEL = REPO / "scripts" / "make_tiny_model.py"
# DYNAMO_REQUIRE_VLLM=1 (CI, where it has just built .venv-vllm): a missing vLLM is an error.
pytest_collection_modifyitems = package_gate("vllm", "vLLM", Path(__file__).parent)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The tiny random Llama's directory, built once per machine (a cache) and reused."""
    out = os.environ.get("DYNAMO_TINY_MODEL_DIR")
    return built_model_dir([sys.executable, str(MAKE_TINY_MODEL)] + (["--out", out] if out else []))


@pytest.fixture(scope="session")
def thinking_model(tmp_path_factory) -> str:
    """The tiny model that reasons, then calls (tests/support/thinking_model.py), built once
    per session in a process of its own, offline."""
    return build_with(sys.executable, tmp_path_factory.mktemp("thinking-model") / "model")
