#!/usr/bin/env python3
"""The SGLang frontend heap: its size, and a full collection over it stock against frozen.

One child process, run with the SGLang venv's python (``scripts/setup_sglang_env.sh``), builds
what a ``--dyn-chat-processor sglang`` process holds, step by step, counting tracked objects
after each (``len(gc.get_objects())`` after a full collection):

1. ``frontend``: the frontend's own modules (``dynamo.frontend.main``), as under ``hf``;
2. ``+ sglang``: SGLang's frontend modules imported and warmed up
   (``import_processor_libraries("sglang")``): what a preprocess worker freezes;
3. ``+ model``: one model's processor (the tiny model's tokenizer and template, with the
   qwen25 / deepseek-r1 parsers) and one request through it: what the frontend holds once a
   model is discovered.

Then, on that heap and repetition after repetition, as ``bench_gc_pause.py`` times it:
``stock`` one ``gc.collect()``, ``freeze`` one ``freeze_gc_heap()`` (collect, ``gc.freeze()``,
the count of its log line), ``frozen`` one ``gc.collect()`` with the heap frozen (the median of
several), then ``gc.unfreeze()``. The figure is the ratio frozen / stock, side by side.

    python scripts/bench_sglang_heap.py [--quick|--smoke] [--sglang-python PATH] [--publish]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "sglang_heap"
REPS = {"full": 9, "quick": 3, "smoke": 1}
FROZEN_INNER = 9
DEFAULT_SGLANG_PYTHON = Path(__file__).resolve().parent.parent / ".venv-sglang" / "bin" / "python"


def tracked() -> int:
    import gc

    gc.collect()
    return len(gc.get_objects())


def build_steps(tokenizer_dir: str) -> list[dict]:
    """The heap, built step by step (see the module docstring); returns the counts."""
    steps = [{"step": "bare interpreter", "tracked": tracked()}]
    import dynamo.frontend.main  # noqa: F401 - the frontend's own import heap

    steps.append({"step": "frontend", "tracked": tracked()})
    from dynamo.frontend.processors.chat_processor import (
        build_chat_processor,
        import_processor_libraries,
    )

    steps.append({"step": "+ sglang", "note": import_processor_libraries("sglang")})
    steps[-1]["tracked"] = tracked()
    from dynamo.frontend.processors.sglang_processor import SglangSettings
    from dynamo.vllm.mock_model import load_mock_model

    card = load_mock_model(tokenizer_dir, served_model_name="bench").card
    processor = build_chat_processor(card, "sglang", SglangSettings("qwen25", "deepseek-r1"))
    ids = processor.encode_chat(processor.render([{"role": "user", "content": "Hello!"}]))
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    parser = processor.output_parser([tool])
    assert parser is not None
    detokenizer = processor.detokenizer()
    for token in ids:
        parser.feed(detokenizer.add([token]))
    parser.finish()
    steps.append({"step": "+ model", "tracked": tracked(), "prompt_tokens": len(ids)})
    return steps


def measure(tokenizer_dir: str, reps: int) -> dict:
    import gc
    import time

    from bench_common import median

    from dynamo_gc.freeze import freeze_gc_heap

    steps = build_steps(tokenizer_dir)
    stock, freeze, frozen = [], [], []
    for _ in range(reps):
        started = time.perf_counter()
        gc.collect()
        stock.append((time.perf_counter() - started) * 1000.0)
        started = time.perf_counter()
        record = freeze_gc_heap(context="bench")
        freeze.append((time.perf_counter() - started) * 1000.0)
        inner = []
        for _ in range(FROZEN_INNER):
            started = time.perf_counter()
            gc.collect()
            inner.append((time.perf_counter() - started) * 1000.0)
        frozen.append(median(inner))
        gc.unfreeze()
    ratios = [f / s for f, s in zip(frozen, stock, strict=True)]
    return {
        "python": ".".join(str(part) for part in sys.version_info[:3]),
        "steps": steps,
        "frozen_objects": record,
        "stock_ms": stock,
        "freeze_ms": freeze,
        "frozen_ms": frozen,
        "stock_ms_median": median(stock),
        "freeze_ms_median": median(freeze),
        "frozen_ms_median": median(frozen),
        "frozen_over_stock_median": median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer-dir", help=argparse.SUPPRESS)
    parser.add_argument(
        "--sglang-python",
        default=str(DEFAULT_SGLANG_PYTHON),
        help="the SGLang venv's python (default: .venv-sglang/bin/python)",
    )
    import bench_common as bc

    bc.add_mode_args(parser)
    args = parser.parse_args(argv)
    reps = REPS[bc.mode_name(args)]
    if args.child:
        print(json.dumps(measure(args.tokenizer_dir, reps)))
        return 0

    tokenizer_dir = bc.tiny_tokenizer_dir()
    print(f"measuring with {args.sglang_python} ...", file=sys.stderr, flush=True)
    measured = bc.run_json_child(
        [args.sglang_python, __file__, "--child", "--tokenizer-dir", tokenizer_dir]
        + (["--quick"] if args.quick else ["--smoke"] if args.smoke else []),
        timeout_s=900,
        env=bc.child_env(bc.OFFLINE_ENV),
    )
    result = {
        "benchmark": NAME,
        "mode": bc.mode_name(args),
        "machine": bc.machine_info(),
        "reps": reps,
        **measured,
    }
    print(
        bc.format_table(
            ["step", "tracked objects", "added"],
            [
                [step["step"], step["tracked"], step["tracked"] - previous["tracked"]]
                for previous, step in zip(
                    [measured["steps"][0], *measured["steps"][:-1]], measured["steps"], strict=True
                )
            ],
        )
    )
    print()
    print(
        bc.format_table(
            ["CPython", "heap (tracked)", "stock gc.collect ms", "freeze_gc_heap() ms",
             "frozen gc.collect ms", "frozen / stock"],
            [[measured["python"], measured["steps"][-1]["tracked"], measured["stock_ms_median"],
              measured["freeze_ms_median"], measured["frozen_ms_median"],
              f"{100.0 * measured['frozen_over_stock_median']:.1e} %"]],
        )
    )  # fmt: skip
    path = bc.write_result(args, NAME, result)
    print(f"\nwrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
