"""``ab_self_benchmark.py --engine vllm``: the self-benchmark A/B on the real engine.

Each run is the real worker, ``python -m dynamo.vllm --engine vllm`` on the tiny random model
(scripts/make_tiny_model.py), run by .venv-vllm's python (``--vllm-python``), no synthetic heap
anywhere: its heaps are vLLM's own, in three processes (the worker's main process, vLLM's
EngineCore and the rank; vLLM's CPU backend always runs the model in a process of its own). Runs
alternate ``off freeze`` / ``freeze off``. On top of the figures of the mock mode, per run and
process, from the worker's log: the process's ``Self-benchmark GC report`` lines (heap size:
tracked and frozen objects; full collections during the sweep; growth of its objects per point)
and the pause lines its pause logger wrote during the sweep (the worker passes
``--gc-pause-log-ms``; EngineCore's and the rank's lines carry their pid). A stall is attributed
to the process(es) whose pause overlapped the point's window (each point records its start on
the wall clock). Goal (issue 12): with the policy, at most a tenth of off's stalls and a longest
stall at most a fifth of off's; full collections during the sweep per process. Results go to
``ab_self_benchmark_vllm*.json`` and its plot.
"""

from __future__ import annotations

import bisect
import datetime
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import bench_common as bc
import self_benchmark_sweep as sweep

VLLM_NAME = "ab_self_benchmark_vllm"
VLLM_MODES: dict[str, dict[str, Any]] = {
    # A real point is a prefill of up to 64 x 255 tokens plus one decode step: ~5-60 ms here.
    "full": {"points": 30_480, "passes": 1},
    "quick": {"points": 2_000, "passes": 1},
    "smoke": {"points": 24, "passes": 1},
}
REPORT_LINE = re.compile(rb"Self-benchmark GC report: (\{.*\})")
# "2026-12-02 22:06:42,349 INFO pid=20477 [vllm rank] dynamo...: GC gen2 pause 396.6 ms"
TIMED_PAUSE_LINE = re.compile(
    rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ pid=(\d+) .*?GC gen(\d) pause ([0-9.]+) ms",
    re.MULTILINE,
)
PROCESS_ORDER = ("main", "vllm EngineCore", "vllm rank")
# Log timestamps have millisecond resolution: a pause counts in a window only when it overlaps it
# by more than this (a real stall overlaps by the whole pause).
ATTRIBUTION_SLACK_S = 0.002


