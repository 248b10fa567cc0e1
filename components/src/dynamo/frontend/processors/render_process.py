"""One template render process: the child's loop, and the frontend's handle on it.

A render process is a ``spawn``-ed interpreter that imports Jinja and this project's template
environment, nothing of the frontend's state; it limits its own address space (``RLIMIT_AS``) to
what it holds once started plus a bound, says so, and then renders (or only compiles) what it
is sent, one request at a time, until its pipe closes. The frontend kills it to stop a render
that runs over its time (a thread cannot be stopped, a process can). Who uses these processes,
and how they are shared, is :mod:`.template_sandbox` (renders) and :mod:`.compile_checks`
(registration's compile checks).

Every answer is ``(kind, text)``:

* ``ok``: the rendered prompt (``""`` for a compile check);
* ``template``: the template rejected the conversation (its ``raise_exception``), or, for a
  compile check, does not compile: the client's 400 / the model refused;
* ``failed``: the template failed, or rendered what is no prompt (a lone surrogate): the
  model's 502 (:class:`~.hf_processor.ChatTemplateFailed`);
* ``value``: it tried to build a value over the frontend's bound (refused before it was built:
  the process is fine);
* ``memory``: it went over the memory bound (the process is replaced);
* and on the frontend's side, ``timeout`` (no answer in time) and ``died`` (the process went).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import resource
from collections import OrderedDict
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from dynamo.runtime.chat_template import MAX_VALUE_SIZE, TemplateValueTooLarge

from .hf_processor import (
    ChatTemplateError,
    ChatTemplateFailed,
    HfChatTemplate,
    ModelFilesError,
    check_rendered,
)

# Compiled templates a process keeps (by the hash of their source); least recently used go.
CACHED_TEMPLATES = 32
# What of an error a render process sends back (the client sees less: the 400 quotes 500).
MAX_ERROR_CHARS = 4096
# How long a new process may take to start and report ready.
START_TIMEOUT_S = 60.0


def template_key(source: str, variables: Mapping[str, Any]) -> str:
    """What a compiled template is known by: its source and its variables (two models may share
    a template's text with different special tokens)."""
    identity = json.dumps([source, sorted(variables.items())])
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
        answer = _answer(templates, key, source, variables, messages, options)
        # An error's text is the template's to choose (raise_exception): it crosses the pipe
        # bounded, whatever it computed.
        conn.send((answer[0], answer[1][:MAX_ERROR_CHARS]) if answer[0] != "ok" else answer)


def _answer(
    templates: OrderedDict[str, HfChatTemplate],
    key: str,
    source: str,
    variables: Mapping[str, Any],
    messages: list | None,
    options: Any,
) -> tuple[str, str]:
    """One request's answer (see the module docstring); ``messages`` None: compile only."""
    try:
        if messages is None:  # compile only: the registration's check
            HfChatTemplate(source, variables)
            return ("ok", "")
        template = templates.get(key)
        if template is None:
            template = templates[key] = HfChatTemplate(source, variables)
            while len(templates) > CACHED_TEMPLATES:
                templates.popitem(last=False)
        templates.move_to_end(key)
        text = check_rendered(template.render(messages, options))
        if len(text) > MAX_VALUE_SIZE:  # what goes back to the frontend is bounded too
            raise TemplateValueTooLarge(
                f"the rendered prompt is {len(text)} characters, over the frontend's bound "
                f"of {MAX_VALUE_SIZE}"
            )
        return ("ok", text)
    except TemplateValueTooLarge as exc:
        return ("value", str(exc))
    except ChatTemplateError as exc:
        return ("template", str(exc))
    except ModelFilesError as exc:  # does not compile: refused at registration, else failed
        return ("template" if messages is None else "failed", str(exc))
    except MemoryError as exc:
        templates.clear()
        return ("memory", type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - ChatTemplateFailed, and whatever else: the model's
        text = str(exc) if isinstance(exc, ChatTemplateFailed) else f"{type(exc).__name__}: {exc}"
        return ("failed", text)


# -- the frontend's side -----------------------------------------------------------------------


class RenderProcess:
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
        """Blocking: the process's answer, or ("timeout", "") / ("died", ...)."""
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
