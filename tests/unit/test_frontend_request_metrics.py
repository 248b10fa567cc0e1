"""The frontend's dynamo_frontend_* request metrics: upstream's buckets, the counts a request
moves through the real service (tests/support/frontend_fakes.py: the tiny model's tokenizer
and template, a request-plane echo engine that streams a known output), bounded labels."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.serving import request_metrics as rm
from tests.support.frontend_fakes import MODEL, echo_worker, frontend, request_plane_server
from tests.support.tiny_model import tiny_card

HELLO = [{"role": "user", "content": "héllo"}]

# Upstream's defaults (lib/llm/src/http/service/metrics.rs, Metrics::new: generate_log_buckets
# of (min, max, count)), written out so a change to our rule, or to theirs, is seen here.
UPSTREAM_BUCKETS = {
    "REQUEST_DURATION_BUCKETS": (0, 2, 4, 8, 16, 32, 64, 130, 260, 510),
    "INPUT_SEQUENCE_BUCKETS": (
        0, 100, 210, 430, 870, 1800, 3600, 7400, 15000, 31000, 63000, 130000,
    ),
    "OUTPUT_SEQUENCE_BUCKETS": (0, 100, 210, 430, 880, 1800, 3700, 7600, 16000, 32000),
    "TTFT_BUCKETS": (
        0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1.0, 2.2, 4.7, 10, 22, 48, 100,
        220, 480,
    ),
    "ITL_BUCKETS": (
        0, 0.0019, 0.0035, 0.0067, 0.013, 0.024, 0.045, 0.084, 0.16, 0.3, 0.56, 1.1, 2.0,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(UPSTREAM_BUCKETS))
def test_buckets_are_upstreams_defaults(name):
    assert getattr(rm, name) == pytest.approx(UPSTREAM_BUCKETS[name], rel=1e-12)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "validation"), (413, "validation"), (404, "not_found"), (503, "overload"),
     (429, "overload"), (501, "not_implemented"), (500, "internal"), (502, "internal")],
)  # fmt: skip
def test_error_type_of_a_status(status, kind):
    assert rm.error_type(status) == kind


def request_to(metrics: rm.RequestMetrics, model: str) -> None:
    with metrics.request(rm.ENDPOINT_CHAT) as track:
        track.served(model)
        track.sent(3)
        track.tokens(2)


def test_model_labels_are_bounded_and_follow_what_is_served():
    """Issue 29: a model that arrives after many others still gets its own series (the old
    rule kept the first 64 names forever and counted later ones as "other")."""
    served = {"kept"}
    metrics = rm.RequestMetrics(is_served=served.__contains__, max_gone_labels=3)
    request_to(metrics, "kept")
    for i in range(50):  # churn: each model served once, then gone
        served.add(f"m{i}")
        request_to(metrics, f"m{i}")
        served.discard(f"m{i}")
    # The served model and the 3 most recently used gone ones; the rest gave their label up.
    assert metrics.labels() == ["kept", "m47", "m48", "m49"]
    served.add("late")
    request_to(metrics, "late")
    assert metrics.labels() == ["kept", "m48", "m49", "late"]
    assert value(metrics, rm.REQUESTS_TOTAL, **ok_labels("late")) == 1.0
    assert value(metrics, rm.REQUESTS_TOTAL, **ok_labels("kept")) == 1.0
    # A gone model's series are removed from the registry, every family of them.
    exposed = generate_latest(metrics.registry).decode()
    assert 'model="m0"' not in exposed and 'model="m47"' not in exposed
    assert 'model="late"' in exposed and "other" not in exposed


def test_a_gone_model_with_a_request_in_flight_keeps_its_label():
    served: set[str] = set()
    metrics = rm.RequestMetrics(is_served=served.__contains__, max_gone_labels=0)
    with metrics.request(rm.ENDPOINT_CHAT) as track:
        track.served("slow")
        request_to(metrics, "other-model")  # a new label: "slow" is gone but in flight
        assert "slow" in metrics.labels()
    assert value(metrics, rm.INFLIGHT_REQUESTS, model="slow") == 0.0
    request_to(metrics, "third")
    assert "slow" not in metrics.labels()


def ok_labels(model: str) -> dict[str, str]:
    return {
        "model": model, "endpoint": rm.ENDPOINT_CHAT, "request_type": rm.UNARY,
        "status": rm.SUCCESS, "error_type": rm.ERROR_NONE,
    }  # fmt: skip


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


def chat(model: str = MODEL, *, stream: bool = False, max_tokens: int = 6) -> dict:
    return {"model": model, "messages": HELLO, "stream": stream, "max_tokens": max_tokens}


def value(metrics: rm.RequestMetrics, name: str, **labels) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def requests(metrics, model, request_type, status="success", error="", endpoint="chat_completions"):
    return value(
        metrics,
        rm.REQUESTS_TOTAL,
        model=model,
        endpoint=endpoint,
        request_type=request_type,
        status=status,
        error_type=error,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_moves_every_family_as_its_tokens_say(card, stream):
    """6 tokens in items of 2: one TTFT, four inter-token latencies (the two later items' two
    tokens each), six output tokens, the prompt's length once, the output's length once."""
    processor = build_chat_processor(card)
    prompt = processor.encode_chat(processor.render(HELLO))
    output = processor.encode_completion("abcdefghijkl")[:6]
    assert len(output) == 6
    metrics = rm.RequestMetrics()

    async def scenario():
        async with (
            echo_worker(output=output, chunk=2) as (_, endpoint),
            frontend(card, endpoint, request_metrics=metrics) as client,
        ):
            response = await client.post("/v1/chat/completions", json=chat(stream=stream))
            await response.read()
            return response.status

    assert asyncio.run(scenario()) == 200
    kind = "stream" if stream else "unary"
    assert requests(metrics, MODEL, kind) == 1
    assert requests(metrics, MODEL, "unary" if stream else "stream") == 0
    assert value(metrics, rm.OUTPUT_TOKENS_TOTAL, model=MODEL) == 6
    assert value(metrics, rm.TIME_TO_FIRST_TOKEN_SECONDS + "_count", model=MODEL) == 1
    assert value(metrics, rm.INTER_TOKEN_LATENCY_SECONDS + "_count", model=MODEL) == 4
    assert value(metrics, rm.INPUT_SEQUENCE_TOKENS + "_sum", model=MODEL) == len(prompt)
    assert value(metrics, rm.INPUT_SEQUENCE_TOKENS + "_count", model=MODEL) == 1
    assert value(metrics, rm.OUTPUT_SEQUENCE_TOKENS + "_sum", model=MODEL) == 6
    assert value(metrics, rm.REQUEST_DURATION_SECONDS + "_count", model=MODEL) == 1
    assert value(metrics, rm.INFLIGHT_REQUESTS, model=MODEL) == 0


def test_failures_are_counted_by_kind_and_never_under_the_clients_model_string(card):
    metrics = rm.RequestMetrics()

    async def crashing(body: dict):
        yield {"token_ids": [5]}
        raise RuntimeError("engine crashed")

    async def scenario():
        async with (
            request_plane_server(crashing) as endpoint,
            frontend(card, endpoint, request_metrics=metrics) as client,
        ):
            statuses = []
            for body in (
                chat(model="no-such-model-\u2603"),  # 404
                {"model": MODEL, "messages": "not a list"},  # 400
                {**chat(), "n": 2, "temperature": 0},  # 400: vLLM's rule for greedy choices
                {"model": "no-such-model", "messages": "not a list"},  # 400, no served model
                chat(stream=True),  # 200, then the worker fails mid-stream
                chat(),  # 503
            ):
                response = await client.post("/v1/chat/completions", json=body)
                await response.read()
                statuses.append(response.status)
            response = await client.post("/v1/completions", data=b"{not json")
            statuses.append(response.status)
            return statuses

    assert asyncio.run(scenario()) == [404, 400, 400, 400, 200, 503, 400]
    assert requests(metrics, rm.UNKNOWN_MODEL, "unary", "error", "not_found") == 1
    # Refused by the field rules before the model was looked up: still the model's, when the
    # body names one the registry serves (other 400s for it carry its name too).
    assert requests(metrics, MODEL, "unary", "error", "validation") == 2
    assert requests(metrics, rm.UNKNOWN_MODEL, "unary", "error", "validation") == 1
    assert requests(metrics, MODEL, "stream", "error", "overload") == 1
    assert requests(metrics, MODEL, "unary", "error", "overload") == 1
    assert requests(metrics, rm.UNKNOWN_MODEL, "unary", "error", "validation", "completions") == 1
    models = {
        sample.labels.get("model")
        for family in metrics.registry.collect()
        for sample in family.samples
    }
    assert models == {MODEL, rm.UNKNOWN_MODEL}
    assert value(metrics, rm.INFLIGHT_REQUESTS, model=MODEL) == 0
    # The two requests that reached the worker each got their one token before it failed.
    assert value(metrics, rm.OUTPUT_TOKENS_TOTAL, model=MODEL) == 2
