"""The soak's figures (scripts/bench_gc_soak.py): per arm, per pair of arms side by side, the
issue's goals judged on them, the table docs/benchmarks.md quotes and the plot.

Every ratio compares two arms of the same pass (run one after the other, under the machine's
load at that time); the load average of each is kept beside it.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import bench_common as bc
from serving_load import summary_of

STALL_MS = 50.0  # the line: a serving pause of 50 ms or more
COLORS = {"stock": "C3", "once": "C1", "idle": "C2", "withdraw": "C0",
          "once-busy": "C5", "idle-busy": "C4"}  # fmt: skip


def _workers(run: dict) -> list[str]:
    return [name for name in run["processes"] if name.startswith("worker")]


def _longest(process: dict) -> float:
    """The longest serving pause of a process, in ms: exact when the pause logger logged it,
    else the upper bound of the pause histogram's highest non-empty serving bucket."""
    logged = max((p["ms"] for p in process["serving_pauses"]), default=0.0)
    bucket = process["metrics"]["serving_all"]["max_le_ms"] or 0.0
    return logged if logged else bucket


def figures(run: dict, budget_ms: float) -> dict:
    """One arm's figures (one pass)."""
    workers = _workers(run)
    procs = run["processes"]
    pauses = [p for proc in procs.values() for p in proc["serving_pauses"]]
    held = [h for proc in procs.values() for h in proc["held"]]
    waits = [proc["metrics"]["waits"] for proc in procs.values()]
    maintenances = [dict(m, process=name) for name, proc in procs.items()
                    for m in proc["maintenances"]]  # fmt: skip
    rss_workers = [run["rss_end_mb"][name] for name in workers if run["rss_end_mb"].get(name)]
    peak = [
        max((s["rss_mb"].get(name) or 0.0) for s in run["timeline"]) if run["timeline"] else 0.0
        for name in workers
    ]
    loads = [s["load1"] for s in run["timeline"]]
    return {
        "arm": run["arm"],
        "pass": run["pass"],
        "workers": run["workers"],
        "offered_rps": run["offered_rps"],
        "sent": run["sent"],
        "ok": run["ok"],
        "errors": run["errors"],
        "errors_by_kind": run["errors_by_kind"],
        "achieved_rps": run["achieved_rps"],
        "achieved_rps_per_worker": run["achieved_rps"] / run["workers"],
        "latency": bc.summarise([run["latency_s"]]),
        "ttft": bc.summarise([run["ttft_s"]]),
        "serving_pauses_ge_50ms": sum(1 for p in pauses if p["ms"] >= STALL_MS),
        "serving_pauses_ge_budget": sum(1 for p in pauses if p["ms"] >= budget_ms),
        "longest_pause_ms": {name: _longest(proc) for name, proc in procs.items()},
        "serving_gen2": {name: proc["metrics"]["serving_gen2"] for name, proc in procs.items()},
        "held_waits_ge_50ms": sum(h["requests"] for h in held if h["ms"] >= STALL_MS),
        "longest_wait_ms": max(
            [h["ms"] for h in held] + [w["max_le_ms"] or 0.0 for w in waits], default=0.0
        ),
        "waits": sum(w["count"] for w in waits),
        "maintenances": len(maintenances),
        "maintenance_took_ms": [m["took_ms"] for m in maintenances],
        "maintenance_closed_ms": [m["closed_ms"] for m in maintenances],
        "reclaimed": sum(m["reclaimed"] for m in maintenances),
        "gave_up": sum(proc["gave_up"] for proc in procs.values()),
        "due_warnings": sum(proc["due_warnings"] for proc in procs.values()),
        "rss_worker_end_mb": statistics.mean(rss_workers) if rss_workers else None,
        "rss_worker_peak_mb": statistics.mean(peak) if peak else None,
        "rss_frontend_end_mb": run["rss_end_mb"].get("frontend"),
        "loadavg_mean": statistics.mean(loads) if loads else None,
        "loadavg_start": run["loadavg_start"],
    }


