"""The real frontend with ``--dyn-chat-processor sglang --dyn-preprocess-workers 2`` from the
SGLang venv, against the mock worker on the tiny model: SGLang's prompt, SGLang's heap frozen in
the frontend and in each pool worker before the listener opens, no freeze in the frontend for a
model found while serving, stock GC everywhere with the freeze off.

Without SGLang, the processor is exit 2 naming the flag and the set-up command (unmarked: it
runs in the default venvs).
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.sglang.sglang_reference import sglang_decode, sglang_prompt_ids
from tests.support.answers import streamed_text
from tests.support.pair import FROZEN_LINE, REFUSED_LINE, lines_with_pids, request, stream_events
from tests.support.processes import LISTENING_LINE, listening_url, start_frontend, start_worker

MODEL = "sglang-mock"
SECOND_MODEL = "sglang-mock-second"
WORKERS = 2
FROZEN_COUNT = r"GC heap frozen \((frontend|preprocess worker)\): collected=\d+ frozen=(\d+)"
DISABLED_LINE = r"GC heap freeze disabled \((frontend|preprocess worker)\)"
# Three interpreters importing SGLang (torch included) at once on a loaded 2-core machine.
START_DEADLINE_S = 240.0
# A worker that froze before importing SGLang holds a few tens of thousands of objects; SGLang's
# frontend modules are ~0.5M (docs/benchmarks.md).
SGLANG_HEAP_FLOOR = 300_000
MESSAGES = [
    {
        "role": "user",
        "content": [{"type": "text", "text": "Hello,"}, {"type": "text", "text": "SGLang! ❄"}],
    },
]


# How an upstream Dynamo manifest starts its SGLang-mode frontend: upstream's flags, and env
# vars the Dynamo operator injects into every pod (which mean nothing here: one WARNING).
UPSTREAM_ARGS = (
    "--dyn-chat-processor", "sglang", "--tool-call-parser", "qwen25",
    "--reasoning-parser", "deepseek-r1",
)  # fmt: skip
UPSTREAM_ENV = {"DYN_NAMESPACE": "dynamo", "DYN_SYSTEM_PORT": "9090", "DYN_LOG": "info"}


def sglang_frontend(directory, *args: str):
    return start_frontend(
        "frontend", directory, directory / "discovery",
        *UPSTREAM_ARGS, "--dyn-preprocess-workers", str(WORKERS), *args,
        env=UPSTREAM_ENV,
    )  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sglang")
    worker = start_worker("worker", directory, directory / "discovery", MODEL, mock_token_ms=1)
    frontend = sglang_frontend(directory)
    try:
        frontend.wait_for_log(LISTENING_LINE, deadline_s=START_DEADLINE_S)
        url = listening_url(frontend)
        frontend.wait_for_log(rf"Model added: model={MODEL} ")
        yield directory, frontend, url
    finally:
        frontend.stop()
        worker.stop()


@pytest.mark.sglang
@pytest.mark.integration
def test_the_prompt_is_sglangs_own_template_and_tokenizer(pair, tiny_tokenizer):
    _, _, url = pair
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 64}
    status, answer = request("POST", url + "/v1/chat/completions", body)
    assert status == 200, answer
    ids = sglang_prompt_ids(tiny_tokenizer, MESSAGES)
    assert answer["usage"]["prompt_tokens"] == len(ids)
    # The mock echoes the prompt up to its end-of-sequence token, decoded by SGLang's tokenizer.
    content = answer["choices"][0]["message"]["content"]
    assert content == sglang_decode(tiny_tokenizer, ids[: answer["usage"]["completion_tokens"]])
    assert "Hello, SGLang! ❄" in content  # SGLang joins content parts with a space
    events = list(stream_events(url, {**body, "stream": True}))
    assert streamed_text(events) == content


@pytest.mark.sglang
@pytest.mark.integration
def test_an_upstream_sglang_frontend_invocation_works_unchanged(pair):
    _, frontend, url = pair
    status, models = request("GET", url + "/v1/models")
    assert status == 200 and MODEL in [model["id"] for model in models["data"]]
    log = frontend.log()
    assert "Ignoring upstream Dynamo env vars" in log and "DYN_SYSTEM_PORT" in log
    assert "Traceback" not in log


@pytest.mark.sglang
@pytest.mark.integration
def test_each_pool_worker_and_the_frontend_freeze_sglangs_heap_before_the_listener(pair):
    _, frontend, _ = pair
    log = frontend.log()
    listening = re.search(LISTENING_LINE, log).start()
    freezes = lines_with_pids(log, FROZEN_LINE)
    assert len(freezes) == WORKERS + 1, freezes
    pool = {pid for pid, line in freezes if "(preprocess worker)" in line}
    assert len(pool) == WORKERS and frontend.pid not in pool
    for match in re.finditer(FROZEN_COUNT, log):
        assert match.start() < listening
        assert int(match.group(2)) > SGLANG_HEAP_FLOOR, match.group(0)
    for pid in pool:
        assert re.search(
            rf"pid={pid}\b.*Preprocess worker initialised: chat_processor=sglang \(SGLang ", log
        ), pid
    assert "Chat processor sglang: imported SGLang" in log


@pytest.mark.sglang
@pytest.mark.integration
def test_a_model_registered_while_serving_causes_no_freeze_in_the_frontend(pair):
    directory, frontend, url = pair
    before = frontend.count(FROZEN_LINE)
    second = start_worker(
        "second-worker", directory, directory / "discovery", SECOND_MODEL, mock_token_ms=1
    )
    try:
        frontend.wait_for_log(rf"Model added: model={SECOND_MODEL} ")
        body = {"model": SECOND_MODEL, "messages": MESSAGES, "max_tokens": 8}
        status, answer = request("POST", url + "/v1/chat/completions", body)
        assert status == 200, answer
    finally:
        second.stop()
    log = frontend.log()
    assert frontend.count(FROZEN_LINE) == before == WORKERS + 1
    assert re.search(REFUSED_LINE, log) is None
    assert re.search(
        rf"Chat processor built: model={SECOND_MODEL} processor=sglang .*chat_template=yes", log
    )


@pytest.mark.sglang
@pytest.mark.integration
def test_no_freeze_leaves_the_frontend_and_every_pool_worker_on_stock_gc(tmp_path):
    frontend = sglang_frontend(tmp_path, "--no-dyn-freeze-gc-heap")
    try:
        frontend.wait_for_log(LISTENING_LINE, deadline_s=START_DEADLINE_S)
        log = frontend.log()
    finally:
        assert frontend.stop() == 0
    disabled = lines_with_pids(log, DISABLED_LINE)
    assert len({pid for pid, _ in disabled}) == WORKERS + 1, disabled
    assert re.search(FROZEN_LINE, log) is None


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed")
def test_without_sglang_the_processor_exits_2_naming_the_flag_and_the_setup_command(tmp_path):
    frontend = start_frontend(
        "frontend", tmp_path, tmp_path / "discovery", "--dyn-chat-processor", "sglang"
    )
    assert frontend.exit_code(60) == 2
    log = frontend.log()
    assert "--dyn-chat-processor / DYN_CHAT_PROCESSOR" in log
    assert "scripts/setup_sglang_env.sh" in log
    assert "Traceback" not in log and "HTTP service listening" not in log
