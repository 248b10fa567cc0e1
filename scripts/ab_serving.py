#!/usr/bin/env python3
"""A/B of the GC freeze in serving: a real frontend + mock worker, open-loop Poisson load.

Arms (each a fresh pair of real processes, ``python -m dynamo.frontend`` and
``python -m dynamo.vllm --engine mock``, each with a synthetic long-lived heap):

- ``ctl``: both ``--no-*``: stock CPython GC in both processes;
- ``worker``: the worker frozen, the frontend stock;
- ``all``: both frozen (the defaults);
- ``nogc``: both frozen and automatic GC disabled in both (``BENCH_GC_DISABLE``, see
  scripts/bench_launch.py): the limit.

The arms run in alternating order (``ctl worker all nogc``, then reversed), ``--passes`` times.
Per arm (a pair of processes: scripts/serving_pair.py), the offered load climbs through the
rungs. The load comes from a client in its own process (scripts/serving_load.py: asyncio +
aiohttp) that sends at Poisson-scheduled times whatever the server does (open loop) and counts
latency from the *scheduled* send time, so a stalled server is charged for the requests it
delayed (no coordinated omission). Per arm and rung: p50/p99/max of the
end-to-end latency and of the time to first token, errors, achieved RPS, and the pauses of 50 ms
or more that each process's pause logger reported (``GC gen<g> pause <x> ms`` WARNING lines).

The frontend's heap is built before its start-up freeze by scripts/bench_launch.py (the frontend
has no heap option); the worker's by its own ``--mock-heap-objects``.

With ``--engine vllm`` **no process gets a synthetic heap**: the worker is ``python -m
dynamo.vllm --engine vllm`` on the tiny random model (scripts/make_tiny_model.py) and the
frontend runs ``--dyn-chat-processor vllm`` (vLLM's own tokenizer and chat-template rendering),
both by .venv-vllm's python (``--vllm-python``), so each heap is the one its imports and
start-up build. vLLM's EngineCore process (scheduler and model) freezes its own start-up heap
in every arm (``vllm.v1.engine.core``); the arms differ in the two processes our flags govern.
Each engine start takes 10-40 s and a stock process needs minutes of load before its first
full collection, so that mode has its own ladder (results go to ``ab_serving_vllm*.json``),
and two extra runs (scripts/serving_probes.py): ``--probe`` (how long each process of a
``ctl`` pair takes to its first full collection, and a full collection timed in each serving
process under load, stock against frozen) and ``--cross-check`` (one rung driven by vLLM's own
``vllm bench serve`` beside this client).

RSS is read at the end of every rung (psutil) for the frontend, the worker's main process and
the worker's child processes (EngineCore), so the freeze's memory cost is in the table.

    python scripts/ab_serving.py [--quick|--smoke] [--engine vllm [--probe|--cross-check]]
        [--rungs 50,100,...] [--duration S] [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_common as bc
from serving_load import run_client, summary_of
from serving_pair import MODEL, PAUSE_LOG_MS, Pair, run_rung

NAME = "ab_serving"
ARMS = ("ctl", "worker", "all", "nogc")
# Requests live ~0.65 s (16 tokens x 40 ms): long enough that their objects survive young
# collections and get promoted, which is what makes the stock GC run full collections at all.
DEFAULT_TOKEN_MS = 40.0
DEFAULT_MAX_TOKENS = 16

# Rungs are fractions of the capacity a calibration run measures (unless --rungs is given), so
# the ladder reaches past saturation on whatever machine runs it.
MODES: dict[str, dict[str, Any]] = {
    "full": {
        "heap": 800_000,
        "duration_s": 30.0,
        "passes": 2,
        "rung_fractions": [0.3, 0.5, 0.7, 0.85, 1.0, 1.2],
    },
    # Quick: one fixed rung, no calibration; it shows the script works, rarely a gen2 pause.
    "quick": {"heap": 800_000, "duration_s": 6.0, "passes": 1, "rungs": [150.0]},
    "smoke": {
        "heap": 20_000,
        "duration_s": 1.0,
        "passes": 1,
        "rung_fractions": [0.5],
        "arms": ("ctl", "all"),
        "rungs": [20.0],
        "token_ms": 1.0,
        "max_tokens": 4,
    },
}
# --engine vllm: every heap is the process's own ("heap" is unused). The full mode's rungs are
# minutes long: docs/benchmarks.md section 3c says why (the probe's time to a first gen2).
VLLM_MODES: dict[str, dict[str, Any]] = {
    # Fixed rungs: at 120 RPS a stock pair on this machine runs a full collection every ~30 s
    # in the frontend and every ~50 s in the worker (the probe); 60 RPS is below that regime,
    # 180 RPS past the stock pair's comfort. Three arms: `worker` is left out to fit the run.
    "full": {
        "heap": 0,
        "duration_s": 90.0,
        "passes": 2,
        "rungs": [60.0, 120.0, 180.0],
        "arms": ("ctl", "all", "nogc"),
        "rung_fractions": [0.4, 0.7, 1.0],
    },
    "quick": {"heap": 0, "duration_s": 10.0, "passes": 1, "rung_fractions": [0.5, 1.0]},
    "smoke": {
        "heap": 0,
        "duration_s": 1.0,
        "passes": 1,
        "rungs": [2.0],
        "arms": ("ctl", "all"),
        "max_tokens": 4,
    },
}


def calibrate(args, heap: int, work_root: Path) -> dict:
    """Capacity in RPS of the `all` pair: double the offered load until it stops keeping up.

    Each step is a short open-loop run; the pair "keeps up" while it completes at least 90% of
    the offered rate without errors. The capacity is the best achieved rate seen.
    """
    work_dir = work_root / "calibration"
    work_dir.mkdir(parents=True)
    pair = Pair("all", heap, args, work_dir)
    url = pair.base_url + "/v1/chat/completions"
    steps: list[dict] = []
    try:
        pair.wait_ready()
        run_client(url, min(20.0, args.calibration_start_rps), 1.0, 0, args)  # warm-up
        rate = args.calibration_start_rps
        while True:
            load = run_client(url, rate, args.calibration_s, len(steps) + 1, args)
            steps.append(
                {
                    "offered_rps": rate,
                    "achieved_rps": load["achieved_rps"],
                    "errors": load["errors"],
                }
            )
            print(
                f"  calibration: offered {rate:.0f} -> achieved {load['achieved_rps']:.0f} RPS, "
                f"errors {load['errors']}",
                file=sys.stderr,
                flush=True,
            )
            if load["achieved_rps"] < 0.9 * rate or load["errors"] or len(steps) >= 8:
                break
            rate *= 2
    finally:
        pair.stop()
    return {"capacity_rps": max(step["achieved_rps"] for step in steps), "steps": steps}


def run_arms(args, mode: str, settings: dict, rungs: list[float], work_root: Path) -> list[dict]:
    arms = list(args.arms.split(",")) if args.arms else list(settings.get("arms", ARMS))
    passes = args.passes or settings["passes"]
    duration_s = args.duration or settings["duration_s"]
    heap = args.heap_objects if args.heap_objects is not None else settings["heap"]
    runs = []
    for pass_index in range(passes):
        order = arms if pass_index % 2 == 0 else list(reversed(arms))
        for arm in order:
            work_dir = bc.run_dir(
                work_root, f"pass{pass_index}-{arm}", f"pass {pass_index + 1}/{passes}: arm {arm}"
            )
            pair = Pair(arm, heap, args, work_dir)
            try:
                pair.wait_ready()
                # Warm-up (unmeasured): connections, first-request code paths.
                run_client(pair.base_url + "/v1/chat/completions", rungs[0], 1.0, 0, args)
                for rung_index, rate in enumerate(rungs):
                    seed = 1000 * rung_index + pass_index  # same schedule for every arm
                    measured = run_rung(pair, rate, duration_s, seed, args)
                    measured.update({"arm": arm, "pass": pass_index, "rung": rung_index})
                    runs.append(measured)
                    fe, wk = measured["processes"]["frontend"], measured["processes"]["worker"]
                    print(
                        f"  {arm:6} {rate:7.1f} rps: ok={measured['ok']} "
                        f"errors={measured['errors']} achieved={measured['achieved_rps']:.1f} "
                        f"p99={1000 * bc.percentile(measured['latency_s'], 99):.0f} ms "
                        f"pauses>=50ms fe={fe['pauses_ge_50ms']} wk={wk['pauses_ge_50ms']} "
                        f"gen2 fe={fe['collections']['gen2']} wk={wk['collections']['gen2']}",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                pair.stop()
            if args.keep_logs:
                for name in ("worker", "frontend"):
                    kept = f"{result_name(args)}-pass{pass_index}-{arm}-{name}.log"
                    shutil.copy(work_dir / f"{name}.log", Path(args.out) / kept)
    return runs


def aggregate(runs: list[dict], rungs: list[float]) -> list[dict]:
    """One row per arm and rung, the passes pooled (and each pass's p99 kept)."""
    rows = []
    arms = list(dict.fromkeys(run["arm"] for run in runs))
    for arm in arms:
        for rung_index, rate in enumerate(rungs):
            same = [r for r in runs if r["arm"] == arm and r["rung"] == rung_index]
            if not same:
                continue
            latency = bc.summarise([r["latency_s"] for r in same])
            ttft = bc.summarise([r["ttft_s"] for r in same])
            row = {
                "arm": arm,
                "offered_rps": rate,
                "passes": len(same),
                "sent": sum(r["sent"] for r in same),
                "ok": sum(r["ok"] for r in same),
                "errors": sum(r["errors"] for r in same),
                "errors_by_kind": _merge_counts(r["errors_by_kind"] for r in same),
                "achieved_rps": bc.median(r["achieved_rps"] for r in same),
                "latency": latency,
                "ttft": ttft,
                "p99_ms_per_pass": [1000 * bc.percentile(r["latency_s"], 99) for r in same],
                # Resident memory at the end of the rung, per pass (MiB).
                "rss_mb": {
                    name: [r["rss_mb"][name] for r in same]
                    for name in ("frontend", "worker", "worker_children")
                },
                "send_lag_p99_ms": 1000
                * bc.percentile([v for r in same for v in r["send_lag_s"]], 99),
            }
            for name in ("frontend", "worker"):
                pauses = [p for r in same for p in r["processes"][name]["pauses"]]
                gen2 = [r["processes"][name]["collections"]["gen2"] for r in same]
                gen2_s = [r["processes"][name]["collections"].get("gen2_pause_s") for r in same]
                gen2_total = sum(g for g in gen2 if g is not None)
                row[name] = {
                    "pauses_ge_50ms": len(pauses),
                    "max_pause_ms": max((p["ms"] for p in pauses), default=0.0),
                    "gen2_collections": gen2_total,
                    # Mean of every gen2 pause (metrics), not only the logged >= 50 ms ones.
                    "gen2_mean_ms": 1000 * sum(g for g in gen2_s if g is not None) / gen2_total
                    if gen2_total
                    else 0.0,
                }
            rows.append(row)
    return rows


def _mean(values) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) if present else None