def aggregate(runs: list[dict], budget_ms: float) -> list[dict]:
    """One row per arm, its passes pooled (latencies pooled; counts summed; the rest per pass)."""
    rows = []
    for arm in dict.fromkeys(run["arm"] for run in runs):
        mine = [run for run in runs if run["arm"] == arm]
        each = [figures(run, budget_ms) for run in mine]
        took = [t for f in each for t in f["maintenance_took_ms"]]
        closed = [t for f in each for t in f["maintenance_closed_ms"]]
        rows.append(
            {
                "arm": arm,
                "passes": len(mine),
                "workers": mine[0]["workers"],
                "sent": sum(f["sent"] for f in each),
                "errors": sum(f["errors"] for f in each),
                "achieved_rps_per_worker": [f["achieved_rps_per_worker"] for f in each],
                "latency": bc.summarise([run["latency_s"] for run in mine]),
                "ttft": bc.summarise([run["ttft_s"] for run in mine]),
                "serving_pauses_ge_50ms": sum(f["serving_pauses_ge_50ms"] for f in each),
                "serving_pauses_ge_budget": sum(f["serving_pauses_ge_budget"] for f in each),
                "longest_pause_ms": max(max(f["longest_pause_ms"].values()) for f in each),
                "longest_pause_by_process_ms": [f["longest_pause_ms"] for f in each],
                "serving_gen2": [f["serving_gen2"] for f in each],
                "held_waits_ge_50ms": sum(f["held_waits_ge_50ms"] for f in each),
                "longest_wait_ms": max(f["longest_wait_ms"] for f in each),
                "waits": sum(f["waits"] for f in each),
                "maintenances": sum(f["maintenances"] for f in each),
                "maintenance_took_ms": _spread(took),
                "maintenance_closed_ms": _spread(closed),
                "reclaimed": sum(f["reclaimed"] for f in each),
                "gave_up": sum(f["gave_up"] for f in each),
                "due_warnings": sum(f["due_warnings"] for f in each),
                "rss_worker_end_mb": [f["rss_worker_end_mb"] for f in each],
                "rss_worker_peak_mb": [f["rss_worker_peak_mb"] for f in each],
                "rss_frontend_end_mb": [f["rss_frontend_end_mb"] for f in each],
                "loadavg_mean": [f["loadavg_mean"] for f in each],
            }
        )
    return rows


