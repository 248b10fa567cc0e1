"""The processes under test in the serving A/B: a frontend and a worker for one arm, and one rung.

:class:`Pair` starts ``python -m dynamo.frontend`` and ``python -m dynamo.vllm`` (the mock engine
with a synthetic heap, or the real vLLM engine) through scripts/bench_launch.py, each frozen or
stock as its arm says, and reads what they report: collections per generation from /metrics,
the pause logger's lines from their logs, their RSS. :func:`run_rung` drives one rung of load
(serving_load.py) at a pair and measures both processes over it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path

import bench_common as bc
from launcher_process import LauncherProcess, free_port, wait_until
from serving_load import run_client

PAUSE_LINE = re.compile(rb"GC gen(\d) pause ([0-9.]+) ms")
PAUSE_LOG_MS = 50.0
MODEL = "bench"
BENCH_LAUNCH = Path(__file__).resolve().parent / "bench_launch.py"
STOP_DEADLINE_S = 40.0


def http_get(url: str, timeout_s: float = 5.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read()
    except OSError:
        return None


def gc_counters(metrics_url: str) -> dict:
    """Collections per generation (all of them, timed or not) from a process's /metrics."""
    text = (http_get(metrics_url) or b"").decode(errors="replace")
    counters: dict[str, float | None] = {}
    for generation in range(3):
        match = re.search(
            rf'^python_gc_collections_total{{generation="{generation}"}} ([0-9.e+]+)$',
            text,
            re.MULTILINE,
        )
        counters[f"gen{generation}"] = float(match.group(1)) if match else None
    # Seconds spent in gen2 collections, all of them (the pause logger logs only those >= 50 ms).
    # The series may carry more labels (the serving phase): sum every gen2 series.
    sums = re.findall(
        r'^dynamo_gc_pause_seconds_sum{[^}]*generation="2"[^}]*} ([0-9.e+-]+)$', text, re.MULTILINE
    )
    counters["gen2_pause_s"] = sum(float(value) for value in sums) if sums else None
    return counters


def rss_mb(pid: int, *, children: bool = False) -> float | None:
    """RSS of ``pid`` (or the sum over its descendants) in MiB; None once it is gone."""
    import psutil

    try:
        process = psutil.Process(pid)
        targets = process.children(recursive=True) if children else [process]
        return sum(target.memory_info().rss for target in targets) / 2**20
    except psutil.Error:
        return None


def pauses_in(log: bytes) -> list[dict]:
    return [{"generation": int(g), "ms": float(ms)} for g, ms in PAUSE_LINE.findall(log)]


def _launcher(name: str, module: str, argv: list[str], work_dir: Path, env: dict, python: str):
    return LauncherProcess(
        name,
        module,
        argv,
        log_dir=work_dir,
        env=bc.child_env(env),
        python=python,
        launch=BENCH_LAUNCH,
        cwd=bc.REPO_ROOT,
    )