def _merge_counts(dicts) -> dict:
    merged: dict[str, int] = {}
    for counts in dicts:
        for key, value in counts.items():
            merged[key] = merged.get(key, 0) + value
    return merged


def judge(rows: list[dict]) -> dict:
    """The issue's serving goals, evaluated on the measured rows."""
    by = {(row["arm"], row["offered_rps"]): row for row in rows}
    rates = sorted({row["offered_rps"] for row in rows})
    verdict: dict = {}
    all_rows = [row for row in rows if row["arm"] == "all"]
    if all_rows:
        pauses = sum(
            r["frontend"]["pauses_ge_50ms"] + r["worker"]["pauses_ge_50ms"] for r in all_rows
        )
        verdict["all_pauses_ge_50ms"] = {"measured": pauses, "met": pauses == 0}
    # "The highest rung where ctl still answers": at most 1% of its requests failed (past
    # that, every arm's p99 is the client's timeout and the comparison says nothing).
    answering = [
        rate
        for rate in rates
        if ("ctl", rate) in by and by[("ctl", rate)]["errors"] <= 0.01 * by[("ctl", rate)]["sent"]
    ]
    if answering and all_rows:
        rate = max(answering)
        verdict["rung_rps"] = rate
        for metric in ("latency", "ttft"):
            if ("all", rate) not in by:
                break
            for tail in ("p99_ms", "p999_ms"):
                name = tail[:-3]
                all_tail = by[("all", rate)][metric][tail]
                ctl_tail = by[("ctl", rate)][metric][tail]
                verdict[f"all_over_ctl_{metric}_{name}"] = {
                    "measured": bc.ratio(all_tail, ctl_tail),
                    "met": all_tail <= ctl_tail / 3.0,
                }
                if ("nogc", rate) in by:
                    nogc_tail = by[("nogc", rate)][metric][tail]
                    verdict[f"all_over_nogc_{metric}_{name}"] = {
                        "measured": bc.ratio(all_tail, nogc_tail),
                        "met": all_tail <= 1.2 * nogc_tail,
                    }
    # The freeze's memory cost: RSS of `all` against `ctl` after the last (longest-running) rung.
    last = rates[-1] if rates else None
    if ("all", last) in by and ("ctl", last) in by:
        for name in ("frontend", "worker", "worker_children"):
            all_rss = _mean(by[("all", last)]["rss_mb"][name])
            ctl_rss = _mean(by[("ctl", last)]["rss_mb"][name])
            if all_rss is None or ctl_rss is None or not ctl_rss:
                continue
            verdict[f"rss_all_over_ctl_{name}"] = {
                "measured": all_rss / ctl_rss,
                "met": all_rss <= 1.05 * ctl_rss,
                "all_mb": all_rss,
                "ctl_mb": ctl_rss,
            }
    ceilings = {}
    for arm in dict.fromkeys(row["arm"] for row in rows):
        ceilings[arm] = max(row["achieved_rps"] for row in rows if row["arm"] == arm)
    verdict["ceiling_rps"] = ceilings
    if "ctl" in ceilings and "all" in ceilings:
        verdict["ceiling_all_over_ctl"] = bc.ratio(ceilings["all"], ceilings["ctl"])
    return verdict


