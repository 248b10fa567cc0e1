"""The pair on loopback: real ``python -m dynamo.frontend`` + real ``python -m dynamo.vllm``.

One frontend and one worker (module fixture) serve every test; tests that need a worker to come,
go or die start one of their own for a model of their own, so the shared pair stays intact.
The frontend runs with the test-only explicit-collect trace (tests/support/gc_trace), which logs
each explicit ``gc.collect()``: its start-up freeze logs exactly one, and discovery must add none.
"""

from __future__ import annotations

import json
import re
import signal

import pytest

from tests.support import wait_until
from tests.support.answers import assert_openai_error, streamed_text
from tests.support.pair import (
    CLIENT_TIMEOUT_S,
    EXPLICIT_COLLECT_LINE,
    FROZEN_LINE,
    REFUSED_LINE,
    chat_body,
    expected_completion_tokens,
    expected_content,
    expected_finish_reason,
    request,
    stream_events,
)
from tests.support.processes import LISTENING_LINE, listening_url, start_frontend, start_worker

pytestmark = pytest.mark.integration

MODEL = "pair-mock"


class Pair:
    def __init__(self, directory):
        self.directory = directory
        self.discovery_dir = directory / "discovery"
        self.worker = start_worker(
            "worker", directory, self.discovery_dir, MODEL, "--mock-heap-objects", "100000",
            mock_token_ms=1,
        )  # fmt: skip
        # A lease far longer than any test here: a SIGKILLed worker's record must stay known for
        # the 503 test, however slow the machine (expiry is tested in test_discovery_lease.py).
        self.frontend = start_frontend(
            "frontend", directory, self.discovery_dir, "--discovery-ttl", "3600",
            trace_gc_collect=True,
        )  # fmt: skip
        self.url = listening_url(self.frontend)
        self.frontend.wait_for_log(rf"Model added: model={MODEL} ")

    def chat_url(self) -> str:
        return self.url + "/v1/chat/completions"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    pair = Pair(tmp_path_factory.mktemp("pair"))
    yield pair
    # Both stop on SIGTERM with exit 0: a failure here is reported as a teardown error.
    codes = {"frontend": pair.frontend.stop(), "worker": pair.worker.stop()}
    assert codes == {"frontend": 0, "worker": 0}, (codes, pair.frontend.log())


