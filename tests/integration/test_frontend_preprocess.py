"""``--dyn-preprocess-workers 2``: each preprocess process freezes its own heap before the
frontend admits anything, requests still succeed, a SIGKILLed preprocess process is replaced
(the new ones freeze their own heaps too) and SIGTERM takes the pool down."""

from __future__ import annotations

import ast
import os
import re
import signal

import pytest

from tests.support import wait_until
from tests.support.answers import streamed_text
from tests.support.pair import (
    FROZEN_LINE,
    REFUSED_LINE,
    chat_body,
    expected_content,
    lines_with_pids,
    request,
    stream_events,
)
from tests.support.processes import (
    LISTENING_LINE,
    listening_url,
    pid_alive,
    start_frontend,
    start_worker,
)

pytestmark = pytest.mark.integration

MODEL = "preprocess-mock"
WORKERS = 2
# Room for the 500-token stream of the SIGTERM test (the tiny tokenizer says 512).
MAX_MODEL_LEN = 4096
POOL_PIDS = r"Preprocess pool (?:ready|rebuilt in [\d.]+ s): workers=2 pids=(\[[\d, ]+\])"
# From a SIGKILLed preprocess process to requests served again: two interpreters spawned and
# initialised on a loaded 2-core machine.
REBUILD_DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("preprocess")
    discovery_dir = directory / "discovery"
    worker = start_worker(
        "worker", directory, discovery_dir, MODEL, "--mock-max-model-len", str(MAX_MODEL_LEN),
        mock_token_ms=1,
    )  # fmt: skip
    frontend = start_frontend(
        "frontend", directory, discovery_dir, "--dyn-preprocess-workers", str(WORKERS),
        trace_gc_collect=True,
    )  # fmt: skip
    try:
        url = listening_url(frontend)
        frontend.wait_for_log(rf"Model added: model={MODEL} ")
        yield frontend, url
    finally:
        frontend.stop()
        worker.stop()


def test_each_preprocess_worker_logs_its_own_freeze_before_the_listener(pair):
    frontend, _ = pair
    log = frontend.log()
    listening = re.search(LISTENING_LINE, log).start()
    freezes = lines_with_pids(log, FROZEN_LINE)
    preprocess = [(pid, line) for pid, line in freezes if "(preprocess worker)" in line]
    own = [(pid, line) for pid, line in freezes if "(frontend)" in line]
    assert len(freezes) == WORKERS + 1, freezes
    assert len(own) == 1 and own[0][0] == frontend.pid
    pids = {pid for pid, _ in preprocess}
    assert len(pids) == WORKERS and frontend.pid not in pids
    for _, line in preprocess + own:
        assert log.index(line) < listening
    # The pool reported the same processes as ready, after their freezes.
    ready = re.search(r"Preprocess pool ready: workers=2 pids=(\[[\d, ]+\])", log)
    assert set(ast.literal_eval(ready.group(1))) == pids
    assert all(log.index(line) < ready.start() for _, line in preprocess)
    assert REFUSED_LINE not in log


def test_requests_still_succeed_through_the_pool(pair):
    _, url = pair
    for max_tokens in (8, 33, 64):
        body = chat_body(MODEL, max_tokens=max_tokens)
        status, completion = request("POST", url + "/v1/chat/completions", body)
        assert status == 200, completion
        assert completion["choices"][0]["message"]["content"] == expected_content(body)
    body = chat_body(MODEL, max_tokens=20, stream=True)
    events = list(stream_events(url, body))
    assert events[-1] == "[DONE]" and streamed_text(events) == expected_content(body)


def current_pool_pids(log: str) -> set[int]:
    """The pids of the last pool the frontend reported ready (at start-up, or rebuilt)."""
    return set(ast.literal_eval(re.findall(POOL_PIDS, log)[-1]))


def test_a_killed_preprocess_process_is_replaced_and_requests_succeed_again(pair):
    frontend, url = pair
    old_pids = current_pool_pids(frontend.log())
    offset = len(frontend.log())
    os.kill(min(old_pids), signal.SIGKILL)
    body = chat_body(MODEL, max_tokens=8)
    failed = 0

    def answer() -> int:
        nonlocal failed
        status, completion = request("POST", url + "/v1/chat/completions", body)
        if status == 200:
            assert completion["choices"][0]["message"]["content"] == expected_content(body)
        else:
            assert status == 503 and completion["error"]["code"] == "preprocess_unavailable"
            failed += 1
        return status

    # The executor notices the death a moment after the kill (a request may still reach the
    # live process meanwhile); the first request after that gets 503 and starts the rebuild.
    wait_until(lambda: answer() == 503, deadline_s=REBUILD_DEADLINE_S, what="the pool to break")
    wait_until(lambda: answer() == 200, deadline_s=REBUILD_DEADLINE_S, what="requests to succeed")
    since = frontend.log()[offset:]
    assert len(re.findall(r"WARNING .*Preprocess pool broke", since)) == 1, since
    new_pids = current_pool_pids(frontend.log())
    assert len(new_pids) == WORKERS and not new_pids & old_pids
    # Each new process froze its own heap, in its initializer, before the pool was back.
    rebuilt_at = re.search(POOL_PIDS, since).start()
    freezes = [(pid, line) for pid, line in lines_with_pids(since, FROZEN_LINE)
               if "(preprocess worker)" in line]  # fmt: skip
    assert {pid for pid, _ in freezes} == new_pids, since
    assert all(since.index(line) < rebuilt_at for _, line in freezes)
    assert REFUSED_LINE not in since
    # The failed requests' WARNING is budgeted (one per cause per 10 s, the next counting those
    # held back), and no ERROR: the rebuild worked.
    assert 1 <= len(re.findall(r"WARNING .*-> 503 preprocess_unavailable", since)) <= failed
    assert " ERROR " not in since
    assert request("GET", url + "/health")[0] == 200


def test_sigterm_lets_the_stream_in_flight_finish_then_stops_the_pool(pair):
    frontend, url = pair
    pids = current_pool_pids(frontend.log())
    assert len(pids) == WORKERS and all(pid_alive(pid) for pid in pids)
    # ~0.6 s of tokens at 1 ms each, past the echoed prompt's EOS
    body = chat_body(MODEL, max_tokens=500, stream=True, ignore_eos=True)
    events = stream_events(url, body)
    first = next(events)
    frontend.signal(signal.SIGTERM)
    frontend.wait_for_log(r"Draining: 1 request\(s\) in flight")
    rest = list(events)
    assert rest[-1] == "[DONE]"
    # Nothing cut short.
    assert streamed_text([first, *rest]) == expected_content(body, max_model_len=MAX_MODEL_LEN)
    assert frontend.wait_exit() == 0
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), deadline_s=30, what="pool exit")