def plot(args, rows: list[dict]):
    plt = bc.pyplot()
    if plt is None:
        return None
    fig, (p99_ax, ttft_ax, rps_ax) = plt.subplots(1, 3, figsize=(15, 4.6))
    styles = {"ctl": "C3", "worker": "C1", "all": "C0", "nogc": "C2"}
    for arm in dict.fromkeys(row["arm"] for row in rows):
        mine = [row for row in rows if row["arm"] == arm]
        x = [row["offered_rps"] for row in mine]
        color = styles.get(arm)
        p99_ax.plot(x, [row["latency"]["p99_ms"] for row in mine], "o-", color=color, label=arm)
        ttft_ax.plot(x, [row["ttft"]["p99_ms"] for row in mine], "o-", color=color, label=arm)
        rps_ax.plot(x, [row["achieved_rps"] for row in mine], "o-", color=color, label=arm)
    p99_ax.set_yscale("log")
    p99_ax.set_title("p99 end-to-end latency vs offered load")
    p99_ax.set_ylabel("ms (from the scheduled send time)")
    ttft_ax.set_yscale("log")
    ttft_ax.set_title("p99 time to first token vs offered load")
    ttft_ax.set_ylabel("ms (from the scheduled send time)")
    rps_ax.set_title("achieved vs offered load")
    rps_ax.set_ylabel("achieved RPS (OK responses)")
    lim = max(row["offered_rps"] for row in rows)
    rps_ax.plot([0, lim], [0, lim], color="grey", lw=0.8, ls=":")
    for ax in (p99_ax, ttft_ax, rps_ax):
        ax.set_xlabel("offered load, RPS (open-loop Poisson)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    title = (
        f"ab_serving ({bc.mode_name(args)}): frontend + {args.engine} worker, "
        f"{rows[0].get('heap', '')} {bc.cpu_model()}, {os.cpu_count()} cores"
    )
    return bc.save_plot(args, fig, result_name(args), title)


