"""Smoke runs of the serving A/B on real heaps (``ab_serving.py --engine vllm``) and its probes.

Real processes only: the frontend on ``--dyn-chat-processor vllm`` and the worker on the real
engine, both run by this (the vLLM environment's) python. They check that the modes run and
write what docs/benchmarks.md quotes; they never assert on a time or a ratio.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AB_SERVING = REPO / "scripts" / "ab_serving.py"

pytestmark = [pytest.mark.vllm, pytest.mark.integration]


def run_ab_serving(out: Path, *extra: str, timeout_s: float = 600) -> dict:
    proc = subprocess.run(
        [sys.executable, str(AB_SERVING), "--engine", "vllm", "--smoke",
         "--vllm-python", sys.executable, "--out", str(out), "--keep-logs", *extra],
        capture_output=True, text=True, timeout=timeout_s, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, f"ab_serving failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    (result,) = out.glob("*.json")
    return json.loads(result.read_text())


def test_the_ab_runs_on_real_heaps_and_reports_rss(tmp_path):
    result = run_ab_serving(tmp_path)
    assert result["settings"]["worker_heap"].startswith("vLLM's own")
    assert result["settings"]["heap_objects_per_process"] is None
    rows = result["rows"]
    assert [row["arm"] for row in rows] == ["ctl", "all"]
    for row in rows:
        assert row["sent"] > 0 and row["ok"] == row["sent"], row["errors_by_kind"]
        assert 0 < row["latency"]["p50_ms"] <= row["latency"]["p999_ms"] <= row["latency"]["max_ms"]
        # RSS of the frontend, the worker and vLLM's EngineCore under it, read at the rung's end.
        for name in ("frontend", "worker", "worker_children"):
            assert all(mb is not None and mb > 50 for mb in row["rss_mb"][name]), row["rss_mb"]
    assert "rss_all_over_ctl_worker" in result["goal"]
    # No synthetic heap anywhere: the frontend ran vLLM's chat processor, as the doc says.
    for log in tmp_path.glob("*frontend.log"):
        text = log.read_text(errors="replace")
        assert "Chat processor vllm" in text, text[-2000:]
    assert len(list(tmp_path.glob("*frontend.log"))) == 2


def test_the_probe_times_a_full_collection_in_each_serving_process(tmp_path):
    result = run_ab_serving(tmp_path, "--probe", "--arms", "ctl", "--rate", "4", "--duration", "6")
    (arm,) = result["probe"]["arms"]
    assert arm["arm"] == "ctl" and arm["load"]["ok"] > 0
    for name in ("frontend", "worker"):
        process = arm["processes"][name]
        sizes = process["generation_objects_at_start"]
        assert len(sizes) == 3 and sizes[2] > 100_000  # vLLM's imports: the real heap
        timed = process["timed_full_collections"]
        assert len(timed) == 3 and all(t["took_ms"] > 0 for t in timed)
        assert process["rss_mb_at_end"] > 50
    assert len(arm["counter_samples"]) >= 2 and len(arm["heap_samples"]) >= 2


def test_the_cross_check_runs_vllms_own_benchmark_client(tmp_path):
    result = run_ab_serving(tmp_path, "--cross-check", "--rate", "4", "--duration", "4")
    check = result["cross_check"]
    assert len(check["ours"]) == 2 and all(run["ok"] > 0 for run in check["ours"])
    theirs = check["vllm_bench_serve"]
    assert theirs["completed"] > 0 and theirs["failed"] == 0, theirs
    assert theirs["p99_e2el_ms"] > 0 and theirs["request_throughput"] > 0
