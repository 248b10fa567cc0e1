#!/usr/bin/env python3
"""A/B of the self-benchmark's GC policy: the worker's own sweep, policy off against freeze.

Each run is a real ``python -m dynamo.vllm --engine mock`` with ``--self-benchmark-points N``,
``--self-benchmark-output F`` and ``--fpm-gc-policy off|freeze``, with one rank process
(``--tensor-parallel-size 1``) or two in lockstep (``2``), the same points in the same seeded
order in every run, and the same synthetic start-up heap in the worker's main process. The run
ends when the worker logs ``Self-benchmark done``; it is then stopped with SIGTERM (it would go
on to register and serve). Runs alternate (``off freeze`` then ``freeze off``) ``--passes``
times.

Per run, from the JSON lines the worker wrote (one per point, its wall time):

- outliers: samples slower than 3x the median of the same (batch, seq) point (the worker's own
  definition), and their indices;
- the longest stall: the largest ``wall - point median`` (a pause inside a measured window);
- stalls: outliers at least ``--stall-ms`` over their point's median (a collection, not a
  scheduler hiccup), and their spacing: median ratio of successive indices (a geometric ladder,
  as CPython's 25% rule gives when the long-lived heap grows, has a ratio ~1.2) and median
  difference (a periodic pattern has a constant difference);
- the main process's GC pauses its pause logger reported during the sweep.

Goal (issue 5): policy on has at most a tenth of the off arm's outliers.

With ``--engine vllm`` each run is the real worker on the tiny random model, no synthetic heap
anywhere (scripts/ab_self_benchmark_vllm.py says what it measures on top). Both modes run and
analyse their sweeps with scripts/self_benchmark_sweep.py.

    python scripts/ab_self_benchmark.py [--quick|--smoke] [--points N] [--out DIR] [--publish]
    python scripts/ab_self_benchmark.py --engine vllm [--quick|--smoke] [--points N] [--passes N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import bench_common as bc
import self_benchmark_sweep as sweep
from ab_self_benchmark_vllm import main_vllm

NAME = "ab_self_benchmark"

MODES: dict[str, dict[str, Any]] = {
    # 30,480 points: the size of the published sweep.
    "full": {"points": 30_480, "passes": 2, "heap": 800_000, "ranks": (1, 2)},
    "quick": {"points": 3_000, "passes": 1, "heap": 800_000, "ranks": (1, 2)},
    "smoke": {"points": 120, "passes": 1, "heap": 10_000, "ranks": (1,)},
}


def run_worker(
    policy: str,
    ranks: int,
    points: int,
    heap: int,
    pause_log_ms: float,
    work_dir: Path,
    deadline_s: float,
) -> dict:
    output = work_dir / f"points-{policy}-tp{ranks}.jsonl"
    log_bytes = sweep.run_until_sweep_done(
        f"worker-{policy}-tp{ranks}",
        [
            "--engine", "mock",
            "--model", bc.tiny_tokenizer_dir(), "--served-model-name", "self-bench",
            "--discovery-dir", str(work_dir / "discovery"), "--request-plane-host", "127.0.0.1",
            "--mock-heap-objects", str(heap),
            "--gc-pause-log-ms", str(pause_log_ms),
            "--self-benchmark-points", str(points), "--self-benchmark-output", str(output),
            "--fpm-gc-policy", policy,
            "--tensor-parallel-size", str(ranks),
        ],
        work_dir,
        deadline_s=deadline_s,
        stop_s=60,
    )  # fmt: skip
    during = sweep.sweep_log(log_bytes, with_done_line=False)
    rows = [json.loads(line) for line in output.read_text().splitlines() if line.strip()]
    return {
        "policy": policy,
        "ranks": ranks,
        "rows": rows,
        "worker_summary": sweep.done_summary(log_bytes),
        "main_pauses": [
            {"generation": int(g), "ms": float(ms)} for g, ms in sweep.PAUSE_LINE.findall(during)
        ],
    }


def plot(args, runs: list[dict]):
    plt = bc.pyplot()
    if plt is None:
        return None
    ranks = sorted({run["ranks"] for run in runs})
    fig, axes = plt.subplots(1, len(ranks), figsize=(7 * len(ranks), 4.6), squeeze=False)
    colors = {"off": "C3", "freeze": "C0"}
    for ax, tp in zip(axes[0], ranks, strict=True):
        for run in [r for r in runs if r["ranks"] == tp and r["pass"] == 0]:
            analysis = run["analysis"]
            idx = analysis["outlier_indices"]
            walls = {row["point"]: row["wall_ms"] for row in run["rows"]}
            ax.scatter(
                idx,
                [walls[i] for i in idx],
                s=12,
                color=colors[run["policy"]],
                label=f"policy {run['policy']}: {analysis['outliers']} outliers",
            )
        if any(r["analysis"]["outliers"] for r in runs if r["ranks"] == tp):
            ax.set_yscale("log")  # an empty log axis makes tight_layout fail (smoke runs)
        ax.set_xlabel("point index in the sweep")
        ax.set_ylabel("wall ms of outlier samples (> 3x their point's median)")
        ax.set_title(f"tensor-parallel-size {tp} (pass 1)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    title = f"ab_self_benchmark ({bc.mode_name(args)}), {bc.cpu_model()}"
    return bc.save_plot(args, fig, NAME, title)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, help="points per sweep (default: the mode's)")
    parser.add_argument("--passes", type=int, help="passes over off/freeze (alternating order)")
    parser.add_argument("--heap-objects", type=int, help="synthetic heap of the worker process")
    parser.add_argument("--tensor-parallel-sizes", help="comma-separated, default 1,2")
    parser.add_argument(
        "--stall-ms",
        type=float,
        default=5.0,
        help="an outlier this much over its point's median is also a stall",
    )
    parser.add_argument(
        "--pause-log-ms",
        type=float,
        default=5.0,
        help="the worker's --gc-pause-log-ms (with --engine vllm: every process's pauses)",
    )
    args = bc.parse_ab_args(parser, argv)
    bc.exit_cleanly_on_sigterm()
    if args.engine == "vllm":
        for name in ("heap_objects", "tensor_parallel_sizes"):
            if getattr(args, name) is not None:
                parser.error(
                    f"--{name.replace('_', '-')} is for --engine mock (the real engine "
                    "runs vLLM's own heaps, tensor-parallel-size 1)"
                )
        return main_vllm(args)
    return main_mock(args)


def main_mock(args) -> int:
    mode = bc.mode_name(args)
    settings = MODES[mode]
    points = args.points or settings["points"]
    passes = args.passes or settings["passes"]
    heap = args.heap_objects if args.heap_objects is not None else settings["heap"]
    tp_sizes = (
        [int(v) for v in args.tensor_parallel_sizes.split(",")]
        if args.tensor_parallel_sizes
        else list(settings["ranks"])
    )

    result = bc.new_result(
        NAME,
        mode,
        settings={
            "points": points,
            "passes": passes,
            "heap_objects": heap,
            "stall_ms": args.stall_ms,
            "tensor_parallel_sizes": tp_sizes,
            "pause_log_ms": args.pause_log_ms,
        },
        runs=[],
    )
    runs = []
    with tempfile.TemporaryDirectory(prefix="ab_self_benchmark-") as tmp:
        step = 0
        for pass_index in range(passes):
            for tp in tp_sizes:
                order = sweep.policies_in_order(step)
                step += 1
                for policy in order:
                    work_dir = bc.run_dir(
                        Path(tmp),
                        f"pass{pass_index}-tp{tp}-{policy}",
                        f"pass {pass_index + 1}/{passes}: tp={tp} policy={policy}",
                    )
                    run = run_worker(
                        policy,
                        tp,
                        points,
                        heap,
                        args.pause_log_ms,
                        work_dir,
                        deadline_s=60 + points * 0.05,
                    )
                    run["pass"] = pass_index
                    run["analysis"] = sweep.analyse(run["rows"], args.stall_ms)
                    runs.append(run)

    result["goal"] = {"verdicts": report(args, runs, tp_sizes)}
    path = plot(args, runs)
    for run in runs:
        run["analysis"]["outlier_indices"] = run["analysis"]["outlier_indices"][:500]
        del run["rows"]  # the points themselves stay in the run's temp dir; JSON stays small
    result["runs"] = runs
    return bc.finish(args, NAME, result, path)


def report(args, runs: list[dict], tp_sizes: list[int]) -> list[dict]:
    """Print one row per run and the goal per tensor-parallel size (issue 5); the verdicts."""
    table, verdicts = [], []
    for tp in tp_sizes:
        for policy in sweep.POLICIES:
            for run in [r for r in runs if r["ranks"] == tp and r["policy"] == policy]:
                a = run["analysis"]
                main_pauses = run["main_pauses"]
                table.append(
                    [
                        tp,
                        policy,
                        run["pass"] + 1,
                        a["points"],
                        a["p50_ms"],
                        a["outliers"],
                        a["outlier_pct"],
                        a["stalls"],
                        a["max_wall_ms"],
                        a["max_stall_ms"],
                        "-" if a["index_gap_median"] is None else f"{a['index_gap_median']:.0f}",
                        "-"
                        if a["index_ratio_median"] is None
                        else f"{a['index_ratio_median']:.3f}",
                        len(main_pauses),
                        max((p["ms"] for p in main_pauses), default=0.0),
                    ]
                )
        off = sum(
            r["analysis"]["outliers"] for r in runs if r["ranks"] == tp and r["policy"] == "off"
        )
        on = sum(
            r["analysis"]["outliers"] for r in runs if r["ranks"] == tp and r["policy"] == "freeze"
        )
        stalls_off = sum(
            r["analysis"]["stalls"] for r in runs if r["ranks"] == tp and r["policy"] == "off"
        )
        stalls_on = sum(
            r["analysis"]["stalls"] for r in runs if r["ranks"] == tp and r["policy"] == "freeze"
        )
        verdicts.append(
            {
                "tensor_parallel_size": tp,
                "outliers_off": off,
                "outliers_freeze": on,
                "freeze_over_off": bc.ratio(on, off),
                "met": on * 10 <= off,
                "stalls_off": stalls_off,
                "stalls_freeze": stalls_on,
            }
        )
    print(
        bc.format_table(
            [
                "tp",
                "policy",
                "pass",
                "points",
                "p50 ms",
                "outliers",
                "outliers %",
                f"stalls >= {args.stall_ms:g} ms",
                "max wall ms",
                "max stall ms",
                "stall gap (median)",
                "stall index ratio (median)",
                f"main pauses>={args.pause_log_ms:g}ms",
                "max main pause ms",
            ],
            table,
        )
    )
    for verdict in verdicts:
        print(
            f"goal tp={verdict['tensor_parallel_size']}: outliers freeze/off = "
            f"{verdict['outliers_freeze']}/{verdict['outliers_off']} "
            f"({'met' if verdict['met'] else 'MISSED'}, goal <= 1/10); stalls >= "
            f"{args.stall_ms:g} ms freeze/off = {verdict['stalls_freeze']}/{verdict['stalls_off']}"
        )
    return verdicts


if __name__ == "__main__":
    sys.exit(main())
