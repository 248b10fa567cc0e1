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

from dynamo.frontend.serving import request_metrics as rm
from dynamo_gc.metrics import PAUSE_BUCKETS_S
from tests.support import LauncherProcess, dashboard, wait_until
from tests.support.pair import chat_body, expected_completion_tokens, stream_events
from tests.support.pair import request as http_request
from tests.support.processes import start_frontend, start_worker
from tests.unit.test_metrics import STABLE_FAMILIES

# The frontend's own: whether discovery is cut off from its store (0 with a readable directory).
# And upstream's request metrics (dynamo.frontend.serving.request_metrics); the parser names a
# counter's family without its "_total".
FRONTEND_FAMILIES: dict[str, tuple[str, set[str]]] = {
    "dynamo_discovery_degraded": ("gauge", set()),
    "dynamo_frontend_requests": (
        "counter",
        {"model", "endpoint", "request_type", "status", "error_type"},
    ),
    "dynamo_frontend_inflight_requests": ("gauge", {"model"}),
    "dynamo_frontend_request_duration_seconds": ("histogram", {"model"}),
    "dynamo_frontend_time_to_first_token_seconds": ("histogram", {"model"}),
    "dynamo_frontend_inter_token_latency_seconds": ("histogram", {"model"}),
    "dynamo_frontend_input_sequence_tokens": ("histogram", {"model"}),
    "dynamo_frontend_output_sequence_tokens": ("histogram", {"model"}),
    "dynamo_frontend_output_tokens": ("counter", {"model"}),
}

# The serving-time maintenance's, on the frontend here (started with --dyn-gc-maintenance idle).
MAINTENANCE_FAMILIES: dict[str, tuple[str, set[str]]] = {
    "dynamo_gc_maintenance": ("counter", {"mode", "reason"}),
    "dynamo_gc_maintenance_seconds": ("histogram", {"mode"}),
    "dynamo_gc_maintenance_withdrawn_seconds": ("histogram", {"mode"}),
    "dynamo_gc_maintenance_wait_seconds": ("histogram", set()),
    "dynamo_gc_maintenance_reclaimed_objects": ("counter", set()),
    "dynamo_gc_maintenance_gave_up": ("counter", {"mode"}),
    "dynamo_gc_maintenance_due": ("gauge", set()),
    "dynamo_gc_unfrozen_objects_estimate": ("gauge", set()),
    "dynamo_gc_full_collections_held": ("gauge", set()),
}

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
    # Maintenance on (its series are on the dashboard), with a budget no collection here reaches.
    frontend = start_frontend(
        "frontend", directory, discovery, "--dyn-debug-gc-endpoint",
        "--dyn-gc-maintenance", "idle", "--dyn-gc-pause-budget-ms", "60000",
    )  # fmt: skip
    try:
        worker_port = worker.wait_for_log(
            r"System server listening on http://127\.0\.0\.1:(\d+)"
        ).group(1)
        worker.wait_for_log(r"Model registered: ")
        frontend_port = frontend.wait_for_log(
            r"HTTP service listening on http://127\.0\.0\.1:(\d+)"
        ).group(1)
        logger.info("worker system port %s, frontend HTTP port %s", worker_port, frontend_port)
        # Ready (readiness: --dyn-ready-min-models 1) once the frontend serves the model.
        wait_until(
            lambda: http_request("GET", f"http://127.0.0.1:{frontend_port}/health")[0] == 200,
            deadline_s=60,
            what="the frontend to serve the model",
        )
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
    assert phases == {"starting": 0, "serving": 1, "maintaining": 0, "draining": 0}


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
    # prometheus_client's creation timestamps of counters and histograms (`X_created`, which
    # the text format parses as gauges of their own) are not families of ours.
    dynamo = {n for n in families if n.startswith("dynamo_") and not n.endswith("_created")}
    stable = dict(STABLE_FAMILIES)
    if which == "frontend":
        stable.update(FRONTEND_FAMILIES)
        stable.update(MAINTENANCE_FAMILIES)
    assert dynamo == set(stable)
    for name, (kind, labels) in stable.items():
        assert families[name].type == kind, name
        for s in families[name].samples:
            assert set(s.labels) - {"le"} == labels, (name, s)
    pause = families["dynamo_gc_pause_seconds"].samples
    assert {s.labels["generation"] for s in pause} == {"0", "1", "2"}
    assert {s.labels["phase"] for s in pause} == {"starting", "serving", "maintaining", "draining"}
    bounds = sorted(
        {float(s.labels["le"]) for s in pause if s.name.endswith("_bucket")} - {float("inf")}
    )
    assert bounds == sorted(PAUSE_BUCKETS_S)
    assert bounds[0] == 0.0001 and bounds[-1] == 10.0
    assert {"python_gc_collections", "process_resident_memory_bytes"} <= set(families)


