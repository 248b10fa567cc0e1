#!/usr/bin/env python3
"""What ``gc.callbacks`` see on each CPython, and the pause logger's timestamps against 3.15's
``info["duration"]``.

One child per interpreter (bare CPython, the project's sources on PYTHONPATH) reports:

- the default thresholds, and whether ``gc.set_threshold`` / ``gc.get_threshold`` round-trip an
  odd triple exactly (the save/restore the freeze and the policy rely on);
- the keys of the ``info`` dict at ``stop`` (3.15 adds ``duration`` and ``candidates``);
- on a synthetic heap of N long-lived objects, a bare ``gc.freeze()`` right after a collection,
  and ``gc.collect()`` unfrozen and frozen, alternately:
  the pause the pause logger measures (two ``perf_counter_ns`` in its callback, as
  ``GcPauseLogger`` does), the interpreter's ``duration`` and ``candidates`` where reported;
- an allocation loop shaped like request handling (automatic gen0/gen1/gen2 collections; the big
  heap dropped first, so gen2 comes often enough to measure), twice:
  our callback alone, then with another callback installed before it that walks the collected
  generation at ``stop`` (as vLLM's and SGLang's GC loggers walk the heap): per generation, the
  median and p99 of ours minus the interpreter's duration.

    python scripts/bench_gc_callback_info.py [--quick|--smoke] [--python PATH ...] [--out DIR]
                                             [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "gc_callback_info"
OBJECTS = {"full": 1_000_000, "quick": 1_000_000, "smoke": 10_000}
REPS = {"full": 9, "quick": 5, "smoke": 1}
REQUESTS = {"full": 300_000, "quick": 100_000, "smoke": 2_000}
ODD_THRESHOLDS = (1234, 17, 9)


class Recorder:
    """The pause logger's measurement (two timestamps around the collection) plus the info."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, float | None, int | None]] = []
        self._start = 0

    def __call__(self, phase: str, info: dict) -> None:
        import time

        if phase == "start":
            self._start = time.perf_counter_ns()
            return
        ours = time.perf_counter_ns() - self._start
        self.rows.append((info["generation"], ours, info.get("duration"), info.get("candidates")))


def heap_walker(phase: str, info: dict) -> None:
    """Another library's logger: it walks the generation just collected."""
    import gc

    if phase == "stop":
        len(gc.get_objects(info["generation"]))


def _requests(count: int) -> None:
    # A window of ~20k live containers dropped half at a time: enough net allocation to pass
    # 3.13+'s threshold0 of 2000, so every version collects all three generations.
    window: list[dict] = []
    for i in range(count):
        request = {"id": i, "tokens": list(range(16)), "meta": {"n": i, "tags": ["a", "b"]}}
        window.append(request)
        if len(window) > 5000:
            del window[:2500]


def measure(objects: int, reps: int, requests: int) -> dict:
    import gc
    import statistics
    import time

    from dynamo.common.utils.synthetic_heap import build_synthetic_heap

    default_thresholds = gc.get_threshold()
    gc.set_threshold(*ODD_THRESHOLDS)
    round_trip = gc.get_threshold()
    gc.set_threshold(*default_thresholds)
    restored = gc.get_threshold()

    heap = build_synthetic_heap(objects)
    gc.collect()
    recorder = Recorder()
    gc.callbacks.append(recorder)
    explicit: dict[str, list] = {"unfrozen": [], "frozen": []}
    freeze_us: list[float] = []
    for rep in range(reps):
        for arm in ("unfrozen", "frozen") if rep % 2 == 0 else ("frozen", "unfrozen"):
            if arm == "frozen":
                started = time.perf_counter_ns()
                gc.freeze()  # bare, right after a collection: what freeze_gc_heap adds to it
                freeze_us.append((time.perf_counter_ns() - started) / 1e3)
            recorder.rows.clear()
            gc.collect()
            explicit[arm].append(recorder.rows[-1])
            gc.unfreeze()
    info_keys = sorted(_stop_info_keys())
    # The loops without the big heap: with it, automatic gen2 collections wait for the 25% rule.
    del heap
    gc.collect()

    loops = {}
    for arm, others in (("alone", []), ("after_a_heap_walker", [heap_walker])):
        gc.callbacks[:] = [*others, recorder]
        recorder.rows.clear()
        _requests(requests)
        loops[arm] = _by_generation(recorder.rows)
    gc.callbacks[:] = []

    def explicit_summary(rows: list) -> dict:
        ours = [r[1] / 1e6 for r in rows]
        out: dict = {"ours_ms_median": statistics.median(ours)}
        if rows[0][2] is not None:
            out["duration_ms_median"] = statistics.median(r[2] * 1e3 for r in rows)
            out["candidates_median"] = statistics.median(r[3] for r in rows)
        return out

    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "default_thresholds": list(default_thresholds),
        "thresholds_round_trip_exact": round_trip == ODD_THRESHOLDS
        and restored == default_thresholds,
        "stop_info_keys": info_keys,
        "objects": objects,
        "bare_freeze_us_median": statistics.median(freeze_us),
        "explicit": {arm: explicit_summary(rows) for arm, rows in explicit.items()},
        "loops": loops,
    }


