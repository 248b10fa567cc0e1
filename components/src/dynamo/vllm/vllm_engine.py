"""The real engine behind ``python -m dynamo.vllm --engine vllm``: vLLM's ``AsyncLLM``.

The worker parses its own options first; every argument it does not know is handed, in order, to
vLLM's own parser (``AsyncEngineArgs.add_cli_args`` on vLLM's ``FlexibleArgumentParser``), so
vLLM's flags work as they are::

    python -m dynamo.vllm --engine vllm --model PATH --max-model-len 256 \\
        --kv-cache-memory-bytes 64M --enforce-eager

Three of the worker's options are vLLM's too and reach it from the worker: ``--model`` (the
model to load, also the name the worker registers), ``--tensor-parallel-size`` (passed on when
not 1) and ``--worker-extension-cls`` (through ``build_engine``'s ``worker_extension_cls``).

This process embeds ``AsyncLLM``: it is the parent whose heap (torch, transformers, vLLM, the
engine client: ~600k tracked objects) the worker freezes after engine init. vLLM freezes its own
EngineCore process, not this one.

Importing this module imports vLLM (seconds); :mod:`dynamo.vllm.engine_factory` imports it only
for ``--engine vllm``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from typing import Any, AsyncIterator, Sequence

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # vLLM releases before the utils split
    from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]

from dynamo.vllm.engine import EngineUnavailable

logger = logging.getLogger(__name__)

VLLM_PROG = "python -m dynamo.vllm --engine vllm"


def vllm_arg_parser() -> FlexibleArgumentParser:
    """vLLM's own engine-argument parser, as ``vllm serve`` builds it."""
    parser = FlexibleArgumentParser(
        prog=VLLM_PROG,
        description="vLLM engine arguments (everything python -m dynamo.vllm does not know)",
    )
    return AsyncEngineArgs.add_cli_args(parser)


def parse_vllm_args(rest: Sequence[str]) -> AsyncEngineArgs:
    """vLLM's engine arguments from the arguments the worker did not recognise.

    Bad input exits 2 with vLLM's own message, as ``vllm serve`` would.
    """
    namespace = vllm_arg_parser().parse_args(list(rest))
    return AsyncEngineArgs.from_cli_args(namespace)


def engine_args_from_config(
    config: argparse.Namespace, *, worker_extension_cls: str | None = None
) -> AsyncEngineArgs:
    """The worker's config (its options plus ``config.vllm_args``) as vLLM engine arguments."""
    argv = ["--model", config.model]
    tensor_parallel_size = getattr(config, "tensor_parallel_size", 1)
    if tensor_parallel_size != 1:
        # First, so an explicit vLLM -tp/--tensor-parallel-size later in the rest still wins.
        argv += ["--tensor-parallel-size", str(tensor_parallel_size)]
    rest = list(getattr(config, "vllm_args", []))
    try:
        engine_args = parse_vllm_args(argv + rest)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        # vLLM's parser has printed the reason; the worker's usual exit path turns this into 2.
        raise EngineUnavailable(f"--engine vllm: invalid vLLM arguments {rest}") from None
    if worker_extension_cls is not None:
        engine_args.worker_extension_cls = worker_extension_cls
    return engine_args


def build_vllm_engine(
    config: argparse.Namespace, *, worker_extension_cls: str | None = None
) -> "VllmEngine":
    """What :func:`dynamo.vllm.engine_factory.build_engine` calls for ``--engine vllm``.

    Uses the arguments ``prepare_engine`` parsed before start-up (``config.vllm_engine_args``)
    when there are some, else parses them now.
    """
    engine_args = getattr(config, "vllm_engine_args", None)
    if engine_args is None:
        engine_args = engine_args_from_config(config, worker_extension_cls=worker_extension_cls)
    return VllmEngine(engine_args, model_name=config.model)


