#!/usr/bin/env python3
"""What the GC layer costs while it runs: the pause logger, its metrics sink, the policy's tick.

For each CPython 3.10-3.15 (the project's ``.venv-3.X`` where it exists, so the metrics sink's
dependencies are there; else pyenv's bare interpreter, without the metrics arm) a child process:

1. **Pause logger.** Runs an allocation-heavy loop shaped like request handling (per-request
   dicts and lists, a window of them surviving a while, so gen0, gen1 and gen2 collections all
   fire) with a frozen start-up heap, as in serving. Arms: ``none`` (no GC callback), ``logger``
   (``install_gc_pause_logger(50)``, as the launchers install it), ``noop-callback`` (an empty
   ``gc.callbacks`` entry: what CPython itself charges for calling any callback) and, where
   ``dynamo_gc.metrics`` imports, ``logger+metrics`` (``on_pause=DynamoMetrics.observe_pause``).
   Repetitions are interleaved (the arms' order rotates each round) and the cost is the median of
   the per-round ratios ``t(arm) / t(none) - 1``. The cost per collection of the callback itself is
   also timed directly (no workload noise) and multiplied by the collections the loop triggers.
2. **Freeze tick.** The policy's background thread does a bare ``gc.freeze()`` each interval
   (``dynamo_gc.bench_policy``; its public ``freeze_tick()`` is timed instead when it has one). It
   is timed with 1e4 and with 5e6 objects already frozen, in alternating blocks, each tick after a
   batch of fresh survivors like the ones a real tick moves.

Goals (issue 5): logger < 3%; tick at 5e6 < 2x tick at 1e4.

    python scripts/bench_overheads.py [--quick|--smoke] [--python PATH ...] [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "overheads"

SETTINGS = {
    # rounds: interleaved repetitions of the logger arms; iterations: loop length per repetition
    # (about 0.1 s: short rounds, many of them, so drift hits both arms of a round alike);
    # tick_sizes: frozen heaps; tick_blocks: alternating blocks per size.
    "full": {
        "rounds": 101,
        "iterations": 100_000,
        "tick_sizes": [10_000, 5_000_000],
        "tick_blocks": 2,
        "ticks": 400,
        "callback_calls": 200_000,
    },
    "quick": {
        "rounds": 15,
        "iterations": 50_000,
        "tick_sizes": [10_000, 1_000_000],
        "tick_blocks": 1,
        "ticks": 200,
        "callback_calls": 50_000,
    },
    "smoke": {
        "rounds": 1,
        "iterations": 5_000,
        "tick_sizes": [1_000, 10_000],
        "tick_blocks": 1,
        "ticks": 10,
        "callback_calls": 1_000,
    },
}
START_UP_HEAP = {"full": 500_000, "quick": 200_000, "smoke": 5_000}
LOGGER_THRESHOLD_MS = 50.0
WINDOW = 2_000  # requests kept alive at once: their objects survive young collections
SURVIVORS_PER_TICK = 1_000
GOAL_LOGGER_PCT = 3.0
GOAL_TICK_RATIO = 2.0


# --- child: runs under each interpreter ---------------------------------------------------------


def _workload(iterations: int) -> None:
    """Allocation-heavy, request-shaped: every iteration makes ~5 tracked containers.

    Each request also refers to itself (as a request bound to its handler, a future to its
    callbacks, an exception to its traceback do), so when it leaves the window it is cyclic
    garbage that only the collector frees. CPython counts net allocations of tracked objects
    towards the next collection (refcount-freed ones cancel out), so without that cycle a
    steady loop would hardly ever trigger one, and the logger would have nothing to cost.
    """
    from collections import deque

    window: deque = deque(maxlen=WINDOW)
    for i in range(iterations):
        tokens = [i, i + 1, i + 2]
        request = {"id": i, "tokens": tokens, "sampling": {"n": [1]}, "meta": (tokens, [i])}
        request["self"] = request
        window.append(request)


def _collections() -> int:
    import gc

    return sum(stat["collections"] for stat in gc.get_stats())


def measure_logger(settings: dict, start_up_heap: int) -> dict:
    import gc
    import logging
    import statistics
    import time

    from dynamo.common.utils.synthetic_heap import build_synthetic_heap
    from dynamo_gc import pause_logger

    logging.getLogger("dynamo").setLevel(logging.ERROR)  # no "installed" INFO line per round
    metrics_error = None
    try:
        from dynamo_gc.metrics import DynamoMetrics
    except ImportError as exc:  # a bare interpreter without prometheus_client
        metrics_error = f"{type(exc).__name__}: {exc}"

    heap = build_synthetic_heap(start_up_heap)
    gc.collect()
    gc.freeze()  # as in serving: the start-up heap is frozen, collections walk only the young
    sink = None if metrics_error else DynamoMetrics(freeze_enabled=True, process_collectors=False)

    def noop_callback(phase: str, info: dict) -> None:
        pass

    def install(arm: str) -> None:
        if arm == "noop-callback":
            gc.callbacks.append(noop_callback)
        elif arm == "logger":
            pause_logger.install_gc_pause_logger(LOGGER_THRESHOLD_MS)
        elif arm == "logger+metrics" and sink is not None:
            pause_logger.install_gc_pause_logger(LOGGER_THRESHOLD_MS, on_pause=sink.observe_pause)

    # noop-callback: what CPython charges for calling any gc.callbacks entry (it builds an info
    # dict per call), the floor under which no pause logger can go.
    arms = ["none", "noop-callback", "logger"] + (["logger+metrics"] if sink else [])
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    collections: dict[str, list[int]] = {arm: [] for arm in arms}
    try:
        for round_index in range(settings["rounds"]):
            shift = round_index % len(arms)
            for arm in arms[shift:] + arms[:shift]:  # rotate the order every round
                gc.collect()  # same starting state for every arm, untimed
                install(arm)
                before = _collections()
                start = time.perf_counter_ns()
                _workload(settings["iterations"])
                elapsed = (time.perf_counter_ns() - start) / 1e9
                collections[arm].append(_collections() - before)
                pause_logger.uninstall_gc_pause_logger()
                if noop_callback in gc.callbacks:
                    gc.callbacks.remove(noop_callback)
                times[arm].append(elapsed)
    finally:
        pause_logger.uninstall_gc_pause_logger()

    # The callback alone, called as CPython calls it, without a workload around it.
    info = {"generation": 0, "collected": 0, "uncollectable": 0}
    callback_ns = {}
    for arm in arms[1:]:
        if arm == "noop-callback":
            callback = noop_callback
        else:
            callback = pause_logger.GcPauseLogger(
                LOGGER_THRESHOLD_MS,
                on_pause=sink.observe_pause if sink and arm == "logger+metrics" else None,
            )
        calls = settings["callback_calls"]
        start = time.perf_counter_ns()
        for _ in range(calls):
            callback("start", info)
            callback("stop", info)
        callback_ns[arm] = (time.perf_counter_ns() - start) / calls
    gc.unfreeze()
    del heap
    gc.collect()

    result: dict = {
        "arms": arms,
        "metrics_unavailable": metrics_error,
        "start_up_heap": start_up_heap,
    }
    for arm in arms:
        result[arm] = {
            "seconds": times[arm],
            "seconds_median": statistics.median(times[arm]),
            "collections_median": statistics.median(collections[arm]),
        }
    for arm in arms[1:]:
        ratios = [t / base - 1.0 for t, base in zip(times[arm], times["none"], strict=True)]
        per_second = result[arm]["collections_median"] / result["none"]["seconds_median"]
        result[arm]["cost_pct_median"] = 100.0 * statistics.median(ratios)
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        result[arm]["cost_pct_iqr"] = [100.0 * quartiles[0], 100.0 * quartiles[2]]
        result[arm]["cost_pct_per_round"] = [100.0 * r for r in ratios]
        result[arm]["callback_ns_per_collection"] = callback_ns[arm]
        # Direct estimate: callback time per collection x collections per second of workload.
        result[arm]["cost_pct_from_callback"] = 100.0 * callback_ns[arm] * 1e-9 * per_second
    return result


def _tick_function():
    """The policy's tick: ``dynamo_gc.bench_policy.freeze_tick`` if public, else bare freeze."""
    import gc

    try:
        from dynamo_gc import bench_policy
    except ImportError:
        return gc.freeze, "gc.freeze (dynamo_gc.bench_policy not importable)"
    tick = getattr(bench_policy, "freeze_tick", None)
    if callable(tick):
        return tick, "dynamo.vllm.bench_policy.freeze_tick"
    return gc.freeze, "gc.freeze (what dynamo_gc.bench_policy's thread calls)"


