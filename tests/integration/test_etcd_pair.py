"""The real launchers on etcd: ``python -m dynamo.frontend`` and ``python -m dynamo.vllm`` with
``--discovery-backend etcd``, against a real etcd server on loopback started by the test."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
import sys
import threading
import time
import urllib.request

import aetcd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dynamo.common.configuration.runtime_options import DISCOVERY_DIR
from dynamo.runtime.discovery import ModelRecord
from tests.support import LauncherProcess, wait_until
from tests.support.pair import EXPLICIT_COLLECT_LINE, chat_body, request
from tests.support.processes import listening_url, start_frontend, start_worker
from tests.support.tiny_model import tiny_tokenizer_dir

pytestmark = pytest.mark.integration

TTL = "2"


# dynamo.frontend.routing.model_registry's line when a model's last instance goes; group 1: its
# time.
REMOVED_LINE = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ pid=\d+ \S+: Model removed: model=%s "


def log_time(stamp: str) -> float:
    """A launcher's log timestamp (logging's asctime, local time) as time.time() would say."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def etcd_args(server, *extra: str) -> tuple[str, ...]:
    return ("--discovery-backend", "etcd", "--etcd-endpoints", server.url, "--discovery-ttl",
            TTL, "--namespace", "pair", *extra)  # fmt: skip


def pair_on_etcd(
    server, log_dir, discovery_dir, *models: str
) -> tuple[list[LauncherProcess], LauncherProcess]:
    """A mock worker per model (``worker-<model>.log``) and a frontend (with the explicit-collect
    trace), all on ``server``; ``discovery_dir`` is set (in the environment: on the command
    line it would exit 2, as it means nothing on etcd) and must go unused."""
    env = {DISCOVERY_DIR.env_var: str(discovery_dir)}
    workers = [
        start_worker(
            f"worker-{model}", log_dir, None, model, *etcd_args(server), env=env, mock_token_ms=1
        )
        for model in models
    ]
    frontend = start_frontend(
        "frontend", log_dir, None, *etcd_args(server), env=env, trace_gc_collect=True
    )
    return workers, frontend


def models(url: str) -> set[str]:
    status, body = request("GET", url + "/v1/models")
    assert status == 200, body
    return {m["id"] for m in body["data"]}


def etcd_records(server) -> list[ModelRecord]:
    async def listing():
        async with aetcd.Client(host="127.0.0.1", port=server.client_port, timeout=5) as c:
            return [
                ModelRecord.from_json(kv.value.decode())
                for kv in await c.get_prefix(b"dynamo-gc/pair/models/")
            ]

    return asyncio.run(listing())


def chat_ok(url: str, model: str) -> bool:
    status, body = request("POST", url + "/v1/chat/completions", chat_body(model, max_tokens=4))
    return status == 200 and body["choices"][0]["finish_reason"] in ("length", "stop")


def test_register_discover_serve_and_drain(etcd_server, tmp_path):
    # The discovery dir is never used on etcd: a path that cannot exist proves it.
    nowhere = tmp_path / "file" / "not-a-dir"
    (tmp_path / "file").write_text("")
    (worker,), frontend = pair_on_etcd(etcd_server, tmp_path, nowhere, "etcd-a")
    try:
        url = listening_url(frontend)
        wait_until(lambda: "etcd-a" in models(url), deadline_s=30, what="the model on etcd")
        assert chat_ok(url, "etcd-a")
        status, health = request("GET", url + "/health")
        assert status == 200 and "discovery" not in health  # ok: nothing to say
        signalled_at = time.time()  # the wall clock the launchers' log lines are stamped with
        worker.signal()
        wait_until(lambda: "etcd-a" not in models(url), deadline_s=10, what="the model to go")
        # The interval the contract is about: SIGTERM sent -> the frontend's registry dropped the
        # model (the moment /v1/models stops listing it), read from the frontend's own log line,
        # not from when this test's next poll of /v1/models happened to be answered (on a
        # loaded CI machine that adds the poll's own latency).
        removed = frontend.wait_for_log(REMOVED_LINE % "etcd-a", deadline_s=10)
        gone_s = log_time(removed.group(1)) - signalled_at
        assert worker.wait_exit() == 0
        assert gone_s < 1.0, f"left /v1/models {gone_s:.2f} s after SIGTERM"
        assert etcd_records(etcd_server) == []
    finally:
        worker.stop()
        frontend.stop()
    assert "Model registered: model=etcd-a" in worker.log()
    assert "etcd lease 2 s" in worker.log()
    # The start-up freeze's one collect; discovery (on etcd too) adds none.
    assert frontend.count(EXPLICIT_COLLECT_LINE) == 1
    assert "Traceback" not in worker.log() + frontend.log()


def test_sigkill_leaves_after_the_ttl_and_the_other_worker_serves(
    etcd_server, tmp_path, record_property
):
    d = tmp_path / "unused"
    (doomed, other), frontend = pair_on_etcd(etcd_server, tmp_path, d, "etcd-doomed", "etcd-other")
    try:
        url = listening_url(frontend)
        wait_until(lambda: {"etcd-doomed", "etcd-other"} <= models(url), deadline_s=30, what="both")
        doomed.proc.kill()
        doomed.proc.wait(timeout=10)
        began = time.monotonic()
        wait_until(lambda: "etcd-doomed" not in models(url), deadline_s=15, what="expiry")
        gone_s = time.monotonic() - began
        record_property("sigkill_gone_after_s", round(gone_s, 2))
        print(f"SIGKILLed worker's model gone after {gone_s:.2f} s (TTL {TTL} s)")
        assert gone_s <= float(TTL) + 2.0  # the TTL plus etcd's expiry tick
        assert chat_ok(url, "etcd-other")
    finally:
        for process in (doomed, other, frontend):
            process.stop()


LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy, ever


def degraded_gauge(url: str) -> float:
    """The frontend's dynamo_discovery_degraded gauge, from its /metrics."""
    with LOOPBACK.open(url + "/metrics", timeout=10) as response:
        for family in text_string_to_metric_families(response.read().decode()):
            if family.name == "dynamo_discovery_degraded":
                (sample,) = family.samples
                return sample.value
    raise AssertionError("no dynamo_discovery_degraded on /metrics")


def test_etcd_restarted_after_the_ttl_under_load(etcd_server, tmp_path):
    """etcd stopped for longer than the TTL, restarted on the same data dir, while the pair
    serves: no request fails, the worker registers again, no instance twice, views agree."""
    d = tmp_path / "unused"
    (worker,), frontend = pair_on_etcd(etcd_server, tmp_path, d, "etcd-load")
    failures: list[str] = []
    served = [0]
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                if chat_ok(url, "etcd-load"):
                    served[0] += 1
                else:
                    failures.append("not ok")
            except Exception as exc:  # noqa: BLE001 - a failure is what this test counts
                failures.append(repr(exc))

    try:
        url = listening_url(frontend)
        wait_until(lambda: "etcd-load" in models(url), deadline_s=30, what="the model")
        (before,) = etcd_records(etcd_server)
        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        wait_until(lambda: served[0] >= 5, deadline_s=20, what="load")
        etcd_server.stop()
        frontend.wait_for_log(r"Discovery degraded: lost etcd", deadline_s=20)
        worker.wait_for_log(r"Discovery: lost etcd", deadline_s=20)
        status, health = request("GET", url + "/health")
        assert (status, health.get("discovery")) == (200, "degraded")
        assert degraded_gauge(url) == 1.0  # what a dashboard or an alert reads
        # Stopped for longer than the lease, measured by requests served meanwhile.
        outage_ends = time.monotonic() + float(TTL) + 1.0
        wait_until(lambda: time.monotonic() > outage_ends, deadline_s=10, what="the outage")
        served_in_outage = served[0]
        etcd_server.start()
        frontend.wait_for_log(r"Discovery recovered", deadline_s=30)
        worker.wait_for_log(r"registered again|still held", deadline_s=30)
        wait_until(lambda: len(etcd_records(etcd_server)) == 1, deadline_s=15, what="record")
        wait_until(lambda: served[0] > served_in_outage + 5, deadline_s=20, what="more load")
        stop.set()
        loader.join(timeout=30)
        (after,) = etcd_records(etcd_server)
        assert after.instance_id == before.instance_id  # the same instance, once
        status, health = request("GET", url + "/health")
        assert status == 200 and "discovery" not in health and health["models"] == 1
        assert degraded_gauge(url) == 0.0
    finally:
        stop.set()
        worker.stop()
        frontend.stop()
    assert failures == [], failures[:5]
    assert frontend.count(r"Discovery degraded: lost etcd") == 1
    assert worker.count(r"Discovery: lost etcd") == 1
    assert frontend.count(r"Model instance added|Model added") == 1
    assert "Traceback" not in worker.log() + frontend.log()


def test_start_up_with_etcd_down_stays_not_ready_then_serves(etcd_server, tmp_path):
    etcd_server.stop()
    d = tmp_path / "unused"
    (worker,), frontend = pair_on_etcd(etcd_server, tmp_path, d, "etcd-late")
    try:
        url = listening_url(frontend)
        frontend.wait_for_log(r"cannot reach etcd", deadline_s=20)
        worker.wait_for_log(r"cannot reach etcd", deadline_s=20)
        status, health = request("GET", url + "/health")
        assert (status, health["status"], health["discovery"]) == (503, "notready", "connecting")
        etcd_server.start()
        wait_until(lambda: "etcd-late" in models(url), deadline_s=30, what="the model")
        assert chat_ok(url, "etcd-late")
        assert request("GET", url + "/health")[0] == 200
    finally:
        worker.stop()
        frontend.stop()
    assert worker.proc.returncode == 0 and frontend.proc.returncode == 0


@pytest.mark.parametrize("module", ["dynamo.frontend", "dynamo.vllm"])
@pytest.mark.parametrize(
    "env,needle",
    [
        ({"ETCD_AUTH_USERNAME": "u"}, "ETCD_AUTH_PASSWORD is not set"),
        ({"ETCD_AUTH_PASSWORD": "secret-pw"}, "ETCD_AUTH_USERNAME is not set"),
        ({"ETCD_AUTH_CA": "/ca.pem"}, "ETCD_AUTH_CA set, but"),
    ],
)
def test_unusable_etcd_credentials_exit_2_and_never_print_a_password(module, env, needle):
    result = subprocess.run(
        [sys.executable, "-m", module, "--discovery-backend", "etcd"]
        + (
            ["--engine", "mock", "--model", tiny_tokenizer_dir()] if module == "dynamo.vllm" else []
        ),
        env={
            **{k: v for k, v in __import__("os").environ.items() if not k.startswith("ETCD_")},
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert "secret-pw" not in result.stderr + result.stdout
