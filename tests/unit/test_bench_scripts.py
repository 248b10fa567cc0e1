"""Smoke runs of the benchmark scripts: each one's ``--smoke`` mode, and the shape of its JSON.

These never assert on a time or a ratio (benchmarks are not tests, and this machine is shared):
they make CI notice when a script no longer runs or no longer writes what docs/benchmarks.md
quotes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "scripts"


def run_smoke(script: str, out_dir: Path, *extra: str, timeout_s: float = 120) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--smoke", "--out", str(out_dir), *extra],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    results = list(out_dir.glob("*-smoke.json"))
    assert len(results) == 1, f"expected one smoke JSON in {out_dir}, found {results}"
    assert "|" in proc.stdout, f"{script} printed no table:\n{proc.stdout}"
    return json.loads(results[0].read_text())


def assert_machine(result: dict) -> None:
    machine = result["machine"]
    assert machine["nproc"] >= 1
    assert machine["cpu_model"]
    assert result["mode"] == "smoke"


def test_bench_gc_pause_smoke(tmp_path):
    result = run_smoke("bench_gc_pause.py", tmp_path)
    assert result["benchmark"] == "gc_pause"
    assert_machine(result)
    (measured,) = result["interpreters"]
    assert measured["python"] == "%d.%d.%d" % sys.version_info[:3]
    # Importing the GC core must pull in nothing but the lifecycle module (and stdlib).
    assert measured["gc_freeze_imports_ok"], measured["gc_freeze_imports"]
    assert "dynamo.common.lifecycle" in measured["gc_freeze_imports"]["project"]
    assert [row["objects"] for row in measured["rows"]] == result["sizes"]
    for row in measured["rows"]:
        assert row["tracked"] >= row["objects"]
        assert row["frozen_count"] >= row["objects"]
        for key in ("stock_ms", "frozen_ms", "frozen_with_live_ms", "freeze_call_ms"):
            assert len(row[key]) == result["reps"]
            assert all(value > 0 for value in row[key])
        assert row["frozen_over_stock_median"] > 0
        assert row["freeze_call_over_collect_median"] > 0