class Pair:
    """A frontend and a worker for one arm, up and serving MODEL."""

    def __init__(
        self, arm: str, heap: int, args: argparse.Namespace, work_dir: Path, debug_gc: bool = False
    ) -> None:
        self.arm = arm
        discovery = work_dir / "discovery"
        discovery.mkdir(parents=True, exist_ok=True)
        worker_frozen = arm in ("worker", "all", "nogc")
        frontend_frozen = arm in ("all", "nogc")
        bench_env = {"BENCH_GC_DISABLE": "1" if arm == "nogc" else "0"}
        self.worker_metrics_port = free_port()
        self.http_port = free_port()
        self.model = args.model_name
        common = [
            "--discovery-dir",
            str(discovery),
            "--request-plane-host",
            "127.0.0.1",
            "--gc-pause-log-ms",
            str(PAUSE_LOG_MS),
            "--system-host",
            "127.0.0.1",
            "--system-port",
            str(self.worker_metrics_port),
            "--freeze-gc-heap" if worker_frozen else "--no-freeze-gc-heap",
            *(["--debug-gc-endpoint"] if debug_gc else []),
        ]
        if args.engine == "vllm":
            # The real heap: vLLM's imports and AsyncLLM, no synthetic one.
            engine_argv = ["--engine", "vllm", "--model", args.model_name, *common, *bc.VLLM_ARGS]
            worker_env, worker_python = {**bench_env, **bc.OFFLINE_ENV}, args.vllm_python
        else:
            engine_argv = [
                "--engine",
                "mock",
                "--model",
                bc.tiny_tokenizer_dir(),
                "--served-model-name",
                MODEL,
                *common,
                "--mock-heap-objects",
                str(heap),
                "--mock-token-ms",
                str(args.token_ms),
            ]
            worker_env, worker_python = bench_env, sys.executable
        self.worker = _launcher(
            "worker", "dynamo.vllm", engine_argv, work_dir, worker_env, worker_python
        )
        frontend_argv = [
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--discovery-dir",
            str(discovery),
            "--dyn-gc-pause-log-ms",
            str(PAUSE_LOG_MS),
            "--dyn-freeze-gc-heap" if frontend_frozen else "--no-dyn-freeze-gc-heap",
            *(["--dyn-debug-gc-endpoint"] if debug_gc else []),
        ]
        if args.engine == "vllm":
            # The real heap: vLLM's tokenizer and chat-template rendering, imported at start-up.
            frontend_argv += ["--dyn-chat-processor", "vllm"]
            frontend_env, frontend_python = {**bench_env, **bc.OFFLINE_ENV}, args.vllm_python
        else:
            frontend_env = {**bench_env, "BENCH_START_UP_HEAP_OBJECTS": str(heap)}
            frontend_python = sys.executable
        self.frontend = _launcher(
            "frontend", "dynamo.frontend", frontend_argv, work_dir, frontend_env, frontend_python
        )
        self.base_url = f"http://127.0.0.1:{self.http_port}"

    def wait_ready(self, deadline_s: float = 300.0) -> None:
        def ready():
            self.worker.check_alive()
            self.frontend.check_alive()
            body = http_get(self.base_url + "/v1/models", timeout_s=2.0)
            return body is not None and json.dumps(self.model).encode() in body

        wait_until(
            ready,
            deadline_s=deadline_s,
            what=f"the {self.arm} pair to serve {self.model}",
            poll_s=0.1,
        )

    def processes(self) -> dict[str, tuple[LauncherProcess, str]]:
        return {
            "frontend": (self.frontend, self.base_url + "/metrics"),
            "worker": (self.worker, f"http://127.0.0.1:{self.worker_metrics_port}/metrics"),
        }

    def debug_urls(self) -> dict[str, str]:
        """Each process's /debug/gc base URL (served with ``debug_gc=True`` only)."""
        return {
            "frontend": self.base_url + "/debug/gc",
            "worker": f"http://127.0.0.1:{self.worker_metrics_port}/debug/gc",
        }

    def rss_mb(self) -> dict[str, float | None]:
        """Resident memory now: frontend, worker main process, the worker's children (vLLM's
        EngineCore with --engine vllm; none with the mock)."""
        return {
            "frontend": rss_mb(self.frontend.pid),
            "worker": rss_mb(self.worker.pid),
            "worker_children": rss_mb(self.worker.pid, children=True),
        }

    def stop(self) -> None:
        self.frontend.stop(STOP_DEADLINE_S)
        self.worker.stop(STOP_DEADLINE_S)


def run_rung(pair: Pair, rate: float, duration_s: float, seed: int, args) -> dict:
    """One rung of load at ``pair``: the client's figures, and per process the pauses of 50 ms or
    more it logged, its collections per generation over the rung, and the RSS at its end."""
    processes = pair.processes()
    before = {name: (proc.log_size(), gc_counters(url)) for name, (proc, url) in processes.items()}
    load = run_client(pair.base_url + "/v1/chat/completions", rate, duration_s, seed, args)
    per_process = {}
    for name, (proc, url) in processes.items():
        proc.check_alive()
        offset, counters_before = before[name]
        counters_after = gc_counters(url)
        pauses = pauses_in(proc.log_bytes(offset, proc.log_size()))
        per_process[name] = {
            "pauses_ge_50ms": len(pauses),
            "max_pause_ms": max((p["ms"] for p in pauses), default=0.0),
            "pauses": pauses,
            "collections": {
                gen: (counters_after[gen] - counters_before[gen])
                if counters_after[gen] is not None and counters_before[gen] is not None
                else None
                for gen in counters_after
            },
        }
    load["processes"] = per_process
    load["rss_mb"] = pair.rss_mb()  # at the end of the rung: what the arm's heap costs
    return load
