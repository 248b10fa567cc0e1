"""The marks of an upstream test that needs vLLM in the upstream environment (upstream's vLLM
worker, or the frontend's ``--dyn-chat-processor vllm``): skipped with the reason where
scripts/setup_upstream_env.sh ran with ``UPSTREAM_VLLM=0``; ``DYNAMO_REQUIRE_UPSTREAM_VLLM=1``
(CI) turns a missing vLLM into an error at collection.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_ENV = "DYNAMO_REQUIRE_UPSTREAM_VLLM"
MISSING = importlib.util.find_spec("vllm") is None
if MISSING and os.environ.get(REQUIRE_ENV) == "1":
    raise RuntimeError(f"{REQUIRE_ENV}=1 but vLLM is not installed in this environment")

NEEDS_VLLM = pytest.mark.skipif(
    MISSING,
    reason="vLLM is not in this environment (scripts/setup_upstream_env.sh without "
    "UPSTREAM_VLLM=0 installs it)",
)
