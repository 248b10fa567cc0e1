"""The built-in engine behind ``python -m dynamo.vllm --engine mock --model DIR``.

It gives the GC layer a real engine loop to live in without vLLM, in a real model's vocabulary:
DIR is a Hugging Face tokenizer directory (:mod:`dynamo.vllm.mock_model`), so the frontend
tokenizes with DIR's own tokenizer and detokenizes what the mock streams.

* ``generate`` streams one token per step, each step an ``asyncio.sleep`` of ``--mock-token-ms``
  (the engine's simulated compute). The completion is the prompt's token ids echoed back, then
  DIR's ordinary (non-special) ids counted from the position in the completion
  (``ordinary_ids[position % len(ordinary_ids)]``). It ends as vLLM's would:

  - ``stop`` on a token of the card's EOS ids (unless ``ignore_eos``; the echoed prompt carries
    the chat template's EOS tokens, so a chat prompt is echoed up to the end of its first
    message), on one of ``stop_token_ids``, or once the decoded completion contains one of the
    ``stop`` strings; none of these before ``min_tokens`` tokens. The stopping token is
    streamed too (the frontend hides special tokens and cuts at stop strings);
  - ``length`` at ``max_tokens``, or when prompt plus completion reach the context length.

  A prompt that leaves no room in the context is refused before the first token (the request
  plane answers 400), as vLLM refuses it. Closing the stream early
  (client disconnect, drain timeout) aborts the request; aborts are counted.
* ``start`` (engine init) takes ``--mock-init-ms`` (default 0), then builds the optional
  synthetic long-lived heap of ``--mock-heap-objects`` tracked objects and keeps it on the
  engine for the life of the process, like a real engine's imports and tokenizer tables.
* ``--mock-heap-growth`` N: each request adds N tracked objects that stay (a cache of request
  state), a ``--mock-heap-evict-percent`` share of them evicted later as cyclic garbage
  (:mod:`dynamo.vllm.mock_growth`): a heap that grows after the start-up freeze.
* ``forward_pass`` / ``collective_rpc`` run on lockstep rank processes
  (:mod:`dynamo.vllm.ranks`), started only when the self-benchmark is configured or
  ``--tensor-parallel-size`` > 1. While serving, ``wait_until_dead`` watches them: a rank that
  ends ends the engine (the worker exits 1), as a dead TP rank ends vLLM's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

from dynamo.common.utils.synthetic_heap import TRACKED_PER_UNIT, build_synthetic_heap
from dynamo.runtime.model_card import ModelCard, out_of_vocabulary
from dynamo.runtime.request_plane import BadGenerateRequest, GenerateRequest
from dynamo.runtime.sampling import ADDED_FIELDS, SamplingOptions, is_set
from dynamo.vllm.backend_args import WorkerConfig
from dynamo.vllm.engine import aborted
from dynamo.vllm.mock_growth import RequestStateCache
from dynamo.vllm.mock_model import MockModel, load_mock_model

logger = logging.getLogger(__name__)

NO_RANKS_MESSAGE = (
    "no rank processes: the self-benchmark is off (--self-benchmark-points 0) and "
    "--tensor-parallel-size is 1"
)


class MockCompletion:
    """The tokens the mock engine streams for one request, and why it stopped.

    Iterating yields the token ids one at a time; once exhausted, :attr:`finish_reason` is
    ``"stop"`` or ``"length"``.
    """

    def __init__(self, model: MockModel, prompt: Sequence[int], sampling: SamplingOptions):
        self.model = model
        self.prompt = list(prompt)
        self.sampling = sampling
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None

    def check_prompt(self) -> None:
        """Raise :class:`BadGenerateRequest` for what vLLM refuses too: an id outside the
        model's vocabulary, a prompt that leaves no room in the context."""
        max_token_id = self.model.card.max_token_id
        assert max_token_id is not None, "the mock's card always has its vocabulary's bound"
        found = out_of_vocabulary(self.prompt, max_token_id)
        if found is not None:
            index, message = found
            raise BadGenerateRequest(message, field=f"token_ids.{index}")
        # The mock echoes: it cannot steer what it does not sample, and has no distribution
        # whose log probabilities it could report.
        for name in ADDED_FIELDS:
            if is_set(getattr(self.sampling, name)):
                raise BadGenerateRequest(
                    f"the mock engine does not apply {name}", field=f"sampling.{name}"
                )
        context_length = self.model.card.context_length
        if len(self.prompt) >= context_length:
            raise BadGenerateRequest(
                f"the prompt ({len(self.prompt)} tokens) leaves no room in the model's context "
                f"length of {context_length} tokens",
                field="token_ids",
            )

    def token_at(self, position: int) -> int:
        if position < len(self.prompt):
            return self.prompt[position]
        ordinary = self.model.ordinary_ids
        return ordinary[position % len(ordinary)]

    def __iter__(self) -> Iterator[int]:
        sampling = self.sampling
        stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop_ids.update(self.model.card.eos_token_ids)
        limit = min(sampling.max_tokens, self.model.card.context_length - len(self.prompt))
        # Stop strings are matched on the completion's own decoded text, as vLLM matches them
        # (special tokens skipped); the decoder only runs when there is something to match.
        decoder = DecodeStream(skip_special_tokens=True) if sampling.stop else None
        text = ""
        for position in range(limit):
            token_id = self.token_at(position)
            self.token_ids.append(token_id)
            searched_from = len(text)
            if decoder is not None:
                text += decoder.step(self.model.tokenizer, token_id) or ""
            yield token_id
            if len(self.token_ids) <= sampling.min_tokens:
                continue
            if token_id in stop_ids or any(
                text.find(stop, max(0, searched_from - len(stop) + 1)) != -1
                for stop in sampling.stop
            ):
                self.finish_reason = "stop"
                return
        self.finish_reason = "length"


