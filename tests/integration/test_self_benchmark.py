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
from pathlib import Path

import aiohttp
import pytest

from dynamo.runtime import request_plane
from dynamo.runtime.discovery import DiscoveryStore
from tests.integration.harness import LauncherProcess

pytestmark = pytest.mark.integration

MODEL = "self-benchmark-model"
POINTS = 200
RANKS = 2
SUMMARY_LINE = rf"Self-benchmark done: points={POINTS} .* gc_policy=freeze"
SERVING_FREEZE_LINE = r"GC heap frozen \(vllm worker\)"
REGISTERED_LINE = r"Model registered: model=(\S+) instance=(\w+) endpoint=(\S+)"


def start_worker(name: str, directory: Path, *args: str, env=None) -> LauncherProcess:
    return LauncherProcess(
        name,
        "dynamo.vllm",
        ["--model", MODEL, "--discovery-dir", str(directory / "discovery"), *args],
        log_dir=directory,
        env=env,
    )


def line_numbers(log: str, pattern: str) -> list[int]:
    return [number for number, line in enumerate(log.splitlines()) if re.search(pattern, line)]


@pytest.fixture(scope="module")
def benchmarked_worker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("self-benchmark")
    output = directory / "points.jsonl"
    process = start_worker(
        "benchmarked-worker",
        directory,
        "--self-benchmark-points", str(POINTS),
        "--self-benchmark-output", str(output),
        "--fpm-gc-policy", "freeze",
        "--tensor-parallel-size", str(RANKS),
        "--mock-heap-objects", "100000",
        "--mock-token-ms", "1",
    )
    try:
        process.wait_for_log(REGISTERED_LINE, deadline_s=120)
        yield process, directory, output
    finally:
        assert process.stop() == 0, process.log()


def test_writes_one_json_line_per_point(benchmarked_worker):
    _, _, output = benchmarked_worker
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["point"] for row in rows] == list(range(POINTS))
    assert all(set(row) == {"point", "batch", "seq", "wall_ms"} for row in rows)
    assert all(row["wall_ms"] > 0 for row in rows)


def test_policy_runs_everywhere_and_stops_before_the_one_serving_freeze(benchmarked_worker):
    process, _, _ = benchmarked_worker
    log = process.log()
    started = line_numbers(log, r"GC policy started: automatic gen2 off")
    stopped = line_numbers(log, r"GC policy stopped: thresholds restored")
    # The main process and each rank, each once.
    assert len(started) == len(stopped) == 1 + RANKS, log
    rank_stops = line_numbers(log, r"\[rank \d\] dynamo\.vllm\.gc_policy: GC policy stopped")
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


def test_registers_after_the_benchmark_and_serves(benchmarked_worker):
    _, directory, _ = benchmarked_worker
    (record,) = DiscoveryStore(directory / "discovery").read_all().values()

    async def generate():
        async with aiohttp.ClientSession() as session:
            request = {"request_id": "after-bench", "token_ids": [4, 5], "max_tokens": 3}
            stream = request_plane.generate(session, record.endpoint, request)
            return [item async for item in stream]

    items = asyncio.run(generate())
    assert items[-1] == {"finish_reason": "length", "prompt_tokens": 2, "completion_tokens": 3}


def test_a_conflicting_worker_extension_exits_2_before_engine_init(tmp_path):
    process = start_worker(
        "conflict",
        tmp_path,
        "--self-benchmark-points", "5",
        "--fpm-gc-policy", "freeze",
        env={"DYN_VLLM_WORKER_EXTENSION_CLS": "collections.OrderedDict"},
    )
    try:
        assert process.wait_exit() == 2
    finally:
        process.stop()
    log = process.log()
    assert "--worker-extension-cls" in log and "--fpm-gc-policy" in log, log
    assert "collections.OrderedDict" in log and "Engine init" not in log, log


def test_a_bad_interval_env_exits_2_naming_flag_and_env(tmp_path):
    process = start_worker(
        "bad-interval",
        tmp_path,
        "--self-benchmark-points", "5",
        env={"DYN_FPM_GC_POLICY": "freeze", "DYN_FPM_GC_FREEZE_INTERVAL_S": "0.5"},
    )
    try:
        assert process.wait_exit() == 2
    finally:
        process.stop()
    log = process.log()
    assert "--fpm-gc-freeze-interval-s" in log and "DYN_FPM_GC_FREEZE_INTERVAL_S" in log, log
