"""Where upstream's Python sees each request, gated for the serving-time maintenance.

An ``idle`` maintenance needs the process's requests counted in flight, and a place where a new
one can wait while a maintenance holds admission (:class:`dynamo_gc.admission.AdmissionGate`).
Upstream's HTTP service, router and request plane are Rust; the Python a request passes through
is an async generator method of one of upstream's classes, looked up on the instance when
upstream hands it to its Rust side (``PythonAsyncEngine(processor.generator, ...)``,
``endpoint.serve_endpoint(handler.generate, ...)``). Replacing that class attribute before
upstream builds the instance puts every request of it through the gate: the request is counted
from its first item asked for to its generator's end (or close: a client gone), and waits at
the gate first while a maintenance holds it.

Each :class:`RequestPath` is checked against the real class before anything is installed: the
module imports, the class is there, the attribute is an ``async def`` generator of its own
(``inspect.isasyncgenfunction``); otherwise exit 2 naming the installed ai-dynamo and the
symbol, as :mod:`.hooks` does for module globals.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from dynamo_gc.admission import AdmissionGate
from dynamo_gc.upstream.hooks import WRAPPED_MARK, is_wrapped
from dynamo_gc.upstream.versions import refuse


@dataclass(frozen=True)
class RequestPath:
    """An async generator method of upstream's that every request of some kind passes through."""

    module: str  # "dynamo.frontend.vllm_processor"
    class_name: str  # "VllmProcessor"
    method: str  # "generator"

    @property
    def symbol(self) -> str:
        return f"{self.module}.{self.class_name}.{self.method}"


def resolve(program: str, path: RequestPath) -> type:
    """The class, once the method is what the gate expects; exit 2 otherwise."""
    try:
        module = importlib.import_module(path.module)
    except ImportError as exc:
        refuse(program, path.module, f"cannot be imported ({type(exc).__name__}: {exc})")
    cls = getattr(module, path.class_name, None)
    if not isinstance(cls, type):
        refuse(program, f"{path.module}.{path.class_name}", "is missing")
    method = cls.__dict__.get(path.method)
    if method is None:
        refuse(program, path.symbol, "is missing (not defined by the class itself)")
    original = method.__wrapped__ if is_wrapped(method) else method
    if not inspect.isasyncgenfunction(original):
        refuse(program, path.symbol, "is no longer an async generator method")
    return cls


def gated(original: Callable[..., AsyncGenerator[Any, None]], gate: AdmissionGate) -> Callable:
    """``original`` (an async generator method) with each call counted in flight by ``gate``,
    waiting first while it is held."""

    @functools.wraps(original)
    async def through_the_gate(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with gate.admitted():
            # aclosing: a client that goes away closes upstream's generator at once, here, and
            # the request leaves the count with it.
            async with contextlib.aclosing(original(*args, **kwargs)) as items:
                async for item in items:
                    yield item

    setattr(through_the_gate, WRAPPED_MARK, True)
    return through_the_gate


def gate_requests(program: str, paths: tuple[RequestPath, ...], gate: AdmissionGate) -> None:
    """Put every request of ``paths`` through ``gate``; all checked before any is replaced.
    Gating again replaces the earlier wrapper (one gate per method)."""
    classes = [resolve(program, path) for path in paths]
    for cls, path in zip(classes, paths, strict=True):
        current = cls.__dict__[path.method]
        original = current.__wrapped__ if is_wrapped(current) else current
        setattr(cls, path.method, gated(original, gate))


def ungate(paths: tuple[RequestPath, ...]) -> None:
    """Put the original methods back where they were gated (tests run many adapters in one
    process); a module never imported was never gated."""
    for path in paths:
        module = sys.modules.get(path.module)
        cls = getattr(module, path.class_name, None)
        current = None if cls is None else cls.__dict__.get(path.method)
        if current is not None and is_wrapped(current):
            setattr(cls, path.method, current.__wrapped__)
