"""Upstream ai-dynamo's real frontend and mock engine on loopback, for the adapters' tests (run
with the upstream environment's Python, which has ai-dynamo 1.6.1 and dynamo-gc); how the pair
finds itself on one machine is scripts/upstream_pair.py's.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import openai
from launcher_process import LauncherProcess, free_port, wait_until
from upstream_pair import (  # scripts/ is on sys.path (pyproject.toml: pytest's pythonpath)
    HTTP_STARTED,
    MODEL,
    loopback_env,
    mocker_args,
)

FROZEN = r"GC heap frozen \(upstream frontend, before HTTP admits requests\)"
START_DEADLINE_S = 120.0


def start_mocker(model_dir: Path, kv_dir: Path, log_dir: Path) -> LauncherProcess:
    mocker = LauncherProcess(
        "mocker",
        "dynamo.mocker",
        mocker_args(model_dir, speedup_ratio=1000),
        log_dir=log_dir,
        env=loopback_env(kv_dir),
    )
    return mocker


class Frontend:
    """Upstream's frontend (``module``: ``dynamo.frontend``, or the adapter's launcher); with
    ``launch``, run through that script (``python LAUNCH MODULE ARGS``)."""

    def __init__(
        self,
        module: str,
        args: list[str],
        *,
        kv_dir: Path,
        log_dir: Path,
        env: dict[str, str] | None = None,
        name: str = "frontend",
        launch: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.process = LauncherProcess(
            name,
            module,
            [
                "--discovery-backend",
                "file",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(self.port),
                *args,
            ],
            log_dir=log_dir,
            env={**loopback_env(kv_dir), **(env or {})},
            launch=launch,
        )
        self.base_url = f"http://127.0.0.1:{self.port}"

    def wait_http(self) -> None:
        self.process.wait_for_log(HTTP_STARTED, deadline_s=START_DEADLINE_S)

    def wait_model(self) -> None:
        def listed() -> bool:
            self.process.check_alive()
            try:
                with urllib.request.urlopen(self.base_url + "/v1/models", timeout=5) as answer:
                    return any(m["id"] == MODEL for m in json.load(answer)["data"])
            except OSError:
                return False

        wait_until(listed, deadline_s=START_DEADLINE_S, what=f"the frontend to list {MODEL}")

    def chat(self, content: str = "hello") -> str:
        client = openai.OpenAI(base_url=self.base_url + "/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4
        )
        assert answer.choices[0].finish_reason in ("length", "stop")
        return answer.choices[0].message.content or ""

    def serve_a_chat(self) -> str:
        """HTTP up, the model listed, one chat answered: the frontend serves."""
        self.wait_http()
        self.wait_model()
        return self.chat()

    def position(self, pattern: str) -> int:
        """Where ``pattern`` first appears in the log (-1: nowhere)."""
        match = re.search(pattern, self.process.log())
        return -1 if match is None else match.start()

    def metrics_port(self) -> int:
        match = self.process.wait_for_log(r"GC metrics served on http://127\.0\.0\.1:(\d+)/metrics")
        return int(match.group(1))

    def scrape(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port()}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.read().decode()

    def debug_gc_state(self) -> dict:
        """``GET /debug/gc/state`` on upstream's HTTP port (``DYN_DEBUG_GC_ENDPOINT=1``)."""
        with urllib.request.urlopen(self.base_url + "/debug/gc/state", timeout=30) as answer:
            return json.load(answer)

    def stop(self) -> None:
        self.process.stop()