def _stop_info_keys() -> set[str]:
    import gc

    keys: set[str] = set()

    def grab(phase: str, info: dict) -> None:
        if phase == "stop":
            keys.update(info)

    gc.callbacks.append(grab)
    gc.collect(0)
    gc.callbacks.remove(grab)
    return keys


def _by_generation(rows: list) -> dict:
    import statistics

    out = {}
    for generation in (0, 1, 2):
        picked = [r for r in rows if r[0] == generation]
        if not picked:
            continue
        entry: dict = {
            "collections": len(picked),
            "ours_us_median": statistics.median(r[1] / 1e3 for r in picked),
        }
        if picked[0][2] is not None:
            diffs = sorted(r[1] / 1e3 - r[2] * 1e6 for r in picked)
            entry["duration_us_median"] = statistics.median(r[2] * 1e6 for r in picked)
            entry["ours_minus_duration_us_median"] = statistics.median(diffs)
            entry["ours_minus_duration_us_p99"] = diffs[min(len(diffs) - 1, int(0.99 * len(diffs)))]
            entry["candidates_median"] = statistics.median(r[3] for r in picked)
        out[f"gen{generation}"] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    import bench_common as bc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = bc.parse_interpreter_args(
        parser, argv, "pyenv's CPython 3.10-3.13 and setup_pythons.sh's 3.14, 3.15"
    )
    mode = bc.mode_name(args)
    if args.child:
        print(json.dumps(measure(OBJECTS[mode], REPS[mode], REQUESTS[mode])))
        return 0

    measured = bc.measure_children(args, __file__)
    facts, loops = [], []
    for m in measured:
        unfrozen, frozen = m["explicit"]["unfrozen"], m["explicit"]["frozen"]
        facts.append(
            [
                m["python"],
                str(tuple(m["default_thresholds"])),
                m["thresholds_round_trip_exact"],
                m["bare_freeze_us_median"],
                unfrozen["ours_ms_median"],
                unfrozen.get("duration_ms_median", "-"),
                unfrozen.get("candidates_median", "-"),
                frozen["ours_ms_median"],
                frozen.get("duration_ms_median", "-"),
                frozen.get("candidates_median", "-"),
                ",".join(
                    k
                    for k in m["stop_info_keys"]
                    if k not in ("generation", "collected", "uncollectable")
                )
                or "-",
            ]
        )
        for arm, generations in m["loops"].items():
            for generation, e in generations.items():
                loops.append(
                    [
                        m["python"],
                        arm,
                        generation,
                        e["collections"],
                        e["ours_us_median"],
                        e.get("duration_us_median", "-"),
                        e.get("ours_minus_duration_us_median", "-"),
                        e.get("ours_minus_duration_us_p99", "-"),
                        e.get("candidates_median", "-"),
                    ]
                )
    objects = OBJECTS[mode]
    print(
        bc.format_table(
            [
                "python",
                "thresholds",
                "round-trip exact",
                "gc.freeze() us",
                f"collect {objects:,} ms (ours)",
                "duration ms",
                "candidates",
                "frozen: ours ms",
                "duration ms",
                "candidates",
                "new info keys",
            ],
            facts,
        )
    )
    print()
    print(
        bc.format_table(
            [
                "python",
                "callbacks",
                "gen",
                "collections",
                "ours us",
                "duration us",
                "ours-duration us",
                "p99",
                "candidates",
            ],
            loops,
        )
    )
    result = bc.new_result(
        NAME, mode, objects=objects, reps=REPS[mode], requests=REQUESTS[mode], interpreters=measured
    )
    return bc.finish(args, NAME, result, None)


if __name__ == "__main__":
    sys.exit(main())
