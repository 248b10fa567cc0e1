"""scripts/ab_upstream.py still runs: both arms on upstream's real frontend and mocker, seconds of
load (``--smoke``, upstream's default chat processor so vLLM is not needed), and both arms on
upstream's vLLM worker through the adapter (``--target vllm-worker``). The measurement itself is
the script's full run (docs/benchmarks.md), never a timed assert here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.upstream.needs_vllm import NEEDS_VLLM

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ab_upstream.py"


def run_smoke(tmp_path: Path, name: str, *args: str, timeout_s: float) -> dict:
    """``ab_upstream.py --smoke ARGS`` with this environment as the upstream one: its result."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--smoke",
            *args,
            "--upstream-python",
            sys.executable,
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / f"{name}-smoke.json").read_text())


def test_the_upstream_ab_runs_both_arms_in_both_orders(tmp_path):
    result = run_smoke(tmp_path, "ab_upstream", "--chat-processor", "default", timeout_s=600)
    runs = result["runs"]
    assert [run["arm"] for run in runs] == ["stock", "frozen", "frozen", "stock"]
    for run in runs:
        assert run["ok"] > 0 and run["errors"] == 0
    frozen = [run for run in runs if run["arm"] == "frozen"]
    stock = [run for run in runs if run["arm"] == "stock"]
    assert all(run["frozen_at_start"] for run in frozen)
    assert not any(run["frozen_at_start"] for run in stock)
    # frozen: only what was built after the freeze is left in the collected generations
    assert all(f["unfrozen_after_model"] < s["unfrozen_after_model"] for f in frozen for s in stock)


@NEEDS_VLLM
def test_the_vllm_worker_ab_runs_both_arms_on_upstreams_worker(tmp_path):
    """``--target vllm-worker``: python -m dynamo_gc.vllm on the real vLLM CPU engine behind
    upstream's frontend, freeze on and off; the smoke runs one order (each arm starts an engine)."""
    result = run_smoke(
        tmp_path, "ab_upstream_vllm_worker", "--target", "vllm-worker", timeout_s=900
    )
    assert result["target"] == "vllm-worker"
    runs = result["runs"]
    assert [run["arm"] for run in runs] == ["stock", "frozen"]
    for run in runs:
        assert run["ok"] > 0 and run["errors"] == 0
        assert run["rss_mb"] > 0
    stock, frozen = runs
    assert stock["frozen_at_start"] is None
    assert frozen["frozen_at_start"] > 100_000  # the worker parent's heap: vLLM's AsyncLLM
