#!/usr/bin/env python3
"""The full-collection hold of serving-time maintenance, measured on each CPython.

While maintenance serves, ``dynamo_gc.full_collection_hold.FullCollectionHold`` holds CPython's
automatic full collections off (the third threshold at GEN2_NEVER), and the trigger's held mode
(``MaintenanceTrigger.look_held`` / ``held_walk_s``) estimates from counters alone how long the
heap grown since the last maintenance would take to walk. This script measures, per interpreter,
what that costs and how good the estimate is, on a synthetic heap.

Two children per interpreter (bare CPython, the project's sources on PYTHONPATH), one per arm,
so that each arm's RSS is its own: ``held`` (the hold taken) and ``not_held`` (stock
thresholds). Each builds a synthetic start-up heap, freezes it as a launcher does, runs the
settling pass, marks itself serving and grows the way ``--mock-heap-growth 1000
--mock-heap-evict-percent 50`` grows a worker (entries of 1,000 tracked objects in one
reference cycle, half of them kept, half cached until evicted, which makes them cyclic garbage
only a full collection frees; short-lived request garbage beside them). Growth is counted in
requests (deterministic), in rounds of k "cycles" (threshold0 x threshold1 x (threshold2 + 1)
net allocations: the growth after which CPython could run its next full collection). Each round
ends in a maintenance as the maintainer runs it (``maintain_gc_heap`` in a maintenance window),
whose collection's time teaches the trigger one cycle's walk the way the maintainer does
(collect time over the cycles since the last maintenance). The first round (``1 boot``) is
estimated by the bootstrap, before any cycle is measured; then, for k = 1, 2, 4, 8, a round of k
cycles after rounds of half as many (``k after k/2``: growth speeding up) and one after a round
of its own size (``k``: a maintainer that maintains every k cycles).

Per round and arm: the automatic full collections while serving, the longest young (gen0/gen1)
pause, the held estimate (learned, and the bootstrap's for comparison) against the measured
collection, what that collection collected (the cyclic garbage the hold deferred), the unfrozen
tracked objects and RSS before it. And the threshold and count semantics the hold relies on.

    python scripts/bench_gc_hold.py [--quick|--smoke] [--python PATH ...] [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "gc_hold"
ARMS = ("not_held", "held")
START_OBJECTS = {"full": 1_000_000, "quick": 300_000, "smoke": 10_000}
# Groups of rounds, each round (label, cycles of growth) ending in a maintenance. The first
# round is estimated by the bootstrap; in each later group the first round comes after smaller
# ones (the estimate lags a growth that speeds up), the second after one of its own size (the
# steady state of a maintainer maintaining every k cycles). Between groups the grown entries are
# dropped (unfreeze, collect, freeze, settle: outside the measurement), to bound the memory.
GROUPS = {
    "full": (
        (("1 boot", 1),),
        (("1 after 1", 1), ("1", 1)),
        (("2 after 1", 2), ("2", 2)),
        (("4 after 2", 4), ("4", 4)),
        (("8 after 4", 8), ("8", 8)),
    ),
    "smoke": ((("1 boot", 1),), (("1 after 1", 1), ("1", 1)), (("2 after 1", 2), ("2", 2))),
}
GROUPS["quick"] = GROUPS["full"]
PER_REQUEST = 1_000  # tracked objects per entry, as --mock-heap-growth 1000
EVICT_PERCENT = 50  # as the soak's workload: half the entries become cyclic garbage
EVICTING_OBJECTS = 20_000  # the evicting cache's size: garbage comes within the first cycle
CHURN = 50  # short-lived objects per request beside it
BUDGET_MS = 50.0  # the options' default pause budget (due at half of it)


def _rss_bytes() -> int:
    import os

    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_arm(arm: str, mode: str) -> dict:
    """One child: the start-up freeze, then the rounds of growth and maintenance."""
    import gc
    import math
    import platform

    from dynamo.common.utils.synthetic_heap import build_synthetic_heap
    from dynamo.vllm.mock_growth import RequestStateCache
    from dynamo_gc import lifecycle
    from dynamo_gc.freeze import freeze_gc_heap, last_freeze
    from dynamo_gc.full_collection_hold import FullCollectionHold
    from dynamo_gc.gc_builds import GEN2_NEVER
    from dynamo_gc.maintenance import maintain_gc_heap, settle_after_freeze
    from dynamo_gc.maintenance_trigger import MaintenanceTrigger
    from dynamo_gc.pause_logger import GcPauseLogger

    stock = tuple(gc.get_threshold())
    gc.collect()
    lifecycle.reset_for_new_process()
    heap = build_synthetic_heap(START_OBJECTS[mode])
    freeze_gc_heap(context="start-up")
    settle_after_freeze()
    trigger = MaintenanceTrigger(BUDGET_MS)
    trigger.calibrate_from_freeze(last_freeze())
    boot = MaintenanceTrigger(BUDGET_MS)  # the bootstrap alone, never taught a cycle
    boot.objects_per_s = trigger.objects_per_s
    young, middle, third = stock
    cycle_requests = math.ceil(young * middle * (third + 1) / PER_REQUEST)

    stats = {"full": 0, "young_max_ms": 0.0, "young": 0, "young_total_ms": 0.0}

    def on_collection(generation: int, seconds: float, info: dict) -> None:
        trigger.on_collection(generation, seconds, info)
        if lifecycle.current_phase() is not lifecycle.Phase.SERVING:
            return
        if generation == 2:
            stats["full"] += 1
        else:
            stats["young"] += 1
            stats["young_total_ms"] += seconds * 1e3
            stats["young_max_ms"] = max(stats["young_max_ms"], seconds * 1e3)

    hold = FullCollectionHold("bench")
    semantics: dict = {"stock": list(stock)}
    if arm == "held":
        semantics["taken"] = hold.take()
        semantics["held_thresholds"] = list(gc.get_threshold())
    logger = GcPauseLogger(0, on_collection=on_collection)
    gc.callbacks.append(logger)
    lifecycle.mark_serving("bench")
    caches = [RequestStateCache(PER_REQUEST, EVICT_PERCENT, EVICTING_OBJECTS)]
    rounds = []

    def grow_and_maintain(label: str, cycles: int) -> dict:
        stats.update(full=0, young_max_ms=0.0, young=0, young_total_ms=0.0)
        rss_before = _rss_bytes()
        cache = caches[0]
        for _ in range(cycles * cycle_requests):
            cache.add()
            garbage = [{"t": [i]} for i in range(CHURN // 2)]
            del garbage
        passes = gc.get_count()[2]
        threshold = hold.threshold()
        row = {
            "round": label,
            "cycles": cycles,
            "requests": cycles * cycle_requests,
            "full_collections": stats["full"],
            "young_collections": stats["young"],
            "young_max_ms": stats["young_max_ms"],
            "young_total_ms": stats["young_total_ms"],
            "young_passes": passes,
            "estimate_ms": _ms(trigger.held_walk_s(passes, threshold)),
            "bootstrap_ms": _ms(boot.held_walk_s(passes, threshold)),
            "cycle_walk_ms_before": _ms(trigger.cycle_walk_s),
            "rss_grown_bytes": _rss_bytes() - rss_before,
            "unfrozen_before": len(gc.get_objects()),
        }
        trigger.maintaining_candidates = None
        with lifecycle.maintenance_window("ahead", lambda: 0) as window:
            record = maintain_gc_heap(window, context="bench")
        assert record is not None
        # As GcMaintainer._learn: the rate (3.15: the collector's candidates), one cycle.
        trigger.calibrate(trigger.maintaining_candidates, record.collect_ms / 1000.0)
        trigger.maintained(
            record.collect_ms / 1000.0, trigger.cycles_since_maintained(passes, threshold)
        )
        row.update(
            collect_ms=record.collect_ms,
            collected=record.collected,
            maintaining_candidates=trigger.maintaining_candidates,
            objects_per_ms_after=(trigger.objects_per_s or 0.0) / 1e3,
        )
        return row

    def drop_grown() -> None:
        # Outside the measurement (a window: the callbacks do not count it, nothing is learnt).
        with lifecycle.maintenance_window("bench-reset", lambda: 0):
            gc.unfreeze()
            caches[0] = RequestStateCache(PER_REQUEST, EVICT_PERCENT, EVICTING_OBJECTS)
            gc.collect()
            gc.freeze()
            settle_after_freeze()

    try:
        for group in GROUPS[mode]:
            drop_grown()
            for label, cycles in group:
                rounds.append(grow_and_maintain(label, cycles))
                if arm == "held":
                    passes = rounds[-1]["young_passes"]
                    semantics["max_passes"] = max(semantics.get("max_passes", 0), passes)
    finally:
        gc.callbacks.remove(logger)
        lifecycle.reset_for_new_process()
        if arm == "held":
            semantics["still_held"] = list(gc.get_threshold()) == [young, middle, GEN2_NEVER]
            hold.give_back()
            semantics["given_back"] = list(gc.get_threshold())
            semantics["restored_exactly"] = tuple(gc.get_threshold()) == stock
    gc.unfreeze()
    caches.clear()
    del heap
    gc.collect()
    return {
        "python": platform.python_version(),
        "arm": arm,
        "thresholds": list(stock),
        "hold_unavailable": hold.unavailable,
        "cycle_objects": young * middle * (third + 1),
        "cycle_requests": cycle_requests,
        "objects_per_ms_calibrated": (boot.objects_per_s or 0.0) / 1e3,
        "rounds": rounds,
        "semantics": semantics,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _accuracy_rows(measured: list[dict]) -> list[list]:
    rows = []
    for m in measured:
        held, stock = m["held"], m["not_held"]
        for h, s in zip(held["rounds"], stock["rounds"], strict=True):
            learned = h["estimate_ms"] / h["collect_ms"] if h["round"] != "1 boot" else None
            rows.append(
                [
                    m["python"],
                    h["round"],
                    f"{s['full_collections']} / {h['full_collections']}",
                    f"{s['young_max_ms']:.1f} / {h['young_max_ms']:.1f}",
                    f"{s['young_total_ms']:.0f} / {h['young_total_ms']:.0f}",
                    h["collect_ms"],
                    h["estimate_ms"],
                    learned if learned is not None else "-",
                    h["bootstrap_ms"] / h["collect_ms"],
                    f"{s['collected']} / {h['collected']}",
                    f"{s['unfrozen_before']} / {h['unfrozen_before']}",
                    f"{s['rss_grown_bytes'] / 2**20:.0f} / {h['rss_grown_bytes'] / 2**20:.0f}",
                ]
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    import bench_common as bc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    args = bc.parse_interpreter_args(
        parser, argv, "pyenv's CPython 3.10-3.13 and setup_pythons.sh's 3.14, 3.15"
    )
    mode = bc.mode_name(args)
    if args.child:
        print(json.dumps(run_arm(args.arm, mode)))
        return 0
    child = [__file__, "--child", *([] if mode == "full" else [f"--{mode}"])]
    measured = bc.measure_each(
        bc.interpreters_to_measure(args),
        lambda python: {
            arm: bc.run_json_child([python, *child, "--arm", arm], timeout_s=1800) for arm in ARMS
        },
    )
    for m in measured:
        m["python"] = m["held"]["python"]
    print(
        bc.format_table(
            [
                "python",
                "round (cycles)",
                "full collections (stock / held)",
                "longest young ms (stock / held)",
                "all young ms (stock / held)",
                "held: collect ms",
                "estimate ms",
                "estimate / collect",
                "bootstrap / collect",
                "collected (stock / held)",
                "unfrozen objects (stock / held)",
                "RSS grown MiB (stock / held)",
            ],
            _accuracy_rows(measured),
        )
    )
    print()
    print(
        bc.format_table(
            [
                "python",
                "thresholds",
                "held as",
                "gc.get_count()[2] held (max)",
                "given back",
                "exact",
            ],
            [
                [
                    m["python"],
                    str(tuple(m["held"]["thresholds"])),
                    str(tuple(m["held"]["semantics"].get("held_thresholds", ()))) or "-",
                    m["held"]["semantics"].get("max_passes", "-"),
                    str(tuple(m["held"]["semantics"].get("given_back", ()))),
                    m["held"]["semantics"].get("restored_exactly", False),
                ]
                for m in measured
            ],
        )
    )
    result = bc.new_result(
        NAME,
        mode,
        start_objects=START_OBJECTS[mode],
        per_request=PER_REQUEST,
        evict_percent=EVICT_PERCENT,
        evicting_objects=EVICTING_OBJECTS,
        budget_ms=BUDGET_MS,
        interpreters=measured,
    )
    return bc.finish(args, NAME, result, None)


if __name__ == "__main__":
    sys.exit(main())
