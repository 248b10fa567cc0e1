"""One worker's self-benchmark sweep, run to its end, and the analysis of its points.

The worker (``python -m dynamo.vllm ... --self-benchmark-points N --self-benchmark-output F``)
measures its points, logs ``Self-benchmark done``, then would go on to register and serve: it is
stopped there. ab_self_benchmark.py (the mock engine) and ab_self_benchmark_vllm.py (the real
one) share this.
"""

from __future__ import annotations

import re
import sys
from itertools import pairwise
from pathlib import Path

import bench_common as bc
from launcher_process import LauncherProcess

POLICIES = ("off", "freeze")
OUTLIER_FACTOR = 3.0
PAUSE_LINE = re.compile(rb"GC gen(\d) pause ([0-9.]+) ms")
DONE_LINE = re.compile(rb"Self-benchmark done: (.*)")
START_LINE = b"Self-benchmark:"
SWEEP_POLL_S = 0.2  # the worker's log grows with the sweep: read it now and then


def policies_in_order(step: int) -> tuple[str, ...]:
    """Both policies for the ``step``-th pair of runs: ``off`` first, then last, alternately."""
    return POLICIES if step % 2 == 0 else tuple(reversed(POLICIES))


def run_until_sweep_done(
    name: str,
    args: list[str],
    work_dir: Path,
    *,
    deadline_s: float,
    stop_s: float,
    python: str = sys.executable,
    extra_env: dict[str, str] | None = None,
) -> bytes:
    """Run ``python -m dynamo.vllm ARGS`` (the project's sources first on its path, plus
    ``extra_env``) until it logs ``Self-benchmark done``, then stop it with SIGTERM; its log
    (``work_dir/<name>.log``), as bytes."""
    worker = LauncherProcess(
        name,
        "dynamo.vllm",
        args,
        log_dir=work_dir,
        env=bc.child_env(extra_env),
        python=python,
        cwd=bc.REPO_ROOT,
    )
    try:
        worker.wait_for_log(DONE_LINE.pattern.decode(), deadline_s=deadline_s, poll_s=SWEEP_POLL_S)
    finally:
        worker.stop(stop_s)
    return worker.log_bytes()


def done_summary(log: bytes) -> str:
    """The worker's own one-line summary of its sweep (after ``Self-benchmark done:``)."""
    done = DONE_LINE.search(log)
    assert done is not None, "run_until_sweep_done returns only once the line is there"
    return done.group(1).decode(errors="replace")


def sweep_log(log: bytes, *, with_done_line: bool) -> bytes:
    """The part of the log written during the sweep (with or without its last line)."""
    done = DONE_LINE.search(log)
    assert done is not None, "run_until_sweep_done returns only once the line is there"
    return log[log.index(START_LINE) : done.end() if with_done_line else done.start()]


def analyse(rows: list[dict], stall_ms: float) -> dict:
    by_point: dict[tuple[int, int], list[float]] = {}
    for row in rows:
        by_point.setdefault((row["batch"], row["seq"]), []).append(row["wall_ms"])
    medians = {point: bc.median(values) for point, values in by_point.items()}
    outliers = []
    for row in rows:
        median = medians[(row["batch"], row["seq"])]
        if row["wall_ms"] > OUTLIER_FACTOR * median:
            outliers.append(
                {
                    "index": row["point"],
                    "wall_ms": row["wall_ms"],
                    "point_median_ms": median,
                    "excess_ms": row["wall_ms"] - median,
                }
            )
    indices = [o["index"] for o in outliers]
    # Spacing of the stalls (not of every outlier: sub-millisecond points also fail the 3x test
    # on a scheduler hiccup, which has no pattern and would hide the collector's).
    stall_indices = [o["index"] for o in outliers if o["excess_ms"] >= stall_ms]
    ratios = [b / a for a, b in pairwise(stall_indices) if a > 0]
    gaps = [b - a for a, b in pairwise(stall_indices)]
    walls = [row["wall_ms"] for row in rows]
    return {
        "points": len(rows),
        "p50_ms": bc.median(walls),
        "max_wall_ms": max(walls) if walls else float("nan"),
        "outliers": len(outliers),
        "outlier_pct": 100.0 * len(outliers) / len(rows) if rows else float("nan"),
        "max_stall_ms": max((o["excess_ms"] for o in outliers), default=0.0),
        # Outliers whose stall is long enough to be a collection, not the scheduler: on two
        # shared cores with the worker and its ranks busy, sub-millisecond points get
        # 1-4 ms hiccups that pass the 3x test without any GC involved.
        "stalls": len(stall_indices),
        "stall_indices": stall_indices,
        "outlier_indices": indices,
        "top_outliers": sorted(outliers, key=lambda o: -o["excess_ms"])[:20],
        "index_ratio_median": bc.median(ratios) if ratios else None,
        "index_gap_median": bc.median(gaps) if gaps else None,
        "sweep_s": sum(walls) / 1000.0,
    }
