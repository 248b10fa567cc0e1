"""Smoke run of the self-benchmark A/B on the real engine (``ab_self_benchmark.py --engine vllm``).

Run by the vLLM environment's python (skipped elsewhere, required in CI with
DYNAMO_REQUIRE_VLLM=1, as every test here). It checks that the mode runs and writes what
docs/benchmarks.md quotes; it never asserts on a time or a ratio.
"""

from __future__ import annotations

import sys

import pytest

from tests.unit.test_bench_scripts import run_smoke

# The real vLLM worker, twice: its EngineCore and rank processes too.
pytestmark = [pytest.mark.vllm, pytest.mark.integration]


def test_ab_self_benchmark_vllm_engine_smoke(tmp_path):
    result = run_smoke(
        "ab_self_benchmark.py", tmp_path, "--engine", "vllm", "--vllm-python", sys.executable,
        benchmark="ab_self_benchmark_vllm", timeout_s=300,
    )  # fmt: skip
    points = result["settings"]["points"]
    runs = result["runs"]
    assert [run["policy"] for run in runs] == ["off", "freeze"]  # pass 1: off first
    for run in runs:
        analysis = run["analysis"]
        assert analysis["points"] == points
        assert 0 < analysis["p50_ms"] <= analysis["max_wall_ms"]
        assert f"gc_policy={run['policy']}" in run["worker_summary"]
        processes = analysis["processes"]
        # Every process of the real engine reported its heap: main, EngineCore, the rank.
        assert set(processes) == {"main", "vllm EngineCore", "vllm rank"}
        assert len({proc["pid"] for proc in processes.values()}) == 3
        for proc in processes.values():
            assert proc["tracked_objects"] + proc["frozen_objects"] > 1000
            assert proc["policy_running_in_sweep"] is (run["policy"] == "freeze")
            if run["policy"] == "freeze":
                assert proc["gen2_collections_in_sweep"] == 0
    goal = result["goal"]
    assert set(goal["per_process"]) == {"main", "vllm EngineCore", "vllm rank"}
    assert isinstance(goal["stalls_met"], bool)
