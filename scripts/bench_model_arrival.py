#!/usr/bin/env python3
"""How long ``/health`` waits while models arrive (docs/security.md, "Discovery records").

One run serves the frontend's real HTTP app (its registry, the ``hf`` processor, its listener)
on 127.0.0.1, and a child process asks ``GET /health`` every 5 ms on a kept-alive connection.
In each round ``--models`` records arrive at once, each naming its own model directory whose
tokenizer.json is about ``--tokenizer-mb`` (the tiny model's, with added tokens), and the
frontend builds their processors, as it does when a deployment's workers start together.
Measured: each /health answer's time, from the first record to the last processor built.

Two arms alternate round by round, so both see the same machine:

* ``in turn``: as built, the tokenizers' long native calls (which hold the GIL) one at a time,
  the event loop given a turn after each (dynamo.frontend.processors.native_calls);
* ``all at once``: the same with that turn-taking switched off (what the frontend did before).

Printed: per arm, the median over rounds of the longest /health answer and of its p99, and
their ratio.

    python scripts/bench_model_arrival.py [--rounds N] [--models N] [--tokenizer-mb X]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLLER = r"""
import http.client, sys, time
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
while True:
    started = time.perf_counter()
    conn.request("GET", "/health")
    conn.getresponse().read()
    print(time.monotonic(), time.perf_counter() - started, flush=True)
    time.sleep(0.005)
"""


def big_tokenizers(root: Path, count: int, megabytes: float) -> list[Path]:
    """``count`` copies of the tiny tokenizer, each with enough added tokens to weigh about
    ``megabytes`` (every copy its own tokens: nothing is shared between the loads)."""
    import bench_common

    source = Path(bench_common.tiny_tokenizer_dir())
    base = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    first_id = max(base["model"]["vocab"].values()) + 1
    per_token = 140  # bytes of JSON an added token takes, about
    added = max(1, int(megabytes * 1024 * 1024 - len(json.dumps(base))) // per_token)
    directories = []
    for index in range(count):
        directory = root / f"model-{index}"
        shutil.copytree(source, directory, ignore=shutil.ignore_patterns(".*"))
        tokenizer = dict(base)
        tokenizer["added_tokens"] = list(base.get("added_tokens", [])) + [
            {"id": first_id + k, "content": f"<m{index}-t{k}>", "single_word": False,
             "lstrip": False, "rstrip": False, "normalized": False, "special": False}
            for k in range(added)
        ]  # fmt: skip
        (directory / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
        directories.append(directory)
    return directories


@contextlib.contextmanager
def turn_taking(on: bool):
    """The native calls' turn-taking as built, or switched off."""
    from dynamo.frontend.processors import native_calls

    saved = native_calls._turn, native_calls.LOOP_TURN_S
    if not on:
        native_calls._turn, native_calls.LOOP_TURN_S = contextlib.nullcontext(), 0.0  # type: ignore[assignment]
    try:
        yield
    finally:
        native_calls._turn, native_calls.LOOP_TURN_S = saved


async def measure_round(directories: list[Path], in_turn: bool, round_index: int) -> list[float]:
    from aiohttp import web

    from dynamo.frontend.processors.chat_processor import build_chat_processor
    from dynamo.frontend.routing.model_registry import ModelRegistry
    from dynamo.frontend.routing.worker_router import WorkerRouter, create_worker_session
    from dynamo.frontend.serving.http_service import FrontendService
    from dynamo.frontend.serving.http_surface import http_runner
    from dynamo.runtime.discovery import ModelRecord
    from dynamo.runtime.model_card import ModelCard

    cards = [
        ModelCard(
            served_model_name=f"r{round_index}-m{index}",
            model_path=str(directory),
            tokenizer_path=str(directory),
            context_length=1024,
        )
        for index, directory in enumerate(directories)
    ]
    registry = ModelRegistry(build_chat_processor)
    session = create_worker_session()
    router = WorkerRouter(session)
    runner = http_runner(FrontendService(registry, router).build_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    poller = await asyncio.create_subprocess_exec(
        sys.executable, "-c", POLLER, str(port), stdout=subprocess.PIPE
    )
    answers: list[tuple[float, float]] = []

    async def read_answers() -> None:
        assert poller.stdout is not None
        async for line in poller.stdout:
            at, took = line.split()
            answers.append((float(at), float(took)))

    reading = asyncio.ensure_future(read_answers())
    try:
        while not answers:  # the poller is answered: the measurement can start
            await asyncio.sleep(0.01)
        with turn_taking(in_turn):
            started = time.monotonic()
            for card in cards:
                name = card.served_model_name
                registry.add_instance(
                    ModelRecord(model=name, endpoint="http://127.0.0.1:9", card=card)
                )
            await registry.wait_idle()
            ended = time.monotonic()
        await asyncio.sleep(0.2)  # the answers asked before the end arrive
        assert len(registry.entries()) == len(cards), "a model was not built"
    finally:
        poller.kill()
        await poller.wait()
        reading.cancel()
        await router.aclose()
        await session.close()
        await runner.cleanup()
        await registry.aclose()
    # An answer overlapped the arrival if it ended after the first record and began before
    # the last processor was built.
    return [took for at, took in answers if at >= started and at - took <= ended]


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, round(len(values) * 0.99) - 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--tokenizer-mb", type=float, default=1.0)
    args = parser.parse_args(argv)
    arms = {"in turn": True, "all at once": False}
    worst: dict[str, list[float]] = {arm: [] for arm in arms}
    tails: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as root:
        directories = big_tokenizers(Path(root), args.models, args.tokenizer_mb)
        for round_index in range(args.rounds):
            for arm, in_turn in arms.items():
                times = asyncio.run(measure_round(directories, in_turn, round_index))
                worst[arm].append(max(times) * 1e3)
                tails[arm].append(p99(times) * 1e3)
    print(
        f"{args.models} models arriving at once, tokenizer.json ~{args.tokenizer_mb:g} MB each, "
        f"{args.rounds} rounds per arm\n"
    )
    print("| arm | longest /health (median of rounds) | p99 /health (median) | worst round |")
    print("|---|---|---|---|")
    for arm in arms:
        print(
            f"| {arm} | {statistics.median(worst[arm]):.0f} ms | "
            f"{statistics.median(tails[arm]):.0f} ms | {max(worst[arm]):.0f} ms |"
        )
    ratio = statistics.median(worst["in turn"]) / statistics.median(worst["all at once"])
    print(f"\nin turn / all at once, longest answer: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
