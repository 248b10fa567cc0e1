#!/usr/bin/env python3
"""A/B of the GC freeze on upstream ai-dynamo's own heap: its frontend with
``--dyn-chat-processor vllm`` and its mock engine, stock against frozen, through the adapter's
real activation paths.

Arms (each a fresh pair of upstream processes, run by the upstream environment's python,
scripts/setup_upstream_env.sh): the frontend is ``python -m dynamo.frontend
--dyn-chat-processor vllm`` with ``DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze`` (``--way launcher``:
``python -m dynamo_gc.frontend`` instead), the worker ``python -m dynamo.mocker`` serving the tiny
model at ``--speedup-ratio`` (default 1: upstream's simulated engine timing, ~0.5 s for 16
streamed tokens here). Both arms have the adapter's pause logger (every pause of 50 ms or
more logged) and metrics port; they differ only in ``DYN_FREEZE_GC_HEAP``:

- ``stock``: ``DYN_FREEZE_GC_HEAP=0``, stock CPython GC;
- ``frozen``: ``DYN_FREEZE_GC_HEAP=1`` (the default, set explicitly so that an inherited value
  cannot turn it off), the start-up heap frozen before HTTP admits.

The arms alternate (``stock frozen``, then ``frozen stock``), ``--passes`` times. Load: the
serving A/B's open-loop Poisson client (scripts/serving_load.py, latency counted from the
scheduled send time), ``--rate`` requests per second for ``--duration`` seconds per arm. A stock
frontend of this kind runs a full collection only when enough per-request state survives its
young collections, which depends on how many streams are in flight: at 80 RPS with the mocker's
own timing (~40 in flight) one came every ~65 s; at 40 RPS with ``--speedup-ratio 1000`` (under
one in flight) none came in 7 minutes. So an arm needs minutes: ``--probe`` first runs one stock
arm until its first full collection of 50 ms or more and reports when it came, and what the
collector did meanwhile.

Per arm: p50/p99/p99.9/p99.99/max latency, errors, achieved RPS, the frontend's pauses of 50 ms
or more (from its log) and its collections per generation (from its metrics), its RSS at the
end, the objects frozen at start-up, and what the model registered while serving added to the
unfrozen heap (``GET /debug/gc/state`` once, before the load: objects tracked in the collected
generations).

    python scripts/ab_upstream.py [--quick|--smoke] [--probe] [--way extension|launcher]
        [--upstream-python PY] [--rate RPS] [--duration S] [--passes N] [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_common as bc
from launcher_process import LauncherProcess, free_port, wait_until
from serving_load import run_client, summary_of
from serving_pair import gc_counters, http_get, pauses_in, rss_mb
from upstream_pair import HTTP_STARTED, MODEL, loopback_env, mocker_args, tiny_model_dir

NAME = "ab_upstream"
ARMS = ("stock", "frozen")
PAUSE_LOG_MS = "50"
START_DEADLINE_S = 600.0
DEFAULT_UPSTREAM_PYTHON = bc.REPO_ROOT / ".venv-upstream" / "bin" / "python"
MODES: dict[str, dict[str, Any]] = {
    "full": {"duration_s": 400.0, "passes": 1, "rate": 80.0},
    "quick": {"duration_s": 60.0, "passes": 1, "rate": 80.0},
    "smoke": {"duration_s": 3.0, "passes": 1, "rate": 5.0},
}


class UpstreamPair:
    """Upstream's frontend (vllm processor) and mocker for one arm, serving MODEL."""

    def __init__(self, arm: str, args: argparse.Namespace, model_dir: Path, work_dir: Path):
        kv_dir = work_dir / "kv"
        kv_dir.mkdir(parents=True)
        env = loopback_env(kv_dir)
        self.port = free_port()
        self.metrics_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        gc_env = {
            "DYN_FREEZE_GC_HEAP": "1" if arm == "frozen" else "0",
            "DYN_GC_PAUSE_LOG_MS": PAUSE_LOG_MS,
            "DYN_GC_METRICS_PORT": str(self.metrics_port),
            "DYN_GC_METRICS_HOST": "127.0.0.1",
            "DYN_DEBUG_GC_ENDPOINT": "1",
        }
        module = "dynamo.frontend"
        if args.way == "extension":
            gc_env["DYN_FRONTEND_ROUTE_EXTENSIONS"] = "gc-freeze"
        else:
            module = "dynamo_gc.frontend"
        frontend_args = ["--discovery-backend", "file"]
        if args.chat_processor != "default":
            frontend_args += ["--dyn-chat-processor", args.chat_processor]
        frontend_args += ["--http-host", "127.0.0.1", "--http-port", str(self.port)]
        self.frontend = LauncherProcess(
            "frontend",
            module,
            frontend_args,
            log_dir=work_dir,
            env={**env, **gc_env},
            python=args.upstream_python,
        )
        self.worker = LauncherProcess(
            "mocker",
            "dynamo.mocker",
            mocker_args(model_dir, args.speedup_ratio),
            log_dir=work_dir,
            env=env,
            python=args.upstream_python,
        )

    def wait_ready(self) -> None:
        self.frontend.wait_for_log(HTTP_STARTED, deadline_s=START_DEADLINE_S)

        def listed() -> bool:
            self.frontend.check_alive()
            self.worker.check_alive()
            body = http_get(self.base_url + "/v1/models")
            models = json.loads(body).get("data", []) if body else []
            return any(model.get("id") == MODEL for model in models)

        wait_until(listed, deadline_s=START_DEADLINE_S, what=f"the frontend to list {MODEL}")

    def gc_state(self) -> dict:
        return json.loads(http_get(self.base_url + "/debug/gc/state", timeout_s=60) or b"{}")

    def stop(self) -> None:
        self.frontend.stop()
        self.worker.stop()


