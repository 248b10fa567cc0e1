"""One arm of scripts/ab_upstream.py: upstream ai-dynamo's frontend and a worker on loopback,
with the adapter on the measured one (the frontend, or the vLLM worker) and its GC freeze on
(``frozen``) or off (``stock``); run by the upstream environment's python.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from launcher_process import LauncherProcess, free_port, wait_until
from serving_pair import http_get
from upstream_pair import HTTP_STARTED, MODEL, loopback_env, mocker_args, vllm_worker_args

PAUSE_LOG_MS = "50"
METRICS_SERVED = r"GC metrics served on http://127\.0\.0\.1:(\d+)/metrics"
START_DEADLINE_S = 600.0


def _frontend_gc(arm: str, args: argparse.Namespace) -> tuple[str, dict]:
    """The adapter on upstream's frontend: its module and env for ``arm``."""
    gc_env = {
        "DYN_FREEZE_GC_HEAP": "1" if arm == "frozen" else "0",
        "DYN_GC_PAUSE_LOG_MS": PAUSE_LOG_MS,
        "DYN_GC_METRICS_PORT": "0",  # a free one, logged (see UpstreamPair.metrics_url)
        "DYN_GC_METRICS_HOST": "127.0.0.1",
        "DYN_DEBUG_GC_ENDPOINT": "1",
    }
    if args.way == "extension":
        return "dynamo.frontend", {**gc_env, "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"}
    return "dynamo_gc.frontend", gc_env


def _vllm_worker_gc(arm: str) -> dict:
    """The adapter on upstream's vLLM worker: its env for ``arm`` (its flags' env vars)."""
    return {
        "DYN_VLLM_FREEZE_GC_HEAP": "1" if arm == "frozen" else "0",
        "DYN_VLLM_GC_PAUSE_LOG_MS": PAUSE_LOG_MS,
        "DYN_VLLM_GC_METRICS_PORT": "0",
        "DYN_VLLM_GC_METRICS_HOST": "127.0.0.1",
    }


class UpstreamPair:
    """Upstream's frontend and a worker for one arm, serving MODEL; ``measured`` is the process
    the adapter is on (the frontend, or the vLLM worker)."""

    def __init__(self, arm: str, args: argparse.Namespace, model_dir: Path, work_dir: Path):
        kv_dir = work_dir / "kv"
        kv_dir.mkdir(parents=True)
        env = loopback_env(kv_dir)
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.debug_endpoint = args.target == "frontend"
        frontend_module, frontend_env = "dynamo.frontend", dict[str, str]()
        if args.target == "frontend":
            frontend_module, frontend_env = _frontend_gc(arm, args)
        frontend_args = ["--discovery-backend", "file"]
        if args.chat_processor != "default":
            frontend_args += ["--dyn-chat-processor", args.chat_processor]
        frontend_args += ["--http-host", "127.0.0.1", "--http-port", str(self.port)]
        self.frontend = LauncherProcess(
            "frontend",
            frontend_module,
            frontend_args,
            log_dir=work_dir,
            env={**env, **frontend_env},
            python=args.upstream_python,
        )
        if args.target == "frontend":
            self.worker = LauncherProcess(
                "mocker",
                "dynamo.mocker",
                mocker_args(model_dir, args.speedup_ratio),
                log_dir=work_dir,
                env=env,
                python=args.upstream_python,
            )
            self.measured = self.frontend
        else:
            self.worker = LauncherProcess(
                "worker",
                "dynamo_gc.vllm",
                # room for the load's prompts (~230 tokens of 8 turns) and 64 tokens out
                [*vllm_worker_args(model_dir), "--max-model-len", "512"],
                log_dir=work_dir,
                env={**env, **_vllm_worker_gc(arm)},
                python=args.upstream_python,
            )
            self.measured = self.worker

    def wait_ready(self) -> None:
        self.frontend.wait_for_log(HTTP_STARTED, deadline_s=START_DEADLINE_S)

        def listed() -> bool:
            self.frontend.check_alive()
            self.worker.check_alive()
            body = http_get(self.base_url + "/v1/models")
            models = json.loads(body).get("data", []) if body else []
            return any(model.get("id") == MODEL for model in models)

        wait_until(listed, deadline_s=START_DEADLINE_S, what=f"the frontend to list {MODEL}")

    def metrics_url(self) -> str:
        """The adapter's metrics port, as the measured process logged it (it binds a free one:
        a port picked here and bound there could be taken in between)."""
        match = self.measured.wait_for_log(METRICS_SERVED, deadline_s=START_DEADLINE_S)
        return f"http://127.0.0.1:{match.group(1)}/metrics"

    def gc_state(self) -> dict:
        """``GET /debug/gc/state`` of the frontend's adapter; {} for the vLLM worker (no such
        endpoint: its heap is read from its metrics and its freeze line)."""
        if not self.debug_endpoint:
            return {}
        return json.loads(http_get(self.base_url + "/debug/gc/state", timeout_s=60) or b"{}")

    def stop(self) -> None:
        self.frontend.stop()
        self.worker.stop()


def frozen_at_start(log: str) -> int | None:
    match = re.search(r"GC heap frozen \([^)]*\): collected=\d+ frozen=(\d+)", log)
    return int(match.group(1)) if match else None
