"""The real engine behind ``python -m dynamo.vllm --engine vllm``: vLLM's ``AsyncLLM``.

Its arguments are vLLM's own (:mod:`dynamo.vllm.vllm_args`).

Requests arrive as the model's own token ids (the frontend tokenized them with the tokenizer
the model card names) and are handed to vLLM unchanged, as a ``TokensPrompt``; their
:class:`~dynamo.runtime.sampling.SamplingOptions` become ``SamplingParams`` (DELTA output), with
the model's generation-config defaults for the fields a request leaves unset, as ``vllm serve``
applies them. After engine init the model card is read from what vLLM resolved
(:mod:`dynamo.vllm.vllm_card`).

This process embeds ``AsyncLLM``: it is the parent whose heap (torch, transformers, vLLM, the
engine client: ~600k tracked objects) the worker freezes after engine init. vLLM freezes its own
EngineCore process, not this one.

Importing this module imports vLLM (seconds); :mod:`dynamo.vllm.engine_factory` imports it only
for ``--engine vllm``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

try:
    from vllm.exceptions import VLLMValidationError
except ImportError:  # vLLM releases before it: SamplingParams raised ValueError
    VLLMValidationError = ValueError  # type: ignore[misc,assignment]

try:
    from vllm.v1.engine.exceptions import EngineDeadError
except ImportError:  # a vLLM without the v1 engine's exceptions: nothing raises it

    class EngineDeadError(Exception):  # type: ignore[no-redef]
        pass


from dynamo.runtime.model_card import ModelCard, out_of_vocabulary
from dynamo.runtime.request_plane import BadGenerateRequest, GenerateRequest
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm import engine_init
from dynamo.vllm.backend_args import WorkerConfig
from dynamo.vllm.engine import EngineDied, EngineInitFailed, aborted
from dynamo.vllm.process_watch import ending_stuck_children, first_exit
from dynamo.vllm.vllm_args import engine_args_from_config, served_name_of
from dynamo.vllm.vllm_card import one_line, read_model_card
from dynamo.vllm.vllm_sampling import (
    generate_kwargs,
    sampling_params,
    wire_logprobs,
    wire_ranks,
)

logger = logging.getLogger(__name__)


# How long vLLM's process manager waits for EngineCore to exit before it force-kills it.
ENGINE_SHUTDOWN_TIMEOUT_S = 20.0
# After a request met vLLM's EngineDeadError: how long to wait for the core process's end, whose
# exit status names the cause (it ends within milliseconds of a kill; a core that failed and
# lives on costs the worker's exit this much).
DEAD_CAUSE_WAIT_S = 2.0


def build_vllm_engine(
    config: WorkerConfig, *, worker_extension_cls: str | None = None
) -> VllmEngine:
    """The engine for ``config`` (its vLLM arguments parsed now)."""
    engine_args = engine_args_from_config(config, worker_extension_cls=worker_extension_cls)
    return VllmEngine(engine_args, chat_template=config.chat_template)


def engine_core_processes(engine: Any) -> list[tuple[str, Any]]:
    """vLLM's EngineCore processes behind an ``AsyncLLM``, as ``(label, process)`` pairs; none
    when the core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) or elsewhere (Ray).
    """
    resources = getattr(getattr(engine, "engine_core", None), "resources", None)
    manager = getattr(resources, "engine_manager", None)
    processes = getattr(manager, "processes", None) or []
    return [(f"{process.name} process", process) for process in processes]


def _shut_down(engine: Any) -> None:
    """An engine whose init ended after the process stopped waiting for it."""
    engine.shutdown()


class VllmEngine:
    """The engine protocol (:class:`dynamo.vllm.engine.Engine`) on vLLM's ``AsyncLLM``."""

    def __init__(self, engine_args: AsyncEngineArgs, *, chat_template: str | None = None) -> None:
        self.engine_args = engine_args
        self.chat_template = chat_template
        self._engine: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._card: ModelCard | None = None
        self._model_defaults: dict[str, Any] = {}
        self._vocab_size = 0
        self._max_token_id = -1
        self._max_model_len = 0
        self._request_ids = itertools.count()
        # Unique per process, so request ids never collide with another worker's in logs.
        self._id_prefix = uuid.uuid4().hex[:8]
        self._clamped_seq_lens: set[int] = set()
        self._benchmark_body: list[int] = []
        # Set when a request finds vLLM dead (EngineDeadError): see wait_until_dead.
        self._reported_dead = asyncio.Event()
        self._dead_reason = ""

    @property
    def engine(self) -> Any:
        """The running ``AsyncLLM`` (raises before :meth:`start` and after :meth:`shutdown`)."""
        if self._engine is None:
            raise RuntimeError("the vLLM engine is not running")
        return self._engine

    @property
    def served_model_name(self) -> str:
        return served_name_of(self.engine_args)

    @property
    def model_card(self) -> ModelCard:
        if self._card is None:
            raise RuntimeError("the vLLM engine has not started: no model card yet")
        return self._card

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
        # AsyncLLM.from_engine_args blocks for 10-40 s: in a thread of its own the event loop
        # stays free for health probes and signals (see dynamo.vllm.engine_init). AsyncLLM
        # starts its output handler on the loop at the first request; vLLM's own shutdown is
        # written to be called from any thread.
        with engine_init.adopting_orphans():
            self._engine = await self._initialise()

    async def _initialise(self) -> Any:
        spared = engine_init.child_pids()
        creation = engine_init.run_in_init_thread(self._create_engine, on_orphan=_shut_down)
        try:
            return await asyncio.shield(creation)
        except EngineInitFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of vLLM's init is engine init's
            # E.g. "Engine core initialization failed. See root cause above." after the CPU
            # memory check: the engine core has logged its own traceback; ours would add
            # nothing but noise.
            raise EngineInitFailed(f"vLLM engine init failed: {one_line(exc)}") from None
        except asyncio.CancelledError:
            # A signal during engine init: its processes are stopped, which ends the init;
            # an engine that was ready by then is shut down as usual (by the worker's closer).
            self._engine = await engine_init.abandon_init(creation, spared)
            raise

    def _create_engine(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        began = time.perf_counter()
        engine = AsyncLLM.from_engine_args(self.engine_args)
        try:
            model_config = engine.model_config
            self._vocab_size = model_config.get_vocab_size()
            # vLLM's own bound on prompt ids (its InputProcessor): the larger of the
            # tokenizer's largest id and the model's vocabulary size - 1.
            tokenizer_max = getattr(engine.tokenizer, "max_token_id", None)
            self._max_token_id = max(
                self._vocab_size - 1, -1 if tokenizer_max is None else int(tokenizer_max)
            )
            self._max_model_len = model_config.max_model_len
            self._model_defaults = dict(model_config.get_diff_sampling_param())
            self._card = read_model_card(
                engine,
                served_model_name=self.served_model_name,
                chat_template=self.chat_template,
                max_token_id=self._max_token_id,
            )
        except BaseException:
            engine.shutdown()  # its processes are running: stop them before reporting
            raise
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

    def _check_prompt(self, prompt: Sequence[int]) -> None:
        """What vLLM would refuse, refused before the first item (a 400 on the request plane)."""
        found = out_of_vocabulary(prompt, self._max_token_id)
        if found is not None:
            index, message = found
            raise BadGenerateRequest(message, field=f"token_ids.{index}")
        if len(prompt) >= self._max_model_len:
            raise BadGenerateRequest(
                f"the prompt ({len(prompt)} tokens) leaves no room in max_model_len "
                f"{self._max_model_len}",
                field="token_ids",
            )

    def _next_request_id(self, label: str) -> str:
        return f"{label or 'req'}-{self._id_prefix}-{next(self._request_ids)}"

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[dict, None]:
        engine = self.engine
        prompt = list(request.token_ids)  # the model's own ids: sent to vLLM unchanged
        self._check_prompt(prompt)
        try:
            params = sampling_params(request.sampling, self._model_defaults)
        except (ValueError, VLLMValidationError) as exc:  # SamplingParams._verify_args
            raise BadGenerateRequest(f"sampling: {one_line(exc)}", field="sampling") from None
        # The frontend's id is kept as a prefix for the logs; the suffix makes it unique in
        # vLLM, which rejects a request id that is still running.
        request_id = self._next_request_id(request.request_id)
        produced = 0
        finished = False
        prompt_sent = False  # the prompt's logprobs go on the first item
        try:
            # aclosing: leaving early closes vLLM's generator now (its own cleanup aborts the
            # request), not whenever the garbage collector finalises it.
            async with contextlib.aclosing(
                engine.generate(
                    TokensPrompt(prompt_token_ids=prompt),
                    params,
                    request_id,
                    **generate_kwargs(request.sampling),
                )
            ) as outputs:
                async for output in outputs:
                    completion = output.outputs[0]
                    if completion.token_ids:
                        produced += len(completion.token_ids)
                        step: dict[str, Any] = {"token_ids": list(completion.token_ids)}
                        if params.logprobs is not None:
                            step["logprobs"] = wire_logprobs(completion.logprobs or ())
                        if params.prompt_logprobs is not None and not prompt_sent:
                            step["prompt_logprobs"] = wire_logprobs(output.prompt_logprobs or ())
                            step["prompt_ranks"] = wire_ranks(output.prompt_logprobs or ())
                            prompt_sent = True
                        yield step
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
        except VLLMValidationError as exc:
            # vLLM's own check of the request when it is added (a structured output's schema
            # or grammar that does not compile, more logprobs than its --max-logprobs): the
            # client's 400, before any token, naming the sampling field vLLM names.
            if produced:
                raise
            name = getattr(exc, "parameter", None)
            if name not in SamplingOptions.model_fields:
                structured = request.sampling.structured_outputs is not None
                name = "structured_outputs" if structured else None
            field = f"sampling.{name}" if name else "sampling"
            raise BadGenerateRequest(f"vLLM refused it: {one_line(exc)}", field=field) from None
        except EngineDeadError as exc:
            # vLLM's EngineCore is gone (it logged why): this stream ends with an in-band
            # error, and the worker, woken by wait_until_dead, logs the death once and exits.
            self._report_dead(one_line(exc))
            raise EngineDied(f"the vLLM engine died: {one_line(exc)}") from None
        finally:
            if not finished and not self._is_dead(engine):
                # The consumer went away (client disconnect, drain timeout) or the stream
                # failed: make sure the request's scheduler slot and KV blocks are freed now.
                # Aborting a request vLLM already dropped is a no-op.
                try:
                    await engine.abort(request_id)
                except Exception:  # a dead engine must not mask the first error
                    logger.exception("Aborting vLLM request %s failed", request_id)
                else:
                    aborted("vLLM", request_id, produced)

    def _report_dead(self, reason: str) -> None:
        if not self._reported_dead.is_set():
            self._dead_reason = reason
            self._reported_dead.set()

    def _is_dead(self, engine: Any) -> bool:
        # A dead engine has nothing to abort (vLLM's own generate does not abort then either).
        return self._reported_dead.is_set() or bool(getattr(engine, "errored", False))

    async def wait_until_dead(self) -> str:
        """Returns when vLLM's EngineCore process ends (its sentinel, watched on the event loop;
        vLLM's own monitor thread notices it too and shuts its client down) or a request finds
        the engine dead (EngineDeadError: the core failed without exiting yet). EngineCore
        watches its own workers and exits when one dies, so a dead worker ends up here too."""
        engine = self.engine
        processes = engine_core_processes(engine)
        watches: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._reported_dead.wait())]
        if processes:
            watches.append(asyncio.ensure_future(first_exit(processes)))
        try:
            done, _ = await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for watch in watches:
                watch.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
        for watch in done:
            result = watch.result()
            if result is not True:  # the process watch's ProcessExit
                return f"vLLM's {result.describe()} while serving"
        # A request met vLLM's EngineDeadError first. When the core process has ended too (it
        # usually has: vLLM's client notices a killed core at once), how it ended is the cause
        # an operator needs (a signal, an exit code), where vLLM's own words only say "see the
        # stack trace": wait a moment for it, and say it. Which one came first is a race.
        if processes:
            try:
                ended = await asyncio.wait_for(first_exit(processes), timeout=DEAD_CAUSE_WAIT_S)
            except asyncio.TimeoutError:
                pass
            else:
                return f"vLLM's {ended.describe()} while serving"
        return f"vLLM's engine reported itself dead while serving: {self._dead_reason}"

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

    async def engine_core_call(self, command: str, **params: Any) -> dict:
        """A GC-policy command in vLLM's EngineCore process, and that process's GC report
        (:func:`dynamo.vllm.gc_scheduler.call_engine_core`)."""
        from dynamo.vllm.gc_scheduler import call_engine_core

        return await call_engine_core(self.engine, command, **params)

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        if engine is None:
            return
        began = time.perf_counter()
        # Stops EngineCore and its workers (SIGTERM, then a bounded wait) and the output
        # handler; by now the request plane is closed. EngineCore's workers that stay blocked
        # are ended meanwhile, else vLLM force-kills them with WARNINGs (see the function).
        with ending_stuck_children([process for _, process in engine_core_processes(engine)]):
            try:
                # EngineCore's own teardown (gc.unfreeze, then a full collection of its heap)
                # takes seconds on a CPU after its workers are gone, over 5 s on a loaded
                # machine: a longer bound than vLLM's 5 s default, which it overran.
                engine.shutdown(timeout=ENGINE_SHUTDOWN_TIMEOUT_S)
            except TypeError:  # a vLLM whose shutdown takes no timeout
                engine.shutdown()
        # DEBUG: the worker logs the engine's shutdown with its duration (one line per event).
        logger.debug("vLLM AsyncLLM shut down in %.1f s", time.perf_counter() - began)
