#!/usr/bin/env python3
"""What a hostile chat template costs the other models of a frontend (issue 37, items 3 and 6;
docs/benchmarks.md, "Hostile templates"). Real processes: ``python -m dynamo.frontend`` with
its default render processes, a mock worker serving a healthy model (the tiny tokenizer), and
hostile models that are only discovery records (their requests never reach a worker).

* ``output`` (item 3): a hostile model whose template renders ``{{ 'a' * N }}`` (N = 2,000,000,
  within the render processes' 16 Mi bound), asked by ``--hostile-clients`` clients in a loop,
  while one client asks the healthy model one request at a time. Measured: the healthy
  requests' latency during the attack (median, p99, max), and the frontend process's resident
  memory (before the attack, and its peak). Once with the hostile model's context at the tiny
  model's 512 tokens, once at 131072 (where the prompt is within what the context could hold,
  and is tokenized).
* ``compile`` (item 6): six records whose templates take longer than ``--dyn-template-timeout``
  (2 s) to compile, then, once the frontend has seen them (a second: five of its directory
  polls), an ordinary model's record: how long until the ordinary model is served, from the
  moment its record is written.

Each arm is a frontend: ``after`` runs this checkout's sources; ``--before-src DIR`` adds a
``before`` arm running the frontend from another checkout's ``components/src`` (a worktree of
the commit before the change), and the two alternate in rounds, side by side on one machine.

    python scripts/bench_hostile_templates.py [--before-src DIR] [--rounds N] [--quick|--smoke]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bench_common as bc
from launcher_process import LauncherProcess, wait_until
from serving_pair import rss_mb

LISTENING = r"HTTP service listening on (http://127\.0\.0\.1:\d+)"
HEALTHY = "healthy"
ORDINARY = "[{{ messages[0].content }}]"
SLOW_TO_COMPILE = "{{ x }}" * 140_000  # ~1 MB: seconds to compile
CONTEXTS = (512, 131072)


def post(url: str, body: dict, timeout_s: float = 120.0) -> int:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code


def register(discovery: Path, name: str, template: str, context: int) -> None:
    from dynamo.runtime.discovery import ModelRecord
    from dynamo.runtime.discovery.file_store import DiscoveryStore
    from dynamo.runtime.model_card import ModelCard

    path = discovery.parent / f"{name}.jinja"
    path.write_text(template, encoding="utf-8")
    tokenizer = bc.tiny_tokenizer_dir()
    card = ModelCard(
        served_model_name=name,
        model_path=tokenizer,
        tokenizer_path=tokenizer,
        context_length=context,
        eos_token_ids=(1,),
        chat_template_path=str(path),
    )
    DiscoveryStore(discovery).register(
        ModelRecord(model=name, endpoint="http://127.0.0.1:9", card=card)
    )


class Frontend:
    """A frontend (from ``src``: another checkout's sources, or None for this one's) and a mock
    worker serving the healthy model, on a fresh discovery directory."""

    def __init__(self, work_dir: Path, src: str | None, *frontend_args: str) -> None:
        self.discovery = work_dir / "discovery"
        self.discovery.mkdir(parents=True)
        self._url: str | None = None
        common = ["--discovery-dir", str(self.discovery)]
        self.worker = LauncherProcess(
            "worker", "dynamo.vllm",
            ["--engine", "mock", "--model", bc.tiny_tokenizer_dir(), "--served-model-name",
             HEALTHY, "--request-plane-host", "127.0.0.1", "--mock-token-ms", "1", *common],
            log_dir=work_dir, env=bc.child_env(), cwd=bc.REPO_ROOT,
        )  # fmt: skip
        env = bc.child_env()
        if src is not None:
            env["PYTHONPATH"] = f"{src}:{env['PYTHONPATH']}"
        self.frontend = LauncherProcess(
            "frontend", "dynamo.frontend",
            ["--http-host", "127.0.0.1", "--http-port", "0", "--discovery-ttl",
             "3600", *common, *frontend_args],
            log_dir=work_dir, env=env, cwd=bc.REPO_ROOT,
        )  # fmt: skip

    @property
    def url(self) -> str:
        """Where the frontend listens: it binds port 0 and logs the port it got (a port picked
        free beforehand can be taken by another process before the frontend binds it)."""
        if self._url is None:
            self._url = self.frontend.wait_for_log(LISTENING).group(1)
        return self._url

    def served(self) -> set[str]:
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=2.0) as response:
                return {model["id"] for model in json.load(response)["data"]}
        except (OSError, ValueError):
            return set()

    def wait_serving(self, *models: str, deadline_s: float = 180.0) -> None:
        def ready() -> bool:
            self.frontend.check_alive()
            return set(models) <= self.served()

        wait_until(ready, deadline_s=deadline_s, what=f"{models} served", poll_s=0.05)

    def stop(self) -> None:
        self.frontend.stop(30.0)
        self.worker.stop(30.0)


def chat(url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    return post(url + "/v1/chat/completions", body)


def output_round(work_dir: Path, src: str | None, context: int, args) -> dict:
    """One frontend under the output attack (see the module docstring)."""
    server = Frontend(work_dir, src)
    try:
        register(server.discovery, "hostile", f"{{{{ 'a' * {args.chars} }}}}", context)
        server.wait_serving(HEALTHY, "hostile")
        chat(server.url, HEALTHY)  # warm
        baseline = rss_mb(server.frontend.pid) or 0.0
        stop = threading.Event()
        peak = [baseline]
        hostile_statuses: list[int] = []

        def sample_memory() -> None:
            while not stop.wait(0.1):
                peak[0] = max(peak[0], rss_mb(server.frontend.pid) or 0.0)

        def attack() -> None:
            while not stop.is_set():
                hostile_statuses.append(chat(server.url, "hostile"))

        latencies: list[float] = []
        statuses: list[int] = []
        with concurrent.futures.ThreadPoolExecutor(args.hostile_clients + 1) as threads:
            threads.submit(sample_memory)
            for _ in range(args.hostile_clients):
                threads.submit(attack)
            time.sleep(args.settle_s)  # the attack under way
            ends = time.monotonic() + args.duration_s
            while time.monotonic() < ends:
                started = time.perf_counter()
                statuses.append(chat(server.url, HEALTHY))
                latencies.append((time.perf_counter() - started) * 1000.0)
                time.sleep(0.05)
            stop.set()
        return {
            "context": context,
            "healthy_ms": latencies,
            "healthy_statuses": sorted(set(statuses)),
            "hostile_statuses": sorted(set(hostile_statuses)),
            "hostile_requests": len(hostile_statuses),
            "rss_before_mb": baseline,
            "rss_peak_mb": peak[0],
        }
    finally:
        server.stop()


def compile_round(work_dir: Path, src: str | None, args) -> dict:
    """One frontend: six slow-compiling records, then an ordinary one (see the docstring)."""
    server = Frontend(work_dir, src, "--dyn-template-timeout", "2")
    try:
        server.wait_serving(HEALTHY)
        for i in range(args.hostile_records):
            register(server.discovery, f"hostile{i}", SLOW_TO_COMPILE + f"{{# {i} #}}", 512)
        # The watcher reads the directory every 0.2 s, its records in the order of their file
        # names (random instance ids): the ordinary record must come after the hostile ones.
        time.sleep(1.0)
        written = time.monotonic()
        register(server.discovery, "ordinary", ORDINARY, 512)
        server.wait_serving("ordinary", deadline_s=600.0)
        return {"ordinary_served_after_s": time.monotonic() - written}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-src", help="components/src of the checkout before the change")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chars", type=int, default=2_000_000)
    parser.add_argument("--hostile-clients", type=int, default=4)
    parser.add_argument("--hostile-records", type=int, default=6)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument(
        "--scenarios", default="output,compile", help="which of output,compile to run"
    )
    bc.add_mode_args(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.chars, args.duration_s, args.settle_s = 1, 20_000, 1.0, 0.2
        args.hostile_clients, args.hostile_records = 1, 1
    elif args.quick:
        args.rounds, args.duration_s = 1, 8.0
    bc.exit_cleanly_on_sigterm()
    arms = (
        {"after": None} if args.before_src is None else {"before": args.before_src, "after": None}
    )
    root = bc.run_dir(Path(args.out), f"hostile-templates-{int(time.time())}", "measuring")
    runs: dict[str, dict[str, list]] = {arm: {"output": [], "compile": []} for arm in arms}
    scenarios = args.scenarios.split(",")
    for round_index in range(args.rounds):
        for arm, src in arms.items():
            for context in CONTEXTS if "output" in scenarios else ():
                work = root / f"{arm}-{round_index}-output-{context}"
                runs[arm]["output"].append(output_round(work, src, context, args))
            if "compile" in scenarios:
                work = root / f"{arm}-{round_index}-compile"
                runs[arm]["compile"].append(compile_round(work, src, args))
    rows = []
    for arm in arms:
        for context in CONTEXTS if "output" in scenarios else ():
            rounds = [r for r in runs[arm]["output"] if r["context"] == context]
            ms = [v for r in rounds for v in r["healthy_ms"]]
            hostile = sorted({s for r in rounds for s in r["hostile_statuses"]})
            rows.append([
                arm, f"output, context {context}", bc.median(ms), bc.percentile(ms, 99), max(ms),
                max(r["rss_peak_mb"] for r in rounds), min(r["rss_before_mb"] for r in rounds),
                ",".join(str(s) for s in hostile), "",
            ])  # fmt: skip
        served = [r["ordinary_served_after_s"] for r in runs[arm]["compile"]]
        if served:
            span = f"{min(served):.1f}-{max(served):.1f}"
            rows.append([arm, "compile", "", "", "", "", "", "", span])
    headers = [
        "arm", "scenario", "healthy median ms", "healthy p99 ms", "healthy max ms",
        "frontend peak MiB", "frontend before MiB", "hostile statuses", "ordinary served after s",
    ]  # fmt: skip
    print(bc.format_table(headers, rows))
    result = bc.new_result("hostile_templates", bc.mode_name(args), arms=list(arms), runs=runs)
    return bc.finish(args, "hostile_templates", result, None)


if __name__ == "__main__":
    sys.exit(main())
