"""A launcher's lifecycle steps, recorded in order with the process state at each one.

The launcher tests run a real ``main`` in this process and check the order of its steps (the
freeze after engine init and before admission, the drain before the engine stops, ...) and the
serving phase and frozen-object count each step saw.
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Callable

from dynamo_gc import lifecycle, pause_logger

Step = tuple[str, lifecycle.Phase, int]


class StepRecorder:
    """``recorded``: one ``(step, phase, frozen objects)`` per call of a wrapped function.

    The steps every launcher takes are wrapped from the start: ``pause_logger`` (installing the
    process's pause logger), ``mark_serving`` and ``mark_draining``; a test adds its launcher's
    own with :meth:`wrap`.
    """

    def __init__(self, mocker) -> None:
        self.recorded: list[Step] = []
        self._mocker = mocker
        self.wrap(pause_logger, "install_gc_pause_logger", "pause_logger")
        self.wrap(lifecycle, "mark_serving", "mark_serving")
        self.wrap(lifecycle, "mark_draining", "mark_draining")

    def note(self, step: str) -> None:
        self.recorded.append((step, lifecycle.current_phase(), gc.get_freeze_count()))

    def wrap(
        self, owner: object, name: str, step: str, *, after: Callable[[], object] | None = None
    ) -> None:
        """Patch ``owner.name`` (a function or a coroutine function) to note ``step`` before
        each call, and to run ``after`` once the call has returned."""
        real = getattr(owner, name)

        def call(*args, **kwargs):
            self.note(step)
            result = real(*args, **kwargs)
            if after is not None:
                after()
            return result

        async def call_async(*args, **kwargs):
            self.note(step)
            result = await real(*args, **kwargs)
            if after is not None:
                after()
            return result

        wrapper = call_async if inspect.iscoroutinefunction(real) else call
        self._mocker.patch.object(owner, name, wrapper)