class VllmEngine:
    """The engine protocol (:class:`dynamo.vllm.engine.Engine`) on vLLM's ``AsyncLLM``."""

    def __init__(self, engine_args: AsyncEngineArgs, *, model_name: str | None = None) -> None:
        self.engine_args = engine_args
        self.model_name = model_name or engine_args.model
        self._engine: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._vocab_size = 0
        self._max_model_len = 0
        self._request_ids = itertools.count()
        # Unique per process, so request ids never collide with another worker's in logs.
        self._id_prefix = uuid.uuid4().hex[:8]
        self._clamped_seq_lens: set[int] = set()
        self._benchmark_body: list[int] = []

    @property
    def engine(self) -> Any:
        """The running ``AsyncLLM`` (raises before :meth:`start` and after :meth:`shutdown`)."""
        if self._engine is None:
            raise RuntimeError("the vLLM engine is not running")
        return self._engine

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def max_seq_len(self) -> int | None:
        """The longest prompt :meth:`forward_pass` runs: one token is generated after it, and
        vLLM refuses a prompt of ``max_model_len`` tokens. ``None`` before :meth:`start`."""
        if self._max_model_len <= 0:
            return None
        return max(1, self._max_model_len - 1)

    async def start(self) -> None:
        if self._engine is not None:
            return
        # AsyncLLM.from_engine_args blocks for 10-40 s (imports, spawning EngineCore and its
        # worker, loading weights, warm-up). In a thread the event loop stays free for health
        # probes and signals; AsyncLLM starts its output handler on the loop at the first
        # request. vLLM's own shutdown is written to be called from any thread.
        creation = asyncio.ensure_future(asyncio.to_thread(self._create_engine))
        try:
            engine = await asyncio.shield(creation)
        except asyncio.CancelledError:
            # A signal during engine init: the thread cannot be interrupted. Wait for it, so
            # shutdown() can stop the processes it started instead of orphaning them.
            try:
                self._engine = await creation
            except Exception:  # noqa: BLE001 - the cancellation stays the reason we stop
                # E.g. a SIGTERM to the whole process group also stopped EngineCore.
                logger.info("vLLM engine init failed after start-up was cancelled", exc_info=True)
            raise
        self._engine = engine

    def _create_engine(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        began = time.perf_counter()
        engine = AsyncLLM.from_engine_args(self.engine_args)
        model_config = engine.model_config
        self._vocab_size = model_config.get_vocab_size()
        self._max_model_len = model_config.max_model_len
        logger.info(
            "vLLM AsyncLLM started in %.1f s: model=%s vocab_size=%d max_model_len=%d "
            "worker_extension_cls=%s",
            time.perf_counter() - began,
            self.engine_args.model,
            self._vocab_size,
            self._max_model_len,
            self.engine_args.worker_extension_cls or "none",
        )
        return engine

    def map_token_ids(self, token_ids: Sequence[int]) -> list[int]:
        """Request-plane token ids as ids of this model's vocabulary.

        The frontend keeps the chat template and tokenizer (its built-in byte-level tokenizer,
        ids 0..255 plus specials and merged tokens above); it does not know this model's
        vocabulary. Ids are mapped into ``[0, vocab_size)`` by remainder, so every request is
        valid input for the model and different ids stay mostly different (clamping would
        collapse them all onto the last id). Generated ids come back unmapped: the frontend's
        detokenizer decodes any id (unknown ones as U+FFFD).
        """
        vocab_size = self._vocab_size
        return [token_id % vocab_size for token_id in token_ids]

    def _next_request_id(self, label: str) -> str:
        return f"{label or 'req'}-{self._id_prefix}-{next(self._request_ids)}"

    async def generate(self, request: dict) -> AsyncIterator[dict]:
        engine = self.engine
        prompt = self.map_token_ids(request["token_ids"])
        if not prompt:
            raise ValueError("the prompt has no tokens")
        # The frontend's id is kept as a prefix for the logs; the suffix makes it unique in
        # vLLM, which rejects a request id that is still running.
        request_id = self._next_request_id(request.get("request_id", ""))
        params = SamplingParams(
            max_tokens=request["max_tokens"], output_kind=RequestOutputKind.DELTA
        )
        produced = 0
        finished = False
        try:
            # aclosing: leaving early closes vLLM's generator now (its own cleanup aborts the
            # request), not whenever the garbage collector finalises it.
            async with contextlib.aclosing(
                engine.generate(TokensPrompt(prompt_token_ids=prompt), params, request_id)
            ) as outputs:
                async for output in outputs:
                    completion = output.outputs[0]
                    if completion.token_ids:
                        produced += len(completion.token_ids)
                        yield {"token_ids": list(completion.token_ids)}
                    if output.finished:
                        finished = True
                        yield {
                            # vLLM stops at max_tokens or at max_model_len: both are "length".
                            "finish_reason": (
                                "length" if completion.finish_reason == "length" else "stop"
                            ),
                            "prompt_tokens": len(prompt),
                            "completion_tokens": produced,
                        }
                        return
        finally:
            if not finished:
                # The consumer went away (client disconnect, drain timeout) or the stream
                # failed: make sure the request's scheduler slot and KV blocks are freed now.
                # Aborting a request vLLM already dropped is a no-op.
                try:
                    await engine.abort(request_id)
                except Exception:  # noqa: BLE001 - a dead engine must not mask the first error
                    logger.exception("Aborting vLLM request %s failed", request_id)
                else:
                    logger.info(
                        "vLLM request %s aborted after %d token(s)", request_id, produced
                    )

    async def forward_pass(self, batch_size: int, seq_len: int) -> None:
        """A real generate step at this point: ``batch_size`` concurrent requests of ``seq_len``
        prompt tokens, one output token each (prefill of the batch plus one decode step).

        Every prompt starts with two tokens unique to it, so vLLM's prefix cache never turns a
        repeated point into a cache hit. A length the model cannot take is clamped to
        ``max_model_len - 1`` (one WARNING per length).
        """
        engine = self.engine
        seq = max(1, min(seq_len, self._max_model_len - 1))
        if seq != seq_len and seq_len not in self._clamped_seq_lens:
            self._clamped_seq_lens.add(seq_len)
            logger.warning(
                "forward_pass: sequence length %d does not fit max_model_len %d; using %d",
                seq_len,
                self._max_model_len,
                seq,
            )
        params = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)

        async def one_request() -> None:
            number = next(self._request_ids)
            prompt = self._benchmark_prompt(number, seq)
            request_id = f"fpm-{self._id_prefix}-{number}"
            prompt_input = TokensPrompt(prompt_token_ids=prompt)
            async for _ in engine.generate(prompt_input, params, request_id):
                pass

        tasks = [asyncio.ensure_future(one_request()) for _ in range(batch_size)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            # A cancelled generate aborts its request in vLLM: leave nothing running.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def _benchmark_prompt(self, number: int, seq: int) -> list[int]:
        vocab_size = self._vocab_size
        if len(self._benchmark_body) < seq:
            self._benchmark_body = [(7 * i + 3) % vocab_size for i in range(self._max_model_len)]
        unique_head = [number % vocab_size, (number // vocab_size) % vocab_size]
        return (unique_head + self._benchmark_body[: max(0, seq - 2)])[:seq]

    async def collective_rpc(self, method: str, args: Sequence[Any] = ()) -> list:
        """``method`` on every rank's worker (worker extension methods included); one result
        per rank."""
        return await self.engine.collective_rpc(method, args=tuple(args))

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        began = time.perf_counter()
        # Stops EngineCore and its workers (SIGTERM, then a bounded wait) and the output
        # handler. It blocks for a few seconds; by now the request plane is closed.
        engine.shutdown()
        # DEBUG: the worker logs the engine's shutdown with its duration (one line per event).
        logger.debug("vLLM AsyncLLM shut down in %.1f s", time.perf_counter() - began)