def result_name(args: argparse.Namespace) -> str:
    """``ab_serving`` for the mock worker, ``ab_serving_vllm`` for the real engine."""
    return NAME if args.engine == "mock" else f"{NAME}_vllm"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, help="offered RPS of --probe and --cross-check")
    parser.add_argument("--duration", type=float, help="seconds of load per rung")
    parser.add_argument(
        "--rungs",
        help="offered loads in RPS, comma-separated (default: fractions of a calibrated capacity)",
    )
    parser.add_argument("--arms", help=f"comma-separated subset of {','.join(ARMS)}")
    parser.add_argument("--passes", type=int, help="passes over the arms (alternating order)")
    parser.add_argument("--heap-objects", type=int, help="synthetic heap per process")
    parser.add_argument(
        "--token-ms", type=float, help=f"mock per-token time (default {DEFAULT_TOKEN_MS:g})"
    )
    parser.add_argument(
        "--max-tokens", type=int, help=f"tokens per request (default {DEFAULT_MAX_TOKENS})"
    )
    parser.add_argument(
        "--messages",
        type=int,
        help="chat turns per request (default 8; 2 with --engine vllm, whose "
        "tiny model takes 256 tokens)",
    )
    parser.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="streaming requests (time to first token is measured too)",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="request timeout, seconds")
    parser.add_argument(
        "--calibration-start-rps",
        type=float,
        help="first offered load of the capacity calibration (doubled per step; "
        "default 50, 2 with --engine vllm)",
    )
    parser.add_argument(
        "--calibration-s",
        type=float,
        help="seconds per calibration step (default 6, 4 with --engine vllm)",
    )
    parser.add_argument("--model-name", default=MODEL, help=argparse.SUPPRESS)
    parser.add_argument(
        "--keep-logs", action="store_true", help="copy the processes' logs to --out"
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="with --engine vllm: time to the first gen2 of each process at "
        "--rate for --duration seconds, then full collections timed under load "
        "(scripts/serving_probes.py)",
    )
    parser.add_argument(
        "--cross-check",
        action="store_true",
        help="with --engine vllm: one rung (--rate, --duration) by this client "
        "and by vLLM's `vllm bench serve`",
    )
    parser.add_argument(
        "--cross-check-input-len",
        type=int,
        default=32,
        help="prompt tokens of vllm bench serve's random dataset",
    )
    args = bc.parse_ab_args(parser, argv)
    bc.exit_cleanly_on_sigterm()
    mode = bc.mode_name(args)
    settings = (VLLM_MODES if args.engine == "vllm" else MODES)[mode]
    real = args.engine == "vllm"
    for name, mock_default, vllm_default in (
        ("messages", 8, 2),
        ("calibration_start_rps", 50.0, 16.0),
        ("calibration_s", 6.0, 4.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, vllm_default if real else mock_default)
    if (args.probe or args.cross_check) and (args.engine != "vllm" or args.rate is None):
        parser.error("--probe and --cross-check need --engine vllm and --rate")
    if args.engine == "vllm":
        # The worker registers the model under its path; requests name it so.
        args.model_name = args.model_dir or bc.tiny_model_dir(args.vllm_python)
    if args.token_ms is None:
        args.token_ms = settings.get("token_ms", DEFAULT_TOKEN_MS)
    if args.max_tokens is None:
        args.max_tokens = settings.get("max_tokens", DEFAULT_MAX_TOKENS)
    heap = args.heap_objects if args.heap_objects is not None else settings["heap"]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = bc.new_result(
        NAME,
        mode,
        settings={
            "heap_objects_per_process": None if real else heap,
            "token_ms": None if real else args.token_ms,
            "max_tokens": args.max_tokens,
            "messages": args.messages,
            "stream": args.stream,
            "timeout_s": args.timeout,
            "duration_s": args.duration or settings["duration_s"],
            "pause_log_ms": PAUSE_LOG_MS,
            "engine": args.engine,
            "model": args.model_name,
            "worker_args": bc.VLLM_ARGS if real else None,
            "worker_heap": "vLLM's own (no synthetic heap)" if real else heap,
            "frontend_heap": "--dyn-chat-processor vllm's own (no synthetic heap)"
            if real
            else heap,
        },
    )
    if args.probe or args.cross_check:
        return run_probes(args, result)
    with tempfile.TemporaryDirectory(prefix="ab_serving-") as tmp:
        work_root = Path(tmp)
        if args.rungs:
            rungs = [float(r) for r in args.rungs.split(",")]
        elif "rungs" in settings:
            rungs = list(settings["rungs"])
        else:
            calibration = calibrate(args, heap, work_root)
            result["calibration"] = calibration
            capacity = calibration["capacity_rps"]
            print(f"calibrated capacity: {capacity:.0f} RPS", file=sys.stderr, flush=True)
            rungs = [round(capacity * f, 1) for f in settings["rung_fractions"]]
        result["rungs"] = rungs
        runs = run_arms(args, mode, settings, rungs, work_root)
    rows = aggregate(runs, rungs)
    result["rows"] = rows
    result["per_pass"] = [summary_of(run) for run in runs]
    result["goal"] = judge(rows)
    print(results_table(rows))
    print(json.dumps(result["goal"], indent=1))
    return bc.finish(args, result_name(args), result, plot(args, rows))


def results_table(rows: list[dict]) -> str:
    """One Markdown row per arm and rung (docs/benchmarks.md quotes it)."""
    table = []
    for row in rows:
        table.append(
            [
                row["arm"],
                row["offered_rps"],
                row["achieved_rps"],
                row["ok"],
                row["errors"],
                row["latency"]["p50_ms"],
                row["latency"]["p99_ms"],
                row["latency"]["p999_ms"],
                row["latency"]["max_ms"],
                row["ttft"]["p99_ms"],
                row["ttft"]["p999_ms"],
                f"{row['frontend']['pauses_ge_50ms']}/{row['worker']['pauses_ge_50ms']}",
                max(row["frontend"]["max_pause_ms"], row["worker"]["max_pause_ms"]),
                f"{row['frontend']['gen2_collections']:.0f}/{row['worker']['gen2_collections']:.0f}",
                f"{row['frontend']['gen2_mean_ms']:.0f}/{row['worker']['gen2_mean_ms']:.0f}",
                "/".join(
                    f"{v:.0f}" if v is not None else "-"
                    for v in (
                        _mean(row["rss_mb"][name])
                        for name in ("frontend", "worker", "worker_children")
                    )
                ),
            ]
        )
    return bc.format_table(
        [
            "arm",
            "offered",
            "achieved",
            "ok",
            "errors",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "ttft p99 ms",
            "ttft p99.9 ms",
            "pauses>=50 fe/wk",
            "max pause ms",
            "gen2 fe/wk",
            "gen2 mean ms fe/wk",
            "RSS MiB fe/wk/engine",
        ],
        table,
    )


def run_probes(args: argparse.Namespace, result: dict) -> int:
    import serving_probes

    kind = "probe" if args.probe else "cross_check"
    args.duration = args.duration or (600.0 if args.probe else 60.0)
    result["settings"]["duration_s"] = args.duration
    with tempfile.TemporaryDirectory(prefix=f"ab_serving-{kind}-") as tmp:
        work = Path(tmp)
        result[kind] = (serving_probes.probe if args.probe else serving_probes.cross_check)(
            args, work
        )
        if args.keep_logs:
            for log in work.rglob("*.log"):
                shutil.copy(
                    log, Path(args.out) / f"{result_name(args)}-{kind}-{log.parent.name}-{log.name}"
                )
    path = serving_probes.plot_probe(args, result["probe"]) if args.probe else None
    return bc.finish(args, f"{result_name(args)}-{kind.replace('_', '-')}", result, path)


if __name__ == "__main__":
    sys.exit(main())
