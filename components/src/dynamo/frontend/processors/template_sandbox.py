"""Rendering peers' chat templates in processes the frontend can bound and replace.

A model's chat template comes with its card, from a peer: it is code, and Jinja's sandbox keeps
it from reaching this process's objects but not from looping or allocating (two nested
``range(100000)`` loops run for minutes; a string built from the conversation can take GBs). So
every chat request's template is rendered in one of ``--dyn-template-processes`` child processes
(``spawn``: fresh interpreters that import Jinja and this project's template environment,
nothing of the frontend's state), whichever the chat processor (the ``vllm`` and ``sglang``
processors' templates in the form :mod:`.library_templates` gives them), and:

* **Time.** A render has ``--dyn-template-timeout`` seconds; past it the process is killed and
  replaced (a thread cannot be stopped, a process can), and the request is a 503 naming the
  model (code ``chat_template_limit``).
* **Memory.** Each process's address space is limited (``RLIMIT_AS``) to what it holds once
  started plus ``--dyn-template-memory-mb``: a render that would go over fails with MemoryError
  there (or the process dies), the same 503, the process replaced.
* **Share.** One model's renders use at most :attr:`TemplateSandbox.per_model` of the processes
  at once (all but one, when there are two or more), and a request waits at most the timeout for
  its turn: a model whose template is slow, however many requests it gets, leaves a process to
  every other model. And the *suspects* (models whose last render breached a bound) share those
  ``per_model`` processes between them: however many hostile models a peer registers, once each
  has breached a bound the other models keep a process. The wait for its turn and then for a
  free process are one wait, of at most the timeout.

* **Compiling.** Jinja's compiler is costly on a hostile source, so at registration a card's
  template is compiled in a fresh process under the same bounds
  (:meth:`TemplateSandbox.check_compiles`); one that does not compile in them refuses its model,
  and the frontend never compiles it itself. At most as many compile checks as there are render
  processes run at once (the others wait their turn): a peer registering many models at once
  costs the same memory as one with that many.

Each breach is one WARNING per cause per minute (``Chat template of model %s ...``), naming the
model, never the template's text. A template that raises (its ``raise_exception``) or fails on
the request's messages is the client's 400, as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import logging
import multiprocessing
import resource
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from dynamo.runtime import peer_text
from dynamo.runtime.chat_template import MAX_VALUE_SIZE, TemplateValueTooLarge
from dynamo.runtime.log_budget import CauseBudgets

from .hf_processor import ChatTemplateError, HfChatTemplate, ModelFilesError, RenderOptions

logger = logging.getLogger(__name__)

DEFAULT_PROCESSES = 2
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_MB = 512
# Compiled templates a process keeps (by the hash of their source); least recently used go.
CACHED_TEMPLATES = 32
# What of an error a render process sends back (the client sees less: the 400 quotes 500).
MAX_ERROR_CHARS = 4096
# How long a new process may take to start and report ready.
START_TIMEOUT_S = 60.0
LOG_INTERVAL_S = 60.0
# Models remembered as suspects (their last render breached a bound), the oldest forgotten.
MAX_SUSPECTS = 4096


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


def _template_key(template: HfChatTemplate) -> str:
    """What a render process caches a compiled template under: its source and its variables
    (two models may share a template's text with different special tokens)."""
    identity = json.dumps([template.source, sorted(template.variables.items())])
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()


# -- the child process -------------------------------------------------------------------------


def _vm_size() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _serve(conn: Connection, memory_bytes: int) -> None:
    """A render process: limit the address space, report ready, then render until EOF."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the frontend owns shutdown
    limit = _vm_size() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    templates: OrderedDict[str, HfChatTemplate] = OrderedDict()
    conn.send(("ready", limit))
    while True:
        try:
            key, source, variables, messages, options = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if messages is None:  # compile only: the registration's check
                HfChatTemplate(source, variables)
                conn.send(("ok", ""))
                continue
            template = templates.get(key)
            if template is None:
                template = templates[key] = HfChatTemplate(source, variables)
                while len(templates) > CACHED_TEMPLATES:
                    templates.popitem(last=False)
            templates.move_to_end(key)
            text = template.render(messages, options)
            if len(text) > MAX_VALUE_SIZE:  # what goes back to the frontend is bounded too
                raise TemplateValueTooLarge(
                    f"the rendered prompt is {len(text)} characters, over the frontend's bound "
                    f"of {MAX_VALUE_SIZE}"
                )
            answer: tuple[str, str] = ("ok", text)
        except TemplateValueTooLarge as exc:
            answer = ("value", str(exc))
        except ChatTemplateError as exc:
            answer = ("template", str(exc))
        except ModelFilesError as exc:  # does not compile
            answer = ("template", str(exc))
        except MemoryError as exc:
            templates.clear()
            answer = ("memory", type(exc).__name__)
        except Exception as exc:  # noqa: BLE001 - whatever else a template raises: the client's
            answer = ("template", f"{type(exc).__name__}: {exc}")
        # An error's text is the template's to choose (raise_exception): it crosses the pipe
        # bounded, whatever it computed.
        conn.send((answer[0], answer[1][:MAX_ERROR_CHARS]) if answer[0] != "ok" else answer)


# -- the frontend's side -----------------------------------------------------------------------


class _Process:
    """One render process and the frontend's end of its pipe (used by one request at a time)."""

    def __init__(self, memory_bytes: int, *, wait: bool = True) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child, memory_bytes), name="template-render", daemon=True
        )
        self.process.start()
        child.close()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until the process has limited itself and said so (blocking)."""
        try:
            if self.conn.poll(START_TIMEOUT_S):
                self.conn.recv()
                return
        except (EOFError, OSError):
            pass
        self.kill()
        raise RuntimeError("a template render process did not start in time")

    def render(self, payload: tuple, timeout_s: float) -> tuple[str, str]:
        """Blocking: the process's answer, or ("timeout", ...) / ("died", ...)."""
        try:
            self.conn.send(payload)
            if not self.conn.poll(timeout_s):
                return ("timeout", "")
            return self.conn.recv()
        except (EOFError, OSError):
            return ("died", f"exit code {self.process.exitcode}")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5.0)
        self.conn.close()


