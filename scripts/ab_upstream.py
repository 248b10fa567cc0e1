#!/usr/bin/env python3
"""A/B of the GC freeze on upstream ai-dynamo's own heaps, stock against frozen, through the
adapter's real activation paths: its frontend with ``--dyn-chat-processor vllm`` and its mock
engine (``--target frontend``, the default), or its vLLM worker on the real vLLM CPU engine
(``--target vllm-worker``).

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

``--target vllm-worker`` measures upstream's vLLM worker's parent process (vLLM's ``AsyncLLM``,
upstream's handlers and runtime: vLLM's real heap) serving the tiny model
(scripts/make_tiny_model.py) on the CPU engine: the worker is ``python -m dynamo_gc.vllm`` in
both arms, with the adapter's pause logger (50 ms) and metrics port, and differs only in
``DYN_VLLM_FREEZE_GC_HEAP`` (``stock``: 0, the adapter's ``--no-freeze-gc-heap``; ``frozen``: 1,
frozen after engine init, before ``register_vllm_model``). Upstream's frontend runs unchanged
with its default chat processor (Rust: little Python heap of its own); ``--speedup-ratio`` does
not apply.

The arms alternate (``stock frozen``, then ``frozen stock``), ``--passes`` times (the vLLM
worker's ``--smoke`` runs one order only: each arm starts a real engine). Load: the
serving A/B's open-loop Poisson client (scripts/serving_load.py, latency counted from the
scheduled send time), ``--rate`` requests per second for ``--duration`` seconds per arm. A stock
frontend of this kind runs a full collection only when enough per-request state survives its
young collections, which depends on how many streams are in flight: at 80 RPS with the mocker's
own timing (~40 in flight) one came every ~65 s; at 40 RPS with ``--speedup-ratio 1000`` (under
one in flight) none came in 7 minutes. So an arm needs minutes: ``--probe`` first runs one stock
arm until its first full collection of 50 ms or more and reports when it came, and what the
collector did meanwhile.

Per arm: p50/p99/p99.9/p99.99/max latency, errors, achieved RPS, the measured process's pauses
of 50 ms or more (from its log) and its collections per generation (from its metrics), its RSS at
the end, the objects frozen at start-up, and (the frontend) what the model registered while
serving added to the unfrozen heap (``GET /debug/gc/state`` once, before the load: objects
tracked in the collected generations).

    python scripts/ab_upstream.py [--target frontend|vllm-worker] [--quick|--smoke] [--probe]
        [--way extension|launcher] [--upstream-python PY] [--rate RPS] [--duration S]
        [--passes N] [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_common as bc
from launcher_process import wait_until
from serving_load import run_client, summary_of
from serving_pair import gc_counters, pauses_in, rss_mb
from upstream_arms import UpstreamPair, frozen_at_start
from upstream_pair import MODEL, tiny_model_dir

NAME = "ab_upstream"
ARMS = ("stock", "frozen")
DEFAULT_UPSTREAM_PYTHON = bc.REPO_ROOT / ".venv-upstream" / "bin" / "python"
# Per target and mode: seconds of load per arm, rounds of both orders (``orders`` 1: the first
# order only), offered RPS. The vLLM worker's rate is where its stock parent runs full
# collections (scripts/ab_upstream.py --target vllm-worker --probe; docs/benchmarks.md).
VLLM_WORKER_RATE = 16.0
MODES: dict[str, dict[str, dict[str, Any]]] = {
    "frontend": {
        "full": {"duration_s": 400.0, "passes": 1, "rate": 80.0},
        "quick": {"duration_s": 60.0, "passes": 1, "rate": 80.0},
        "smoke": {"duration_s": 3.0, "passes": 1, "rate": 5.0},
    },
    "vllm-worker": {
        "full": {"duration_s": 240.0, "passes": 1, "rate": VLLM_WORKER_RATE},
        "quick": {"duration_s": 60.0, "passes": 1, "rate": VLLM_WORKER_RATE},
        "smoke": {"duration_s": 3.0, "passes": 1, "rate": 5.0, "orders": 1},
    },
}
# The file names of the results: the frontend's keep the name section 6 of docs/benchmarks.md
# published them under.
RESULT_NAMES = {"frontend": NAME, "vllm-worker": f"{NAME}_vllm_worker"}


def run_arm(arm: str, args, model_dir: Path, work_dir: Path) -> dict:
    pair = UpstreamPair(arm, args, model_dir, work_dir)
    try:
        pair.wait_ready()
        # The machine is shared: each arm records the load average around its own load window.
        loadavg_at_start = list(os.getloadavg())
        state = pair.gc_state()  # the model is registered: its per-model state is built
        metrics_url = pair.metrics_url()
        offset, before = pair.measured.log_size(), gc_counters(metrics_url)
        load = run_client(
            pair.base_url + "/v1/chat/completions", args.rate, args.duration, args.seed, args
        )
        pair.measured.check_alive()
        loadavg_at_end = list(os.getloadavg())
        after = gc_counters(metrics_url)
        pauses = pauses_in(pair.measured.log_bytes(offset, pair.measured.log_size()))
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
            "rss_mb": rss_mb(pair.measured.pid),
            "frozen_at_start": frozen_at_start(pair.measured.log()),
            "unfrozen_after_model": (
                sum(state["generation_objects"]) if "generation_objects" in state else None
            ),
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
        metrics_url = pair.metrics_url()
        before = gc_counters(metrics_url)
        scanned = pair.measured.log_size()
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
                pair.measured.check_alive()
                chunk = complete_lines(pair.measured.log_bytes(scanned, pair.measured.log_size()))
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


def plot(args: argparse.Namespace, name: str, runs: list[dict]) -> Path | None:
    """Per arm, in the order run: client latency (p99, p99.9, max) and the measured process's
    pauses of 50 ms or more (count, longest)."""
    plt = bc.pyplot()
    if plt is None or not runs:
        return None
    fig, (latency_ax, pause_ax) = plt.subplots(1, 2, figsize=(12, 4.4))
    labels = [f"{run['arm']} ({index + 1})" for index, run in enumerate(runs)]
    x = range(len(runs))
    for offset, key in ((-0.25, "p99"), (0.0, "p99.9"), (0.25, "max")):
        latency_ax.bar(
            [i + offset for i in x], [run["latency_ms"][key] for run in runs], 0.25, label=key
        )
    latency_ax.set_ylabel("ms, from the scheduled send time")
    latency_ax.set_title(f"client latency at {args.rate:g} RPS (open loop)")
    latency_ax.legend(fontsize=8)
    colors = ["C3" if run["arm"] == "stock" else "C2" for run in runs]
    pause_ax.bar(x, [run["max_pause_ms"] for run in runs], 0.5, color=colors)
    for i, run in zip(x, runs, strict=True):
        pause_ax.annotate(
            f"{run['pauses_ge_50ms']} >= 50 ms", (i, run["max_pause_ms"]), ha="center", fontsize=8
        )
    pause_ax.set_ylabel("longest GC pause, ms")
    pause_ax.set_title(f"the {args.target}'s GC pauses during the load")
    for ax in (latency_ax, pause_ax):
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    title = (
        f"{name} ({bc.mode_name(args)}): upstream ai-dynamo, stock vs frozen through the "
        f"adapter; {bc.cpu_model()}, {os.cpu_count()} cores"
    )
    return bc.save_plot(args, fig, name, title)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--upstream-python",
        default=str(DEFAULT_UPSTREAM_PYTHON),
        help="python of the upstream environment (scripts/setup_upstream_env.sh)",
    )
    parser.add_argument(
        "--target",
        choices=tuple(MODES),
        default="frontend",
        help="the process the adapter is on and the A/B measures: upstream's frontend (with "
        "the mocker behind it) or upstream's vLLM worker (python -m dynamo_gc.vllm, the real "
        "vLLM CPU engine, behind upstream's unchanged frontend)",
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
        help="the frontend's chat processor (default: upstream's Rust one, whose small Python "
        "heap shows little: the frontend's A/B is for vllm, the default there; the vLLM "
        "worker's A/B keeps the frontend on default)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="only time a stock arm's first full collection (>= 50 ms) under load",
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
    parser.add_argument(
        "--max-tokens", type=int, help="tokens per request (default 16; 64 for the vLLM worker)"
    )
    parser.add_argument(
        "--top-logprobs",
        type=int,
        help="log probabilities per token (default 0; 5 for the vLLM worker, whose parent builds "
        "them: per-request state that lives across young collections, as real traffic's does)",
    )
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    bc.add_mode_args(parser)
    args = parser.parse_args(argv)
    if not Path(args.upstream_python).exists():
        parser.error(
            f"--upstream-python {args.upstream_python} does not exist: "
            "run scripts/setup_upstream_env.sh"
        )
    mode = MODES[args.target][bc.mode_name(args)]
    args.rate = args.rate or mode["rate"]
    args.duration = args.duration or mode["duration_s"]
    args.passes = args.passes or mode["passes"]
    worker_target = args.target == "vllm-worker"
    if args.max_tokens is None:
        args.max_tokens = 64 if worker_target else 16
    if args.top_logprobs is None:
        args.top_logprobs = 5 if worker_target else 0
    if args.chat_processor is None:
        args.chat_processor = "vllm" if args.target == "frontend" else "default"
    orders = (ARMS, tuple(reversed(ARMS)))[: mode.get("orders", 2)]
    args.model_name = MODEL
    name = RESULT_NAMES[args.target]
    bc.exit_cleanly_on_sigterm()

    work_root = Path(tempfile.mkdtemp(prefix="ab-upstream-"))
    try:
        if args.target == "frontend":
            model_dir = tiny_model_dir(work_root / "model")  # the mocker's: tokenizer and config
        else:  # the engine's: weights too, built once per machine by the upstream environment
            model_dir = Path(bc.tiny_model_dir(args.upstream_python))
        result = bc.new_result(
            name,
            bc.mode_name(args),
            target=args.target,
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
            return bc.finish(args, name + "_probe", result, None)
        runs: list[dict] = []
        for index in range(args.passes):
            for order in orders:
                for arm in order:
                    print(f"{name}: pass {index + 1}, arm {arm}", file=sys.stderr, flush=True)
                    run = run_arm(arm, args, model_dir, work_root / f"{index}-{len(runs)}-{arm}")
                    run["pass"] = index + 1
                    runs.append(run)
                    # An arm is minutes of load: keep what is measured if a later arm fails.
                    result["runs"] = runs
                    bc.write_result(
                        argparse.Namespace(**{**vars(args), "publish": False}), name, result
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
        return bc.finish(args, name, result, plot(args, name, runs))
    finally:
        shutil.rmtree(work_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