def _spread(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": statistics.median(values), "max": max(values)}


def side_by_side(runs: list[dict]) -> list[dict]:
    """Per pass, each arm against ``once`` (throughput per worker) and ``stock`` (RSS per
    worker), with both arms' load averages: the ratios the goals are judged on."""
    pairs = []
    for pass_index in sorted({run["pass"] for run in runs}):
        mine = {run["arm"]: figures(run, 0.0) for run in runs if run["pass"] == pass_index}
        for arm, f in mine.items():
            entry: dict[str, Any] = {"pass": pass_index, "arm": arm, "load": f["loadavg_mean"]}
            reference = "once-busy" if arm.endswith("-busy") else "once"
            if reference in mine and arm != reference:
                ref = mine[reference]
                entry["throughput_over_once"] = bc.ratio(
                    f["achieved_rps_per_worker"], ref["achieved_rps_per_worker"]
                )
                entry["once_load"] = ref["loadavg_mean"]
            if "stock" in mine and arm != "stock" and f["rss_worker_end_mb"]:
                entry["rss_over_stock"] = bc.ratio(
                    f["rss_worker_end_mb"], mine["stock"]["rss_worker_end_mb"] or 0.0
                )
                entry["stock_load"] = mine["stock"]["loadavg_mean"]
            pairs.append(entry)
    return pairs


def judge(rows: list[dict], pairs: list[dict]) -> dict:
    """The issue's goals on the measured figures: met or not, with the figure."""
    by = {row["arm"]: row for row in rows}
    verdict: dict[str, Any] = {}
    for arm in ("withdraw", "idle"):
        if arm not in by:
            continue
        row = by[arm]
        stalls = row["serving_pauses_ge_50ms"] + row["held_waits_ge_50ms"]
        verdict[f"{arm}_stalls_ge_50ms"] = {"measured": stalls, "met": stalls == 0}
        verdict[f"{arm}_failed_requests"] = {"measured": row["errors"], "met": row["errors"] == 0}
        ratios = [p["throughput_over_once"] for p in pairs
                  if p["arm"] == arm and "throughput_over_once" in p]  # fmt: skip
        if ratios:
            worst = min(ratios)
            verdict[f"{arm}_throughput_over_once"] = {"measured": ratios, "met": worst >= 0.95}
        rss = [p["rss_over_stock"] for p in pairs if p["arm"] == arm and "rss_over_stock" in p]
        if rss:
            verdict[f"{arm}_rss_over_stock"] = {"measured": rss, "met": max(rss) <= 1.05}
    if "once" in by:
        longest = by["once"]["longest_pause_ms"]
        verdict["once_longest_pause_ms"] = {"measured": longest, "seconds": longest >= 1000.0}
    return verdict


def without_samples(run: dict) -> dict:
    """A run for the JSON: the per-request lists dropped (the rows pool them), and the slowest
    requests kept with the time they were scheduled at (what the plot marks)."""
    slowest = sorted(zip(run["latency_s"], run["scheduled_s"], strict=True), reverse=True)[:20]
    kept = summary_of(run)
    kept["slowest"] = [{"t": at, "latency_ms": 1000 * latency} for latency, at in slowest]
    return kept


def progress_line(run: dict) -> str:
    f = figures(run, 0.0)
    return (
        f"  {f['arm']:9} ok={f['ok']} errors={f['errors']} "
        f"achieved={f['achieved_rps']:.1f}/{f['offered_rps']:.0f} rps "
        f"p99={f['latency']['p99_ms']:.0f} ms max={f['latency']['max_ms']:.0f} ms "
        f"stalls>=50ms={f['serving_pauses_ge_50ms']} "
        f"longest pause={max(f['longest_pause_ms'].values()):.0f} ms "
        f"maintenances={f['maintenances']} reclaimed={f['reclaimed']} "
        f"rss/worker={f['rss_worker_end_mb'] or 0:.0f} MiB load={f['loadavg_mean'] or 0:.1f}"
    )


def _mean(values) -> float:
    present = [v for v in values if v is not None]
    return statistics.mean(present) if present else float("nan")


def table(rows: list[dict]) -> str:
    """One Markdown row per arm (docs/benchmarks.md quotes it)."""
    cells = []
    for row in rows:
        took, closed = row["maintenance_took_ms"], row["maintenance_closed_ms"]
        cells.append(
            [
                row["arm"],
                row["workers"],
                row["sent"],
                row["errors"],
                _mean(row["achieved_rps_per_worker"]),
                row["latency"]["p99_ms"],
                row["latency"]["p999_ms"],
                row["latency"]["max_ms"],
                row["serving_pauses_ge_50ms"],
                row["longest_pause_ms"],
                f"{row['waits']} / {row['longest_wait_ms']:.0f}",
                row["maintenances"],
                f"{took.get('median', 0):.0f} / {took.get('max', 0):.0f}",
                closed.get("max", 0.0),
                row["reclaimed"],
                _mean(row["rss_worker_end_mb"]),
                _mean(row["loadavg_mean"]),
            ]
        )
    return bc.format_table(
        ["arm", "workers", "requests", "failed", "RPS/worker", "p99 ms", "p99.9 ms", "max ms",
         "pauses >= 50 ms", "longest pause ms", "held waits / longest ms", "maintenances",
         "GC work ms median / max", "admission closed ms max", "reclaimed objects",
         "RSS/worker MiB", "load avg"],
        cells,
    )  # fmt: skip


def plot(args, runs: list[dict], name: str, pause_log_ms: float):
    """RSS per worker over time, the serving pauses and the requests' latency over time (with
    each maintenance marked), and each arm's latency tail."""
    plt = bc.pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(15, 9))
    (rss_ax, pause_ax), (time_ax, tail_ax) = axes
    for run in runs:
        color = COLORS.get(run["arm"])
        first = run["pass"] % 2 == 0
        style, marker = ("-", "o") if first else ("--", "x")
        label = f"{run['arm']} (pass {run['pass'] + 1})"
        workers = _workers(run)
        times = [s["t"] for s in run["timeline"]]
        per_worker = [_mean(s["rss_mb"].get(w) for w in workers) for s in run["timeline"]]
        rss_ax.plot(times, per_worker, style, color=color, label=label, lw=1.2)
        pauses = [p for proc in run["processes"].values() for p in proc["serving_pauses"]]
        pause_ax.scatter([p["t"] for p in pauses], [p["ms"] for p in pauses], s=10,
                         color=color, marker=marker, label=label)  # fmt: skip
        time_ax.scatter(run["scheduled_s"], [1000 * v for v in run["latency_s"]], s=3,
                        color=color, marker=marker, alpha=0.5, label=label)  # fmt: skip
        for proc in run["processes"].values():
            for m in proc["maintenances"]:
                time_ax.axvline(m["t"], color=color, lw=0.4, alpha=0.3, ls=style)
        latencies = sorted(run["latency_s"])
        if latencies:
            n = len(latencies)
            tail_ax.plot([1000 * v for v in latencies], [1 - i / n for i in range(n)], style,
                         color=color, label=label, lw=1.2)  # fmt: skip
    for ax in (pause_ax, time_ax):
        ax.axhline(args.budget_ms, color="grey", ls=":", lw=1)
        ax.axhline(STALL_MS, color="black", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_ylabel("ms (log)")
    rss_ax.set_title("RSS per worker over the run")
    rss_ax.set_ylabel("MiB")
    pause_ax.set_title(f"serving GC pauses >= {pause_log_ms:g} ms, every process")
    time_ax.set_title("each request's latency, at its scheduled time (lines: maintenances)")
    tail_ax.set_title("latency tail (share of requests slower than x)")
    tail_ax.set_xscale("log")
    tail_ax.set_yscale("log")
    tail_ax.set_xlabel("ms from the scheduled send time")
    for ax in (rss_ax, pause_ax, time_ax):
        ax.set_xlabel("seconds of load")
    for ax in axes.flat:
        ax.grid(True, which="both", alpha=0.3)
    rss_ax.legend(fontsize=7)
    tail_ax.legend(fontsize=7)
    title = (
        f"{name} ({bc.mode_name(args)}): frontend + {args.engine} workers, "
        f"{bc.cpu_model()}, {os.cpu_count()} cores"
    )
    return bc.save_plot(args, fig, name, title)


PROCESS_MARKERS = {"frontend": "s", "worker": "o", "worker1": "^"}


def plot_pauses(args, runs: list[dict], name: str, pause_log_ms: float):
    """One panel per arm: every serving GC pause the arm's processes logged, over the run (each
    process its own marker, each pass its colour), and when its maintenances ran. Reads only
    what the result's JSON keeps too (``per_arm``), so it can be drawn again from there."""
    plt = bc.pyplot()
    if plt is None:
        return None
    arms = list(dict.fromkeys(run["arm"] for run in runs))
    fig, axes = plt.subplots(len(arms), 1, figsize=(12, 2.6 * len(arms)), sharex=True,
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, arm in zip(axes[:, 0], arms, strict=True):
        for run in (r for r in runs if r["arm"] == arm):
            color = f"C{run['pass']}"
            for process, figures_of in run["processes"].items():
                pauses = figures_of["serving_pauses"]
                ax.scatter([p["t"] for p in pauses], [p["ms"] for p in pauses], s=12,
                           marker=PROCESS_MARKERS.get(process, "x"), color=color,
                           label=f"pass {run['pass'] + 1}, {process}")  # fmt: skip
                for m in figures_of["maintenances"]:
                    ax.axvline(m["t"], color=color, lw=0.3, alpha=0.25)
        ax.axhline(STALL_MS, color="black", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_ylim(bottom=pause_log_ms * 0.9)
        ax.set_ylabel("pause ms (log)")
        ax.set_title(f"{arm}: serving GC pauses >= {pause_log_ms:g} ms (thin lines: maintenances)",
                     fontsize=9)  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", ncol=3)
    axes[-1, 0].set_xlabel("seconds of load")
    title = f"{name} ({bc.mode_name(args)}): serving pauses per arm, dotted line 50 ms"
    return bc.save_plot(args, fig, f"{name}-pauses", title)
