"""Talking to a real frontend + mock worker pair over HTTP, and what the pair must answer.

HTTP goes through urllib with proxies disabled, so a proxy set in the environment never sees
loopback traffic. :func:`expected_completion` computes the mock engine's answer for a request
(the model's own chat template and tokenizer, the mock's tokens), so a test compares the
frontend's reply with it exactly. The pair's log lines are here too.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator

from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.mock_engine import mock_completion
from dynamo.vllm.mock_model import load_mock_model
from tests.support.answers import sse_payload
from tests.support.tiny_model import tiny_tokenizer_dir

FROZEN_LINE = r"GC heap frozen \(([^)]*)\): collected=\d+ frozen=\d+"
REFUSED_LINE = r"GC heap freeze refused"
# Logged by tests/support/gc_trace (start_frontend(..., trace_gc_collect=True)).
EXPLICIT_COLLECT_LINE = r"explicit gc\.collect\(\) called"
# Every request in these tests is bounded: a hang fails the test instead of stalling the suite.
CLIENT_TIMEOUT_S = 20.0

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
    """What the frontend must answer, its finish reason and its completion token count: the
    mock engine's tokens for this body (the prompt the model's own template renders, the EOS ids
    the frontend sends as stop ids), decoded by the model's own tokenizer. ``card`` names the
    model's files (default: the tiny tokenizer the mock worker of start_worker serves, under the
    body's model name, with the worker's ``--mock-max-model-len`` when it set one)."""
    if card is None:
        card = load_mock_model(
            tiny_tokenizer_dir(),
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
            payload = sse_payload(raw)
            if payload is not None:
                yield payload


def lines_with_pids(log: str, pattern: str) -> list[tuple[int, str]]:
    """(pid, line) for each log line matching ``pattern`` (the frontend logs ``pid=N``)."""
    found = []
    for line in log.splitlines():
        if re.search(pattern, line):
            pid = re.search(r"\bpid=(\d+)\b", line)
            found.append((int(pid.group(1)) if pid else -1, line))
    return found