def measure_tick(settings: dict) -> dict:
    import gc
    import statistics
    import time

    from dynamo.common.utils.synthetic_heap import build_synthetic_heap

    tick, tick_name = _tick_function()
    small, big = settings["tick_sizes"]
    samples: dict[int, list[float]] = {small: [], big: []}
    frozen_counts: dict[int, int] = {}
    gc.collect()
    for _block in range(settings["tick_blocks"]):
        for size in (small, big):
            heap = build_synthetic_heap(size)
            gc.collect()
            gc.freeze()
            frozen_counts[size] = gc.get_freeze_count()  # once, outside the timed region
            for _ in range(settings["ticks"]):
                survivors = build_synthetic_heap(SURVIVORS_PER_TICK)  # what a tick moves
                start = time.perf_counter_ns()
                tick()
                samples[size].append((time.perf_counter_ns() - start) / 1e3)
                del survivors
            gc.unfreeze()
            del heap
            gc.collect()
    small_us = statistics.median(samples[small])
    big_us = statistics.median(samples[big])
    return {
        "tick": tick_name,
        "sizes": [small, big],
        "frozen_counts": {str(k): v for k, v in frozen_counts.items()},
        "tick_us_median": {str(small): small_us, str(big): big_us},
        "tick_us_p99": {
            str(size): sorted(values)[max(0, int(len(values) * 0.99) - 1)]
            for size, values in samples.items()
        },
        "big_over_small": big_us / small_us,
    }


