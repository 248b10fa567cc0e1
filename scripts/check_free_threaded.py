#!/usr/bin/env python3
"""The self-benchmark GC policy on a real free-threaded CPython: detected, refused, and why.

A child process runs on the free-threaded interpreter (``--python``; default
``$DYNAMO_FREE_THREADED_PYTHON``, else the build of ``scripts/setup_pythons.sh --free-threaded``)
with nothing on its path but the standard library, this project's sources and ConfigArgParse (one
pure-Python module, copied from the environment running this script). It:

1. reports the build: version, ``Py_GIL_DISABLED``, whether the GIL is really off;
2. runs the detection (``bench_policy.unsound_build_reason()``, ``threshold2_ignored_reason()``);
3. starts and stops the policy as the worker's self-benchmark does and keeps its log lines: the
   verdict is "refused" when the WARNING says the build is unsound, no periodic-freeze thread
   runs, the start line says automatic full collections still run, and stop restores the
   thresholds exactly;
4. times, on a synthetic heap, alternately over repetitions: ``gc.collect()``, ``gc.freeze()``,
   ``gc.collect()`` with the heap frozen, ``gc.unfreeze()``: the costs behind the refusal.

Step 4 also runs on a standard (GIL) build of the same minor version when one is found (pyenv, or
``--compare PATH``), so the table compares the two side by side in one run. Exits 1 when the
policy was not refused on the free-threaded build.

    python scripts/check_free_threaded.py [--quick|--smoke] [--python PATH] [--compare PATH]
                                          [--out DIR] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "free_threaded"
OBJECTS = {"full": 1_000_000, "quick": 1_000_000, "smoke": 10_000}
REPS = {"full": 7, "quick": 3, "smoke": 1}
POLICY_LOGGER = "dynamo_gc.bench_policy"


# --- child: runs on the interpreter under test; stdlib, the project's sources, configargparse --


def check_policy() -> dict:
    """Start and stop the policy as the self-benchmark does; what it said and left behind."""
    import gc
    import logging
    import threading

    from dynamo_gc import bench_policy

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    policy_logger = logging.getLogger(POLICY_LOGGER)
    policy_logger.addHandler(Keep())
    policy_logger.setLevel(logging.INFO)
    before = gc.get_threshold()
    started = bench_policy.start_policy(interval_s=0.05)
    during = gc.get_threshold()
    freeze_threads = [
        t.name for t in threading.enumerate() if t.name == bench_policy.FREEZE_THREAD_NAME
    ]
    state = bench_policy.gc_policy_state()
    stopped = bench_policy.stop_policy()
    after = gc.get_threshold()
    lines = [(r.levelname, r.getMessage()) for r in records]
    warnings = [m for level, m in lines if level == "WARNING" and "not sound on this build" in m]
    start_lines = [m for _, m in lines if m.startswith("GC policy started")]
    refused = (
        started
        and stopped
        and bool(warnings)
        and not freeze_threads
        and len(start_lines) == 1
        and "automatic full collections still run" in start_lines[0]
        and after == before
    )
    return {
        "unsound_build_reason": bench_policy.unsound_build_reason(),
        "threshold2_ignored_reason": bench_policy.threshold2_ignored_reason(),
        "thresholds_before": list(before),
        "thresholds_during": list(during),
        "thresholds_after": list(after),
        "freeze_threads_during": freeze_threads,
        "freeze_thread_alive_during": state["freeze_thread_alive"],
        "log": lines,
        "refused": refused,
    }


def time_gc(objects: int, reps: int) -> dict:
    """collect / freeze / collect-while-frozen / unfreeze on a synthetic heap, in ms."""
    import gc
    import statistics
    import time

    from dynamo.common.utils.synthetic_heap import build_synthetic_heap

    heap = build_synthetic_heap(objects)
    gc.collect()
    tracked = len(gc.get_objects())
    samples: dict[str, list[float]] = {
        "collect": [],
        "freeze": [],
        "frozen_collect": [],
        "unfreeze": [],
    }

    def timed(key: str, call) -> None:
        start = time.perf_counter_ns()
        call()
        samples[key].append((time.perf_counter_ns() - start) / 1e6)

    gc.disable()  # no automatic collection between the timed calls
    try:
        for _ in range(reps):
            timed("collect", gc.collect)
            timed("freeze", gc.freeze)
            timed("frozen_collect", gc.collect)
            timed("unfreeze", gc.unfreeze)
    finally:
        gc.enable()
    del heap
    gc.collect()
    medians = {f"{key}_ms_median": statistics.median(values) for key, values in samples.items()}
    return {
        "objects": objects,
        "tracked": tracked,
        **{f"{key}_ms": values for key, values in samples.items()},
        **medians,
        "freeze_over_collect": medians["freeze_ms_median"] / medians["collect_ms_median"],
        "frozen_collect_over_collect": (
            medians["frozen_collect_ms_median"] / medians["collect_ms_median"]
        ),
    }


def child(objects: int, reps: int, with_policy: bool) -> dict:
    import platform
    import sysconfig

    gil_enabled = getattr(sys, "_is_gil_enabled", lambda: True)()
    result = {
        "python": platform.python_version(),
        "version": sys.version,
        "py_gil_disabled": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        "gil_enabled": gil_enabled,
    }
    if with_policy:
        result["policy"] = check_policy()
    result["timing"] = time_gc(objects, reps)
    return result


# --- parent ---------------------------------------------------------------------------------


def configargparse_dir(tmp: str) -> str:
    """A directory holding only configargparse.py, copied from this environment."""
    import importlib.util
    import shutil

    spec = importlib.util.find_spec("configargparse")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise SystemExit(
            "configargparse (pure Python) must be importable by the interpreter running this "
            "script; run it with the project's venv, e.g. .venv-3.11/bin/python"
        )
    shutil.copy(spec.origin, tmp)
    return tmp


def run_child(python: str, objects: int, reps: int, with_policy: bool, extra_path: str) -> dict:
    import bench_common as bc

    env = bc.child_env()
    env["PYTHONPATH"] = env["PYTHONPATH"] + ":" + extra_path
    # A free-threaded build re-enables the GIL when told to: this check is about it being off.
    env.pop("PYTHON_GIL", None)
    argv = [python, __file__, "--child", "--objects", str(objects), "--reps", str(reps)]
    return bc.run_json_child(argv + (["--policy"] if with_policy else []), timeout_s=1800, env=env)


def standard_build_of(version: str) -> str | None:
    import bench_common as bc

    major, minor = (int(part) for part in version.split(".")[:2])
    return bc.pyenv_interpreters(versions=((major, minor),)).get((major, minor))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--policy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--objects", type=int, help="synthetic heap size (overrides the mode's)")
    parser.add_argument("--reps", type=int, help="repetitions (overrides the mode's)")
    parser.add_argument("--python", help="the free-threaded interpreter (default: see above)")
    parser.add_argument(
        "--compare", help="a standard build to time beside it (default: pyenv's, same minor)"
    )
    import bench_common as bc
    import provisioned_pythons

    bc.add_mode_args(parser)
    args = parser.parse_args(argv)
    mode = bc.mode_name(args)
    objects = args.objects or OBJECTS[mode]
    reps = args.reps or REPS[mode]

    if args.child:
        print(json.dumps(child(objects, reps, args.policy)))
        return 0

    python = args.python or provisioned_pythons.free_threaded_interpreter()
    if python is None:
        print(
            f"no free-threaded interpreter: pass --python, set "
            f"{provisioned_pythons.FREE_THREADED_ENV}, or build one with "
            f"scripts/setup_pythons.sh --free-threaded",
            file=sys.stderr,
        )
        return 2
    import tempfile

    with tempfile.TemporaryDirectory(prefix="configargparse-") as tmp:
        extra_path = configargparse_dir(tmp)
        free = run_child(python, objects, reps, True, extra_path)
        free["executable"] = python
        measured = [free]
        compare = args.compare or standard_build_of(free["python"])
        if compare:
            standard = run_child(compare, objects, reps, False, extra_path)
            standard["executable"] = compare
            measured.append(standard)

    policy = free["policy"]
    result = bc.new_result(
        NAME,
        mode,
        objects=objects,
        reps=reps,
        interpreters=measured,
        refused=bool(free["py_gil_disabled"] and policy["refused"]),
    )
    rows = []
    for each in measured:
        timing = each["timing"]
        rows.append(
            [
                each["python"] + ("t" if each["py_gil_disabled"] else ""),
                timing["tracked"],
                timing["collect_ms_median"],
                timing["freeze_ms_median"],
                timing["freeze_over_collect"],
                timing["frozen_collect_ms_median"],
                timing["frozen_collect_over_collect"],
                timing["unfreeze_ms_median"],
            ]
        )
    print(
        bc.format_table(
            [
                "python",
                "tracked",
                "gc.collect ms",
                "gc.freeze ms",
                "freeze/collect",
                "collect, frozen ms",
                "frozen/stock",
                "gc.unfreeze ms",
            ],
            rows,
        )
    )
    print(
        f"\n{free['version']} (Py_GIL_DISABLED={int(free['py_gil_disabled'])}, "
        f"GIL enabled at run time: {free['gil_enabled']})"
    )
    print(f"unsound_build_reason(): {policy['unsound_build_reason']!r}")
    print(f"threshold2_ignored_reason(): {policy['threshold2_ignored_reason']!r}")
    for level, message in policy["log"]:
        print(f"  {level} {message}")
    print(
        f"thresholds {policy['thresholds_before']} -> {policy['thresholds_during']} -> "
        f"{policy['thresholds_after']}; periodic-freeze threads during the policy: "
        f"{policy['freeze_threads_during'] or 'none'}"
    )
    verdict = "REFUSED as documented" if result["refused"] else "NOT REFUSED"
    print(f"verdict: the self-benchmark policy's periodic freeze was {verdict}")
    bc.finish(args, NAME, result, None)
    return 0 if result["refused"] else 1


if __name__ == "__main__":
    sys.exit(main())
