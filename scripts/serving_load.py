#!/usr/bin/env python3
"""The serving A/B's load client, in a process of its own: open-loop Poisson load on one URL.

It sends chat requests at Poisson-scheduled times whatever the server does (open loop) and counts
latency from the *scheduled* send time, so a stalled server is charged for the requests it
delayed (no coordinated omission). It prints one JSON document: what it sent, the errors by kind,
the completion rate achieved, and every latency and time to first token (seconds) with the
time each of those requests was scheduled at.

    python scripts/serving_load.py --url URL/v1/chat/completions --rate RPS --duration S
        [--seed N] [--timeout S] [--messages N] [--max-tokens N] [--model-name NAME] [--no-stream]

ab_serving.py and serving_probes.py run it through :func:`run_client` / :func:`client_argv`, the
soak (bench_gc_soak.py) in the background through :func:`start_client`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import bench_common as bc

# The per-request lists of a client's document (the rest is its summary): what a script leaves
# out of its JSON once it has pooled them.
PER_REQUEST_KEYS = ("latency_s", "ttft_s", "send_lag_s", "scheduled_s")


def summary_of(load: dict) -> dict:
    """A client's document without its per-request lists."""
    return {key: value for key, value in load.items() if key not in PER_REQUEST_KEYS}


def poisson_schedule(rate: float, duration_s: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of a Poisson process of ``rate`` per second."""
    rng = random.Random(seed)
    times: list[float] = []
    now = 0.0
    while True:
        now += rng.expovariate(rate)
        if now >= duration_s:
            return times
        times.append(now)


def request_body(
    messages: int, max_tokens: int, stream: bool, index: int, model: str, top_logprobs: int = 0
) -> dict:
    """A chat request: a few turns of conversation (the frontend parses and renders them); with
    ``top_logprobs``, each token's log probabilities too (the engine's process builds them)."""
    turns = []
    for turn in range(messages):
        role = "user" if turn % 2 == 0 else "assistant"
        turns.append({"role": role, "content": f"turn {turn} of request {index}: tell me more"})
    body = {"model": model, "messages": turns, "max_tokens": max_tokens, "stream": stream}
    if top_logprobs:
        body.update(logprobs=True, top_logprobs=top_logprobs)
    return body


async def _one_request(session, url: str, body: dict, scheduled: float, stream: bool, loop):
    sent = loop.time()
    first = None
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                await response.read()
                return {"ok": False, "error": f"http {response.status}", "lag": sent - scheduled}
            if stream:
                done = False
                async for line in response.content:
                    if not line.startswith(b"data: "):
                        continue
                    if first is None:
                        first = loop.time()
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif b'"error"' in line:
                        return {"ok": False, "error": "in-band error", "lag": sent - scheduled}
                if not done:
                    return {"ok": False, "error": "stream ended early", "lag": sent - scheduled}
            else:
                payload = await response.json()
                if not payload.get("choices"):
                    return {"ok": False, "error": "no choices", "lag": sent - scheduled}
        end = loop.time()
        return {
            "ok": True,
            "scheduled": scheduled,
            "latency": end - scheduled,
            "ttft": (first if first is not None else end) - scheduled,
            "lag": sent - scheduled,
            "end": end,
        }
    except asyncio.TimeoutError:
        return {"ok": False, "error": "timeout", "lag": sent - scheduled}
    except Exception as exc:  # noqa: BLE001 - every failure is an error of this request
        return {"ok": False, "error": type(exc).__name__, "lag": sent - scheduled}


async def run_load(args: argparse.Namespace) -> dict:
    import aiohttp

    schedule = poisson_schedule(args.rate, args.duration, args.seed)
    connector = aiohttp.TCPConnector(limit=0)  # open loop: never queue in the client
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = loop.time() + 0.05
        tasks = []
        for index, offset in enumerate(schedule):
            delay = start + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            body = request_body(
                args.messages,
                args.max_tokens,
                args.stream,
                index,
                args.model_name,
                args.top_logprobs,
            )
            tasks.append(
                asyncio.ensure_future(
                    _one_request(session, args.url, body, start + offset, args.stream, loop)
                )
            )
        results = await asyncio.gather(*tasks)
    ok = [r for r in results if r["ok"]]
    errors: dict[str, int] = {}
    for r in results:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    # Completion rate between the first and the last OK response: in steady state that span is
    # the sending window shifted by one latency, past saturation it stretches with the backlog.
    ends = sorted(r["end"] for r in ok)
    achieved = (
        (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 and ends[-1] > ends[0] else 0.0
    )
    return {
        "offered_rps": args.rate,
        "duration_s": args.duration,
        "sent": len(results),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "achieved_rps": achieved,
        "latency_s": [r["latency"] for r in ok],
        # When each OK request was scheduled, in seconds from the first send (same order).
        "scheduled_s": [r["scheduled"] - start for r in ok],
        "ttft_s": [r["ttft"] for r in ok],
        "send_lag_s": [r["lag"] for r in results],
    }


def client_argv(url: str, rate: float, duration_s: float, seed: int, args) -> list[str]:
    """The load client's command line, with the request shape of ``args`` (timeout, messages,
    max tokens, model name, streaming)."""
    return [
        sys.executable,
        __file__,
        "--url",
        url,
        "--rate",
        str(rate),
        "--duration",
        str(duration_s),
        "--seed",
        str(seed),
        "--timeout",
        str(args.timeout),
        "--messages",
        str(args.messages),
        "--max-tokens",
        str(args.max_tokens),
        "--model-name",
        args.model_name,
        "--top-logprobs",
        str(getattr(args, "top_logprobs", 0)),
        "--stream" if args.stream else "--no-stream",
    ]


def start_client(
    url: str, rate: float, duration_s: float, seed: int, args, out: Path
) -> subprocess.Popen:
    """The client started in the background (a caller samples the servers meanwhile), its JSON
    document written to ``out`` (a file: a pipe would fill and block it); read it with
    :func:`client_result`."""
    with open(out, "wb") as sink:
        return subprocess.Popen(
            client_argv(url, rate, duration_s, seed, args),
            stdout=sink,
            stderr=subprocess.PIPE,
            env=bc.child_env(),
            cwd=bc.REPO_ROOT,
        )


def client_result(proc: subprocess.Popen, out: Path, timeout_s: float) -> dict:
    """Wait for a client :func:`start_client` started; its JSON document."""
    _, stderr = proc.communicate(timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"load client exited {proc.returncode}:\n{stderr[-4000:]!r}")
    return json.loads(Path(out).read_text().strip().splitlines()[-1])


def run_client(url: str, rate: float, duration_s: float, seed: int, args) -> dict:
    """Run the client to its end: its JSON document."""
    return bc.run_json_child(
        client_argv(url, rate, duration_s, seed, args), timeout_s=duration_s + args.timeout + 120
    )


def main(argv: list[str] | None = None) -> int:
    import gc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the chat completions URL")
    parser.add_argument("--rate", type=float, required=True, help="offered requests per second")
    parser.add_argument("--duration", type=float, required=True, help="seconds of sending")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Poisson schedule")
    parser.add_argument("--timeout", type=float, default=10.0, help="request timeout, seconds")
    parser.add_argument("--messages", type=int, default=8, help="chat turns per request")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per request")
    parser.add_argument("--model-name", default="bench", help="the model the requests name")
    parser.add_argument(
        "--top-logprobs", type=int, default=0, help="log probabilities asked per token (0: none)"
    )
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    # The client's own collections would add to the latencies it measures, in every arm alike:
    # its start-up heap is frozen and automatic GC is off while it sends (a rung is short).
    gc.collect()
    gc.freeze()
    gc.disable()
    result = asyncio.run(run_load(args))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
