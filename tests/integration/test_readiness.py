"""Readiness and liveness on the real launchers (issue 21, item 5).

The frontend's ``/health`` is readiness: 503 with a ``reason`` until it serves at least
``--dyn-ready-min-models`` / ``DYN_READY_MIN_MODELS`` models (default 1; 0: ready once it
listens), whatever discovery has not found yet; ``/live`` is liveness, 200 throughout. The
worker's ``/health`` on its system port is 200 once its model is registered. A Kubernetes
readiness probe on a frontend with no worker therefore keeps it out of the Service, instead of
sending traffic that can only be answered 404.
"""

from __future__ import annotations

import pytest

from tests.support import wait_until
from tests.support.pair import request
from tests.support.processes import listening_url, start_frontend, start_worker

pytestmark = pytest.mark.integration

SYSTEM_PORT_LINE = r"System server listening on (http://127\.0\.0\.1:\d+)"
DEADLINE_S = 60.0


def health(url: str) -> tuple[int, dict]:
    return request("GET", url + "/health")


def health_with_models(url: str, models: int) -> tuple[int, dict] | None:
    """The frontend's /health once it counts ``models`` served models, else None."""
    answer = health(url)
    return answer if answer[1].get("models") == models else None


def worker(tmp_path, name: str, discovery):
    return start_worker(
        name, tmp_path, discovery, name, "--system-host", "127.0.0.1", "--system-port", "0"
    )


def test_frontend_is_ready_from_n_served_models_and_live_throughout(tmp_path):
    discovery = tmp_path / "discovery"
    empty = tmp_path / "empty"
    default = start_frontend("frontend-default", tmp_path, discovery)
    two = start_frontend("frontend-two", tmp_path, discovery, env={"DYN_READY_MIN_MODELS": "2"})
    zero = start_frontend("frontend-zero", tmp_path, empty, "--dyn-ready-min-models", "0")
    workers = []
    try:
        default_url, two_url, zero_url = map(listening_url, (default, two, zero))
        # Listening, no model: alive, not ready, and saying why (the option, both spellings).
        assert request("GET", default_url + "/live")[0] == 200
        status, body = health(default_url)
        assert (status, body["status"], body["models"]) == (503, "notready", 0), body
        assert "--dyn-ready-min-models / DYN_READY_MIN_MODELS" in body["reason"], body
        # 0: ready as soon as it listens, with nothing to serve.
        assert health(zero_url) == (200, {"status": "ready", "phase": "serving", "models": 0})

        workers.append(worker(tmp_path, "model-a", discovery))
        worker_url = listening_url(workers[0], SYSTEM_PORT_LINE)
        wait_until(lambda: health(worker_url)[0] == 200, deadline_s=DEADLINE_S, what="worker")
        assert health(worker_url) == (200, {"status": "ready", "phase": "serving"})
        ready = wait_until(lambda: health_with_models(default_url, 1), deadline_s=DEADLINE_S)
        assert ready == (200, {"status": "ready", "phase": "serving", "models": 1})
        # One model is not two: still out of the load balancer, and the body says so.
        status, body = wait_until(lambda: health_with_models(two_url, 1), deadline_s=DEADLINE_S)
        assert (status, body["status"]) == (503, "notready"), body
        assert "1 model(s) served, fewer than the 2" in body["reason"], body

        workers.append(worker(tmp_path, "model-b", discovery))
        ready = wait_until(lambda: health_with_models(two_url, 2), deadline_s=DEADLINE_S)
        assert ready == (200, {"status": "ready", "phase": "serving", "models": 2})

        # Readiness follows what is served: the workers gone, the frontend is not ready again.
        for process in workers:
            assert process.stop() == 0, process.log()
        status, body = wait_until(lambda: health_with_models(default_url, 0), deadline_s=DEADLINE_S)
        assert status == 503 and request("GET", default_url + "/live")[0] == 200, body
    finally:
        for process in (*workers, default, two, zero):
            process.stop()


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (("--dyn-ready-min-models", "65"), {}, "--dyn-max-models / DYN_MAX_MODELS"),
        ((), {"DYN_READY_MIN_MODELS": "-1"}, "DYN_READY_MIN_MODELS"),
    ],
    ids=["over-max-models", "negative-env"],
)
def test_a_threshold_that_can_never_be_met_exits_2_naming_the_option(tmp_path, args, env, named):
    process = start_frontend("frontend", tmp_path, tmp_path / "discovery", *args, env=env)
    code, output = process.exit_code(deadline_s=60), process.log()
    assert code == 2, output
    assert "--dyn-ready-min-models" in output and named in output, output
    assert "Frontend starting" not in output  # nothing ran
    assert not (tmp_path / "discovery").exists()  # nothing half-applied
