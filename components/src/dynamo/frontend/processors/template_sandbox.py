"""Rendering peers' chat templates in processes the frontend can bound and replace.

A model's chat template comes with its card, from a peer: it is code, and Jinja's sandbox keeps
it from reaching this process's objects but not from looping or allocating (two nested
``range(100000)`` loops run for minutes; a string built from the conversation can take GBs). So
every chat request's template is rendered in one of ``--dyn-template-processes`` child processes
(:mod:`.render_process`), whichever the chat processor (the ``vllm`` and ``sglang`` processors'
templates in the form :mod:`.library_templates` gives them), and:

* **Time.** A render has ``--dyn-template-timeout`` seconds; past it the process is killed and
  replaced, and the request is a 503 naming the model (code ``chat_template_limit``).
* **Memory.** Each process's address space is limited (``RLIMIT_AS``) to what it holds once
  started plus ``--dyn-template-memory-mb``: a render that would go over fails with MemoryError
  there (or the process dies), the same 503, the process replaced.
* **Share.** The processes are a :class:`~.fair_share.FairShare` between models: one model's
  renders use at most all but one of them at once, and the *suspects* share those between them:
  however many hostile models a peer registers, once each has breached a bound the other models
  keep a process. A model is a suspect for :data:`SUSPECT_MEMORY_S` after its last breach (a
  timeout, the memory bound, a process killed), whatever it renders meanwhile: renders within
  the bounds in between do not clear the mark. A request waits for its turn and then for a free
  process at most the timeout in all.
* **Compiling** is checked at registration, in fresh processes under the same bounds
  (:mod:`.compile_checks`); the frontend never compiles a peer's template itself.

A template that rejects the conversation (its ``raise_exception``) is the client's 400; one that
fails otherwise, or renders text that is no prompt, is the model's 502
(:class:`~.hf_processor.ChatTemplateFailed`). Each breach is one WARNING per cause per minute
(``Chat template of model %s ...``), naming the model, never the template's text.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dynamo.runtime import peer_text
from dynamo.runtime.chat_template import TemplateValueTooLarge
from dynamo.runtime.log_budget import CauseBudgets

from .compile_checks import CompileChecks
from .fair_share import FairShare
from .hf_processor import ChatTemplateError, ChatTemplateFailed, HfChatTemplate, RenderOptions
from .render_process import RenderProcess, template_key

logger = logging.getLogger(__name__)

DEFAULT_PROCESSES = 2
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 512
LOG_INTERVAL_S = 60.0
# Models remembered as suspects, the oldest forgotten; and for how long after a breach.
MAX_SUSPECTS = 4096
SUSPECT_MEMORY_S = 600.0


class TemplateLimitExceeded(Exception):
    """A render went over the time or memory bound, or no process was free for it in time:
    ``str()`` is for the client (it names the model, never the template)."""


def value_too_large(model: str) -> TemplateLimitExceeded:
    """The client's error for a template that tried to build a value over the bound."""
    return TemplateLimitExceeded(
        f"the chat template of model `{model}` builds a value over the frontend's bound "
        "rendering these messages"
    )


_unsandboxed_log = CauseBudgets(logger, lines=1, interval_s=LOG_INTERVAL_S)


def unsandboxed_value_too_large(model: str, exc: TemplateValueTooLarge) -> TemplateLimitExceeded:
    """The same, for a template rendered on a frontend thread (no render processes): logged."""
    _unsandboxed_log.emit(
        "value", "Chat template of model %s was stopped: %s", peer_text.escape(model), exc
    )
    return value_too_large(model)