def mock_completion(
    model: MockModel, prompt: Sequence[int], sampling: SamplingOptions
) -> tuple[list[int], str]:
    """The token ids the mock engine streams for this prompt, and its finish reason (for
    callers and tests)."""
    completion = MockCompletion(model, prompt, sampling)
    completion.check_prompt()
    token_ids = list(completion)
    assert completion.finish_reason is not None
    return token_ids, completion.finish_reason


class MockEngine:
    """Token echo at a fixed per-token time, with an optional start-up heap and rank group."""

    def __init__(
        self,
        model: MockModel,
        *,
        token_ms: float = 5.0,
        heap_objects: int = 0,
        heap_growth: int = 0,
        heap_evict_percent: int = 0,
        init_ms: float = 0.0,
        tensor_parallel_size: int = 1,
        use_ranks: bool = False,
        worker_extension_cls: str | None = None,
    ) -> None:
        self.model = model
        self.token_s = token_ms / 1000.0
        self.heap_objects = heap_objects
        self.request_state = RequestStateCache(heap_growth, heap_evict_percent)
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
        cls,
        config: WorkerConfig,
        *,
        model: MockModel | None = None,
        worker_extension_cls: str | None = None,
    ) -> MockEngine:
        """The mock engine the worker's options describe; ``model`` when start-up has loaded
        it already (else it is loaded from ``--model`` now)."""
        return cls(
            model if model is not None else load_mock_config_model(config),
            token_ms=config.mock_token_ms,
            heap_objects=config.mock_heap_objects,
            heap_growth=config.mock_heap_growth,
            heap_evict_percent=config.mock_heap_evict_percent,
            init_ms=config.mock_init_ms,
            tensor_parallel_size=config.tensor_parallel_size,
            use_ranks=config.self_benchmark.enabled,
            worker_extension_cls=worker_extension_cls,
        )

    @property
    def model_card(self) -> ModelCard:
        return self.model.card

    @property
    def served_model_name(self) -> str:
        return self.model.card.served_model_name

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

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[dict, None]:
        completion = MockCompletion(self.model, request.token_ids, request.sampling)
        completion.check_prompt()  # before the first item: the request plane answers 400
        self.requests_started += 1
        self.request_state.add()
        produced = 0
        finished = False
        try:
            for token in completion:
                await asyncio.sleep(self.token_s)  # the simulated compute of one step
                produced += 1
                yield {"token_ids": [token]}
            finished = True
            self.requests_finished += 1
            yield {
                "finish_reason": completion.finish_reason,
                "prompt_tokens": len(request.token_ids),
                "completion_tokens": produced,
            }
        finally:
            if not finished:
                # GeneratorExit (the consumer closed the stream) or CancelledError (its task
                # was cancelled): either way the request stops here, mid-stream.
                self.requests_aborted += 1
                aborted("Mock engine:", request.request_id, produced)

    async def wait_until_dead(self) -> str:
        """Returns when a rank process ends (without ranks: never; a cancelled wait returns
        nothing). The mock's streams do not step on the ranks, so nothing else would notice."""
        if self._ranks is None:
            await asyncio.get_running_loop().create_future()  # nothing that can die
        ended = await self._ranks.watch()
        return f"{ended.describe()} while serving"

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


def load_mock_config_model(config: WorkerConfig) -> MockModel:
    """The mock engine's model from the worker's options (``--model`` is the directory);
    raises :class:`dynamo.vllm.mock_model.BadModelDirectory`."""
    return load_mock_model(
        config.model,
        served_model_name=config.served_model_name,
        max_model_len=config.mock_max_model_len,
        chat_template=config.chat_template,
    )
