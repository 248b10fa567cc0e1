#!/usr/bin/env python3
"""What the serving-time maintenance's trigger sees on each CPython, and what its steps cost.

One child per interpreter (bare CPython, the project's sources on PYTHONPATH) builds a
synthetic start-up heap of N objects, freezes it as a launcher does, marks itself serving, and
then grows the way ``--mock-heap-growth`` grows a worker (entries of 1,000 tracked objects, one
reference cycle each, with short-lived request garbage beside them) to 2N objects. The layer's
own pause logger and trigger watch every collection, as in a launcher. Twice:

- ``settled``: the start-up freeze followed by the settling full collection the maintenance
  runs (``dynamo_gc.maintenance.settle_after_freeze``), so CPython's 25% rule counts from the
  unfrozen heap;
- ``unsettled``: the start-up freeze alone (``--gc-maintenance off`` today).

Per arm: the serving full collections (when they came, in objects grown since the freeze; the
pause our callback measured), the trigger's estimate of the unfrozen heap at each against what
had grown (the rate calibrated from the start-up freeze's own collection; 3.15: the collector's
``candidates``). Then, on the grown heap, the steps a maintenance takes or avoids: counting the
unfrozen heap (``len(gc.get_objects())``), counting the frozen one (``gc.get_freeze_count()``),
the maintenance itself (collect + freeze + settle), and a reclaiming one (the whole heap).

    python scripts/bench_gc_maintenance.py [--quick|--smoke] [--python PATH ...] [--out DIR]
                                           [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "gc_maintenance"
START_OBJECTS = {"full": 1_000_000, "quick": 300_000, "smoke": 10_000}
PER_REQUEST = 1_000  # tracked objects an entry keeps, as --mock-heap-growth 1000
CHURN = 50  # short-lived objects per request beside it


def _grow(arm: str, start_objects: int) -> dict:
    import gc
    import statistics
    import time

    from dynamo.common.utils.synthetic_heap import build_synthetic_heap
    from dynamo.vllm.mock_growth import request_entry
    from dynamo_gc import lifecycle
    from dynamo_gc.freeze import freeze_gc_heap, last_freeze
    from dynamo_gc.maintenance import maintain_gc_heap, settle_after_freeze
    from dynamo_gc.maintenance_trigger import MaintenanceTrigger
    from dynamo_gc.pause_logger import GcPauseLogger

    gc.collect()
    lifecycle.reset_for_new_process()
    heap = build_synthetic_heap(start_objects)
    freeze_gc_heap(context="start-up")
    if arm == "settled":
        settle_after_freeze()
    trigger = MaintenanceTrigger(1e9)  # never due: only its estimate is read
    trigger.calibrate_from_freeze(last_freeze())
    grown = 0
    passes: list[dict] = []

    def on_collection(generation: int, seconds: float, info: dict) -> None:
        trigger.on_collection(generation, seconds, info)
        if generation == 2:
            passes.append(
                {
                    "grown": grown,
                    "pause_ms": seconds * 1e3,
                    "estimate": trigger.unfrozen_estimate(),
                    "candidates": info.get("candidates"),
                }
            )

    logger = GcPauseLogger(0, on_collection=on_collection)
    gc.callbacks.append(logger)
    lifecycle.mark_serving("bench")
    kept = []
    try:
        while grown < 2 * start_objects:
            kept.append(request_entry(PER_REQUEST))
            grown += PER_REQUEST
            garbage = [{"t": [i]} for i in range(CHURN // 2)]
            del garbage
    finally:
        gc.callbacks.remove(logger)
    errors = [p["estimate"] / p["grown"] for p in passes if p["estimate"] and p["grown"]]
    result: dict = {
        "passes": passes,
        "first_pass_grown": passes[0]["grown"] if passes else None,
        "max_pause_ms": max((p["pause_ms"] for p in passes), default=None),
        "estimate_over_grown_median": statistics.median(errors) if errors else None,
        "objects_per_ms_calibrated": (trigger.objects_per_s or 0) / 1e3,
    }
    if arm == "settled":
        began = time.perf_counter()
        unfrozen = len(gc.get_objects())
        result["count_unfrozen"] = {"objects": unfrozen, "ms": (time.perf_counter() - began) * 1e3}
        began = time.perf_counter()
        frozen = gc.get_freeze_count()
        result["count_frozen"] = {"objects": frozen, "ms": (time.perf_counter() - began) * 1e3}
        with lifecycle.maintenance_window("bench", lambda: 0) as window:
            plain = maintain_gc_heap(window, context="bench")
        with lifecycle.maintenance_window("bench", lambda: 0) as window:
            whole = maintain_gc_heap(window, context="bench", reclaim=True)
        assert plain is not None and whole is not None
        result["maintenance"] = {"objects": unfrozen, "took_ms": plain.took_ms}
        result["reclaim"] = {"objects": unfrozen + frozen, "reclaim_ms": whole.reclaim_ms}
    gc.unfreeze()
    del kept, heap
    lifecycle.reset_for_new_process()
    return result


def measure(start_objects: int) -> dict:
    import gc
    import platform

    return {
        "python": platform.python_version(),
        "thresholds": list(gc.get_threshold()),
        "start_objects": start_objects,
        "settled": _grow("settled", start_objects),
        "unsettled": _grow("unsettled", start_objects),
    }


def _per_million(step: dict, key: str) -> float:
    return step[key] * 1_000_000 / step["objects"] if step["objects"] else 0.0


def main(argv: list[str] | None = None) -> int:
    import bench_common as bc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = bc.parse_interpreter_args(
        parser, argv, "pyenv's CPython 3.10-3.13 and setup_pythons.sh's 3.14, 3.15"
    )
    mode = bc.mode_name(args)
    if args.child:
        print(json.dumps(measure(START_OBJECTS[mode])))
        return 0
    measured = bc.measure_children(args, __file__)
    trigger_rows, cost_rows = [], []
    for m in measured:
        for arm in ("settled", "unsettled"):
            a = m[arm]
            candidates = [p["candidates"] for p in a["passes"] if p["candidates"]]
            trigger_rows.append(
                [
                    m["python"],
                    str(tuple(m["thresholds"])),
                    arm,
                    len(a["passes"]),
                    a["first_pass_grown"] or "-",
                    a["passes"][0]["pause_ms"] if a["passes"] else "-",
                    a["max_pause_ms"] or "-",
                    a["objects_per_ms_calibrated"],
                    a["estimate_over_grown_median"] or "-",
                    "yes" if candidates else "-",
                ]
            )
        s = m["settled"]
        cost_rows.append(
            [
                m["python"],
                _per_million(s["count_unfrozen"], "ms"),
                _per_million(s["count_frozen"], "ms"),
                _per_million(s["maintenance"], "took_ms"),
                _per_million(s["reclaim"], "reclaim_ms"),
            ]
        )
    print(
        bc.format_table(
            [
                "python",
                "thresholds",
                "arm",
                "full passes",
                "1st at grown",
                "1st ms",
                "max ms",
                "calibrated obj/ms",
                "estimate/grown",
                "candidates",
            ],
            trigger_rows,
        )
    )
    print()
    print(
        bc.format_table(
            [
                "python",
                "count unfrozen ms/1M",
                "get_freeze_count ms/1M",
                "maintenance ms/1M unfrozen",
                "reclaim ms/1M whole heap",
            ],
            cost_rows,
        )
    )
    result = bc.new_result(
        NAME,
        mode,
        start_objects=START_OBJECTS[mode],
        per_request=PER_REQUEST,
        interpreters=measured,
    )
    return bc.finish(args, NAME, result, None)


if __name__ == "__main__":
    sys.exit(main())
