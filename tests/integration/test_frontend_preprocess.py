"""``--dyn-preprocess-workers 2``: each preprocess process freezes its own heap before the
frontend admits anything, requests still succeed, and SIGTERM takes the pool down too."""

from __future__ import annotations

import ast
import os
import re
import signal

import pytest

from tests.integration.harness import wait_until
from tests.integration.pair_helpers import (
    FROZEN_LINE,
    LISTENING_LINE,
    REFUSED_LINE,
    chat_body,
    expected_content,
    frontend_url,
    lines_with_pids,
    request,
    start_frontend,
    start_worker,
    stream_events,
    streamed_text,
)

pytestmark = pytest.mark.integration

MODEL = "preprocess-mock"
WORKERS = 2


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("preprocess")
    discovery_dir = directory / "discovery"
    worker = start_worker("worker", directory, discovery_dir, MODEL)
    frontend = start_frontend(
        "frontend", directory, discovery_dir, "--dyn-preprocess-workers", str(WORKERS)
    )
    try:
        url = frontend_url(frontend)
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


def test_sigterm_lets_the_stream_in_flight_finish_then_stops_the_pool(pair):
    frontend, url = pair
    pids = {pid for pid, line in lines_with_pids(frontend.log(), FROZEN_LINE)
            if "(preprocess worker)" in line}  # fmt: skip
    assert len(pids) == WORKERS and all(alive(pid) for pid in pids)
    body = chat_body(MODEL, max_tokens=500, stream=True)  # ~0.6 s of tokens at 1 ms each
    events = stream_events(url, body)
    first = next(events)
    frontend.signal(signal.SIGTERM)
    frontend.wait_for_log(r"Draining: 1 request\(s\) in flight")
    rest = list(events)
    assert rest[-1] == "[DONE]"
    assert streamed_text([first, *rest]) == expected_content(body)  # nothing cut short
    assert frontend.wait_exit() == 0
    wait_until(lambda: not any(alive(pid) for pid in pids), deadline_s=30, what="pool exit")
