"""Freeze an upstream worker once, at its first call of the hooked global, then mark it serving.

The hooked global (the vLLM worker's ``register_vllm_model``, the mocker's ``run_input``) is the
call after which the frontend routes requests to the worker: everything start-up built is on the
heap, nothing is admitted yet. The first call collects and freezes (when enabled), marks the
process ``serving`` (so no later freeze can run: the guard in :mod:`dynamo_gc.lifecycle`), then
calls upstream's function unchanged. Later calls (a second model, more mocker workers) only call
upstream's function. A stop signal recorded before (:mod:`dynamo_gc.startup_stop`) raises
``StartupInterrupted`` instead, before the freeze and again before the phase changes: upstream
registers nothing.
"""

from __future__ import annotations

import functools
import gc
import logging
import threading
from collections.abc import Callable
from typing import Any

from dynamo_gc import lifecycle, startup_stop
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.freeze import maybe_freeze_gc_heap

logger = logging.getLogger(__name__)

# The hooked global's arguments, as its wrapper received them.
Call = tuple[tuple[Any, ...], dict[str, Any]]


class FreezeOnce:
    """Runs the freeze and the phase change the first time it is called, never again."""

    def __init__(
        self,
        settings: GcSettings,
        *,
        context: str,
        admission: str,
        before: Callable[[], None] | None = None,
        after_freeze: Callable[[int | None], object] | None = None,
        on_serving: Callable[[Call | None], object] | None = None,
    ) -> None:
        self.settings = settings
        self.context = context
        self.admission = admission
        # run first, on the first call only (the vLLM adapter hands the signals back to
        # upstream's handlers there: from the freeze on, a stop is upstream's graceful one)
        self.before = before
        # right after the freeze, still starting (the maintenance's settling pass), and once
        # serving, in the hooked call's thread and loop, with its arguments (the maintainer's
        # start, which looks at what the call registers)
        self.after_freeze = after_freeze
        self.on_serving = on_serving
        self.frozen: int | None = None
        self._done = False
        self._lock = threading.Lock()

    def __call__(self, call: Call | None = None) -> None:
        # A stop signal recorded during start-up (its interruption lost on the way: see
        # dynamo_gc.startup_stop) ends it here, before upstream registers; on every call, so a
        # second hooked global cannot register after a stop either.
        startup_stop.check()
        with self._lock:
            if self._done:
                return
            self._done = True
        if self.before is not None:
            self.before()
        self.frozen = maybe_freeze_gc_heap(self.settings.freeze_gc_heap, context=self.context)
        try:
            startup_stop.check()  # a signal during the freeze's collection
        except startup_stop.StartupInterrupted:
            if self.frozen is not None:
                gc.unfreeze()  # a stop leaves the GC state as it was
            raise
        if self.after_freeze is not None:
            self.after_freeze(self.frozen)
        lifecycle.mark_serving(self.admission)
        if self.on_serving is not None:
            self.on_serving(call)


def freezing_wrapper(original: Callable, freeze: FreezeOnce, *, coroutine: bool) -> Callable:
    """``original`` with ``freeze()`` run before it (awaited the same way ``original`` is)."""
    if coroutine:

        @functools.wraps(original)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            freeze((args, kwargs))
            return await original(*args, **kwargs)

        return async_wrapper

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        freeze((args, kwargs))
        return original(*args, **kwargs)

    return wrapper
