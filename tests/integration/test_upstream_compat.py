"""Upstream Dynamo's names on the real launchers: the extension's upstream path, DYN_LOG in every
process, /live during engine init."""

from __future__ import annotations

import json
import re
import signal
import urllib.error
import urllib.request

import pytest

from tests.support import LauncherProcess
from tests.support.processes import listening_url, start_frontend, start_worker
from tests.support.tiny_model import tiny_tokenizer_dir

pytestmark = pytest.mark.integration

MODEL = "upstream-compat-model"
REGISTERED_LINE = r"Model registered: model="
SYSTEM_PORT_LINE = r"System server listening on http://127\.0\.0\.1:(\d+)"
UPSTREAM_EXTENSION = "dynamo.vllm.gc_policy.FpmGcWorkerExtension"
CONFIGURED_DEBUG = re.compile(r" DEBUG pid=(\d+) (\[[^\]]+\] )?dynamo\.common\.logging_setup: ")

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only


def get(url: str) -> tuple[int, dict]:
    try:
        with _opener.open(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("policy", ["freeze", "off"])
def test_the_upstream_extension_path_works_with_the_mock_ranks(tmp_path, policy):
    process = start_worker(
        f"ext-{policy}",
        tmp_path, tmp_path / "discovery", MODEL,
        "--self-benchmark-points", "20",
        "--fpm-gc-policy", policy,
        "--tensor-parallel-size", "2",
        "--worker-extension-cls", UPSTREAM_EXTENSION,
    )  # fmt: skip
    try:
        process.wait_for_log(REGISTERED_LINE, deadline_s=120)
        log = process.log()
        assert len(re.findall(rf"Injected {re.escape(UPSTREAM_EXTENSION)} into", log)) == 2, log
        assert re.search(rf"Self-benchmark done: points=20 .* gc_policy={policy}", log), log
        assert "GC policy did not start in rank" not in log
    finally:
        assert process.stop() == 0, process.log()


def test_live_answers_during_engine_init_while_health_is_503(tmp_path):
    process = start_worker(
        "slow-init",
        tmp_path, tmp_path / "discovery", MODEL,
        "--mock-init-ms", "600000",
        "--system-host", "127.0.0.1",
        "--system-port", "0",
    )  # fmt: skip
    try:
        port = process.wait_for_log(SYSTEM_PORT_LINE).group(1)
        process.wait_for_log(r"Mock engine: engine init takes")
        base = f"http://127.0.0.1:{port}"
        assert get(base + "/live") == (200, {"status": "live", "phase": "starting"})
        assert get(base + "/health")[0] == 503
        assert "Engine init done" not in process.log()  # still in engine init
        process.signal(signal.SIGTERM)
        assert process.wait_exit(60) == 0, process.log()
    finally:
        process.stop()


def test_dyn_log_debug_reaches_every_process(tmp_path):
    env = {"DYN_LOG": "debug"}
    worker_process = start_worker(
        "debug-worker",
        tmp_path,
        tmp_path / "discovery",
        MODEL,
        "--tensor-parallel-size",
        "2",
        env=env,
    )
    frontend = start_frontend(
        "debug-frontend", tmp_path, tmp_path / "discovery", "--dyn-preprocess-workers", "1",
        env=env,
    )  # fmt: skip
    try:
        worker_process.wait_for_log(REGISTERED_LINE, deadline_s=120)
        listening_url(frontend, deadline_s=120)
        worker_pids = {m.group(1) for m in CONFIGURED_DEBUG.finditer(worker_process.log())}
        ranks = {m.group(2) for m in CONFIGURED_DEBUG.finditer(worker_process.log())}
        frontend_pids = {m.group(1) for m in CONFIGURED_DEBUG.finditer(frontend.log())}
        # the worker and its two ranks; the frontend and its preprocess worker
        assert str(worker_process.pid) in worker_pids and len(worker_pids) == 3, worker_pids
        assert {"[rank 0] ", "[rank 1] "} <= ranks, ranks
        assert str(frontend.pid) in frontend_pids and len(frontend_pids) == 2, frontend_pids
    finally:
        assert frontend.stop() == 0, frontend.log()
        assert worker_process.stop() == 0, worker_process.log()


@pytest.mark.parametrize("module", ["dynamo.vllm", "dynamo.frontend"])
def test_an_unknown_dyn_log_level_exits_2_naming_it(tmp_path, module):
    engine = (
        ["--engine", "mock", "--model", tiny_tokenizer_dir()] if module == "dynamo.vllm" else []
    )
    process = LauncherProcess(
        f"loud-{module}",
        module,
        ["--discovery-dir", str(tmp_path / "d"), *engine],
        log_dir=tmp_path,
        env={"DYN_LOG": "loud"},
    )
    assert process.exit_code(60) == 2
    assert "invalid value 'loud' for DYN_LOG" in process.log(), process.log()