def measure(settings: dict, start_up_heap: int) -> dict:
    import platform

    # The tick first: its "small" heap should not carry the metrics sink's imports.
    tick_result = measure_tick(settings)
    logger_result = measure_logger(settings, start_up_heap)
    return {
        "python": platform.python_version(),
        "logger": logger_result,
        "tick": tick_result,
    }


# --- parent ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    import bench_common as bc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = bc.parse_interpreter_args(
        parser, argv, "CPython 3.10-3.15 found (pyenv, setup_pythons.sh)"
    )
    mode = bc.mode_name(args)
    settings = SETTINGS[mode]

    if args.child:
        print(json.dumps(measure(settings, START_UP_HEAP[mode])))
        return 0

    result = bc.new_result(
        NAME,
        mode,
        settings=settings,
        logger_threshold_ms=LOGGER_THRESHOLD_MS,
        interpreters=[],
        goal={"logger_cost_pct_below": GOAL_LOGGER_PCT, "tick_ratio_below": GOAL_TICK_RATIO},
    )
    result["interpreters"] = bc.measure_children(args, __file__, prefer_venvs=True)

    logger_rows, tick_rows, verdicts = [], [], []
    for measured in result["interpreters"]:
        logged = measured["logger"]
        for arm in logged["arms"][1:]:
            logger_rows.append(
                [
                    measured["python"],
                    arm,
                    logged["none"]["seconds_median"],
                    logged[arm]["seconds_median"],
                    logged[arm]["collections_median"],
                    logged[arm]["cost_pct_median"],
                    "[{:.1f}, {:.1f}]".format(*logged[arm]["cost_pct_iqr"]),
                    logged[arm]["callback_ns_per_collection"],
                    logged[arm]["cost_pct_from_callback"],
                ]
            )
            if arm == "noop-callback":
                continue  # a reference point, not a goal
            verdicts.append(
                {
                    "python": measured["python"],
                    "what": f"{arm} cost %",
                    "measured": logged[arm]["cost_pct_median"],
                    "met": logged[arm]["cost_pct_median"] < GOAL_LOGGER_PCT,
                }
            )
        tick = measured["tick"]
        small, big = (str(s) for s in tick["sizes"])
        tick_rows.append(
            [
                measured["python"],
                tick["tick"].split(" ")[0],
                tick["frozen_counts"][small],
                tick["tick_us_median"][small],
                tick["frozen_counts"][big],
                tick["tick_us_median"][big],
                tick["big_over_small"],
            ]
        )
        verdicts.append(
            {
                "python": measured["python"],
                "what": f"tick {big}/{small}",
                "measured": tick["big_over_small"],
                "met": tick["big_over_small"] < GOAL_TICK_RATIO,
            }
        )
    print(
        bc.format_table(
            [
                "python",
                "arm",
                "none s",
                "arm s",
                "collections",
                "cost % (median)",
                "cost % IQR",
                "callback ns/collection",
                "cost % (callback x rate)",
            ],
            logger_rows,
        )
    )
    print()
    print(
        bc.format_table(
            [
                "python",
                "tick",
                "frozen (small)",
                "tick us",
                "frozen (big)",
                "tick us",
                "big/small x",
            ],
            tick_rows,
        )
    )
    for verdict in verdicts:
        print(
            f"goal {verdict['what']} on {verdict['python']}: {verdict['measured']:.3f} "
            f"({'met' if verdict['met'] else 'MISSED'})"
        )
    for measured in result["interpreters"]:
        if measured["logger"]["metrics_unavailable"]:
            print(
                f"note: no logger+metrics arm on {measured['python']}: "
                f"{measured['logger']['metrics_unavailable']}",
                file=sys.stderr,
            )
    result["goal"]["verdicts"] = verdicts
    path = bc.write_result(args, NAME, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
