"""``python -m dynamo.vllm`` with the self-benchmark and its GC policy, as a real process.

One worker (module fixture) runs 200 points over 2 lockstep rank processes with the freeze policy,
then freezes, registers and serves; the read-only tests share it. The bad-configuration tests get
a short-lived process each (they exit 2 before engine init).
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
import subprocess
import sys
import urllib.request

import aiohttp
import pytest

from dynamo.runtime import request_plane
from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support import LauncherProcess
from tests.support.processes import start_worker

pytestmark = pytest.mark.integration

MODEL = "self-benchmark-model"
POINTS = 200
RANKS = 2
SUMMARY_LINE = rf"Self-benchmark done: points={POINTS} .* gc_policy=freeze"
SERVING_FREEZE_LINE = r"GC heap frozen \(vllm worker\)"
REGISTERED_LINE = r"Model registered: model=(\S+) instance=(\w+) endpoint=(\S+)"
SYSTEM_PORT_LINE = r"System server listening on http://127\.0\.0\.1:(\d+)"
# The system port on loopback, any free port, with GET /debug/gc/state.
DEBUG_STATE_ARGS = ("--system-host", "127.0.0.1", "--system-port", "0", "--debug-gc-endpoint")

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only


def line_numbers(log: str, pattern: str) -> list[int]:
    return [number for number, line in enumerate(log.splitlines()) if re.search(pattern, line)]


@pytest.fixture(scope="module")
def benchmarked_worker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("self-benchmark")
    output = directory / "points.jsonl"
    process = start_worker(
        "benchmarked-worker",
        directory,
        directory / "discovery",
        MODEL,
        "--self-benchmark-points",
        str(POINTS),
        "--self-benchmark-output",
        str(output),
        "--fpm-gc-policy",
        "freeze",
        "--tensor-parallel-size",
        str(RANKS),
        "--mock-heap-objects",
        "100000",
        "--mock-token-ms",
        "1",
        *DEBUG_STATE_ARGS,
    )
    try:
        process.wait_for_log(REGISTERED_LINE, deadline_s=120)
        yield process, directory, output
    finally:
        assert process.stop() == 0, process.log()


def debug_gc_state(process: LauncherProcess) -> dict:
    """GET /debug/gc/state from the worker's system port (logged when it bound port 0)."""
    port = process.wait_for_log(SYSTEM_PORT_LINE).group(1)
    url = f"http://127.0.0.1:{port}/debug/gc/state"
    with _opener.open(url, timeout=30) as response:
        return json.loads(response.read())


