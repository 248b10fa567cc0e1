"""The built-in engine behind ``python -m dynamo.vllm --engine mock``.

It gives the GC layer a real engine loop to live in without vLLM:

* ``generate`` streams one token per step, each step an ``asyncio.sleep`` of ``--mock-token-ms``
  (the engine's simulated compute). The completion is the prompt's token ids echoed back, then
  counted tokens (the position in the completion) until ``max_tokens``::

      completion = (prompt + list(range(len(prompt), max_tokens)))[:max_tokens]

  The mock has no end-of-sequence token, so a request that runs to the end always stops at
  ``max_tokens`` with ``finish_reason == "length"``. Closing the stream early (client
  disconnect, drain timeout) aborts the request; aborts are counted.
* ``start`` (engine init) takes ``--mock-init-ms`` (default 0), then builds the optional
  synthetic long-lived heap of ``--mock-heap-objects`` tracked objects and keeps it on the
  engine for the life of the process, like a real engine's imports and tokenizer tables.
* ``forward_pass`` / ``collective_rpc`` run on lockstep rank processes
  (:mod:`dynamo.vllm.ranks`), started only when the self-benchmark is configured or
  ``--tensor-parallel-size`` > 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from typing import Any, AsyncIterator, Sequence

from dynamo.common.utils.synthetic_heap import TRACKED_PER_UNIT, build_synthetic_heap

logger = logging.getLogger(__name__)

NO_RANKS_MESSAGE = (
    "no rank processes: the self-benchmark is off (--self-benchmark-points 0) and "
    "--tensor-parallel-size is 1"
)


def mock_completion(prompt: Sequence[int], max_tokens: int) -> list[int]:
    """The token ids the mock engine streams for this prompt (for callers and tests)."""
    return (list(prompt) + list(range(len(prompt), max_tokens)))[:max_tokens]


class MockEngine:
    """Token echo at a fixed per-token time, with an optional start-up heap and rank group."""

    def __init__(
        self,
        model_name: str,
        *,
        token_ms: float = 5.0,
        heap_objects: int = 0,
        init_ms: float = 0.0,
        tensor_parallel_size: int = 1,
        use_ranks: bool = False,
        worker_extension_cls: str | None = None,
    ) -> None:
        self.model_name = model_name
        self.token_s = token_ms / 1000.0
        self.heap_objects = heap_objects
        self.init_s = init_ms / 1000.0
        self.tensor_parallel_size = tensor_parallel_size
        # Rank processes cost a spawn each; only the self-benchmark and lockstep TP need them.
        self.use_ranks = use_ranks or tensor_parallel_size > 1
        self.worker_extension_cls = worker_extension_cls
        self.started = False
        self.requests_started = 0
        self.requests_finished = 0
        self.requests_aborted = 0
        self._heap: list = []
        self._ranks: Any = None  # dynamo.vllm.ranks.RankGroup once started

    @classmethod
    def from_config(
        cls, config: argparse.Namespace, *, worker_extension_cls: str | None = None
    ) -> "MockEngine":
        return cls(
            config.model,
            token_ms=config.mock_token_ms,
            heap_objects=config.mock_heap_objects,
            init_ms=getattr(config, "mock_init_ms", 0.0),
            tensor_parallel_size=getattr(config, "tensor_parallel_size", 1),
            use_ranks=getattr(config, "self_benchmark_points", 0) > 0,
            worker_extension_cls=worker_extension_cls,
        )

    @property
    def heap(self) -> list:
        """The root of the synthetic start-up heap (empty when none was asked for)."""
        return self._heap

    async def start(self) -> None:
        if self.started:
            return
        if self.init_s > 0:
            # The simulated weight loading of --mock-init-ms; a signal cancels it like any init.
            logger.info("Mock engine: engine init takes %g ms (--mock-init-ms)", self.init_s * 1e3)
            await asyncio.sleep(self.init_s)
        if self.use_ranks:
            # Imported lazily: the rank machinery (multiprocessing) is only paid for when used.
            from dynamo.vllm.ranks import RankGroup

            ranks = RankGroup(
                self.tensor_parallel_size, worker_extension_cls=self.worker_extension_cls
            )
            await ranks.start()  # it logs the ranks' pids and extension
            self._ranks = ranks
        # Built after the ranks are up, so rank processes never carry a copy of it.
        if self.heap_objects > 0:
            began = time.perf_counter()
            self._heap = build_synthetic_heap(self.heap_objects)
            logger.info(
                "Mock engine: synthetic start-up heap of ~%d tracked objects built in %.0f ms",
                len(self._heap) * TRACKED_PER_UNIT,
                (time.perf_counter() - began) * 1000.0,
            )
        self.started = True

    async def generate(self, request: dict) -> AsyncIterator[dict]:
        prompt = request["token_ids"]
        max_tokens = request["max_tokens"]
        self.requests_started += 1
        produced = 0
        finished = False
        try:
            for token in mock_completion(prompt, max_tokens):
                await asyncio.sleep(self.token_s)  # the simulated compute of one step
                produced += 1
                yield {"token_ids": [token]}
            finished = True
            self.requests_finished += 1
            yield {
                "finish_reason": "length" if produced >= max_tokens else "stop",
                "prompt_tokens": len(prompt),
                "completion_tokens": produced,
            }
        finally:
            if not finished:
                # GeneratorExit (the consumer closed the stream) or CancelledError (its task
                # was cancelled): either way the request stops here, mid-stream.
                self.requests_aborted += 1
                logger.info(
                    "Mock engine: request %s aborted after %d token(s)",
                    request.get("request_id", ""),
                    produced,
                )

    async def collective_rpc(self, method: str, args: Sequence[Any] = ()) -> list:
        if self._ranks is None:
            raise RuntimeError(NO_RANKS_MESSAGE)
        return await self._ranks.collective_rpc(method, args)

    async def forward_pass(self, batch_size: int, seq_len: int) -> None:
        await self.collective_rpc("execute_forward", (batch_size, seq_len))

    async def shutdown(self) -> None:
        ranks, self._ranks = self._ranks, None
        if ranks is not None:
            await ranks.shutdown()  # the worker logs the engine's shutdown, once
        self.started = False
