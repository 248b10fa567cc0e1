"""The real worker when vLLM's EngineCore dies while it serves: the same ending as a dead mock
rank (one ERROR line naming the process, its pid and the signal; the streams in flight end with
an in-band error; the record withdrawn; exit 1; no traceback of ours).

EngineCore is found in the worker's process tree by the title vLLM gives it (``VLLM::EngineCore``).
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import time
import urllib.parse
from pathlib import Path

import pytest

from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support import wait_until
from tests.support.processes import start_worker

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

START_DEADLINE_S = 300.0
EXIT_BOUND_S = 30.0  # vLLM's own client shutdown is part of it
MODEL = "tiny-death"
STREAMS = 4  # a few long streams, so some are still running when EngineCore is killed


def _engine_core(worker_pid: int):
    import psutil  # a vLLM dependency: only the vLLM environment has it

    def find():
        for child in psutil.Process(worker_pid).children(recursive=True):
            try:
                if any("EngineCore" in part for part in child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    return wait_until(find, deadline_s=30, what="vLLM's EngineCore process")


def test_a_killed_engine_core_ends_the_real_worker_with_one_error_line(tiny_model, tmp_path):
    import psutil

    discovery = tmp_path / "discovery"
    worker = start_worker("worker-core-dies", tmp_path, discovery, MODEL, vllm_model=tiny_model)
    connections = []
    try:
        worker.wait_for_log("Worker serving model", deadline_s=START_DEADLINE_S)
        (record,) = DiscoveryStore(discovery).read_all().values()
        core = _engine_core(worker.pid)
        plane = urllib.parse.urlsplit(record.endpoint)
        responses = []
        for number in range(STREAMS):
            conn = http.client.HTTPConnection(plane.hostname, plane.port, timeout=60)
            body = {"request_id": f"death-{number}", "model": MODEL, "token_ids": [72, 105, 33],
                    "sampling": {"max_tokens": 250, "ignore_eos": True}}  # fmt: skip
            conn.request("POST", "/generate", json.dumps(body))
            connections.append(conn)
            responses.append(conn.getresponse())
        for response in responses:
            assert response.status == 200
            assert json.loads(response.readline()).get("token_ids")

        began = time.monotonic()
        core.send_signal(signal.SIGKILL)
        endings = [response.read().decode().splitlines() for response in responses]
        assert worker.wait_exit(EXIT_BOUND_S + 30) == 1, worker.log()
        took = time.monotonic() - began
    finally:
        for conn in connections:
            conn.close()
        worker.stop()
    log = worker.log()
    assert took < EXIT_BOUND_S, f"exit {took:.1f} s after EngineCore died:\n{log}"
    ours = [line for line in log.splitlines() if " dynamo." in line]
    errors = [line for line in ours if " ERROR " in line]
    assert len(errors) == 1, log
    assert re.search(
        rf"the engine died: vLLM's EngineCore\S* process \(pid {core.pid}\) was killed by "
        r"signal SIGKILL \(9\) while serving",
        errors[0],
    ), errors
    # Every stream ended properly: finished before the kill, or with an in-band error after it.
    for lines in endings:
        last = json.loads(lines[-1]) if lines else {}
        assert "finish_reason" in last or "engine died" in last.get("error", ""), lines[-2:]
    assert any("error" in json.loads(lines[-1]) for lines in endings if lines), endings
    assert 'File "' + str(Path(__file__).parents[2] / "components") not in log, log
    assert "Traceback" not in "\n".join(ours)
    assert DiscoveryStore(discovery).read_all() == {}
    assert log.index("the engine died") < log.index("Model unregistered")
    assert "Worker stopped after its engine died (exit 1)" in log
    assert not psutil.pid_exists(core.pid) or core.status() == psutil.STATUS_ZOMBIE
