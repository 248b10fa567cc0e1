"""A worker killed with SIGKILL is dropped by the real frontend once its discovery lease expires.

Real ``python -m dynamo.frontend`` and two real ``python -m dynamo.vllm`` workers on 127.0.0.1,
all with a short ``--discovery-ttl`` (the declared option, so the processes run exactly as an
operator would run them). One worker is killed and never removes its record; the other keeps
renewing its own and must stay listed.
"""

from __future__ import annotations

import re

import pytest

from dynamo.runtime.discovery.file_backend import HEARTBEATS_PER_TTL
from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support import wait_until
from tests.support.answers import assert_openai_error
from tests.support.pair import chat_body, request
from tests.support.processes import listening_url, start_frontend, start_worker

pytestmark = pytest.mark.integration

# Short enough for a quick test, long enough that a live worker on a busy 2-core CI machine is
# never taken for dead: it renews every second (TTL/5), so only a stall of five
# seconds in a row would expire it. (2 s, renewing every 0.4 s, left too little room.)
TTL = "5"
DOOMED, SURVIVOR = "lease-doomed", "lease-survivor"
REGISTERED = r"Model registered: model={model} instance=(\w+) endpoint=(\S+) heartbeat every"
EXPIRED = (
    r"Discovery record (\S+) expired: no heartbeat for ([\d.]+) s "
    r"\(worker {instance} at {endpoint}\)"
)
# From SIGKILL to the model gone: one TTL plus polling, with ample room for a loaded machine.
EXPIRY_DEADLINE_S = 60.0
ANY_EXPIRY = r"Discovery record \S+ expired: no heartbeat for [\d.]+ s \(worker (\w+) at "


def listed_models(url: str) -> set[str]:
    status, body = request("GET", url + "/v1/models")
    assert status == 200, body
    return {model["id"] for model in body["data"]}


def survivor_heartbeats(discovery_dir) -> int:
    records = DiscoveryStore(discovery_dir).read_all().values()
    return max((r.heartbeat or 0 for r in records if r.model == SURVIVOR), default=0)


def test_a_sigkilled_worker_is_dropped_after_its_lease_expires(tmp_path):
    discovery_dir = tmp_path / "discovery"
    frontend = start_frontend(
        "frontend", tmp_path, discovery_dir, "--discovery-ttl", TTL, trace_gc_collect=True
    )
    doomed = start_worker(
        "worker-doomed", tmp_path, discovery_dir, DOOMED, "--discovery-ttl", TTL, mock_token_ms=1
    )
    survivor = start_worker(
        "worker-survivor", tmp_path, discovery_dir, SURVIVOR, "--discovery-ttl", TTL,
        mock_token_ms=1,
    )  # fmt: skip
    try:
        url = listening_url(frontend)
        instance, endpoint = doomed.wait_for_log(REGISTERED.format(model=DOOMED)).groups()
        wait_until(
            lambda: {DOOMED, SURVIVOR} <= listed_models(url),
            deadline_s=60,
            what="both models to be listed",
        )
        status, body = request("POST", url + "/v1/chat/completions", chat_body(DOOMED))
        assert status == 200, body

        doomed.proc.kill()  # SIGKILL: no drain, the record stays behind
        doomed.wait_exit()
        record_path = discovery_dir / f"{instance}.json"
        assert record_path.exists()

        expired = frontend.wait_for_log(
            EXPIRED.format(instance=instance, endpoint=re.escape(endpoint)),
            deadline_s=EXPIRY_DEADLINE_S,
        )
        assert expired.group(1) == str(record_path)
        assert float(expired.group(2)) >= float(TTL)  # logged to 0.1 s
        wait_until(
            lambda: DOOMED not in listed_models(url),
            deadline_s=EXPIRY_DEADLINE_S,
            what=f"{DOOMED} to leave /v1/models",
        )
        status, error = request("POST", url + "/v1/chat/completions", chat_body(DOOMED))
        # Gone less than ten minutes ago: a retryable 503 (a restarting worker), not a 404.
        assert assert_openai_error(error, status, 503)["code"] == "worker_unavailable"

        # The live worker renews its lease: two TTLs' worth of heartbeats later it is still listed.
        wait_until(
            lambda: survivor_heartbeats(discovery_dir) >= 2 * HEARTBEATS_PER_TTL,
            deadline_s=EXPIRY_DEADLINE_S,
            what=f"{SURVIVOR}'s record to be renewed for two TTLs",
        )
        assert SURVIVOR in listed_models(url)
        status, body = request("POST", url + "/v1/chat/completions", chat_body(SURVIVOR))
        assert status == 200, body
        # Exactly one expiry, and it is the doomed worker's: the survivor never went silent for
        # a TTL. (Its record file is deleted only after ten TTLs: see the unit tests.)
        expired_instances = re.findall(ANY_EXPIRY, frontend.log())
        assert expired_instances == [instance], frontend.log()
    finally:
        codes = {"frontend": frontend.stop(), "survivor": survivor.stop()}
        doomed.stop()
    assert codes == {"frontend": 0, "survivor": 0}, frontend.log()