def fresh_interpreter(expression: str):
    """``expression`` evaluated in a new process of this very Python (stock GC state)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import gc, json; print(json.dumps({expression}))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(done.stdout)


def fresh_interpreter_thresholds() -> list[int]:
    return fresh_interpreter("gc.get_threshold()")


def test_writes_one_json_line_per_point(benchmarked_worker):
    _, _, output = benchmarked_worker
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["point"] for row in rows] == list(range(POINTS))
    assert all(set(row) == {"point", "batch", "seq", "wall_ms", "started_unix"} for row in rows)
    assert all(row["wall_ms"] > 0 for row in rows)
    starts = [row["started_unix"] for row in rows]
    assert starts == sorted(starts)  # wall clock at each start, in sweep order


def test_policy_runs_everywhere_and_stops_before_the_one_serving_freeze(benchmarked_worker):
    process, _, _ = benchmarked_worker
    log = process.log()
    started = line_numbers(log, r"GC policy started: automatic gen2 off")
    stopped = line_numbers(log, r"GC policy stopped: thresholds restored")
    # The main process and each rank, each once.
    assert len(started) == len(stopped) == 1 + RANKS, log
    rank_stops = line_numbers(log, r"\[rank \d\] dynamo_gc\.bench_policy: GC policy stopped")
    assert len(rank_stops) == RANKS, log
    (summary,) = line_numbers(log, SUMMARY_LINE)
    (serving_freeze,) = line_numbers(log, SERVING_FREEZE_LINE)
    (registered,) = line_numbers(log, REGISTERED_LINE)
    engine_ready = line_numbers(log, r"Engine init done")[0]
    assert engine_ready < min(started) and max(stopped) < summary, log
    assert summary < serving_freeze < registered, log


def test_serving_gets_the_stock_thresholds_back(benchmarked_worker):
    process, _, _ = benchmarked_worker
    restored = re.findall(r"thresholds restored to (\(\d+, \d+, \d+\))", process.log())
    assert restored == [str(gc.get_threshold())] * (1 + RANKS)  # this interpreter's stock values


def test_serving_runs_as_if_the_benchmark_never_ran(benchmarked_worker):
    """Read from the serving process itself, not from the policy's own log line: stock
    thresholds, automatic collection on, and the serving freeze in place."""
    process, _, _ = benchmarked_worker
    state = debug_gc_state(process)
    assert state["phase"] == "serving"
    assert state["thresholds"] == fresh_interpreter_thresholds()
    assert state["isenabled"] is True
    assert state["frozen_objects"] > 0


def test_without_the_serving_freeze_the_benchmark_leaves_nothing_frozen(tmp_path):
    process = start_worker(
        "benchmarked-unfrozen",
        tmp_path,
        tmp_path / "discovery",
        MODEL,
        "--self-benchmark-points",
        "20",
        "--fpm-gc-policy",
        "freeze",
        "--tensor-parallel-size",
        str(RANKS),
        "--no-freeze-gc-heap",
        *DEBUG_STATE_ARGS,
    )
    try:
        process.wait_for_log(REGISTERED_LINE, deadline_s=120)
        state = debug_gc_state(process)
    finally:
        assert process.stop() == 0, process.log()
    assert "Self-benchmark done: points=20" in process.log()
    assert state["phase"] == "serving"
    assert state["thresholds"] == fresh_interpreter_thresholds()
    assert state["isenabled"] is True
    # As a new process of this Python: 0, except 3.12.1's own start-up residue (375).
    assert state["frozen_objects"] == fresh_interpreter("gc.get_freeze_count()")


def test_registers_after_the_benchmark_and_serves(benchmarked_worker):
    _, directory, _ = benchmarked_worker
    (record,) = DiscoveryStore(directory / "discovery").read_all().values()

    async def generate():
        async with aiohttp.ClientSession() as session:
            request = {
                "request_id": "after-bench",
                "model": MODEL,
                "token_ids": [4, 5],
                "sampling": {"max_tokens": 3},
            }
            stream = request_plane.generate(session, record.endpoint, request)
            return [item async for item in stream]

    items = asyncio.run(generate())
    assert items[-1] == request_plane.Finish(
        finish_reason="length", prompt_tokens=2, completion_tokens=3
    )


def test_a_conflicting_worker_extension_exits_2_before_engine_init(tmp_path):
    process = start_worker(
        "conflict",
        tmp_path,
        tmp_path / "discovery",
        MODEL,
        "--self-benchmark-points",
        "5",
        "--fpm-gc-policy",
        "freeze",
        env={"DYN_VLLM_WORKER_EXTENSION_CLS": "collections.OrderedDict"},
    )
    assert process.exit_code() == 2
    log = process.log()
    assert "--worker-extension-cls" in log and "--fpm-gc-policy" in log, log
    assert "collections.OrderedDict" in log and "Engine init" not in log, log


def test_a_bad_interval_env_exits_2_naming_flag_and_env(tmp_path):
    process = start_worker(
        "bad-interval",
        tmp_path,
        tmp_path / "discovery",
        MODEL,
        "--self-benchmark-points",
        "5",
        env={"DYN_FPM_GC_POLICY": "freeze", "DYN_FPM_GC_FREEZE_INTERVAL_S": "0.5"},
    )
    assert process.exit_code() == 2
    log = process.log()
    assert "--fpm-gc-freeze-interval-s" in log and "DYN_FPM_GC_FREEZE_INTERVAL_S" in log, log


def test_an_output_file_that_cannot_be_created_exits_2_before_the_ranks_start(tmp_path):
    output = tmp_path / "no-such-dir" / "points.jsonl"
    process = start_worker(
        "bad-output",
        tmp_path,
        tmp_path / "discovery",
        MODEL,
        "--self-benchmark-points",
        "5",
        "--self-benchmark-output",
        str(output),
        "--tensor-parallel-size",
        "2",
    )
    assert process.exit_code() == 2
    log = process.log()
    assert "--self-benchmark-output / DYN_VLLM_SELF_BENCHMARK_OUTPUT" in log, log
    assert str(output) in log, log
    assert "Traceback" not in log and "rank process" not in log and "Engine init" not in log, log
