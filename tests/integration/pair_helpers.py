"""Helpers shared by the frontend + worker integration tests (this module holds no tests).

Processes are the real launchers (``python -m dynamo.frontend``, ``python -m dynamo.vllm``) on
127.0.0.1, started through the harness (which has the generic starters); the pair's own
settings are added here: fast mock tokens for the worker, the explicit-collect trace hook for the
frontend. HTTP goes through urllib with proxies disabled, so a proxy set in the environment never
sees loopback traffic.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from dynamo.frontend.chat_processor import build_chat_processor
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.mock_engine import mock_completion
from dynamo.vllm.mock_model import load_mock_model
from tests.integration import harness
from tests.integration.harness import LISTENING_LINE, LauncherProcess

__all__ = ["LISTENING_LINE"]  # re-exported: the pair tests import it from here


FROZEN_LINE = r"GC heap frozen \(([^)]*)\): collected=\d+ frozen=\d+"
REFUSED_LINE = r"GC heap freeze refused"
EXPLICIT_COLLECT_LINE = r"explicit gc\.collect\(\) called"
# Every request in these tests is bounded: a hang fails the test instead of stalling the suite.
CLIENT_TIMEOUT_S = 20.0

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def start_worker(
    name: str, log_dir: Path, discovery_dir: Path, model: str, *args: str
) -> LauncherProcess:
    """A mock worker producing a token a millisecond (``args`` may override it)."""
    return harness.start_worker(name, log_dir, discovery_dir, model, "--mock-token-ms", "1", *args)


def start_frontend(name: str, log_dir: Path, discovery_dir: Path, *args: str) -> LauncherProcess:
    # Test-only hook (see dynamo.frontend.gc_collect_trace): logs every explicit gc.collect().
    return harness.start_frontend(
        name, log_dir, discovery_dir, *args, env={"DYN_TEST_TRACE_GC_COLLECT": "1"}
    )


def frontend_url(frontend: LauncherProcess) -> str:
    return harness.listening_url(frontend)


def request(
    method: str, url: str, body: dict | bytes | None = None, timeout: float = CLIENT_TIMEOUT_S
) -> tuple[int, dict]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with _opener.open(req, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def chat_body(
    model: str, max_tokens: int = 16, stream: bool = False, *, ignore_eos: bool = False
) -> dict:
    """A chat request. The mock echoes the rendered prompt, whose EOS tokens end a completion
    unless ``ignore_eos`` (long streams set it, so they run to ``max_tokens``)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello, frozen heap! ❄"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def expected_completion(
    body: dict, card=None, *, max_model_len: int | None = None
) -> tuple[str, str, int]:
    """What the frontend must answer, its finish reason and its completion token count: the mock engine's tokens for this
    body (the prompt the model's own template renders, the EOS ids the frontend sends as stop
    ids), decoded by the model's own tokenizer. ``card`` names the model's files (default: the
    tiny tokenizer the harness's mock worker serves, under the body's model name, with the
    worker's ``--mock-max-model-len`` when it set one)."""
    if card is None:
        card = load_mock_model(
            harness.tiny_tokenizer_dir(),
            served_model_name=body["model"],
            max_model_len=max_model_len,
        ).card
    processor = build_chat_processor(card)
    ids = processor.encode_chat(processor.render(body["messages"]))
    model = load_mock_model(
        card.tokenizer_path,
        served_model_name=card.served_model_name,
        max_model_len=card.context_length,
    )
    ignore_eos = bool(body.get("ignore_eos"))
    sampling = SamplingOptions(
        max_tokens=body["max_tokens"],
        stop_token_ids=() if ignore_eos else card.eos_token_ids,
        ignore_eos=ignore_eos,
    )
    token_ids, finish_reason = mock_completion(model, ids, sampling)
    text = processor.tokenizer.decode(token_ids)
    stops = body.get("stop") or []
    stops = [stops] if isinstance(stops, str) else stops
    found = [text.find(stop) for stop in stops if stop in text]
    if not found:
        return text, finish_reason, len(token_ids)
    # A stop string ends the completion before it: the text stops there, and the tokens
    # counted are those generated until the one that completed it.
    cut = min(found)
    used = next(
        k for k in range(1, len(token_ids) + 1)
        if any(stop in processor.tokenizer.decode(token_ids[:k]) for stop in stops)
    )  # fmt: skip
    return text[:cut], "stop", used


def expected_content(body: dict, card=None, *, max_model_len: int | None = None) -> str:
    return expected_completion(body, card, max_model_len=max_model_len)[0]


def expected_finish_reason(body: dict, card=None) -> str:
    return expected_completion(body, card)[1]


def expected_completion_tokens(body: dict, card=None) -> int:
    return expected_completion(body, card)[2]


def stream_events(url: str, body: dict, timeout: float = CLIENT_TIMEOUT_S) -> Iterator:
    """Yield the SSE payloads of a streamed chat completion (dicts, then the "[DONE]" string)."""
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with _opener.open(req, timeout=timeout) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        for raw in response:
            line = raw.decode().strip()
            if not line:
                continue
            assert line.startswith("data: "), line
            payload = line[len("data: ") :]
            yield payload if payload == "[DONE]" else json.loads(payload)


def streamed_text(events: list) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in events
        if isinstance(e, dict) and e.get("choices")
    )


def assert_openai_error(body: dict, status: int, expected_status: int) -> dict:
    assert status == expected_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def lines_with_pids(log: str, pattern: str) -> list[tuple[int, str]]:
    """(pid, line) for each log line matching ``pattern`` (the frontend logs ``pid=N``)."""
    found = []
    for line in log.splitlines():
        if re.search(pattern, line):
            pid = re.search(r"\bpid=(\d+)\b", line)
            found.append((int(pid.group(1)) if pid else -1, line))
    return found
