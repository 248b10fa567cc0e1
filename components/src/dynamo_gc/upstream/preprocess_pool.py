"""Freeze every ``--dyn-preprocess-workers`` process of upstream's frontend, at the end of its
pool initializer.

In ai-dynamo 1.6.1 only the ``sglang`` chat processor has the pool: the model watcher's
``SglangEngineFactory.chat_engine_factory`` builds a ``ProcessPoolExecutor`` with
``initializer=_init_worker`` (a module global of ``dynamo.frontend.sglang_processor``, read when a
model is registered). The ``vllm`` processor refuses ``--dyn-preprocess-workers`` outright.

The global is replaced with a ``functools.partial`` of :func:`freezing_init_worker`, the
global's location and the GC settings. The partial pickles by reference to *this* module's
function, so under ``spawn`` and ``forkserver`` the child imports ``dynamo_gc`` and runs our
wrapper, which runs upstream's initializer (fresh in that child, so never the wrapper itself)
and then freezes. Under ``fork`` the child inherits the wrapper and the saved original.

A pool process is new and has admitted nothing when its initializer ends, so it is a quiescent
point even though the frontend that forks it is already serving: a forked child inherits the
parent's ``serving`` phase, which the wrapper puts back to ``starting`` before freezing.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dynamo_gc import lifecycle
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.freeze import maybe_freeze_gc_heap
from dynamo_gc.pause_logger import install_gc_pause_logger
from dynamo_gc.upstream.frontend_hooks import EXTENSION_PROGRAM
from dynamo_gc.upstream.hooks import looks_up_global
from dynamo_gc.upstream.versions import refuse

logger = logging.getLogger(__name__)

SGLANG_PROCESSOR = "dynamo.frontend.sglang_processor"
INITIALIZER = "_init_worker"
# The class that builds the pool: with it and without the initializer, upstream changed.
POOL_OWNER = "SglangEngineFactory"
FREEZE_CONTEXT = "upstream preprocess worker, end of its pool initializer"
PROGRAM = EXTENSION_PROGRAM


@dataclass(frozen=True)
class Initializer:
    """Where an upstream pool initializer lives (a module global, read when the pool is built)."""

    module: str = SGLANG_PROCESSOR
    name: str = INITIALIZER


# Upstream's own initializer, saved in the process that wrapped it (and inherited by a forked
# child), with that process's pid.
_original: Callable[..., Any] | None = None
_wrapped_in_pid: int | None = None


def _upstream_initializer(target: Initializer) -> Callable[..., Any]:
    """Upstream's own initializer: the one saved when wrapping, else the module's (a spawned or
    forkserver child imports upstream's module afresh, where the global was never replaced)."""
    if _original is not None:
        return _original
    initializer = getattr(importlib.import_module(target.module), target.name)
    if _is_ours(initializer):
        raise RuntimeError(f"{target.module}.{target.name} is wrapped but its original is lost")
    return initializer


def _is_ours(initializer: object) -> bool:
    return isinstance(initializer, functools.partial) and initializer.func is freezing_init_worker


def freezing_init_worker(target: Initializer, settings: GcSettings, *initargs: Any) -> None:
    """The pool initializer the children run: upstream's, then the pause logger and the freeze."""
    _upstream_initializer(target)(*initargs)
    if os.getpid() == _wrapped_in_pid:
        return  # not a pool process but the frontend itself, which is serving: no freeze
    # A forked child inherits the frontend's phase (serving); this process has served nothing.
    lifecycle.reset_for_new_process()
    install_gc_pause_logger(settings.gc_pause_log_ms)
    maybe_freeze_gc_heap(settings.freeze_gc_heap, context=FREEZE_CONTEXT)
    lifecycle.mark_serving("preprocess worker takes tasks")


def wrap_initializer(
    settings: GcSettings, target: Initializer = Initializer(), *, requested_workers: int = 0
) -> bool:
    """Replace upstream's pool initializer, when upstream loaded the processor that has a pool.

    Returns whether it wrapped. The default and ``vllm`` processors never import the sglang
    processor's module: nothing to do, unless upstream's own options asked for a pool
    (``requested_workers`` > 0: ``--dyn-chat-processor sglang --dyn-preprocess-workers N``), when
    a module missing there means upstream moved it, and the pool would run unfrozen: exit 2.
    Called before the pool exists (the model watcher builds it later, reading the global then).
    """
    global _original, _wrapped_in_pid
    module = sys.modules.get(target.module)
    if module is None:
        if requested_workers > 0:
            refuse(
                PROGRAM,
                target.module,
                f"was not loaded although --dyn-chat-processor sglang with "
                f"--dyn-preprocess-workers {requested_workers} asks for its pool (upstream moved "
                "it: its pool processes would not be frozen)",
            )
        return False
    current = getattr(module, target.name, None)
    owner = getattr(module, POOL_OWNER, None)
    if not callable(current):
        if owner is None:
            return False  # a module of that name that is not upstream's processor
        # The symbol this adapter hooks is gone in this upstream version: say so, never a
        # silent no-op that leaves the pool unfrozen.
        refuse(PROGRAM, f"{target.module}.{target.name}", "is missing")
    factory = getattr(owner, "chat_engine_factory", None)
    if owner is not None and not looks_up_global(factory, target.name):
        refuse(
            PROGRAM,
            f"{target.module}.{POOL_OWNER}.chat_engine_factory",
            f"no longer builds its pool with the module global {target.name}",
        )
    if _is_ours(current):
        return True
    _original = current
    _wrapped_in_pid = os.getpid()
    setattr(module, target.name, functools.partial(freezing_init_worker, target, settings))
    logger.info("Preprocess pool initializer wrapped: each pool process freezes before it works")
    return True


def unwrap_initializer(target: Initializer = Initializer()) -> None:
    """Put upstream's initializer back (tests)."""
    global _original, _wrapped_in_pid
    module = sys.modules.get(target.module)
    if module is not None and _original is not None:
        setattr(module, target.name, _original)
    _original = None
    _wrapped_in_pid = None