def frozen_at_start(log: str) -> int | None:
    match = re.search(r"GC heap frozen \([^)]*\): collected=\d+ frozen=(\d+)", log)
    return int(match.group(1)) if match else None


def run_arm(arm: str, args, model_dir: Path, work_dir: Path) -> dict:
    pair = UpstreamPair(arm, args, model_dir, work_dir)
    try:
        pair.wait_ready()
        # The machine is shared: each arm records the load average around its own load window.
        loadavg_at_start = list(os.getloadavg())
        state = pair.gc_state()  # the model is registered: its per-model state is built
        metrics_url = f"http://127.0.0.1:{pair.metrics_port}/metrics"
        offset, before = pair.frontend.log_size(), gc_counters(metrics_url)
        load = run_client(
            pair.base_url + "/v1/chat/completions", args.rate, args.duration, args.seed, args
        )
        pair.frontend.check_alive()
        loadavg_at_end = list(os.getloadavg())
        after = gc_counters(metrics_url)
        pauses = pauses_in(pair.frontend.log_bytes(offset, pair.frontend.log_size()))
        latencies = sorted(load["latency_s"])
        load = summary_of(load)
        return {
            "arm": arm,
            **load,
            "latency_ms": {
                f"p{q:g}": 1000 * bc.percentile(latencies, q) for q in (50, 99, 99.9, 99.99)
            }
            | {"max": 1000 * max(latencies) if latencies else float("nan")},
            "pauses_ge_50ms": len(pauses),
            "max_pause_ms": max((p["ms"] for p in pauses), default=0.0),
            "pauses": pauses,
            "collections": {
                gen: None if after[gen] is None or before[gen] is None else after[gen] - before[gen]
                for gen in after
            },
            "rss_mb": rss_mb(pair.frontend.pid),
            "frozen_at_start": frozen_at_start(pair.frontend.log()),
            "unfrozen_after_model": sum(state.get("generation_objects", [])),
            "loadavg": {"start": loadavg_at_start, "end": loadavg_at_end},
        }
    finally:
        pair.stop()


def complete_lines(chunk: bytes) -> bytes:
    """``chunk`` up to its last newline: a line still being written is read again, whole, on the
    next scan (a pause line cut in two would otherwise be missed)."""
    return chunk[: chunk.rfind(b"\n") + 1]