def test_worker_health_is_ready_while_serving(served):
    status, body = served["worker"].request("/health")
    assert (status, json.loads(body)["phase"]) == (200, "serving")


def sample(families: dict, name: str, **labels) -> float:
    """One sample's value, 0 when the series does not exist yet (a labelled family's series
    appears with its first request)."""
    for family in families.values():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def test_request_metrics_move_as_known_traffic_says(served):
    """Two whole and one streamed chat completion on the mock engine (whose answer the test
    computes: tests/support/pair.py) and one request for a model nobody serves: each family
    moves by exactly what that traffic means. Only this test sends completions to this
    frontend, so the deltas are its own."""
    frontend = served["frontend"]
    before = frontend.scrape()
    whole = chat_body(MODEL, max_tokens=8, ignore_eos=True)
    streamed = chat_body(MODEL, max_tokens=5, stream=True, ignore_eos=True)
    tokens = 2 * expected_completion_tokens(whole) + expected_completion_tokens(streamed)
    for _ in range(2):
        status, body = http_request("POST", frontend.base_url + "/v1/chat/completions", whole)
        assert status == 200, body
    events = list(stream_events(frontend.base_url, streamed))
    assert events[-1] == "[DONE]"
    status, _ = http_request(
        "POST", frontend.base_url + "/v1/chat/completions", chat_body("no-such-model")
    )
    assert status == 404
    after = frontend.scrape()

    def moved(name: str, **labels) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    ok = {"model": MODEL, "endpoint": "chat_completions", "status": "success", "error_type": ""}
    assert moved(rm.REQUESTS_TOTAL, request_type="unary", **ok) == 2
    assert moved(rm.REQUESTS_TOTAL, request_type="stream", **ok) == 1
    not_found = {"status": "error", "error_type": "not_found", "request_type": "unary"}
    assert moved(
        rm.REQUESTS_TOTAL, model=rm.UNKNOWN_MODEL, endpoint="chat_completions", **not_found
    ) == 1  # fmt: skip
    assert moved(rm.OUTPUT_TOKENS_TOTAL, model=MODEL) == tokens
    assert moved(rm.OUTPUT_SEQUENCE_TOKENS + "_sum", model=MODEL) == tokens
    for family in (rm.TIME_TO_FIRST_TOKEN_SECONDS, rm.INPUT_SEQUENCE_TOKENS,
                   rm.OUTPUT_SEQUENCE_TOKENS, rm.REQUEST_DURATION_SECONDS):  # fmt: skip
        assert moved(family + "_count", model=MODEL) == 3, family
    # One inter-token latency per token after the first item of each answer: at most
    # tokens - 3, at least one per request that had more than one item.
    itl = moved(rm.INTER_TOKEN_LATENCY_SECONDS + "_count", model=MODEL)
    assert 3 <= itl <= tokens - 3
    assert sample(after, rm.INFLIGHT_REQUESTS, model=MODEL) == 0
    ttft_inf = sample(after, rm.TIME_TO_FIRST_TOKEN_SECONDS + "_bucket", model=MODEL, le="+Inf")
    assert ttft_inf == sample(after, rm.TIME_TO_FIRST_TOKEN_SECONDS + "_count", model=MODEL)
    # Every series the Grafana dashboard reads is one this live frontend exports.
    exported = {s.name for family in after.values() for s in family.samples}
    for expr in dashboard.queries():
        assert dashboard.metric_names(expr) <= exported, expr
