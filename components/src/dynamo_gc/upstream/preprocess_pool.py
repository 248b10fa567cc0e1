"""Freeze every ``--dyn-preprocess-workers`` process of upstream's frontend, at the end of its
pool initializer.

In ai-dynamo 1.6.1 only the ``sglang`` chat processor has the pool: the model watcher's
``SglangEngineFactory.chat_engine_factory`` builds a ``ProcessPoolExecutor`` with
``initializer=_init_worker`` (a module global of ``dynamo.frontend.sglang_processor``, read when a
model is registered). The ``vllm`` processor refuses ``--dyn-preprocess-workers`` outright.

The global is replaced with a ``functools.partial`` of :func:`freezing_init_worker` and the GC
settings. The partial pickles by reference to *this* module's function, so under ``spawn`` and
``forkserver`` the child imports ``dynamo_gc`` and runs our wrapper, which runs upstream's
initializer (fresh in that child, so never the wrapper itself) and then freezes. Under ``fork``
the child inherits the wrapper and the saved original.

A pool process is new and has admitted nothing when its initializer ends, so it is a quiescent
point even though the frontend that forks it is already serving: a forked child inherits the
parent's ``serving`` phase, which the wrapper puts back to ``starting`` before freezing.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from dynamo_gc import lifecycle
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.freeze import maybe_freeze_gc_heap
from dynamo_gc.pause_logger import install_gc_pause_logger

logger = logging.getLogger(__name__)

SGLANG_PROCESSOR = "dynamo.frontend.sglang_processor"
INITIALIZER = "_init_worker"
FREEZE_CONTEXT = "upstream preprocess worker, end of its pool initializer"

# Set in the process that wrapped the global (and inherited by a forked child).
_original: Callable[..., Any] | None = None
_wrapped_in_pid: int | None = None


def _upstream_initializer() -> Callable[..., Any]:
    """Upstream's own initializer: the one saved when wrapping, else the module's (a spawned or
    forkserver child imports upstream's module afresh, where the global was never replaced)."""
    if _original is not None:
        return _original
    module = sys.modules.get(SGLANG_PROCESSOR)
    if module is None:
        import importlib

        module = importlib.import_module(SGLANG_PROCESSOR)
    initializer = getattr(module, INITIALIZER)
    if isinstance(initializer, functools.partial) and initializer.func is freezing_init_worker:
        raise RuntimeError(f"{SGLANG_PROCESSOR}.{INITIALIZER} is wrapped but its original is lost")
    return initializer


def freezing_init_worker(settings: GcSettings, *initargs: Any) -> None:
    """The pool initializer the children run: upstream's, then the pause logger and the freeze."""
    if os.getpid() == _wrapped_in_pid:
        # Not a pool process: the frontend itself, which is serving. Run upstream's part only.
        _upstream_initializer()(*initargs)
        return
    _upstream_initializer()(*initargs)
    # A forked child inherits the frontend's phase (serving); this process has served nothing.
    lifecycle.reset_for_new_process()
    install_gc_pause_logger(settings.gc_pause_log_ms)
    maybe_freeze_gc_heap(settings.freeze_gc_heap, context=FREEZE_CONTEXT)
    lifecycle.mark_serving("preprocess worker takes tasks")


def wrap_initializer(settings: GcSettings) -> bool:
    """Replace the sglang processor's pool initializer, when upstream loaded that processor.

    Returns whether it wrapped. The default and ``vllm`` processors have no pool: nothing to do.
    """
    global _original, _wrapped_in_pid
    module = sys.modules.get(SGLANG_PROCESSOR)
    if module is None:
        return False
    current = getattr(module, INITIALIZER, None)
    if current is None or not callable(current):
        # The symbol this adapter hooks is gone in this upstream version: say so, never a
        # silent no-op that leaves the pool unfrozen.
        print(_missing_symbol_message(), file=sys.stderr, flush=True)
        raise SystemExit(2)
    if isinstance(current, functools.partial) and current.func is freezing_init_worker:
        return True
    _original = current
    _wrapped_in_pid = os.getpid()
    setattr(module, INITIALIZER, functools.partial(freezing_init_worker, settings))
    logger.info("Preprocess pool initializer wrapped: each pool process freezes before it works")
    return True


def unwrap_initializer() -> None:
    """Put upstream's initializer back (tests)."""
    global _original, _wrapped_in_pid
    module = sys.modules.get(SGLANG_PROCESSOR)
    if module is not None and _original is not None:
        setattr(module, INITIALIZER, _original)
    _original = None
    _wrapped_in_pid = None


def _missing_symbol_message() -> str:
    try:
        from importlib.metadata import version

        found = version("ai-dynamo")
    except Exception:  # noqa: BLE001 - the message must be produced whatever is installed
        found = "unknown"
    return (
        f"dynamo_gc: ai-dynamo {found} has no callable {SGLANG_PROCESSOR}.{INITIALIZER}; "
        "the preprocess pool cannot be frozen with this version (supported: 1.6.1)"
    )
