"""Serving-time maintenance (``idle``) through the add-on, against upstream's real processes.

Upstream's unchanged frontend with ``--dyn-chat-processor vllm`` and the ``gc-freeze`` route
extension, and upstream's unchanged vLLM worker through ``python -m dynamo_gc.vllm``, each with
``idle`` and a budget of a microsecond, so that one serving full collection makes a maintenance
due. That collection is the test's to place: SIGUSR1 runs one in the process's main thread
(tests/support/gc_nudge, loaded as ``sitecustomize``), as an automatic one would run.

What is judged: the gate sees upstream's requests (a maintenance made due while a streamed
request is in flight waits for it to end: admission is held, given up at the bound, and the
maintenance runs only once the stream is over), every request is answered, the maintenance's
metrics and log line are there; and the refusals where requests never reach Python.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import urllib.request
from datetime import datetime
from pathlib import Path

import bench_common
import openai
import pytest
from launcher_process import LauncherProcess, wait_until
from upstream_pair import MODEL, loopback_env, mocker_args, tiny_model_dir

from tests.upstream.frontend_pair import Frontend
from tests.upstream.needs_vllm import NEEDS_VLLM
from tests.upstream.test_vllm_worker_live import START_DEADLINE_S, start_worker

pytestmark = [pytest.mark.upstream, pytest.mark.integration, NEEDS_VLLM]

NUDGE = str(Path(__file__).resolve().parents[1] / "support" / "gc_nudge")
MAINTAINED = r"GC heap maintained \(([^)]*)\): mode=idle reason=(\w+) "
GAVE_UP = (
    r"GC maintenance deferred \(upstream frontend\): mode=idle: 1 request\(s\) still in flight"
)
# A budget of a microsecond: any serving full collection makes a maintenance due.
IDLE = {"DYN_GC_MAINTENANCE": "idle", "DYN_GC_PAUSE_BUDGET_MS": "0.001"}
LONG_TOKENS = 1000  # with the mocker at its real pace (~6 ms a token): seconds of streaming
# The engine's own lines: a request reached it (the frontend's generator is waiting on its
# items), and ended (the frontend's generator ends only after this).
ENGINE_RECEIVED = r"push_handler: request received"
ENGINE_COMPLETED = r"(\S+Z) .*push_handler: request completed"
STAMPED = r"(\S+Z) .*"  # upstream's log lines start with an RFC 3339 UTC time


def maintenances(metrics: str) -> float:
    return sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith('dynamo_gc_maintenance_total{mode="idle"')
    )


def logged_since(process: LauncherProcess, offset: int, pattern: str) -> re.Match:
    """The first match of ``pattern`` in what ``process`` logged after ``offset``."""
    return wait_until(
        lambda: re.search(pattern, process.log_bytes(offset).decode(errors="replace")),
        deadline_s=60.0,
        what=f"{process.name} to log {pattern!r}",
    )


def stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def slow_mocker(tmp_path):
    """Upstream's mocker at its real pace (streams take seconds), and its discovery directory."""
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    mocker = LauncherProcess(
        "mocker",
        "dynamo.mocker",
        mocker_args(tiny_model_dir(tmp_path / "model"), speedup_ratio=1),
        log_dir=tmp_path,
        env=loopback_env(kv_dir),
    )
    yield mocker, kv_dir
    mocker.stop()


