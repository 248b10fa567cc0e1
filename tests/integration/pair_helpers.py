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
from pathlib import Path
from typing import Iterator

import pytest

from dynamo.frontend.chat_processor import build_chat_processor
from dynamo.runtime import request_plane
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.mock_engine import mock_completion
from dynamo.vllm.mock_model import load_mock_model
from tests.integration import harness
from tests.integration.harness import LISTENING_LINE, LauncherProcess

__all__ = ["LISTENING_LINE"]  # re-exported: the pair tests import it from here


def _worker_speaks_wire_v2() -> bool:
    """Whether the worker side of issue 10 is here: its request plane takes the v2 body.

    The frontend sends v2 bodies and serves only records with a model card; both come from the
    worker side (a separate change). Until it is merged, tests that need a mock worker serving
    through the frontend cannot pass, and are skipped with this reason (transitional: the probe
    turns them on by itself once the worker side lands).
    """
    body = {"request_id": "r", "model": "m", "token_ids": [1], "sampling": {"max_tokens": 1}}
    try:
        request_plane.validate_generate_request(body)
    except ValueError:
        return False
    return True


WORKER_SPEAKS_WIRE_V2 = _worker_speaks_wire_v2()
needs_worker_v2 = pytest.mark.skipif(
    not WORKER_SPEAKS_WIRE_V2,
    reason="needs the worker side of issue 10 (model card in the record, request-plane wire "
    "format v2); the frontend side refuses cardless records",
)

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
    return harness.start_worker(
        name, log_dir, discovery_dir, model, "--mock-token-ms", "1", *args
    )


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


def chat_body(model: str, max_tokens: int = 16, stream: bool = False) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Hello, frozen heap! ❄"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def expected_content(body: dict, card) -> str:
    """What the frontend must answer: the mock engine's tokens for this body (the prompt the
    model's own template renders, the stop ids the frontend sends), decoded by the model's own
    tokenizer (``card`` names its files)."""
    processor = build_chat_processor(card)
    ids = processor.encode_chat(processor.render(body["messages"]))
    model = load_mock_model(card.tokenizer_path, served_model_name=card.served_model_name)
    sampling = SamplingOptions(max_tokens=body["max_tokens"], stop_token_ids=card.eos_token_ids)
    token_ids, _ = mock_completion(model, ids, sampling)
    return processor.tokenizer.decode(token_ids)


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
