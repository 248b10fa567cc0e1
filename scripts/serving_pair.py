"""The processes under test in the serving A/B (and the soak): a frontend and its worker(s) for one
arm, and one rung.

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


def launcher(name: str, module: str, argv: list[str], work_dir: Path, env: dict, python: str):
    """``python bench_launch.py MODULE ARGV`` as a child logging to ``work_dir/<name>.log``."""
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


def worker_command(
    args: argparse.Namespace, heap: int, common: list[str], bench_env: dict[str, str]
) -> tuple[list[str], dict[str, str], str]:
    """A worker's ``(argv, env, python)`` on ``args.engine``, with ``common`` options: the mock
    engine on the tiny tokenizer, serving MODEL with a synthetic start-up heap of ``heap``
    objects at ``args.token_ms`` per token, by this python; or the real vLLM engine on
    ``args.model_name`` with its own heap (no synthetic one), by ``args.vllm_python``."""
    if args.engine == "vllm":
        argv = ["--engine", "vllm", "--model", args.model_name, *common, *bc.VLLM_ARGS]
        return argv, {**bench_env, **bc.OFFLINE_ENV}, args.vllm_python
    argv = [
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
    return argv, bench_env, sys.executable


def frontend_command(
    args: argparse.Namespace, heap: int, argv: list[str], bench_env: dict[str, str]
) -> tuple[list[str], dict[str, str], str]:
    """The frontend's ``(argv, env, python)``: with ``--engine vllm`` it runs vLLM's own chat
    processor (its real heap, imported at start-up) by ``args.vllm_python``; with the mock, a
    synthetic start-up heap of ``heap`` objects that scripts/bench_launch.py builds."""
    if args.engine == "vllm":
        return (
            [*argv, "--dyn-chat-processor", "vllm"],
            {**bench_env, **bc.OFFLINE_ENV},
            args.vllm_python,
        )
    return argv, {**bench_env, "BENCH_START_UP_HEAP_OBJECTS": str(heap)}, sys.executable


class Pair:
    """A frontend and its worker(s) for one arm, up and serving MODEL.

    ab_serving's arms name what is frozen (``ctl``, ``worker``, ``all``, ``nogc``); another
    script gives ``frozen=(worker, frontend)`` itself, more than one worker of the model
    (``workers``, named ``worker``, ``worker1``, ...), and options of its own for each
    process (``worker_extra``, ``frontend_extra``).
    """

    def __init__(
        self,
        arm: str,
        heap: int,
        args: argparse.Namespace,
        work_dir: Path,
        debug_gc: bool = False,
        *,
        workers: int = 1,
        frozen: tuple[bool, bool] | None = None,
        worker_extra: tuple[str, ...] = (),
        frontend_extra: tuple[str, ...] = (),
        pause_log_ms: float = PAUSE_LOG_MS,
    ) -> None:
        self.arm = arm
        discovery = work_dir / "discovery"
        discovery.mkdir(parents=True, exist_ok=True)
        if frozen is None:
            frozen = (arm in ("worker", "all", "nogc"), arm in ("all", "nogc"))
        worker_frozen, frontend_frozen = frozen
        bench_env = {"BENCH_GC_DISABLE": "1" if arm == "nogc" else "0"}
        self.worker_names = ["worker", *(f"worker{i}" for i in range(1, workers))]
        self.worker_metrics_ports = [free_port() for _ in self.worker_names]
        self.worker_metrics_port = self.worker_metrics_ports[0]
        self.http_port = free_port()
        self.model = args.model_name
        self.workers = []
        for name, port in zip(self.worker_names, self.worker_metrics_ports, strict=True):
            common = [
                "--discovery-dir",
                str(discovery),
                "--request-plane-host",
                "127.0.0.1",
                "--gc-pause-log-ms",
                str(pause_log_ms),
                "--system-host",
                "127.0.0.1",
                "--system-port",
                str(port),
                "--freeze-gc-heap" if worker_frozen else "--no-freeze-gc-heap",
                *(["--debug-gc-endpoint"] if debug_gc else []),
                *worker_extra,
            ]
            argv, env, python = worker_command(args, heap, common, bench_env)
            self.workers.append(launcher(name, "dynamo.vllm", argv, work_dir, env, python))
        self.worker = self.workers[0]
        frontend_argv = [
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--discovery-dir",
            str(discovery),
            "--dyn-gc-pause-log-ms",
            str(pause_log_ms),
            "--dyn-freeze-gc-heap" if frontend_frozen else "--no-dyn-freeze-gc-heap",
            *(["--dyn-debug-gc-endpoint"] if debug_gc else []),
            *frontend_extra,
        ]
        frontend_argv, frontend_env, frontend_python = frontend_command(
            args, heap, frontend_argv, bench_env
        )
        self.frontend = launcher(
            "frontend", "dynamo.frontend", frontend_argv, work_dir, frontend_env, frontend_python
        )
        self.base_url = f"http://127.0.0.1:{self.http_port}"

    def wait_ready(self, deadline_s: float = 300.0) -> None:
        def ready():
            for process in (*self.workers, self.frontend):
                process.check_alive()
            body = http_get(self.base_url + "/v1/models", timeout_s=2.0)
            if body is None or json.dumps(self.model).encode() not in body:
                return False
            # Every worker routed to: the frontend counts the model's instances as it adds them.
            return len(self.workers) == 1 or f"({len(self.workers)} instances)" in (
                self.frontend.log()
            )

        wait_until(
            ready,
            deadline_s=deadline_s,
            what=f"the {self.arm} processes to serve {self.model}",
            poll_s=0.1,
        )

    def worker_urls(self) -> dict[str, str]:
        """Each worker's system server (its /metrics, /health and /debug/gc)."""
        return {
            name: f"http://127.0.0.1:{port}"
            for name, port in zip(self.worker_names, self.worker_metrics_ports, strict=True)
        }

    def processes(self) -> dict[str, tuple[LauncherProcess, str]]:
        found = {"frontend": (self.frontend, self.base_url + "/metrics")}
        for worker, (name, url) in zip(self.workers, self.worker_urls().items(), strict=True):
            found[name] = (worker, url + "/metrics")
        return found

    def debug_urls(self) -> dict[str, str]:
        """Each process's /debug/gc base URL (served with ``debug_gc=True`` only)."""
        urls = {"frontend": self.base_url + "/debug/gc"}
        urls.update({name: url + "/debug/gc" for name, url in self.worker_urls().items()})
        return urls

    def rss_mb(self) -> dict[str, float | None]:
        """Resident memory now: frontend, each worker's main process, the first worker's
        children (vLLM's EngineCore with --engine vllm; none with the mock)."""
        found = {"frontend": rss_mb(self.frontend.pid)}
        for name, worker in zip(self.worker_names, self.workers, strict=True):
            found[name] = rss_mb(worker.pid)
        found["worker_children"] = rss_mb(self.worker.pid, children=True)
        return found

    def stop(self) -> None:
        self.frontend.stop(STOP_DEADLINE_S)
        for worker in self.workers:
            worker.stop(STOP_DEADLINE_S)


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