def probe(args, model_dir: Path, work_dir: Path) -> dict:
    """One stock arm under load until its first full collection of 50 ms or more (or the end of
    ``--probe-limit``), with what the collector did meanwhile: when none came, the counts say
    whether gen2 was due at all."""
    import subprocess

    from serving_load import client_argv

    pair = UpstreamPair("stock", args, model_dir, work_dir)
    try:
        pair.wait_ready()
        metrics_url = f"http://127.0.0.1:{pair.metrics_port}/metrics"
        before = gc_counters(metrics_url)
        scanned = pair.frontend.log_size()
        started = time.monotonic()
        client = subprocess.Popen(
            client_argv(
                pair.base_url + "/v1/chat/completions", args.rate, args.probe_limit, args.seed, args
            ),
            stdout=subprocess.DEVNULL,
        )
        try:

            def first_gen2() -> float | None:
                # Scan only the log's new complete lines: it grows by every request's lines.
                nonlocal scanned
                pair.frontend.check_alive()
                chunk = complete_lines(pair.frontend.log_bytes(scanned, pair.frontend.log_size()))
                scanned += len(chunk)
                if any(pause["generation"] == 2 for pause in pauses_in(chunk)):
                    return time.monotonic() - started
                if client.poll() is not None:
                    return -1.0
                return None

            seconds = wait_until(
                first_gen2,
                deadline_s=args.probe_limit + 60,
                what="a full collection >= 50 ms",
                poll_s=1.0,
            )
            load_s = time.monotonic() - started
            after = gc_counters(metrics_url)
            state = pair.gc_state()
        finally:
            client.terminate()
            client.wait(timeout=30)
        return {
            "first_gen2_ge_50ms_after_s": None if seconds < 0 else seconds,
            "load_s": load_s,
            "collections": {
                gen: None if after[gen] is None or before[gen] is None else after[gen] - before[gen]
                for gen in after
            },
            # objects per generation and gc.get_count() at the end: gen2 runs only once 10 gen1
            # collections have passed AND the survivors since the last one exceed 25% of gen2
            "generation_objects": state.get("generation_objects"),
            "counts": state.get("counts"),
        }
    finally:
        pair.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--upstream-python",
        default=str(DEFAULT_UPSTREAM_PYTHON),
        help="python of the upstream environment (scripts/setup_upstream_env.sh)",
    )
    parser.add_argument(
        "--way",
        choices=("extension", "launcher"),
        default="extension",
        help="how the frontend gets the adapter (both arms the same way)",
    )
    parser.add_argument(
        "--chat-processor",
        choices=("vllm", "default"),
        default="vllm",
        help="the frontend's chat processor (default: upstream's Rust one, "
        "whose small Python heap shows little; the A/B is for vllm)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="only time a stock frontend's first full collection under load",
    )
    parser.add_argument(
        "--probe-limit", type=float, default=900.0, help="with --probe: seconds of load at most"
    )
    parser.add_argument("--rate", type=float, help="offered requests per second")
    parser.add_argument("--duration", type=float, help="seconds of load per arm")
    parser.add_argument("--passes", type=int, help="rounds of both arms (in both orders)")
    parser.add_argument(
        "--speedup-ratio",
        type=float,
        default=1.0,
        help="the mocker's speed-up (its token time divided by this; 1, upstream's default, "
        "keeps a real engine's request times and so as many streams in flight as a real "
        "deployment: at 1000 a request takes ~10 ms and a stock frontend ran no full "
        "collection in 7 minutes at 40 RPS)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0, help="request timeout, seconds")
    parser.add_argument("--messages", type=int, default=8, help="chat turns per request")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per request")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    bc.add_mode_args(parser)
    args = parser.parse_args(argv)
    if not Path(args.upstream_python).exists():
        parser.error(
            f"--upstream-python {args.upstream_python} does not exist: "
            "run scripts/setup_upstream_env.sh"
        )
    mode = MODES[bc.mode_name(args)]
    args.rate = args.rate or mode["rate"]
    args.duration = args.duration or mode["duration_s"]
    args.passes = args.passes or mode["passes"]
    args.model_name = MODEL
    bc.exit_cleanly_on_sigterm()

    work_root = Path(tempfile.mkdtemp(prefix="ab-upstream-"))
    try:
        model_dir = tiny_model_dir(work_root / "model")
        result = bc.new_result(
            NAME,
            bc.mode_name(args),
            way=args.way,
            rate=args.rate,
            chat_processor=args.chat_processor,
            duration_s=args.duration,
            speedup_ratio=args.speedup_ratio,
            command=" ".join(["python", "scripts/ab_upstream.py", *(argv or sys.argv[1:])]),
        )
        if args.probe:
            result["probe"] = probe(args, model_dir, work_root / "probe")
            print(json.dumps(result["probe"]))
            return bc.finish(args, NAME + "_probe", result, None)
        runs: list[dict] = []
        for index in range(args.passes):
            for order in (ARMS, tuple(reversed(ARMS))):
                for arm in order:
                    print(f"{NAME}: pass {index + 1}, arm {arm}", file=sys.stderr, flush=True)
                    run = run_arm(arm, args, model_dir, work_root / f"{index}-{len(runs)}-{arm}")
                    run["pass"] = index + 1
                    runs.append(run)
                    # An arm is minutes of load: keep what is measured if a later arm fails.
                    result["runs"] = runs
                    bc.write_result(
                        argparse.Namespace(**{**vars(args), "publish": False}), NAME, result
                    )
        result["runs"] = runs
        headers = [
            "arm",
            "pass",
            "rps",
            "p50",
            "p99",
            "p99.9",
            "p99.99",
            "max",
            "gen2",
            ">=50ms",
            "max pause",
            "RSS MB",
            "frozen",
            "unfrozen",
        ]
        rows = [
            [
                r["arm"],
                r["pass"],
                r["achieved_rps"],
                *r["latency_ms"].values(),
                r["collections"].get("gen2"),
                r["pauses_ge_50ms"],
                r["max_pause_ms"],
                r["rss_mb"],
                r["frozen_at_start"],
                r["unfrozen_after_model"],
            ]
            for r in runs
        ]
        print(bc.format_table(headers, rows))
        return bc.finish(args, NAME, result, None)
    finally:
        shutil.rmtree(work_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
