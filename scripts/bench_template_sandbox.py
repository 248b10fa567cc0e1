#!/usr/bin/env python3
"""What the chat-template bounds cost a normal request (docs/security.md, "Chat templates").

One run renders the same chat (a system prompt and a few turns, ~2 KB, through the tiny
model's Llama-3-style template, scripts/make_tiny_model.py) with one chat processor
(``--processor``: ``hf``, or ``vllm`` / ``sglang`` run from their environments) the two ways the
frontend can:

* ``thread``: on a preprocessing thread of the frontend process (``--dyn-template-processes 0``,
  unbounded): ``hf``'s own Jinja environment, or transformers' ``apply_chat_template`` on vLLM's
  or SGLang's tokenizer;
* ``sandbox``: in a template render process (the default), which adds the pipe's round trip
  (pickling the messages there and the prompt back) and the wait for a free process; for
  ``vllm`` and ``sglang`` it also replaces transformers' render with the render processes' own.

The two alternate in rounds, so both see the same machine; each round renders ``--renders``
times, one at a time (a request's latency, not throughput). Printed: median and p99 per render
of each, and their ratio, as the row docs/security.md quotes.

    python scripts/bench_template_sandbox.py [--processor hf|vllm|sglang] [--rounds N] [--renders N]
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


async def measure(processor_kind: str, rounds: int, renders: int) -> dict[str, list[float]]:
    import tempfile
    from pathlib import Path

    from make_tiny_model import build

    from dynamo.frontend.openai.protocol import parse_chat_request
    from dynamo.frontend.processors.chat_processor import (
        build_chat_processor,
        import_processor_libraries,
    )
    from dynamo.frontend.processors.preprocessing import Preprocessing
    from dynamo.frontend.processors.template_sandbox import TemplateSandbox
    from dynamo.vllm.mock_model import load_mock_model

    import_processor_libraries(processor_kind)
    chat = parse_chat_request({"model": "m", "messages": conversation()})
    sandbox = TemplateSandbox(2)
    await asyncio.to_thread(sandbox.start)
    ways = {"thread": Preprocessing(None), "sandbox": Preprocessing(None, sandbox)}
    times: dict[str, list[float]] = {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as directory:
        tokenizer_dir = build(Path(directory), tokenizer_only=True)
        card = load_mock_model(str(tokenizer_dir), served_model_name="m").card
        processors = {
            "thread": build_chat_processor(card, processor_kind),
            "sandbox": build_chat_processor(
                card, processor_kind, template_check=sandbox.check_compiles
            ),
        }
        try:
            prompts = {way: await ways[way].render_chat(processors[way], chat) for way in ways}
            assert prompts["thread"] == prompts["sandbox"], prompts
            for _ in range(rounds):
                for way, preprocessing in ways.items():
                    for _ in range(renders):
                        started = time.perf_counter()
                        await preprocessing.render_chat(processors[way], chat)
                        times[way].append(time.perf_counter() - started)
        finally:
            sandbox.close()
            for preprocessing in ways.values():
                preprocessing.close()
    return times


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, round(len(values) * 0.99) - 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processor", choices=("hf", "vllm", "sglang"), default="hf")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--renders", type=int, default=200)
    args = parser.parse_args(argv)
    times = asyncio.run(measure(args.processor, args.rounds, args.renders))
    print(f"processor: {args.processor}\n")
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
