"""Scrape /metrics from a real frontend and a real worker after start-up.

One frontend and one worker (sharing a discovery directory, so they also form a pair) serve
every test in this module: each test only reads, or adds one forced collection it accounts for.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dynamo.common.metrics import PAUSE_BUCKETS_S
from tests.support import LauncherProcess
from tests.support.processes import start_frontend, start_worker
from tests.unit.test_metrics import STABLE_FAMILIES

# The frontend's own: whether discovery is cut off from its store (0 with a readable directory).
FRONTEND_FAMILIES: dict[str, tuple[str, set[str]]] = {"dynamo_discovery_degraded": ("gauge", set())}

pytestmark = pytest.mark.integration

logger = logging.getLogger(__name__)

MODEL = "metrics-test-model"
FREEZE_LINE = r"GC heap frozen \({context}\): collected=\d+ frozen=(\d+) took_ms=(\d+\.\d)"
CONTEXTS = {"frontend": "frontend", "worker": "vllm worker"}

# Loopback only, whatever proxy the environment configures.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Served:
    """One launched process and the base URL where it serves /metrics."""

    process: LauncherProcess
    base_url: str

    def request(self, path: str, *, method: str = "GET") -> tuple[int, bytes]:
        request = urllib.request.Request(self.base_url + path, method=method)
        try:
            with _opener.open(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def scrape(self) -> dict:
        status, body = self.request("/metrics")
        assert status == 200, body
        return {f.name: f for f in text_string_to_metric_families(body.decode())}

    def value(self, families: dict, family: str, sample: str, **labels) -> float:
        found = [
            s.value for s in families[family].samples if s.name == sample and s.labels == labels
        ]
        assert len(found) == 1, (sample, labels, found)
        return found[0]

    def gen2_pauses(self, families: dict) -> float:
        return self.value(
            families,
            "dynamo_gc_pause_seconds",
            "dynamo_gc_pause_seconds_count",
            generation="2",
            phase="serving",
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[dict[str, Served]]:
    directory = tmp_path_factory.mktemp("metrics")
    discovery = directory / "discovery"
    worker = start_worker(
        "worker", directory, discovery, MODEL,
        "--mock-heap-objects", "50000",
        "--system-host", "127.0.0.1",
        "--system-port", "0",
        "--debug-gc-endpoint",
    )  # fmt: skip
    frontend = start_frontend("frontend", directory, discovery, "--dyn-debug-gc-endpoint")
    try:
        worker_port = worker.wait_for_log(
            r"System server listening on http://127\.0\.0\.1:(\d+)"
        ).group(1)
        worker.wait_for_log(r"Model registered: ")
        frontend_port = frontend.wait_for_log(
            r"HTTP service listening on http://127\.0\.0\.1:(\d+)"
        ).group(1)
        logger.info("worker system port %s, frontend HTTP port %s", worker_port, frontend_port)
        yield {
            "frontend": Served(frontend, f"http://127.0.0.1:{frontend_port}"),
            "worker": Served(worker, f"http://127.0.0.1:{worker_port}"),
        }
    finally:
        frontend.stop()
        worker.stop()


@pytest.fixture(params=["frontend", "worker"])
def one(request, served) -> tuple[str, Served]:
    return request.param, served[request.param]


def test_frozen_objects_gauge_equals_the_freeze_log_line(one):
    name, target = one
    line = target.process.wait_for_log(FREEZE_LINE.format(context=CONTEXTS[name]))
    assert target.process.count(r"GC heap frozen \(") == 1
    frozen, took_ms = int(line.group(1)), float(line.group(2))
    families = target.scrape()
    assert frozen > 0
    assert target.value(families, "dynamo_gc_frozen_objects", "dynamo_gc_frozen_objects") == frozen
    freeze_s = target.value(families, "dynamo_gc_freeze_seconds", "dynamo_gc_freeze_seconds")
    assert round(freeze_s * 1000.0, 1) == pytest.approx(took_ms, abs=0.1)  # the log rounds to .1
    assert target.value(families, "dynamo_gc_freeze_enabled", "dynamo_gc_freeze_enabled") == 1


def test_phase_gauge_says_serving(one):
    _, target = one
    families = target.scrape()
    phases = {s.labels["phase"]: s.value for s in families["dynamo_serving_phase"].samples}
    assert phases == {"starting": 0, "serving": 1, "draining": 0}


def test_forced_collection_adds_one_generation_2_pause(one):
    """The answer's before/after are read in-process with automatic GC off around the call, so
    they are exactly one apart; the scrapes on either side bracket them (counts only grow)."""
    _, target = one
    before_scrape = target.gen2_pauses(target.scrape())
    status, body = target.request("/debug/gc/collect", method="POST")
    assert status == 200, body
    answer = json.loads(body)
    after_scrape = target.gen2_pauses(target.scrape())
    assert answer["gen2_collections_delta"] == 1
    before, after = (
        answer["pause_histogram_gen2_count_before"],
        answer["pause_histogram_gen2_count_after"],
    )
    assert after == before + 1
    assert before_scrape <= before and after <= after_scrape
    assert after_scrape >= before_scrape + 1


def test_metric_names_and_labels_are_stable(one):
    which, target = one
    families = target.scrape()
    dynamo = {name for name in families if name.startswith("dynamo_")}
    stable = dict(STABLE_FAMILIES)
    if which == "frontend":
        stable.update(FRONTEND_FAMILIES)
    assert dynamo == set(stable)
    for name, (kind, labels) in stable.items():
        assert families[name].type == kind, name
        for s in families[name].samples:
            assert set(s.labels) - {"le"} == labels, (name, s)
    pause = families["dynamo_gc_pause_seconds"].samples
    assert {s.labels["generation"] for s in pause} == {"0", "1", "2"}
    assert {s.labels["phase"] for s in pause} == {"starting", "serving", "draining"}
    bounds = sorted(
        {float(s.labels["le"]) for s in pause if s.name.endswith("_bucket")} - {float("inf")}
    )
    assert bounds == sorted(PAUSE_BUCKETS_S)
    assert bounds[0] == 0.0001 and bounds[-1] == 10.0
    assert {"python_gc_collections", "process_resident_memory_bytes"} <= set(families)


def test_worker_health_is_ready_while_serving(served):
    status, body = served["worker"].request("/health")
    assert (status, json.loads(body)["phase"]) == (200, "serving")
