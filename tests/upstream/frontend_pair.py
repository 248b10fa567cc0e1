"""Upstream ai-dynamo's real frontend and mock engine on loopback, for the frontend adapter's
tests (run with the upstream environment's Python, which has ai-dynamo 1.6.1 and dynamo-gc).

One machine, no etcd, no NATS: file discovery under a directory of the test's own
(``DYN_FILE_KV``), the TCP request plane, every host pinned to 127.0.0.1 (without that upstream
binds and advertises the machine's other address), the hub offline. The model is the tiny
tokenizer (scripts/make_tiny_model.py --tokenizer-only) with a small Llama ``config.json``, which
is what upstream's mocker needs to serve it.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import make_tiny_model  # scripts/ is on sys.path (pyproject.toml: pytest's pythonpath)
import openai
from launcher_process import LauncherProcess, free_port, wait_until

MODEL = "tiny"
HTTP_STARTED = r"Starting HTTP\(S\) service"
FROZEN = r"GC heap frozen \(upstream frontend, before HTTP admits requests\)"
START_DEADLINE_S = 120.0


def loopback_env(kv_dir: Path) -> dict[str, str]:
    return {
        "DYN_FILE_KV": str(kv_dir),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "DYN_SDK_DISABLE_ANSI_LOGGING": "1",  # plain log lines, for the patterns below
        "NO_COLOR": "1",
    }


def tiny_model_dir(out: Path) -> Path:
    """The tiny tokenizer and a Llama ``config.json`` of the tiny model's recipe."""
    make_tiny_model.build(out, tokenizer_only=True)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    added = {token["content"]: token["id"] for token in tokenizer.get("added_tokens", [])}
    ids = {**vocab, **added}
    recipe = make_tiny_model.RECIPE
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": max(ids.values()) + 1,
        "hidden_size": recipe["hidden_size"],
        "intermediate_size": recipe["intermediate_size"],
        "num_hidden_layers": recipe["num_hidden_layers"],
        "num_attention_heads": recipe["num_attention_heads"],
        "num_key_value_heads": recipe["num_key_value_heads"],
        "head_dim": recipe["head_dim"],
        "max_position_embeddings": recipe["max_position_embeddings"],
        "bos_token_id": ids[make_tiny_model.BOS],
        "eos_token_id": ids[make_tiny_model.EOS],
        "pad_token_id": ids[make_tiny_model.PAD],
        "torch_dtype": recipe["dtype"],
        "tie_word_embeddings": False,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def start_mocker(model_dir: Path, kv_dir: Path, log_dir: Path) -> LauncherProcess:
    mocker = LauncherProcess(
        "mocker",
        "dynamo.mocker",
        [
            "--model-path",
            str(model_dir),
            "--model-name",
            MODEL,
            "--discovery-backend",
            "file",
            "--speedup-ratio",
            "1000",
        ],
        log_dir=log_dir,
        env=loopback_env(kv_dir),
    )
    return mocker


class Frontend:
    """Upstream's frontend (``module``: ``dynamo.frontend``, or the adapter's launcher)."""

    def __init__(
        self,
        module: str,
        args: list[str],
        *,
        kv_dir: Path,
        log_dir: Path,
        env: dict[str, str] | None = None,
        name: str = "frontend",
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
