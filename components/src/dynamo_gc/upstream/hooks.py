"""Resolve, check and wrap one of upstream's module globals (the adapters' only way in).

Upstream's launchers look some functions up as module globals at call time (the vLLM worker's
``register_vllm_model``, the mocker's ``run_input``), so replacing the global before upstream's
``main()`` runs reaches every path that calls it. That holds only while (a) the module imports,
(b) the global is there and of the expected kind, and (c) the function that calls it still looks
it up by that name. Each is checked against the real module before anything starts; a failure is
an exit 2 naming the installed ai-dynamo version and the symbol (see :mod:`.versions`), never a
wrapper that nothing calls.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dynamo_gc.upstream.versions import refuse

# Set on every wrapper this module installs: how a second wrap (or the tests) recognise it.
WRAPPED_MARK = "__dynamo_gc_hook__"


@dataclass(frozen=True)
class ModuleGlobalHook:
    """A module global of upstream's that an adapter wraps, and who must call it."""

    module: str  # "dynamo.vllm.main"
    name: str  # "register_vllm_model"
    caller: str  # a function of the same module that looks ``name`` up at call time: "worker"
    coroutine: bool  # the global must be an ``async def`` (its wrapper is one too)
    # With ``coroutine``: the global is a compiled function of ai-dynamo's Rust bindings (pyo3)
    # that returns an awaitable, which upstream awaits (``dynamo.llm.register_model``). Such a
    # function reads as a builtin, async or not, until it is called: it must still be one (or
    # have become an ``async def``).
    compiled: bool = False

    @property
    def symbol(self) -> str:
        return f"{self.module}.{self.name}"


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def looks_up_global(function: Any, name: str) -> bool:
    """True when ``function`` (or a function nested in it) loads the name ``name``.

    ``function`` may also be a code object (the tests read upstream's file without importing it).
    """
    code = function if isinstance(function, types.CodeType) else getattr(function, "__code__", None)
    if code is None:
        return False
    return any(name in each.co_names for each in _code_objects(code))


def _awaitable(function: Any, hook: ModuleGlobalHook) -> bool:
    if inspect.iscoroutinefunction(function):
        return True
    return hook.compiled and inspect.isbuiltin(function)


def resolve(program: str, hook: ModuleGlobalHook) -> types.ModuleType:
    """The real module, once the hook's global and its caller are what the adapter expects."""
    try:
        module = importlib.import_module(hook.module)
    except ImportError as exc:
        refuse(program, hook.module, f"cannot be imported ({type(exc).__name__}: {exc})")
    target = getattr(module, hook.name, None)
    if target is None:
        refuse(program, hook.symbol, "is missing")
    original = getattr(target, "__wrapped__", target) if is_wrapped(target) else target
    if not callable(original):
        refuse(program, hook.symbol, f"is not callable (a {type(original).__name__})")
    if hook.coroutine and not _awaitable(original, hook):
        refuse(program, hook.symbol, "is no longer an async function")
    caller: Any = module
    for part in hook.caller.split("."):  # a function, or a class's method: "Factory.create"
        caller = getattr(caller, part, None)
    if caller is None:
        refuse(program, f"{hook.module}.{hook.caller}", "is missing")
    if not looks_up_global(caller, hook.name):
        refuse(
            program,
            f"{hook.module}.{hook.caller}",
            f"no longer calls the module global {hook.name} (the wrap would never run)",
        )
    return module


def is_wrapped(function: Any) -> bool:
    return getattr(function, WRAPPED_MARK, False) is True


def wrap(
    program: str, hook: ModuleGlobalHook, make_wrapper: Callable[[Callable], Callable]
) -> Callable:
    """Replace the checked global by ``make_wrapper(original)``; returns the original.

    Wrapping twice replaces the first wrapper (one freeze per process, whoever asks twice).
    """
    module = resolve(program, hook)
    current = getattr(module, hook.name)
    original = current.__wrapped__ if is_wrapped(current) else current
    wrapper = make_wrapper(original)
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wrapper, WRAPPED_MARK, True)
    setattr(module, hook.name, wrapper)
    return original


def unwrap(hook: ModuleGlobalHook) -> None:
    """Put the original global back, if this module wrapped it (tests run many in one process)."""
    module = importlib.import_module(hook.module)
    current = getattr(module, hook.name, None)
    if is_wrapped(current):
        setattr(module, hook.name, current.__wrapped__)  # type: ignore[union-attr]