@pytest.fixture
def extra_workers(pair):
    started = []

    def start(name: str, model: str, *args: str):
        worker = start_worker(
            name, pair.directory, pair.discovery_dir, model, *args, mock_token_ms=1
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def test_models_lists_the_workers_model(pair):
    status, body = request("GET", pair.url + "/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [(m["id"], m["object"]) for m in body["data"]] == [(MODEL, "model")]
    assert request("GET", pair.url + "/health") == (
        200,
        {"status": "ready", "phase": "serving", "models": 1},
    )


def test_chat_completion_returns_the_engines_tokens(pair):
    body = chat_body(MODEL, max_tokens=48)
    status, completion = request("POST", pair.chat_url(), body)
    assert status == 200, completion
    assert completion["object"] == "chat.completion" and completion["model"] == MODEL
    (choice,) = completion["choices"]
    assert choice["message"]["content"] == expected_content(body)
    assert choice["finish_reason"] == expected_finish_reason(body)
    assert completion["usage"]["completion_tokens"] == expected_completion_tokens(body)


def test_streaming_chat_completion(pair):
    body = chat_body(MODEL, max_tokens=40, stream=True)
    events = list(stream_events(pair.url, body))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == expected_finish_reason(body)
    assert len(chunks) > 3  # streamed in pieces, not one blob
    assert streamed_text(chunks) == expected_content(body)


def test_each_process_logs_exactly_one_freeze_line_at_start_up(pair):
    frontend_log, worker_log = pair.frontend.log(), pair.worker.log()
    freezes = re.findall(FROZEN_LINE, frontend_log)
    assert freezes == ["frontend"]
    listening = re.search(LISTENING_LINE, frontend_log).start()
    assert re.search(FROZEN_LINE, frontend_log).start() < listening
    # The trace hook is live: the freeze's own collect is the one explicit collect, at start-up.
    collects = [m.start() for m in re.finditer(EXPLICIT_COLLECT_LINE, frontend_log)]
    assert len(collects) == 1 and collects[0] < listening
    assert re.findall(FROZEN_LINE, worker_log) == ["vllm worker"]
    assert re.search(FROZEN_LINE, worker_log).start() < worker_log.index("Model registered")
    assert REFUSED_LINE not in frontend_log + worker_log


BAD_REQUESTS = [
    ("malformed JSON", b'{"model": "pair-mock", "messages": [', 400, "invalid_json"),
    ("missing messages", {"model": MODEL}, 400, "missing_field"),
    ("missing model", {"messages": [{"role": "user", "content": "x"}]}, 400, "missing_field"),
    ("bad max_tokens", {**chat_body(MODEL), "max_tokens": 0}, 400, "invalid_value"),
    ("unknown model", chat_body("no-such-model"), 404, "model_not_found"),
]


@pytest.mark.parametrize(
    "body, status, code", [case[1:] for case in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_bad_input_gets_an_openai_error(pair, body, status, code):
    got_status, got = request("POST", pair.chat_url(), body)
    assert assert_openai_error(got, got_status, status)["code"] == code


def test_malformed_discovery_records_are_logged_and_ignored(pair):
    broken = pair.discovery_dir / "broken-record.json"
    partial = pair.discovery_dir / "partial-record.json"
    broken.write_text('{"model": "half', encoding="utf-8")
    partial.write_text(json.dumps({"model": "ghost"}), encoding="utf-8")
    try:
        pair.frontend.wait_for_log(r"WARNING .*Ignoring malformed discovery record .*broken-record")
        pair.frontend.wait_for_log(
            r"WARNING .*Ignoring malformed discovery record .*partial-record"
        )
        status, models = request("GET", pair.url + "/v1/models")
        assert [m["id"] for m in models["data"]] == [MODEL]
        status, completion = request("POST", pair.chat_url(), chat_body(MODEL))
        assert status == 200, completion
        assert pair.frontend.proc.poll() is None
    finally:
        broken.unlink()
        partial.unlink()


def test_a_model_registered_while_serving_is_servable_without_freeze_or_collect(
    pair, extra_workers
):
    offset = len(pair.frontend.log())
    late = extra_workers("worker-late", "pair-late")
    pair.frontend.wait_for_log(r"Model added: model=pair-late ")
    body = chat_body("pair-late", max_tokens=24)
    status, completion = request("POST", pair.chat_url(), body)
    assert status == 200, completion
    assert completion["choices"][0]["message"]["content"] == expected_content(body)

    since = pair.frontend.log()[offset:]
    assert "Chat processor built: model=pair-late" in since  # the factory ran, while serving
    assert re.findall(FROZEN_LINE, since) == []
    assert re.findall(REFUSED_LINE, since) == []
    assert re.findall(EXPLICIT_COLLECT_LINE, since) == []

    # The worker leaves cleanly: its record goes, and so does the model.
    assert late.stop() == 0
    pair.frontend.wait_for_log(r"Model removed: model=pair-late ")
    status, error = request("POST", pair.chat_url(), body)
    # Gone less than ten minutes ago: a retryable 503 (a restarting worker), not a 404.
    assert assert_openai_error(error, status, 503)["code"] == "worker_unavailable"
    since = pair.frontend.log()[offset:]
    assert re.findall(f"{FROZEN_LINE}|{REFUSED_LINE}|{EXPLICIT_COLLECT_LINE}", since) == []


def test_a_killed_worker_turns_its_model_into_503s_not_hangs(pair, extra_workers):
    doomed = extra_workers(
        "worker-doomed", "pair-doomed", "--mock-token-ms", "20", "--mock-max-model-len", "100000"
    )
    pair.frontend.wait_for_log(r"Model added: model=pair-doomed ")
    # A long stream in flight when the worker dies (5000 tokens at 20 ms would take 100 s).
    body = chat_body("pair-doomed", max_tokens=5000, stream=True, ignore_eos=True)
    events = stream_events(pair.url, body)
    started = [next(events), next(events), next(events)]
    assert started[0]["choices"][0]["delta"]["role"] == "assistant"
    doomed.signal(signal.SIGKILL)
    # The rest of the stream arrives within the client's socket timeout and ends in-band.
    rest = list(events)
    assert rest[-1] == "[DONE]"
    error = rest[-2]["error"]
    assert error["code"] == "worker_unavailable", rest[-2]
    # Its record stays behind (SIGKILL) until its lease expires (an hour here), so the frontend
    # still knows the model: every request for it is a prompt 503, streamed or not, and the
    # shared model is unaffected.
    wait_until(lambda: doomed.proc.poll() is not None, deadline_s=30, what="the worker to die")
    for stream in (False, True):
        status, body = request(
            "POST", pair.chat_url(), chat_body("pair-doomed", stream=stream),
            timeout=CLIENT_TIMEOUT_S,
        )  # fmt: skip
        assert assert_openai_error(body, status, 503)["code"] == "worker_unavailable"
    status, _ = request("POST", pair.chat_url(), chat_body(MODEL))
    assert status == 200
    assert pair.frontend.proc.poll() is None
