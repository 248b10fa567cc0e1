#!/usr/bin/env python3
"""What the chat-template bounds cost a normal request (docs/security.md, "Chat templates").

One run renders the same chat (a system prompt and a few turns, ~2 KB, through the tiny
model's Llama-3-style template, scripts/make_tiny_model.py) the two ways the frontend can:

* ``thread``: on a preprocessing thread of the frontend process (``--dyn-template-processes 0``,
  the old path, unbounded);
* ``sandbox``: in a template render process (the default), which adds the pipe's round trip
  (pickling the messages there and the prompt back) and the wait for a free process.

The two alternate in rounds, so both see the same machine; each round renders ``--renders``
times, one at a time (a request's latency, not throughput). Printed: median and p99 per render
of each, and their ratio, as the row docs/security.md quotes.

    python scripts/bench_template_sandbox.py [--rounds N] [--renders N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time


def conversation() -> list[dict[str, str]]:
    turns = [{"role": "system", "content": "You are a helpful assistant. " * 10}]
    for i in range(4):
        turns.append({"role": "user", "content": f"Question {i}: " + "what about this? " * 12})
        turns.append({"role": "assistant", "content": f"Answer {i}: " + "it is so. " * 15})
    turns.append({"role": "user", "content": "And finally?"})
    return turns


async def measure(rounds: int, renders: int) -> dict[str, list[float]]:
    import concurrent.futures

    from make_tiny_model import CHAT_TEMPLATE

    from dynamo.frontend.processors.hf_processor import HfChatTemplate, RenderOptions
    from dynamo.frontend.processors.template_sandbox import TemplateSandbox

    template = HfChatTemplate(CHAT_TEMPLATE, {"bos_token": "<s>", "eos_token": "</s>"})
    messages, options = conversation(), RenderOptions()
    sandbox = TemplateSandbox(2)
    await asyncio.to_thread(sandbox.start)
    threads = concurrent.futures.ThreadPoolExecutor(4)
    loop = asyncio.get_running_loop()
    assert await sandbox.render("m", template, messages, options) == template.render(messages)
    times: dict[str, list[float]] = {"thread": [], "sandbox": []}
    try:
        for _ in range(rounds):
            for _ in range(renders):
                started = time.perf_counter()
                await loop.run_in_executor(threads, template.render, messages, options)
                times["thread"].append(time.perf_counter() - started)
            for _ in range(renders):
                started = time.perf_counter()
                await sandbox.render("m", template, messages, options)
                times["sandbox"].append(time.perf_counter() - started)
    finally:
        sandbox.close()
        threads.shutdown()
    return times


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, round(len(values) * 0.99) - 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--renders", type=int, default=200)
    args = parser.parse_args(argv)
    times = asyncio.run(measure(args.rounds, args.renders))
    medians = {way: statistics.median(values) * 1e3 for way, values in times.items()}
    p99s = {way: p99(values) * 1e3 for way, values in times.items()}
    print("| way | renders | median ms | p99 ms |")
    print("|---|---|---|---|")
    for way in times:
        print(f"| {way} | {len(times[way])} | {medians[way]:.3f} | {p99s[way]:.3f} |")
    print(
        f"\nsandbox / thread: median {medians['sandbox'] / medians['thread']:.2f}x "
        f"(+{medians['sandbox'] - medians['thread']:.3f} ms), "
        f"p99 {p99s['sandbox'] / p99s['thread']:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
