#!/usr/bin/env python3
"""The preprocess pool's start-up, ``spawn`` against ``forkserver`` (3.14's default on Linux).

Each repetition starts, in a fresh process (as ``python -m dynamo.frontend`` does once per
process), a ``PreprocessPool`` of N workers with the freeze on and the given start method, and
times ``start()``: every child started, its initializer run (the chat processor's libraries
imported, the heap frozen) and its ready report received. The two methods alternate, so both
see the same machine. Each row also gives what every child froze in its own initializer: the
same counts under both methods mean a forkserver child starts from a heap no bigger than a
spawned one's.

    python scripts/bench_pool_start.py [--quick|--smoke] [--workers N] [--processor hf|vllm|sglang]
                                       [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "pool_start"
METHODS = ("spawn", "forkserver")
REPS = {"full": 9, "quick": 3, "smoke": 1}


def child(method: str, workers: int, processor: str) -> dict:
    import logging
    import time

    from dynamo.frontend.processors.preprocess_pool import PreprocessPool

    started = time.perf_counter()
    pool = PreprocessPool(
        workers,
        freeze_gc_heap=True,
        gc_pause_log_ms=0.0,
        log_level=logging.WARNING,
        chat_processor=processor,
        start_method=method,
    )
    try:
        pool.start()
        start_s = time.perf_counter() - started
        return {"method": pool.start_method, "start_s": start_s, "frozen": pool.frozen}
    finally:
        pool.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=2, help="pool processes (default 2)")
    parser.add_argument("--processor", default="hf", help="--dyn-chat-processor (default hf)")
    import bench_common as bc

    bc.add_mode_args(parser)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.workers, args.processor)))
        return 0

    mode = bc.mode_name(args)
    samples: dict[str, list[dict]] = {method: [] for method in METHODS}
    for rep in range(REPS[mode]):
        order = METHODS if rep % 2 == 0 else METHODS[::-1]
        for method in order:
            argv_child = [sys.executable, __file__, "--child", method]
            argv_child += ["--workers", str(args.workers), "--processor", args.processor]
            samples[method].append(bc.run_json_child(argv_child, timeout_s=600))

    rows: list[list[object]] = []
    summary: dict[str, dict] = {}
    for method in METHODS:
        times = [sample["start_s"] for sample in samples[method]]
        frozen = sorted({count for sample in samples[method] for count in sample["frozen"]})
        summary[method] = {"start_s": times, "start_s_median": bc.median(times), "frozen": frozen}
        rows.append([method, args.workers, bc.median(times), min(times), max(times), str(frozen)])
    ratio = summary["forkserver"]["start_s_median"] / summary["spawn"]["start_s_median"]
    print(
        bc.format_table(
            ["start method", "workers", "start s (median)", "min", "max", "frozen per child"],
            rows,
        )
    )
    print(f"forkserver / spawn (medians): {ratio:.2f}x")
    result = bc.new_result(
        NAME,
        mode,
        python=".".join(map(str, sys.version_info[:3])),
        workers=args.workers,
        processor=args.processor,
        reps=REPS[mode],
        methods=summary,
        forkserver_over_spawn=ratio,
    )
    return bc.finish(args, NAME, result, None)


if __name__ == "__main__":
    sys.exit(main())