class TemplateSandbox:
    """``processes`` render processes (see the module docstring); :meth:`start` before use."""

    def __init__(
        self,
        processes: int = DEFAULT_PROCESSES,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ) -> None:
        if processes < 1:
            raise ValueError("a template sandbox needs at least one process")
        self.processes = processes
        self.timeout_s = timeout_s
        self.memory_bytes = memory_mb * 1024 * 1024
        self.per_model = max(1, processes - 1)
        self.replaced = 0  # processes killed for a breach and started anew
        self._idle: asyncio.Queue[_Process] | None = None
        self._all: list[_Process] = []
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=processes, thread_name_prefix="template-render"
        )
        self._in_use: dict[str, int] = {}
        # Models whose last render breached a bound (a timeout, the memory limit): between them
        # they use per_model processes at most, so any number of hostile models leave a process
        # to the others. A render within the bounds clears the mark.
        self._suspects: OrderedDict[str, None] = OrderedDict()
        self._suspects_in_use = 0
        self._turns: asyncio.Condition | None = None
        self._lock = threading.Lock()
        # Compile checks at once (each a fresh process under the memory bound): the registry
        # builds models on many threads, and 8 hostile records started 6 processes, 2.87 GB.
        self._compiles = threading.BoundedSemaphore(processes)
        self._closed = False  # no process is replaced once closing
        self._log = CauseBudgets(logger, lines=1, interval_s=LOG_INTERVAL_S)

    def start(self) -> None:
        """Start every process (blocking: call before serving, or in a thread)."""
        started = [_Process(self.memory_bytes, wait=False) for _ in range(self.processes)]
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

    def _queue(self) -> asyncio.Queue[_Process]:
        if self._idle is None:  # made on the serving loop, at first use
            self._idle = asyncio.Queue()
            for process in self._all:
                self._idle.put_nowait(process)
            self._turns = asyncio.Condition()
        return self._idle

    async def render(
        self,
        model: str,
        template: HfChatTemplate,
        messages: Sequence[Mapping[str, Any]],
        options: RenderOptions,
    ) -> str:
        """``template`` rendered for ``messages`` in a render process. Raises
        ChatTemplateError (the client's 400) or TemplateLimitExceeded (a 503)."""
        idle = self._queue()
        assert self._turns is not None
        name = peer_text.escape(model)
        suspect = False
        kind, text = "busy", ""  # until a process has answered

        def my_turn() -> bool:
            if self._in_use.get(model, 0) >= self.per_model:
                return False
            return model not in self._suspects or self._suspects_in_use < self.per_model

        # One deadline for both waits (its turn, then a free process): a request waits for a
        # render process at most the timeout in all.
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                async with self._turns:
                    await self._turns.wait_for(my_turn)
                    self._in_use[model] = self._in_use.get(model, 0) + 1
                    suspect = model in self._suspects
                    self._suspects_in_use += suspect
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
            key = _template_key(template)
            payload = (key, template.source, template.variables, list(messages), options)
            loop = asyncio.get_running_loop()
            slot, kind = process, "died"  # unless the render returns
            try:
                kind, text, slot = await loop.run_in_executor(
                    self._threads, self._render_or_replace, process, payload
                )
            finally:
                idle.put_nowait(slot)
        finally:
            async with self._turns:
                left = self._in_use[model] - 1
                if left:
                    self._in_use[model] = left
                else:
                    del self._in_use[model]
                self._suspects_in_use -= suspect
                self._judge(model, kind)
                self._turns.notify_all()
        if kind == "ok":
            return text
        if kind == "template":
            raise ChatTemplateError(text)
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

    def _judge(self, model: str, kind: str) -> None:
        """A render that breached a bound (or killed its process) makes its model a suspect; one
        within the bounds clears it; one that never got a process says nothing."""
        if kind == "busy":
            return
        if kind in ("ok", "template", "value"):
            self._suspects.pop(model, None)
        else:
            self._suspects[model] = None
            self._suspects.move_to_end(model)
            while len(self._suspects) > MAX_SUSPECTS:
                self._suspects.popitem(last=False)

    def _render_or_replace(self, process: _Process, payload: tuple) -> tuple[str, str, _Process]:
        """In a thread: render, and after a breach replace the process (returned: the one that
        takes the slot)."""
        kind, text = process.render(payload, self.timeout_s)
        if kind in ("timeout", "died", "memory") and not self._closed:
            process.kill()
            try:
                fresh = _Process(self.memory_bytes)
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
        the same bounds as a render; raises ModelFilesError when it does not compile or breaks
        a bound (the model is refused). Jinja's compiler is itself costly on a hostile source:
        a megabyte of ``{{ x }}`` took 90 s and over 1 GB. At most :attr:`processes` checks run
        at once; the others wait (each is bounded in time, so the wait is too)."""
        with self._compiles:
            process = _Process(self.memory_bytes)
            try:
                kind, text = process.render(
                    ("check", source, dict(variables), None, None), self.timeout_s
                )
            finally:
                process.kill()
        if kind == "ok":
            return
        if kind == "template":
            raise ModelFilesError(text)
        what = {
            "timeout": f"took over {self.timeout_s:g} s to compile",
            "memory": f"went over {self.memory_bytes >> 20} MiB compiling",
        }.get(kind, f"killed the process compiling it ({text})")
        raise ModelFilesError(
            f"the chat template {what} (--dyn-template-timeout / --dyn-template-memory-mb)"
        )

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop the processes (requests in flight get EOF: a 503)."""
        self._closed = True
        for process in self._all:
            process.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)
