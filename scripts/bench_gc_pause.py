#!/usr/bin/env python3
"""Full-collection pause against heap size, stock against frozen, on each CPython 3.10-3.15.

For each interpreter a child process (bare CPython, the project's sources on PYTHONPATH, no
third-party package) builds a synthetic long-lived heap of N tracked objects
(``dynamo.common.utils.synthetic_heap``) and, repetition after repetition, in alternating order:

- ``stock``: times one ``gc.collect()`` over the whole heap (what an automatic gen2 costs);
- ``freeze``: times ``freeze_gc_heap()`` itself (collect + ``gc.freeze()`` + the one
  ``gc.get_freeze_count()`` of its log line), the one-off price paid at start-up;
- ``frozen``: times ``gc.collect()`` with the heap frozen (what a gen2 costs after the freeze),
  then ``gc.unfreeze()`` for the next repetition.

Ratios are per repetition, side by side in one process. Goal (issue 5): frozen < 1% of stock at
1M objects.

    python scripts/bench_gc_pause.py [--quick|--smoke] [--python PATH ...] [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Literal

NAME = "gc_pause"

SIZES = {
    "full": [10_000, 30_000, 100_000, 300_000, 1_000_000, 2_000_000, 5_000_000],
    "quick": [10_000, 100_000, 1_000_000],
    "smoke": [1_000, 10_000],
}
REPS = {"full": 7, "quick": 3, "smoke": 1}
# A frozen collection takes microseconds: time several per repetition and keep the median.
FROZEN_INNER = 9
# After the freeze a full collection walks only what was allocated since: time it also with a
# fixed unfrozen working set (requests in flight), to show it no longer depends on the heap.
LIVE_OBJECTS = {"full": 10_000, "quick": 10_000, "smoke": 1_000}
GOAL_SIZE = 1_000_000
GOAL_FROZEN_PCT = 1.0

# What importing the freeze may pull in beyond the standard library (package __init__ included).
ALLOWED_PROJECT_IMPORTS = {
    "dynamo_gc",
    "dynamo_gc.freeze",
    "dynamo_gc.lifecycle",
}

IMPORT_CHECK = """
import json, sys
before = set(sys.modules)
import dynamo_gc.freeze
added = sorted(set(sys.modules) - before)
stdlib = getattr(sys, "stdlib_module_names", frozenset())
print(json.dumps({
    "project": [m for m in added if m.split(".")[0] in ("dynamo", "dynamo_gc")],
    "third_party": [m for m in added if m.split(".")[0] not in ("dynamo", "dynamo_gc")
                    and m.split(".")[0] not in stdlib and not m.startswith("_")],
}))
"""


# --- child: runs under each interpreter; stdlib, dynamo_gc and dynamo.common.utils only ---------


def measure(sizes: list[int], reps: int, live_objects: int) -> dict:
    import gc
    import logging
    import platform
    import statistics
    import time

    from dynamo.common.utils.synthetic_heap import build_synthetic_heap
    from dynamo_gc.freeze import freeze_gc_heap, last_freeze

    logging.getLogger("dynamo").setLevel(logging.WARNING)  # no freeze INFO line per repetition
    ns = time.perf_counter_ns

    def timed_collect() -> float:
        start = ns()
        gc.collect()
        return (ns() - start) / 1e6

    rows = []
    gc.collect()
    baseline_tracked = len(gc.get_objects())
    for size in sizes:
        heap = build_synthetic_heap(size)
        gc.collect()  # settle: the heap now sits in the oldest generation, like a served heap's
        tracked = len(gc.get_objects())
        gc.disable()  # no automatic collection between the timed ones
        stock, freeze_call, freeze_collect_and_freeze, frozen, frozen_live = [], [], [], [], []
        try:
            for rep in range(reps):
                # Alternate which arm goes first so cache warmth does not favour one of them.
                if rep % 2 == 0:
                    stock.append(timed_collect())
                start = ns()
                frozen_count = freeze_gc_heap(context="bench_gc_pause")
                freeze_call.append((ns() - start) / 1e6)
                record = last_freeze()
                if frozen_count is None or record is None:
                    raise RuntimeError("freeze_gc_heap refused: the bench child is not starting")
                freeze_collect_and_freeze.append(record.took_ms)
                frozen.append(statistics.median(timed_collect() for _ in range(FROZEN_INNER)))
                live = build_synthetic_heap(live_objects)
                frozen_live.append(statistics.median(timed_collect() for _ in range(FROZEN_INNER)))
                del live
                gc.collect()
                gc.unfreeze()
                if rep % 2 == 1:
                    stock.append(timed_collect())
        finally:
            gc.enable()
        ratios = [f / s for f, s in zip(frozen, stock, strict=True)]
        freeze_ratios = [f / s for f, s in zip(freeze_call, stock, strict=True)]
        rows.append(
            {
                "objects": size,
                "tracked": tracked,
                "frozen_count": frozen_count,
                "stock_ms": stock,
                "frozen_ms": frozen,
                "frozen_with_live_ms": frozen_live,
                "freeze_call_ms": freeze_call,
                "freeze_collect_and_freeze_ms": freeze_collect_and_freeze,
                "stock_ms_median": statistics.median(stock),
                "frozen_ms_median": statistics.median(frozen),
                "frozen_with_live_ms_median": statistics.median(frozen_live),
                "freeze_call_ms_median": statistics.median(freeze_call),
                "frozen_over_stock_median": statistics.median(ratios),
                "freeze_call_over_collect_median": statistics.median(freeze_ratios),
            }
        )
        del heap
        gc.collect()
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "baseline_tracked": baseline_tracked,
        "thresholds": list(gc.get_threshold()),
        "live_objects": live_objects,
        "rows": rows,
    }


# --- parent ---------------------------------------------------------------------------------


def run_interpreter(
    python: str, sizes: list[int], reps: int, live_objects: int, timeout_s: float
) -> dict:
    import bench_common as bc

    imports = bc.run_json_child([python, "-c", IMPORT_CHECK], timeout_s=60)
    unexpected = sorted(set(imports["project"]) - ALLOWED_PROJECT_IMPORTS) + imports["third_party"]
    result = bc.run_json_child(
        [
            python,
            __file__,
            "--child",
            "--sizes",
            ",".join(map(str, sizes)),
            "--reps",
            str(reps),
            "--live-objects",
            str(live_objects),
        ],
        timeout_s=timeout_s,
    )
    result["gc_freeze_imports"] = imports
    result["gc_freeze_imports_ok"] = not unexpected
    return result


def plot(args, results: list[dict]):
    import bench_common as bc

    plt = bc.pyplot()
    if plt is None:
        return None
    fig, (pause_ax, cost_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    from matplotlib.lines import Line2D

    # (median's key, marker, line style, label): the line style a Literal, as matplotlib's
    # stubs (3.10+) type it.
    arms: tuple[tuple[str, str, Literal["-", "--", ":"], str | None], ...] = (
        ("stock_ms_median", "o", "-", "stock"),
        ("frozen_ms_median", "s", "--", "frozen"),
        ("frozen_with_live_ms_median", "^", ":", None),
    )
    for index, result in enumerate(results):
        color = f"C{index}"
        x = [row["tracked"] for row in result["rows"]]
        for key, marker, linestyle, _ in arms:
            pause_ax.plot(
                x, [r[key] for r in result["rows"]], marker=marker, linestyle=linestyle, color=color
            )
        cost_ax.plot(
            x,
            [r["freeze_call_over_collect_median"] for r in result["rows"]],
            "o-",
            color=color,
            label=f"CPython {result['python']}",
        )
    # One legend entry per interpreter (colour) and per arm (line style), not their product.
    live = results[0]["live_objects"] if results else 0
    handles = [
        Line2D([], [], color=f"C{i}", label=f"CPython {r['python']}") for i, r in enumerate(results)
    ]
    handles += [
        Line2D(
            [],
            [],
            color="black",
            linestyle=linestyle,
            marker=marker,
            label=label or f"frozen + {live} unfrozen live objects",
        )
        for _, marker, linestyle, label in arms
    ]
    pause_ax.legend(handles=handles, fontsize=7, loc="center left")
    pause_ax.set_xscale("log")
    pause_ax.set_yscale("log")
    pause_ax.set_xlabel("tracked objects in the process")
    pause_ax.set_ylabel("full collection (gc.collect) pause, ms (median)")
    pause_ax.set_title("Full-collection pause vs heap: stock vs frozen")
    pause_ax.grid(True, which="both", alpha=0.3)
    cost_ax.set_xscale("log")
    cost_ax.axhline(1.0, color="grey", lw=0.8)
    cost_ax.set_xlabel("tracked objects in the process")
    cost_ax.set_ylabel("freeze_gc_heap() / bare gc.collect() (median of per-rep ratios)")
    cost_ax.set_title("One-off cost of the start-up freeze")
    cost_ax.grid(True, which="both", alpha=0.3)
    cost_ax.legend(fontsize=7)
    title = (
        f"bench_gc_pause ({bc.mode_name(args)}), {bc.cpu_model()}, "
        f"{bc.machine_info()['nproc']} cores"
    )
    return bc.save_plot(args, fig, NAME, title)


def main(argv: list[str] | None = None) -> int:
    import bench_common as bc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", help="comma-separated heap sizes (overrides the mode's)")
    parser.add_argument("--reps", type=int, help="repetitions per size (overrides the mode's)")
    parser.add_argument("--live-objects", type=int, help="unfrozen working set (overrides)")
    args = bc.parse_interpreter_args(
        parser, argv, "pyenv's CPython 3.10-3.13 and setup_pythons.sh's 3.14 and 3.15"
    )
    mode = bc.mode_name(args)
    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else SIZES[mode]
    reps = args.reps or REPS[mode]
    live_objects = args.live_objects if args.live_objects is not None else LIVE_OBJECTS[mode]

    if args.child:
        print(json.dumps(measure(sizes, reps, live_objects)))
        return 0

    result = bc.new_result(
        NAME,
        mode,
        sizes=sizes,
        reps=reps,
        live_objects=live_objects,
        interpreters=[],
        goal={"objects": GOAL_SIZE, "frozen_over_stock_pct_below": GOAL_FROZEN_PCT},
    )
    result["interpreters"] = bc.measure_each(
        bc.interpreters_to_measure(args),
        lambda python: run_interpreter(python, sizes, reps, live_objects, timeout_s=1800),
    )

    rows = []
    for measured in result["interpreters"]:
        for row in measured["rows"]:
            rows.append(
                [
                    measured["python"],
                    row["objects"],
                    row["tracked"],
                    row["stock_ms_median"],
                    row["frozen_ms_median"],
                    100.0 * row["frozen_over_stock_median"],
                    row["frozen_with_live_ms_median"],
                    row["freeze_call_ms_median"],
                    row["freeze_call_over_collect_median"],
                ]
            )
    print(
        bc.format_table(
            [
                "python",
                "objects",
                "tracked",
                "stock ms",
                "frozen ms",
                "frozen/stock %",
                f"frozen+{live_objects} live ms",
                "freeze_gc_heap ms",
                "freeze/collect x",
            ],
            rows,
        )
    )
    verdicts = []
    for measured in result["interpreters"]:
        if not measured["gc_freeze_imports_ok"]:
            print(
                f"WARNING: on {measured['python']} importing dynamo_gc.freeze pulled in "
                f"{measured['gc_freeze_imports']}",
                file=sys.stderr,
            )
        at_goal = [r for r in measured["rows"] if r["objects"] == GOAL_SIZE]
        if at_goal:
            pct = 100.0 * at_goal[0]["frozen_over_stock_median"]
            verdicts.append(
                {
                    "python": measured["python"],
                    "frozen_over_stock_pct": pct,
                    "met": pct < GOAL_FROZEN_PCT,
                }
            )
            print(
                f"goal on {measured['python']}: frozen/stock at 1M = {pct:.2g}% "
                f"({'met' if pct < GOAL_FROZEN_PCT else 'MISSED'}, goal < {GOAL_FROZEN_PCT}%)"
            )
    result["goal"]["verdicts"] = verdicts
    return bc.finish(args, NAME, result, plot(args, result["interpreters"]))


if __name__ == "__main__":
    sys.exit(main())