class SuspectMemory:
    """Models that breached a render bound within the last ``memory_s`` seconds (at most
    ``capacity``, the least recently marked forgotten)."""

    def __init__(
        self,
        memory_s: float = SUSPECT_MEMORY_S,
        capacity: int = MAX_SUSPECTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.memory_s = memory_s
        self.capacity = capacity
        self._clock = clock
        self._marked: OrderedDict[str, float] = OrderedDict()  # model -> its last breach

    def mark(self, model: str) -> None:
        self._marked.pop(model, None)
        self._marked[model] = self._clock()
        while len(self._marked) > self.capacity:
            self._marked.popitem(last=False)

    def __contains__(self, model: object) -> bool:
        marked = self._marked.get(model)  # type: ignore[call-overload]
        if marked is None:
            return False
        if self._clock() - marked < self.memory_s:
            return True
        del self._marked[model]  # type: ignore[arg-type]
        return False


class TemplateSandbox:
    """``processes`` render processes (see the module docstring); :meth:`start` before use."""

    def __init__(
        self,
        processes: int = DEFAULT_PROCESSES,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        suspects: SuspectMemory | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("a template sandbox needs at least one process")
        self.processes = processes
        self.timeout_s = timeout_s
        self.memory_bytes = memory_mb * 1024 * 1024
        self.replaced = 0  # processes killed for a breach and started anew
        self._idle: asyncio.Queue[RenderProcess] | None = None
        self._all: list[RenderProcess] = []
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=processes, thread_name_prefix="template-render"
        )
        # The processes between models: a model (key) at most N - 1, suspects (heavy) together
        # at most N - 1. Made on the serving loop, at first use.
        self.share: FairShare | None = None
        self.suspects = suspects or SuspectMemory()
        self._lock = threading.Lock()
        self.compiles = CompileChecks(
            processes, timeout_s=timeout_s, memory_bytes=self.memory_bytes
        )
        self._closed = False  # no process is replaced once closing
        self._log = CauseBudgets(logger, lines=1, interval_s=LOG_INTERVAL_S)

    @property
    def per_model(self) -> int:
        """The processes one model's renders may use at once."""
        return max(1, self.processes - 1)

    def start(self) -> None:
        """Start every process (blocking: call before serving, or in a thread)."""
        started = [RenderProcess(self.memory_bytes, wait=False) for _ in range(self.processes)]
        try:
            for process in started:  # they start side by side
                process.wait_ready()
        except RuntimeError:
            for process in started:
                process.kill()
            raise
        self._all = started

    def pids(self) -> list[int | None]:
        return [p.process.pid for p in self._all]

    def _queue(self) -> asyncio.Queue[RenderProcess]:
        if self._idle is None:  # made on the serving loop, at first use
            self._idle = asyncio.Queue()
            for process in self._all:
                self._idle.put_nowait(process)
            self.share = FairShare(self.processes)
        return self._idle

    async def render(
        self,
        model: str,
        template: HfChatTemplate,
        messages: Sequence[Mapping[str, Any]],
        options: RenderOptions,
    ) -> str:
        """``template`` rendered for ``messages`` in a render process. Raises
        ChatTemplateError (the client's 400), ChatTemplateFailed (the model's 502) or
        TemplateLimitExceeded (a 503)."""
        idle = self._queue()
        share = self.share
        assert share is not None
        name = peer_text.escape(model)
        suspect = False
        # One deadline for both waits (its turn, then a free process): a request waits for a
        # render process at most the timeout in all.
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                suspect = await share.acquire(model, heavy=lambda: model in self.suspects)
        except TimeoutError:
            self._breach("busy", name, "every render process it may use stayed busy")
            raise TemplateLimitExceeded(
                f"the chat template of model `{model}` could not be rendered within "
                f"{self.timeout_s:g} s: its renders are all busy; retry later"
            ) from None
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    process = await idle.get()
            except TimeoutError:
                self._breach("busy", name, "no render process was free")
                raise TemplateLimitExceeded(
                    f"the chat template of model `{model}` could not be rendered within "
                    f"{self.timeout_s:g} s: the frontend's renders are busy; retry later"
                ) from None
            key = template_key(template.source, template.variables)
            payload = (key, template.source, template.variables, list(messages), options)
            loop = asyncio.get_running_loop()
            slot, kind, text = process, "died", ""  # unless the render returns
            try:
                kind, text, slot = await loop.run_in_executor(
                    self._threads, self._render_or_replace, process, payload
                )
            finally:
                idle.put_nowait(slot)
                if kind in ("timeout", "memory", "died"):
                    self.suspects.mark(model)  # before its turn is given back
        finally:
            share.release(model, heavy=suspect)
        return self._outcome(model, name, kind, text)

    def _outcome(self, model: str, name: str, kind: str, text: str) -> str:
        """The prompt, or what a render process's answer means for the client."""
        if kind == "ok":
            return text
        if kind == "template":
            raise ChatTemplateError(text)
        if kind == "failed":
            raise ChatTemplateFailed(text)
        if kind == "value":  # refused before it was built: the process is fine
            self._breach(kind, name, f"was stopped: {text}")
            raise value_too_large(model)
        what = {
            "timeout": f"took over {self.timeout_s:g} s",
            "memory": f"went over {self.memory_bytes >> 20} MiB",
        }.get(kind, f"killed its render process ({text})")
        self._breach(kind, name, what + ": the render process was replaced")
        raise TemplateLimitExceeded(
            f"the chat template of model `{model}` {what} rendering these messages"
        )

    def _render_or_replace(
        self, process: RenderProcess, payload: tuple
    ) -> tuple[str, str, RenderProcess]:
        """In a thread: render, and after a breach replace the process (returned: the one that
        takes the slot)."""
        kind, text = process.render(payload, self.timeout_s)
        if kind in ("timeout", "died", "memory") and not self._closed:
            process.kill()
            try:
                fresh = RenderProcess(self.memory_bytes)
            except RuntimeError as exc:  # the slot keeps the dead one: its next use retries
                logger.error("A template render process could not be replaced: %s", exc)
                return kind, text, process
            with self._lock:
                self._all[self._all.index(process)] = fresh
                self.replaced += 1
            return kind, text, fresh
        return kind, text, process

    def _breach(self, cause: str, model: str, what: str) -> None:
        self._log.emit(
            cause,
            "Chat template of model %s %s (bounds: --dyn-template-timeout %g s, "
            "--dyn-template-memory-mb %d)",
            model,
            what,
            self.timeout_s,
            self.memory_bytes >> 20,
        )

    def check_compiles(self, source: str, variables: Mapping[str, Any]) -> None:
        """Blocking (the registry's build thread): compile ``source`` in a fresh process under
        the render bounds (:mod:`.compile_checks`); raises ModelFilesError when it does not
        compile or breaks a bound (the model is refused)."""
        self.compiles.check(source, variables)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop the processes (requests in flight get EOF: a 503)."""
        self._closed = True
        self.compiles.close()
        for process in self._all:
            process.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)
