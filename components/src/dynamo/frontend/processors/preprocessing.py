"""Rendering and tokenising a request's prompt, never on the event loop.

Templates render in the template render processes (:mod:`.template_sandbox`), or without them
on a bounded pool of threads in this process; prompts are tokenised in the preprocess pool's
processes when there is one (``--dyn-preprocess-workers``), else on the same threads. So
``/health`` and the streams in flight are served while a 1 MB prompt is processed.

What a prompt costs to tokenise is the model's template's to decide (``{{ 'a' * 2000000 }}``
took ~10 s and ~400 MB here), so the tokenising workers (the threads, or the pool's
processes) are a :class:`~.fair_share.FairShare` between models: one model's prompts use at
most all but one of them at once, and prompts over :data:`HEAVY_PROMPT_CHARS` (of every model
together) at most all but one too. However long one model's prompts are, another model's
short prompt finds a worker. (A prompt longer than its model's context could hold is refused
before it gets here: :func:`dynamo.frontend.openai.prompt_budget.prompt_within_context`.)

When the preprocess pool cannot take the work, a client is told so by the pool's state, and
never what the failure said (a path on this host, a library's words): that goes to the log
(docs/security.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from dynamo.frontend.openai import protocol as oai
from dynamo.runtime import peer_text
from dynamo.runtime.chat_template import MAX_VALUE_SIZE, TemplateValueTooLarge

from .chat_processor import ChatProcessor, ModelFilesError
from .fair_share import FairShare
from .hf_processor import ChatTemplateFailed
from .preprocess_pool import PreprocessPool, PreprocessPoolError
from .template_sandbox import TemplateSandbox, unsandboxed_value_too_large

if TYPE_CHECKING:
    from .openai_protocol import ChatCompletionRequest

# Threads that render chat templates and tokenise in this process (tokenising goes to the
# preprocess pool instead when there is one). Bounded: more requests wait their turn.
PREPROCESS_THREADS = 4
# A prompt longer than this is costly to tokenise (~0.3 s for the worst text on this project's
# test machine; a real prompt of this length is ~16k tokens): such prompts share all but one of
# the tokenising workers.
HEAVY_PROMPT_CHARS = 64 * 1024
# What a client is told when the model's preprocessing cannot run, by the pool's state.
PREPROCESS_UNAVAILABLE = {
    "rebuilding": "the model's preprocessing is being rebuilt after a process died; retry shortly",
    "failed": "the model's preprocessing is down",
}
PREPROCESS_UNAVAILABLE_OTHERWISE = "the model's preprocessing is unavailable right now; retry later"

T = TypeVar("T")


class Preprocessing:
    def __init__(self, pool: PreprocessPool | None, sandbox: TemplateSandbox | None = None) -> None:
        self.pool = pool
        # Where the hf processor's templates (a peer's code) render, bounded; None: on the
        # threads here (tests, and processors whose library renders its own way).
        self.sandbox = sandbox
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=PREPROCESS_THREADS, thread_name_prefix="preprocess"
        )
        self.tokenizing = FairShare(PREPROCESS_THREADS if pool is None else pool.workers)

    def close(self) -> None:
        """Stop the threads (work queued and not started is dropped)."""
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def run(self, work: Callable[..., T], *args) -> T:
        """``work(*args)`` on a preprocessing thread."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, work, *args)

    async def render_chat(self, processor: ChatProcessor, chat: ChatCompletionRequest) -> str:
        """The chat's prompt: in the template render processes when the frontend has them
        (every processor's template, in its bounded form), else on a thread. Raises
        NoChatTemplate, ChatTemplateError (the client's 400), ChatTemplateFailed (the model's
        502) or TemplateLimitExceeded (a 503), the same in both places."""
        if self.sandbox is not None:
            bounded = await self.run(processor.bounded_render_inputs, chat)
            if bounded is not None:
                return await self.sandbox.render(processor.model, *bounded)
        try:
            text = await self.run(processor.render_chat, chat)
        except TemplateValueTooLarge as exc:
            raise unsandboxed_value_too_large(processor.model, exc) from None
        except MemoryError:  # this process's, unbounded here: the template's doing
            raise ChatTemplateFailed("MemoryError: the frontend ran out of memory") from None
        if len(text) > MAX_VALUE_SIZE:  # the bound a render process puts on what it sends
            raise unsandboxed_value_too_large(
                processor.model,
                TemplateValueTooLarge(
                    f"the rendered prompt is {len(text)} characters, over the frontend's "
                    f"bound of {MAX_VALUE_SIZE}"
                ),
            )
        return text

    async def encode(
        self, processor: ChatProcessor, prompt: str, *, add_special_tokens: bool
    ) -> list[int]:
        """The prompt's ids by the model's tokenizer, on a tokenising worker the model's fair
        share gives it (see the module docstring); a 503 when the pool cannot take it."""
        heavy = len(prompt) > HEAVY_PROMPT_CHARS
        async with self.tokenizing.slot(processor.model, heavy=heavy):
            return await self._encode(processor, prompt, add_special_tokens=add_special_tokens)

    async def _encode(
        self, processor: ChatProcessor, prompt: str, *, add_special_tokens: bool
    ) -> list[int]:
        if self.pool is None:
            encode = functools.partial(
                processor.tokenizer.encode, add_special_tokens=add_special_tokens
            )
            return await self.run(encode, prompt)
        try:
            return await self.pool.encode(
                processor.card, prompt, add_special_tokens=add_special_tokens
            )
        except PreprocessPoolError as exc:  # the pool logs its own breakage, once
            message = PREPROCESS_UNAVAILABLE.get(self.pool.state, PREPROCESS_UNAVAILABLE_OTHERWISE)
            raise oai.service_unavailable(
                message, code="preprocess_unavailable", detail=str(exc)
            ) from exc
        except ModelFilesError as exc:  # the frontend loaded them: this host's files changed?
            raise oai.service_unavailable(
                PREPROCESS_UNAVAILABLE_OTHERWISE,
                code="preprocess_unavailable",
                detail=f"a preprocess worker cannot load the tokenizer of "
                f"{peer_text.escape(processor.model)}: {exc}",
            ) from exc
