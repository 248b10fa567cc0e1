#!/usr/bin/env python3
"""The soak of the serving-time GC maintenance: days of heap growth in compressed time.

Our frontend (``python -m dynamo.frontend``) and mock workers (``python -m dynamo.vllm --engine
mock``), each with a synthetic start-up heap, the workers growing after their start-up freeze as
a long-serving process does: every request keeps ``--mock-heap-growth`` tracked objects (a cache
of request state), a ``--mock-heap-evict-percent`` share of which is later evicted as cyclic
garbage. Over one arm each worker grows by millions of objects (what days of serving leave),
under an open-loop Poisson load (scripts/serving_load.py: latency from the scheduled send time,
no coordinated omission). Arms, each a fresh set of processes:

- ``stock``: 2 workers, freeze off everywhere (``--no-freeze-gc-heap``);
- ``once``: 2 workers, frozen at start-up, maintenance off (today's default);
- ``idle``: 1 worker with ``--gc-maintenance idle`` (a process alone), at the same load per
  worker, the frontend with ``--dyn-gc-maintenance idle``;
- ``withdraw``: 2 workers with ``--gc-maintenance withdraw``, the frontend ``idle``;
- with ``--busy``, two more on 1 worker under load with no idle moment (requests longer than
  the pause budget, never none in flight): ``once-busy`` and ``idle-busy``.

The arms alternate (``stock once idle withdraw``, then reversed), so each pair is measured side
by side under the machine's load at the time; the load average is recorded per arm. Per arm:
the client's figures (errors, p99 / p99.9 / max latency, throughput), every serving GC pause
each process logged (the pause logger's WARNING lines, at ``--gc-pause-log-ms`` 20: exact from
20 ms; below that the pause histogram's bucket bounds the longest), the waits of requests held
at an idle maintenance's gate, the maintenances (each one's line: its GC work, what it
reclaimed) and RSS every second.

With ``--engine vllm`` the workers are the real engine on the tiny model (no synthetic heap and
no growth knob: the heap is vLLM's own) behind a frontend running vLLM's chat processor, arms
``once`` and ``withdraw``, with a pause budget low enough (``--budget-ms``) that maintenances
happen on those heaps.

    python scripts/bench_gc_soak.py [--quick|--smoke] [--busy] [--engine vllm] [--arms A,B]
        [--passes N] [--duration S] [--rate RPS_PER_WORKER] [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_common as bc
import soak_readings as sr
import soak_report
from serving_load import client_result, start_client
from serving_pair import MODEL, Pair

NAME = "gc_soak"
PAUSE_LOG_MS = 20.0  # every pause from 20 ms on is logged with its exact length
SAMPLE_S = 1.0  # the RSS sampling interval


@dataclass(frozen=True)
class Arm:
    name: str
    workers: int
    frozen: bool
    worker_mode: str  # --gc-maintenance: off, idle, withdraw
    frontend_mode: str  # --dyn-gc-maintenance: off, idle
    busy: bool = False  # requests longer than the budget, never an idle moment


ARMS = {
    "stock": Arm("stock", 2, False, "off", "off"),
    "once": Arm("once", 2, True, "off", "off"),
    "idle": Arm("idle", 1, True, "idle", "idle"),
    "withdraw": Arm("withdraw", 2, True, "withdraw", "idle"),
    "once-busy": Arm("once-busy", 1, True, "off", "off", busy=True),
    "idle-busy": Arm("idle-busy", 1, True, "idle", "idle", busy=True),
}
MAIN_ARMS = ("stock", "once", "idle", "withdraw")
BUSY_ARMS = ("once-busy", "idle-busy")

# Per worker: `rate` requests per second, each keeping `growth` objects: rate x growth x duration
# objects grown (full: 10 x 6,000 x 200 = 12M per worker, what days of serving leave). Half of
# the entries go to the evicting cache (200k objects: 33 entries of 6,000), so from the 66th
# request on each worker turns 30k objects a second into cyclic garbage, each having lived
# ~7 s (long enough to be frozen by a maintenance first: what a reclaim is for). The busy arms'
# requests take 8 x 100 ms: ~8 in flight at any time, never an idle moment.
MODES: dict[str, dict[str, Any]] = {
    "full": {"heap": 600_000, "growth": 6000, "evict": 50, "rate": 10.0, "duration_s": 200.0,
             "passes": 2, "token_ms": 5.0, "busy_token_ms": 100.0, "max_tokens": 8},
    "quick": {"heap": 200_000, "growth": 1500, "evict": 50, "rate": 10.0, "duration_s": 30.0,
              "passes": 1, "token_ms": 5.0, "busy_token_ms": 100.0, "max_tokens": 8},
    "smoke": {"heap": 10_000, "growth": 50, "evict": 50, "rate": 4.0, "duration_s": 2.0,
              "passes": 1, "token_ms": 1.0, "busy_token_ms": 5.0, "max_tokens": 4,
              "arms": ("once", "idle", "withdraw")},
}  # fmt: skip
# --engine vllm: the real heaps; no growth knob, so the budget makes the maintenances happen.
VLLM_MODES: dict[str, dict[str, Any]] = {
    "full": {"rate": 4.0, "duration_s": 300.0, "passes": 1, "max_tokens": 8, "budget_ms": 4.0},
    "quick": {"rate": 2.0, "duration_s": 60.0, "passes": 1, "max_tokens": 8, "budget_ms": 4.0},
    "smoke": {"rate": 1.0, "duration_s": 4.0, "passes": 1, "max_tokens": 4, "budget_ms": 4.0},
}


def arm_pair(arm: Arm, args, settings: dict, work_dir: Path) -> Pair:
    budget = ["--gc-pause-budget-ms", f"{args.budget_ms:g}"]
    worker_extra: list[str] = []
    if arm.worker_mode != "off":
        worker_extra += ["--gc-maintenance", arm.worker_mode, *budget]
    if args.engine == "mock":
        worker_extra += ["--mock-heap-growth", str(settings["growth"])]
        worker_extra += ["--mock-heap-evict-percent", str(settings["evict"])]
    frontend_extra: list[str] = []
    if arm.frontend_mode != "off":
        frontend_extra += ["--dyn-gc-maintenance", arm.frontend_mode]
        frontend_extra += ["--dyn-gc-pause-budget-ms", f"{args.budget_ms:g}"]
    args.token_ms = settings["busy_token_ms"] if arm.busy else settings.get("token_ms", 0.0)
    return Pair(
        arm.name,
        settings.get("heap", 0),
        args,
        work_dir,
        workers=arm.workers,
        frozen=(arm.frozen, arm.frozen),
        worker_extra=tuple(worker_extra),
        frontend_extra=tuple(frontend_extra),
        pause_log_ms=PAUSE_LOG_MS,
    )


def run_arm(arm: Arm, pass_index: int, args, settings: dict, work_dir: Path) -> dict:
    pair = arm_pair(arm, args, settings, work_dir)
    rate = args.rate * arm.workers
    duration_s = args.duration
    try:
        pair.wait_ready(deadline_s=600.0)
        load_start = os.getloadavg()
        processes = pair.processes()
        started = time.time()
        timeline = sr.Timeline(started)
        out = work_dir / "client.json"
        seed = 1000 + pass_index  # the same schedule for every arm of a pass
        url = pair.base_url + "/v1/chat/completions"
        client = start_client(url, rate, duration_s, seed, args, out)
        while client.poll() is None:
            timeline.sample(pair.rss_mb())
            time.sleep(SAMPLE_S)  # the sampling interval
        load = client_result(client, out, timeout_s=args.timeout + 60)
        per_process = {}
        for name, (process, metrics_url) in processes.items():
            process.check_alive()
            per_process[name] = {
                **sr.read_log(process.log_bytes(), started),
                "metrics": sr.process_metrics(metrics_url),
            }
        rss_end = pair.rss_mb()
    finally:
        pair.stop()
        if args.keep_logs:
            for process in (pair.frontend, *pair.workers):
                kept = f"{NAME}-pass{pass_index}-{arm.name}-{process.name}.log"
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / kept).write_bytes(process.log_bytes())
    load.update(
        {
            "arm": arm.name,
            "pass": pass_index,
            "workers": arm.workers,
            "offered_rps": rate,
            "loadavg_start": list(load_start),
            "loadavg_end": list(os.getloadavg()),
            "timeline": timeline.samples,
            "processes": per_process,
            "rss_end_mb": rss_end,
        }
    )
    return load


def run_arms(args, settings: dict, arms: list[str], work_root: Path) -> list[dict]:
    runs = []
    for pass_index in range(args.passes):
        order = arms if pass_index % 2 == 0 else list(reversed(arms))
        for name in order:
            work_dir = bc.run_dir(
                work_root,
                f"pass{pass_index}-{name}",
                f"pass {pass_index + 1}/{args.passes}: {name}",
            )
            run = run_arm(ARMS[name], pass_index, args, settings, work_dir)
            runs.append(run)
            print(soak_report.progress_line(run), file=sys.stderr, flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", help=f"comma-separated subset of {','.join(ARMS)}")
    parser.add_argument("--busy", action="store_true", help=f"also run {', '.join(BUSY_ARMS)}")
    parser.add_argument("--passes", type=int, help="passes over the arms (alternating order)")
    parser.add_argument("--duration", type=float, help="seconds of load per arm")
    parser.add_argument("--rate", type=float, help="offered requests per second per worker")
    parser.add_argument("--budget-ms", type=float, help="the pause budget (default 50; vllm: 4)")
    parser.add_argument("--timeout", type=float, default=60.0, help="request timeout, seconds")
    parser.add_argument("--messages", type=int, default=2, help="chat turns per request")
    parser.add_argument("--keep-logs", action="store_true", help="copy the logs to --out")
    args = bc.parse_ab_args(parser, argv)
    bc.exit_cleanly_on_sigterm()
    mode = bc.mode_name(args)
    real = args.engine == "vllm"
    settings = (VLLM_MODES if real else MODES)[mode]
    args.passes = args.passes or settings["passes"]
    args.duration = args.duration or settings["duration_s"]
    args.rate = args.rate or settings["rate"]
    args.budget_ms = args.budget_ms or settings.get("budget_ms", 50.0)
    args.max_tokens = settings["max_tokens"]
    args.stream = True
    args.model_name = (args.model_dir or bc.tiny_model_dir(args.vllm_python)) if real else MODEL
    if args.arms:
        arms = args.arms.split(",")
        unknown = [name for name in arms if name not in ARMS]
        if unknown:
            parser.error(f"--arms: unknown {', '.join(unknown)} (known: {', '.join(ARMS)})")
    elif real:
        arms = ["once", "withdraw"]
    else:
        arms = list(settings.get("arms", MAIN_ARMS)) + (list(BUSY_ARMS) if args.busy else [])
    result = bc.new_result(
        NAME,
        mode,
        settings={
            "engine": args.engine,
            "model": args.model_name,
            "arms": {name: ARMS[name].__dict__ for name in arms},
            "rate_per_worker": args.rate,
            "duration_s": args.duration,
            "passes": args.passes,
            "budget_ms": args.budget_ms,
            "pause_log_ms": PAUSE_LOG_MS,
            "max_tokens": args.max_tokens,
            "messages": args.messages,
            "timeout_s": args.timeout,
            "heap": "vLLM's own (no synthetic heap, no growth knob)" if real else settings["heap"],
            "growth_per_request": None if real else settings["growth"],
            "evict_percent": None if real else settings["evict"],
            "token_ms": None if real else settings["token_ms"],
            "busy_token_ms": None if real else settings["busy_token_ms"],
            "worker_args": bc.VLLM_ARGS if real else None,
        },
    )
    with tempfile.TemporaryDirectory(prefix="gc_soak-") as tmp:
        runs = run_arms(args, settings, arms, Path(tmp))
    rows = soak_report.aggregate(runs, args.budget_ms)
    result["rows"] = rows
    result["pairs"] = soak_report.side_by_side(runs)
    result["per_arm"] = [soak_report.without_samples(run) for run in runs]
    result["goal"] = soak_report.judge(rows, result["pairs"])
    print(soak_report.table(rows))
    print(json.dumps(result["goal"], indent=1))
    name = NAME if not real else f"{NAME}_vllm"
    pauses_plot = soak_report.plot_pauses(args, runs, name, PAUSE_LOG_MS)
    result["pauses_plot"] = bc.repo_relative(pauses_plot) if pauses_plot else None
    bc.publish_plot(args, pauses_plot)
    return bc.finish(args, name, result, soak_report.plot(args, runs, name, PAUSE_LOG_MS))


if __name__ == "__main__":
    sys.exit(main())