def test_the_frontends_idle_maintenance_waits_for_the_request_upstream_is_streaming(
    slow_mocker, tmp_path
):
    mocker, kv_dir = slow_mocker
    frontend = Frontend(
        "dynamo.frontend",
        ["--dyn-chat-processor", "vllm"],
        kv_dir=kv_dir,
        log_dir=tmp_path,
        env={
            **IDLE,
            "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze",
            "DYN_GC_METRICS_PORT": "0",
            "DYN_GC_METRICS_HOST": "127.0.0.1",
            "PYTHONPATH": NUDGE,
        },
    )
    try:
        frontend.process.wait_for_log(r"Starting HTTP", deadline_s=START_DEADLINE_S)
        frontend.wait_model()
        frontend.chat()
        before = mocker.count(ENGINE_RECEIVED)
        client = openai.OpenAI(base_url=frontend.base_url + "/v1", api_key="-", max_retries=0)
        answer: dict[str, str | None] = {}

        def stream() -> None:
            # The frontend sends this stream's chunks at its end (they are not a sign of the
            # request being in flight); the engine's log is.
            chunks = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "a long answer"}],
                max_tokens=LONG_TOKENS,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].finish_reason:
                    answer["finish_reason"] = chunk.choices[0].finish_reason

        streaming = threading.Thread(target=stream)
        streaming.start()
        wait_until(
            lambda: mocker.count(ENGINE_RECEIVED) > before,
            deadline_s=60.0,
            what="the stream to reach the engine",
        )
        since = frontend.process.log_size()  # what the frontend logs from here on
        frontend.process.signal(signal.SIGUSR1)  # a serving full collection: maintenance due
        # Due for a second with the stream in flight (the gate counts it): admission is held,
        # the stream does not end within the budget, the attempt is given up and tried later.
        logged_since(frontend.process, since, GAVE_UP)
        streaming.join(timeout=300.0)
        assert answer.get("finish_reason") == "length", answer
        line = logged_since(frontend.process, since, STAMPED + MAINTAINED)
        assert line.group(2) == "upstream frontend"
        # Only once the engine had ended the stream (the two processes share the clock).
        ended = re.findall(ENGINE_COMPLETED, mocker.log())
        assert len(ended) == before + 1, ended
        assert stamp(line.group(1)) >= stamp(ended[-1]), (line.group(0), ended[-1])
        frontend.chat()  # admission open again: answered (its finish_reason checked)
        metrics = frontend.scrape()
        assert maintenances(metrics) >= 1
        assert 'phase="maintaining"' in metrics
    finally:
        frontend.stop()


def test_the_frontend_refuses_maintenance_with_upstreams_default_processor(slow_mocker, tmp_path):
    frontend = Frontend(
        "dynamo.frontend",
        [],
        kv_dir=slow_mocker[1],
        log_dir=tmp_path,
        env={**IDLE, "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"},
    )
    assert frontend.process.exit_code(deadline_s=START_DEADLINE_S) == 2
    log = frontend.process.log()
    assert "needs --dyn-chat-processor vllm or sglang" in log and "DYN_GC_MAINTENANCE" in log
    assert "Starting HTTP" not in log


def test_the_mocker_adapter_has_no_maintenance_option(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dynamo_gc.mocker", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ours = proc.stdout.split("Upstream ai-dynamo's own options follow.")[0]
    assert "--freeze-gc-heap" in ours and "--gc-maintenance" not in ours


@pytest.fixture(scope="module")
def model_dir() -> str:
    return bench_common.tiny_model_dir(sys.executable)


def test_the_vllm_workers_idle_maintenance_runs_between_requests(model_dir, tmp_path):
    worker, kv_dir = start_worker(
        "worker",
        model_dir,
        tmp_path,
        ["--gc-maintenance", "idle", "--gc-pause-budget-ms", "0.001", "--gc-metrics-port", "0",
         "--gc-metrics-host", "127.0.0.1"],
        {"PYTHONPATH": NUDGE},
    )  # fmt: skip
    frontend = Frontend("dynamo.frontend", [], kv_dir=kv_dir, log_dir=tmp_path)
    try:
        frontend.process.wait_for_log(r"Starting HTTP", deadline_s=START_DEADLINE_S)
        frontend.wait_model()  # the worker has registered: frozen, serving, maintainer started
        assert frontend.chat()
        port = worker.wait_for_log(r"GC metrics served on http://127\.0\.0\.1:(\d+)/metrics")
        worker.signal(signal.SIGUSR1)  # a serving full collection, nothing in flight
        line = worker.wait_for_log(MAINTAINED, deadline_s=60.0)
        assert "upstream vLLM worker" in line.group(1)
        for index in range(3):
            assert frontend.chat(f"after the maintenance {index}")
        url = f"http://127.0.0.1:{port.group(1)}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert maintenances(answer.read().decode()) >= 1
        assert not re.search(r"freeze refused", worker.log())
    finally:
        frontend.stop()
        worker.stop()
