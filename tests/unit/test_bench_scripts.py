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


def run_smoke(
    script: str, out_dir: Path, *extra: str, benchmark: str, timeout_s: float = 120
) -> dict:
    """``script --smoke`` (then ``extra``): its one JSON result, checked to be ``benchmark``'s
    smoke result with the machine described (see :func:`assert_machine`)."""
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
    result = json.loads(results[0].read_text())
    assert result["benchmark"] == benchmark
    assert_machine(result)
    return result


def assert_machine(result: dict) -> None:
    machine = result["machine"]
    assert machine["nproc"] >= 1
    assert machine["cpu_model"]
    assert result["mode"] == "smoke"


def test_bench_gc_pause_smoke(tmp_path):
    result = run_smoke("bench_gc_pause.py", tmp_path, benchmark="gc_pause")
    (measured,) = result["interpreters"]
    assert measured["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    # Importing the GC core must pull in nothing but the lifecycle module (and stdlib).
    assert measured["gc_freeze_imports_ok"], measured["gc_freeze_imports"]
    assert "dynamo_gc.lifecycle" in measured["gc_freeze_imports"]["project"]
    assert [row["objects"] for row in measured["rows"]] == result["sizes"]
    for row in measured["rows"]:
        assert row["tracked"] >= row["objects"]
        assert row["frozen_count"] >= row["objects"]
        for key in ("stock_ms", "frozen_ms", "frozen_with_live_ms", "freeze_call_ms"):
            assert len(row[key]) == result["reps"]
            assert all(value > 0 for value in row[key])
        assert row["frozen_over_stock_median"] > 0
        assert row["freeze_call_over_collect_median"] > 0


def test_bench_overheads_smoke(tmp_path):
    result = run_smoke("bench_overheads.py", tmp_path, benchmark="overheads")
    (measured,) = result["interpreters"]
    logger = measured["logger"]
    # The test venv has prometheus_client and aiohttp: the metrics arm must be measured too.
    assert logger["arms"] == ["none", "noop-callback", "logger", "logger+metrics"], logger[
        "metrics_unavailable"
    ]
    rounds = result["settings"]["rounds"]
    for arm in logger["arms"]:
        assert len(logger[arm]["seconds"]) == rounds
        assert all(seconds > 0 for seconds in logger[arm]["seconds"])
    for arm in logger["arms"][1:]:
        assert logger[arm]["collections_median"] > 0  # the workload did trigger collections
        assert logger[arm]["callback_ns_per_collection"] > 0
        assert "cost_pct_median" in logger[arm]
    tick = measured["tick"]
    small, big = (str(size) for size in tick["sizes"])
    assert tick["frozen_counts"][big] > tick["frozen_counts"][small]
    assert tick["tick_us_median"][small] > 0 and tick["tick_us_median"][big] > 0
    assert tick["big_over_small"] > 0
    assert {verdict["what"] for verdict in result["goal"]["verdicts"]} == {
        "logger cost %",
        "logger+metrics cost %",
        f"tick {big}/{small}",
    }


@pytest.mark.integration  # a real frontend and worker on loopback
def test_ab_serving_smoke(tmp_path):
    result = run_smoke("ab_serving.py", tmp_path, benchmark="ab_serving", timeout_s=180)
    rows = result["rows"]
    assert [(row["arm"], row["offered_rps"]) for row in rows] == [
        ("ctl", rate) for rate in result["rungs"]
    ] + [("all", rate) for rate in result["rungs"]]
    for row in rows:
        # Real processes answered real requests through the frontend.
        assert row["sent"] > 0 and row["ok"] == row["sent"], row["errors_by_kind"]
        assert row["achieved_rps"] > 0
        for key in ("latency", "ttft"):
            assert 0 < row[key]["p50_ms"] <= row[key]["p99_ms"] <= row[key]["max_ms"]
        for process in ("frontend", "worker"):
            assert row[process]["pauses_ge_50ms"] >= 0
            assert row[process]["gen2_collections"] >= 0
            assert row[process]["gen2_mean_ms"] >= 0
    for run in result["per_pass"]:
        for process in ("frontend", "worker"):
            # Read from each process's /metrics: None would mean the scrape or its parse broke.
            collections = run["processes"][process]["collections"]
            assert None not in collections.values(), (process, collections)
    goal = result["goal"]
    assert set(goal["ceiling_rps"]) == {"ctl", "all"}
    assert "all_pauses_ge_50ms" in goal


@pytest.mark.integration  # real worker processes with their rank processes
def test_ab_self_benchmark_smoke(tmp_path):
    result = run_smoke(
        "ab_self_benchmark.py", tmp_path, benchmark="ab_self_benchmark", timeout_s=180
    )
    points = result["settings"]["points"]
    runs = result["runs"]
    assert sorted((run["ranks"], run["policy"]) for run in runs) == [(1, "freeze"), (1, "off")]
    for run in runs:
        analysis = run["analysis"]
        assert analysis["points"] == points  # every point the worker measured was read back
        assert 0 < analysis["p50_ms"] <= analysis["max_wall_ms"]
        assert 0 <= analysis["stalls"] <= analysis["outliers"] == len(analysis["outlier_indices"])
        assert f"points={points}" in run["worker_summary"]
        assert f"gc_policy={run['policy']}" in run["worker_summary"]
    (verdict,) = result["goal"]["verdicts"]
    assert verdict["tensor_parallel_size"] == 1


@pytest.mark.parametrize("script", ["ab_serving.py", "ab_self_benchmark.py"])
def test_the_vllm_engine_mode_names_the_missing_vllm_environment(tmp_path, script):
    # --engine vllm runs the worker from the vLLM environment's python: without it, the script
    # must say how to make it, before it starts anything.
    missing = tmp_path / "no-venv" / "bin" / "python"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--engine", "vllm", "--smoke",
         "--vllm-python", str(missing), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert str(missing) in proc.stderr and "scripts/setup_vllm_env.sh" in proc.stderr
    assert not list((tmp_path / "out").glob("*.json"))


def test_ab_self_benchmark_counts_a_pause_only_in_the_windows_it_overlaps():
    import ab_self_benchmark_vllm  # scripts/ is on sys.path (pytest's pythonpath)

    rows = [
        {"point": 0, "started_unix": 100.0, "wall_ms": 10.0},
        {"point": 1, "started_unix": 100.5, "wall_ms": 600.0},
        {"point": 2, "started_unix": 101.2, "wall_ms": 10.0},
    ]
    overlapping = ab_self_benchmark_vllm.overlapping_points
    # A pause inside point 1's window, and one that ends 10 ms into it.
    assert overlapping({"ended_unix": 101.0, "ms": 400.0}, rows) == [1]
    assert overlapping({"ended_unix": 100.51, "ms": 500.0}, rows) == [1]
    # Between two points (a maintain window), touching point 2's start: in no window.
    assert overlapping({"ended_unix": 100.499, "ms": 400.0}, rows) == []
    assert overlapping({"ended_unix": 101.2005, "ms": 90.0}, rows) == []


def test_bench_gc_callback_info_smoke(tmp_path):
    result = run_smoke("bench_gc_callback_info.py", tmp_path, benchmark="gc_callback_info")
    (measured,) = result["interpreters"]
    assert measured["thresholds_round_trip_exact"]
    assert measured["bare_freeze_us_median"] > 0
    has_duration = sys.version_info >= (3, 15)
    assert ("duration" in measured["stop_info_keys"]) == has_duration
    frozen = measured["explicit"]["frozen"]
    assert ("candidates_median" in frozen) == has_duration
    assert measured["loops"]["alone"]["gen0"]["collections"] > 0


def test_bench_pool_start_smoke(tmp_path):
    result = run_smoke(
        "bench_pool_start.py", tmp_path, "--workers", "1", benchmark="pool_start", timeout_s=300
    )
    for method in ("spawn", "forkserver"):
        (start_s,) = result["methods"][method]["start_s"]
        assert start_s > 0
        frozen = result["methods"][method]["frozen"]
        assert len(frozen) == 1 and frozen[0] > 0  # the child's own freeze


def test_ab_upstream_probe_reads_a_pause_line_only_once_it_is_whole():
    import ab_upstream  # scripts/ is on sys.path (pytest's pythonpath)
    from serving_pair import pauses_in

    line = b"WARN pause_logger._log_pause: GC gen2 pause 376.7 ms (collected=1 uncollectable=0)\n"
    log = b"INFO request completed\n" + line
    cut = log.index(b"376.7") + 3  # the line is still being written: "... pause 376" so far
    first = ab_upstream.complete_lines(log[:cut])
    assert first == b"INFO request completed\n"
    # the next scan starts where the complete lines ended and sees the whole line
    second = ab_upstream.complete_lines(log[len(first) :])
    assert pauses_in(first) == [] and pauses_in(second) == [{"generation": 2, "ms": 376.7}]
    assert ab_upstream.complete_lines(b"no newline yet") == b""


def test_bench_template_sandbox_smoke():
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_template_sandbox.py"), "--rounds", "1",
         "--renders", "3"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| sandbox | 3 |" in result.stdout and "sandbox / thread: median" in result.stdout


def test_bench_gc_maintenance_smoke(tmp_path):
    result = run_smoke("bench_gc_maintenance.py", tmp_path, benchmark="gc_maintenance")
    (measured,) = result["interpreters"]
    settled = measured["settled"]
    assert settled["objects_per_ms_calibrated"] > 0
    # The steps a maintenance takes or avoids, each counted and timed on the grown heap.
    assert settled["count_unfrozen"]["objects"] >= 2 * result["start_objects"]
    assert settled["count_frozen"]["objects"] > 0
    assert settled["maintenance"]["took_ms"] > 0 and settled["reclaim"]["reclaim_ms"] > 0
    assert "passes" in measured["unsettled"]


def test_bench_gc_hold_smoke(tmp_path):
    result = run_smoke("bench_gc_hold.py", tmp_path, benchmark="gc_hold")
    (measured,) = result["interpreters"]
    held, stock = measured["held"], measured["not_held"]
    assert [r["round"] for r in held["rounds"]] == ["1 boot", "1 after 1", "1", "2 after 1", "2"]
    # Grown alike, request for request; while held no automatic full collection ran.
    assert [r["requests"] for r in held["rounds"]] == [r["requests"] for r in stock["rounds"]]
    assert all(r["full_collections"] == 0 for r in held["rounds"])
    if held["hold_unavailable"] is None:
        semantics = held["semantics"]
        assert semantics["taken"] and semantics["restored_exactly"]
        # CPython's count of generation-1 collections went on past the (held) third threshold.
        assert semantics["max_passes"] > held["thresholds"][2]
    # Each round's held estimate and its maintenance's collection were measured.
    assert all(r["estimate_ms"] > 0 and r["collect_ms"] > 0 for r in held["rounds"])


def test_bench_routing_smoke():
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_routing.py"), "--rounds", "1", "--refused", "20",
         "--hanging", "2"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| 20 refused, one address | [503] |" in result.stdout
    assert "| idle | own time (as built) | 1 of 1 |" in result.stdout


def test_bench_model_arrival_smoke():
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_model_arrival.py"), "--rounds", "1", "--models",
         "2", "--tokenizer-mb", "0.1"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "| in turn |" in result.stdout and "in turn / all at once" in result.stdout


def test_bench_hostile_templates_smoke(tmp_path):
    """Real processes (a frontend, a mock worker): the healthy model answered throughout, each
    scenario measured."""
    result = run_smoke(
        "bench_hostile_templates.py", tmp_path, benchmark="hostile_templates", timeout_s=300
    )
    assert result["arms"] == ["after"]
    runs = result["runs"]["after"]
    assert [run["context"] for run in runs["output"]] == [512, 131072]
    for run in runs["output"]:
        assert run["healthy_statuses"] == [200] and run["healthy_ms"], run
        assert run["rss_peak_mb"] >= run["rss_before_mb"] > 0, run
    (compiled,) = runs["compile"]
    assert compiled["ordinary_served_after_s"] > 0, compiled


def test_bench_gc_soak_smoke(tmp_path):
    """The soak's arms on real processes (frontend and mock workers with the growth knob), a
    couple of seconds each: what each writes, not what it measures."""
    result = run_smoke(
        "bench_gc_soak.py", tmp_path, "--keep-logs", benchmark="gc_soak", timeout_s=600
    )
    assert result["settings"]["growth_per_request"] > 0
    rows = {row["arm"]: row for row in result["rows"]}
    assert set(rows) == {"once", "idle", "withdraw"}
    assert (rows["idle"]["workers"], rows["withdraw"]["workers"]) == (1, 2)
    for row in rows.values():
        assert row["sent"] > 0 and row["errors"] == 0, row
        assert row["latency"]["n"] == row["sent"]
    for run in result["per_arm"]:
        names = {"frontend", "worker", *(["worker1"] if run["workers"] == 2 else [])}
        assert set(run["processes"]) == names
        assert run["timeline"] and all(
            sample["rss_mb"][name] > 0 for sample in run["timeline"] for name in names
        )
        for process in run["processes"].values():
            assert {"serving_pauses", "maintenances", "held", "metrics"} <= set(process)
            assert process["metrics"]["serving_all"]["count"] >= 0
        # What the plot marks: the slowest requests with the time they were scheduled at.
        assert 0 < len(run["slowest"]) <= 20 and "scheduled_s" not in run
    # Every arm against `once` in its pass, and the goals the doc quotes.
    pairs = {pair["arm"]: pair for pair in result["pairs"]}
    assert "throughput_over_once" in pairs["idle"] and "throughput_over_once" in pairs["withdraw"]
    assert {"withdraw_stalls_ge_50ms", "idle_stalls_ge_50ms", "once_longest_pause_ms"} <= set(
        result["goal"]
    )
    # The maintenance options reached the processes they are for.
    logs = {log.name: log.read_text(errors="replace") for log in tmp_path.glob("*.log")}
    assert "gc_maintenance=withdraw" in logs["gc_soak-pass0-withdraw-worker1.log"]
    assert "gc_maintenance=idle" in logs["gc_soak-pass0-idle-worker.log"]
    assert "gc_maintenance=off" in logs["gc_soak-pass0-once-worker.log"]
    # The per-arm pause plot, drawn from what the JSON keeps (when matplotlib is there).
    if result["pauses_plot"] is not None:
        assert (tmp_path / "gc_soak-pauses-smoke.png").stat().st_size > 0