def run_vllm_worker(args, policy: str, points: int, work_dir: Path, deadline_s: float) -> dict:
    output = work_dir / f"points-{policy}.jsonl"
    name = f"worker-{policy}"
    log_bytes = sweep.run_until_sweep_done(
        name,
        [
            "--engine", "vllm",
            "--model", args.model_name, "--served-model-name", "self-bench",
            "--discovery-dir", str(work_dir / "discovery"), "--request-plane-host", "127.0.0.1",
            "--gc-pause-log-ms", str(args.pause_log_ms),
            "--self-benchmark-points", str(points), "--self-benchmark-output", str(output),
            "--fpm-gc-policy", policy, *bc.VLLM_ARGS,
        ],
        work_dir,
        python=args.vllm_python,
        extra_env=bc.OFFLINE_ENV,
        deadline_s=deadline_s,
        stop_s=90,
    )  # fmt: skip
    during = sweep.sweep_log(log_bytes, with_done_line=True)
    rows = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
    reports = [json.loads(m.group(1)) for m in REPORT_LINE.finditer(during)]
    pauses = []
    for stamp, pid, generation, ms in TIMED_PAUSE_LINE.findall(log_bytes):
        ended = datetime.datetime.strptime(stamp.decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        pauses.append(
            {"pid": int(pid), "generation": int(generation), "ms": float(ms), "ended_unix": ended}
        )
    return {
        "policy": policy,
        "rows": rows,
        "reports": reports,
        "pauses": pauses,
        "worker_summary": sweep.done_summary(log_bytes),
        "log": str(work_dir / f"{name}.log"),
    }


def analyse_processes(run: dict, analysis: dict, stall_ms: float) -> dict:
    """Per process: heap, collections and pauses during the sweep; stalls attributed to it."""
    rows = run["rows"]
    by_phase = {(r["phase"], r["label"]): r for r in run["reports"]}
    labels = [label for label in PROCESS_ORDER if ("sweep_start", label) in by_phase]
    labels += sorted({r["label"] for r in run["reports"]} - set(labels))
    sweep_begin = rows[0]["started_unix"] if rows else 0.0
    sweep_end = (rows[-1]["started_unix"] + rows[-1]["wall_ms"] / 1000.0) if rows else 0.0
    stall_set = set(analysis["stall_indices"])
    processes = {}
    pid_label = {}
    for label in labels:
        start, end = by_phase.get(("sweep_start", label)), by_phase.get(("sweep_end", label))
        if start is None or end is None:
            continue
        pid_label[start["pid"]] = label
        in_sweep = [
            p
            for p in run["pauses"]
            if p["pid"] == start["pid"]
            and sweep_begin - ATTRIBUTION_SLACK_S
            <= p["ended_unix"]
            <= sweep_end + ATTRIBUTION_SLACK_S
        ]
        # Only a pause that overlaps a measured window can stall a point; the others ran
        # between points (the policy's gc_maintain windows, the reports' untimed calls).
        pauses = [p for p in in_sweep if overlapping_points(p, rows)]
        between = [p for p in in_sweep if p not in pauses]
        total_start = start["tracked_objects"] + start["frozen_objects"]
        total_end = end["tracked_objects"] + end["frozen_objects"]
        processes[label] = {
            "pid": start["pid"],
            "tracked_objects": start["tracked_objects"],
            "frozen_objects": start["frozen_objects"],
            "gen2_collections_in_sweep": end["collections"][2] - start["collections"][2],
            "gen1_collections_in_sweep": end["collections"][1] - start["collections"][1],
            "objects_growth_per_point": ((total_end - total_start) / len(rows)) if rows else None,
            "policy_running_in_sweep": bool(start["policy_running"] and end["policy_running"]),
            "thresholds_in_sweep": start["thresholds"],
            "pauses_in_sweep": len(pauses),
            "pauses_ge_stall_ms": sum(1 for p in pauses if p["ms"] >= stall_ms),
            "max_pause_ms": max((p["ms"] for p in pauses), default=0.0),
            "gen2_pauses": [p["ms"] for p in pauses if p["generation"] == 2],
            "pauses_between_points": len(between),
            "max_pause_between_points_ms": max((p["ms"] for p in between), default=0.0),
            "stalls_attributed": 0,
        }
    attributed = []
    for pause in run["pauses"]:
        pauser = pid_label.get(pause["pid"])
        if pauser is None:
            continue
        for index in set(overlapping_points(pause, rows)) & stall_set:
            attributed.append(
                {
                    "index": index,
                    "process": pauser,
                    "pause_ms": pause["ms"],
                    "generation": pause["generation"],
                }
            )
    for item in attributed:
        processes[item["process"]]["stalls_attributed"] += 1
    return {
        "processes": processes,
        "attributed_stalls": attributed,
        "unattributed_stalls": len(stall_set - {a["index"] for a in attributed}),
    }


def overlapping_points(pause: dict, rows: list[dict]) -> list[int]:
    """The points whose measured window a pause overlaps by more than the log stamps' resolution
    (a pause that ends where a window starts, like a maintain window's, is not in it)."""
    began = pause["ended_unix"] - pause["ms"] / 1000.0
    ended = pause["ended_unix"]
    starts = [row["started_unix"] for row in rows]
    first = max(0, bisect.bisect_right(starts, began) - 1)
    hits = []
    for row in rows[first:]:
        if row["started_unix"] > ended:
            break
        window_end = row["started_unix"] + row["wall_ms"] / 1000.0
        if min(ended, window_end) - max(began, row["started_unix"]) > ATTRIBUTION_SLACK_S:
            hits.append(row["point"])
    return hits


def plot_vllm(args, runs: list[dict]):
    plt = bc.pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(10, 4.8))
    colors = {"off": "C3", "freeze": "C0"}
    for run in [r for r in runs if r["pass"] == 0]:
        a = run["analysis"]
        ax.scatter(
            [row["point"] for row in run["rows"]],
            [row["wall_ms"] for row in run["rows"]],
            s=3,
            alpha=0.5,
            color=colors[run["policy"]],
            label=f"policy {run['policy']}: {a['stalls']} stalls >= {args.stall_ms:g} ms "
            f"over their point's median, longest {a['max_stall_ms']:.0f} ms",
        )
    ax.set_yscale("log")
    ax.set_xlabel("point index in the sweep")
    ax.set_ylabel("forward_pass wall ms (main process)")
    ax.set_title("real vLLM engine, tiny model: every point, both arms (pass 1)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    title = f"{VLLM_NAME} ({bc.mode_name(args)}), {bc.cpu_model()}"
    return bc.save_plot(args, fig, VLLM_NAME, title)


def main_vllm(args) -> int:
    mode = bc.mode_name(args)
    settings = VLLM_MODES[mode]
    points = args.points or settings["points"]
    passes = args.passes or settings["passes"]
    args.model_name = args.model_dir or bc.tiny_model_dir(args.vllm_python)
    result = bc.new_result(
        VLLM_NAME,
        mode,
        settings={
            "points": points,
            "passes": passes,
            "stall_ms": args.stall_ms,
            "pause_log_ms": args.pause_log_ms,
            "model": args.model_name,
            "worker_args": bc.VLLM_ARGS,
            "tensor_parallel_size": 1,
            # Untimed collect windows of the freeze arm (full collections, counted in
            # "gen2 in sweep", never in a measured window).
            "maintain_windows_freeze": max(0, (points - 1) // 1000),
            "heap": "vLLM's own in every process (no synthetic heap)",
        },
    )
    runs = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ab_self_benchmark_vllm-") as tmp:
        for pass_index in range(passes):
            for policy in sweep.policies_in_order(pass_index):
                work_dir = bc.run_dir(
                    Path(tmp),
                    f"pass{pass_index}-{policy}",
                    f"pass {pass_index + 1}/{passes}: policy={policy}, {points} points",
                )
                run_began = time.monotonic()
                run = run_vllm_worker(args, policy, points, work_dir, deadline_s=300 + points * 0.5)
                run["run_s"] = time.monotonic() - run_began
                run["pass"] = pass_index
                run["analysis"] = sweep.analyse(run["rows"], args.stall_ms)
                run["analysis"].update(analyse_processes(run, run["analysis"], args.stall_ms))
                runs.append(run)

    print_tables(args, runs)
    result["goal"] = judge(args, runs)
    result["elapsed_s"] = time.monotonic() - began
    path = plot_vllm(args, runs)
    for run in runs:
        run["analysis"]["outlier_indices"] = run["analysis"]["outlier_indices"][:500]
        run["analysis"]["attributed_stalls"] = run["analysis"]["attributed_stalls"][:500]
        del run["rows"]  # the points stay in the run's temp dir; the JSON stays small
        run["pauses"] = run["pauses"][:500]
        del run["log"]
    result["runs"] = runs
    return bc.finish(args, VLLM_NAME, result, path)


def print_tables(args, runs: list[dict]) -> None:
    """One row per run, then one per run and process."""
    table, process_table = [], []
    for policy in sweep.POLICIES:
        for run in [r for r in runs if r["policy"] == policy]:
            a = run["analysis"]
            table.append(
                [
                    policy,
                    run["pass"] + 1,
                    a["points"],
                    a["p50_ms"],
                    a["outliers"],
                    a["stalls"],
                    a["max_wall_ms"],
                    a["max_stall_ms"],
                    "-" if a["index_gap_median"] is None else f"{a['index_gap_median']:.0f}",
                    "-" if a["index_ratio_median"] is None else f"{a['index_ratio_median']:.3f}",
                    a["unattributed_stalls"],
                    a["sweep_s"],
                    run["run_s"],
                ]
            )
            for label, proc in a["processes"].items():
                process_table.append(
                    [
                        policy,
                        run["pass"] + 1,
                        label,
                        proc["tracked_objects"],
                        proc["frozen_objects"],
                        proc["objects_growth_per_point"],
                        proc["gen2_collections_in_sweep"],
                        proc["pauses_in_sweep"],
                        proc["pauses_ge_stall_ms"],
                        proc["max_pause_ms"],
                        proc["stalls_attributed"],
                        proc["pauses_between_points"],
                        proc["max_pause_between_points_ms"],
                    ]
                )
    print(
        bc.format_table(
            [
                "policy",
                "pass",
                "points",
                "p50 ms",
                "outliers",
                f"stalls >= {args.stall_ms:g} ms",
                "max wall ms",
                "longest stall ms",
                "stall gap (median)",
                "stall index ratio (median)",
                "stalls unattributed",
                "sweep s",
                "run s",
            ],
            table,
        )
    )
    print(
        bc.format_table(
            [
                "policy",
                "pass",
                "process",
                "tracked objects",
                "frozen objects",
                "growth/point",
                "gen2 in sweep (incl. maintain)",
                f"pauses in windows (>= {args.pause_log_ms:g} ms)",
                f"pauses in windows >= {args.stall_ms:g} ms",
                "max pause in windows ms",
                "stalls attributed",
                "pauses between points",
                "max between ms",
            ],
            process_table,
        )
    )


def judge(args, runs: list[dict]) -> dict:
    """The goals (issue 12) over all runs and per process; printed, and returned for the JSON."""

    def total(policy: str, key: str) -> float:
        return sum(r["analysis"][key] for r in runs if r["policy"] == policy)

    def longest(policy: str) -> float:
        return max(
            (r["analysis"]["max_stall_ms"] for r in runs if r["policy"] == policy), default=0.0
        )

    per_process = {}
    labels = sorted(
        {label for r in runs for label in r["analysis"]["processes"]},
        key=lambda label: PROCESS_ORDER.index(label) if label in PROCESS_ORDER else 9,
    )
    for label in labels:
        values = {
            policy: [
                r["analysis"]["processes"][label]
                for r in runs
                if r["policy"] == policy and label in r["analysis"]["processes"]
            ]
            for policy in sweep.POLICIES
        }
        off_pauses = sum(p["pauses_ge_stall_ms"] for p in values["off"])
        on_pauses = sum(p["pauses_ge_stall_ms"] for p in values["freeze"])
        off_max = max((p["max_pause_ms"] for p in values["off"]), default=0.0)
        on_max = max((p["max_pause_ms"] for p in values["freeze"]), default=0.0)
        per_process[label] = {
            "pauses_ge_stall_ms_off": off_pauses,
            "pauses_ge_stall_ms_freeze": on_pauses,
            "gen2_in_sweep_off": sum(p["gen2_collections_in_sweep"] for p in values["off"]),
            "gen2_in_sweep_freeze": sum(p["gen2_collections_in_sweep"] for p in values["freeze"]),
            "max_pause_ms_off": off_max,
            "max_pause_ms_freeze": on_max,
            "stalls_met": on_pauses * 10 <= off_pauses,
            "longest_met": on_max * 5 <= off_max,
        }
    stalls_off, stalls_on = total("off", "stalls"), total("freeze", "stalls")
    verdict = {
        "stalls_off": stalls_off,
        "stalls_freeze": stalls_on,
        "stalls_met": stalls_on * 10 <= stalls_off,
        "longest_stall_ms_off": longest("off"),
        "longest_stall_ms_freeze": longest("freeze"),
        "longest_met": longest("freeze") * 5 <= longest("off"),
        "per_process": per_process,
        # A goal met with nothing to beat is not a result: say so.
        "off_had_stalls": stalls_off > 0,
    }
    print(
        f"goal: stalls freeze/off = {stalls_on}/{stalls_off} "
        f"({'met' if verdict['stalls_met'] else 'MISSED'}, goal <= 1/10); longest stall "
        f"freeze/off = {longest('freeze'):.1f}/{longest('off'):.1f} ms "
        f"({'met' if verdict['longest_met'] else 'MISSED'}, goal <= 1/5)"
        + ("" if stalls_off else " -- the off arm had no stall: nothing to compare")
    )
    for label, v in per_process.items():
        print(
            f"  {label}: pauses >= {args.stall_ms:g} ms in measured windows freeze/off = "
            f"{v['pauses_ge_stall_ms_freeze']}/{v['pauses_ge_stall_ms_off']}, gen2 in the "
            f"sweep freeze/off = {v['gen2_in_sweep_freeze']}/{v['gen2_in_sweep_off']}, max "
            f"pause freeze/off = {v['max_pause_ms_freeze']:.1f}/{v['max_pause_ms_off']:.1f} ms"
        )
    return verdict
