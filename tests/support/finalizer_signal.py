#!/usr/bin/env python3
"""Test-only: run a launcher with a stop signal delivered inside a finalizer at a chosen step.

    python tests/support/finalizer_signal.py MODULE ARGS...     (as ``python -m MODULE ARGS``)

Read from the environment, before the launcher's own code runs:

- ``FINALIZER_SIGNAL_AT=package.module:name`` (or ``:Class.method``): the start-up step to
  wrap. When the step is called, a reference cycle holding an object with a ``__del__`` is
  dropped, and a garbage collection finalizes it before the step runs; the step
  ``package.module:freeze_gc_heap`` is left to collect it itself (the freeze's own
  ``gc.collect()``).
- ``FINALIZER_SIGNAL=SIGINT`` (or ``SIGTERM``): what the finalizer sends. It sends it to its own
  thread (``signal.raise_signal``), so the process's handler runs right there, inside
  ``__del__``, at once: deterministic, no timing involved. That is what a Ctrl-C landing while a
  collection runs a finalizer looks like (issue 37: ``Exception ignored in: <function
  Group.__del__ ...> ... StartupInterrupted: SIGINT``). The finalizer then prints whether the
  signal was recorded by the time its handler returned.
- ``FINALIZER_SIGNAL_SWALLOW=1``: an async step then waits, after the finalizer, until it is
  cancelled, and swallows the cancellation (as code that catches ``CancelledError`` on its way
  does), before it runs the real step.

Then the launcher runs as ``__main__``, in this process: it is the real launcher.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib
import inspect
import os
import runpy
import signal
import sys


class Finalised:
    """Sends the signal from its ``__del__``; kept alive only by a cycle, so only a collection
    finalizes it."""

    def __init__(self, signum: signal.Signals) -> None:
        self.signum = signum
        self.cycle = self

    def __del__(self) -> None:
        print(f"finalizer: sending {self.signum.name}", file=sys.stderr, flush=True)
        signal.raise_signal(self.signum)
        # Reached only when the handler raised nothing, or on the way out of a raise: below,
        # whether the signal was recorded (dynamo_gc.startup_stop) by the time it returned.
        from dynamo_gc import startup_stop

        print(f"finalizer: recorded {startup_stop.received()}", file=sys.stderr, flush=True)


def drop_a_finalizer(signum: signal.Signals) -> None:
    Finalised(signum)  # unreachable at once, but for its cycle


def wrapped(step, signum: signal.Signals, *, collects_itself: bool, swallow: bool):
    def arrange() -> None:
        drop_a_finalizer(signum)
        if not collects_itself:
            gc.collect()

    if inspect.iscoroutinefunction(step):

        @functools.wraps(step)
        async def async_step(*args, **kwargs):
            arrange()
            if swallow:
                try:
                    await asyncio.Event().wait()  # until the stop's cancellation arrives
                except asyncio.CancelledError:
                    print("step: swallowed a cancellation", file=sys.stderr, flush=True)
            return await step(*args, **kwargs)

        return async_step

    @functools.wraps(step)
    def sync_step(*args, **kwargs):
        arrange()
        return step(*args, **kwargs)

    return sync_step


def install() -> None:
    target = os.environ["FINALIZER_SIGNAL_AT"]
    signum = signal.Signals[os.environ.get("FINALIZER_SIGNAL", "SIGINT")]
    swallow = os.environ.get("FINALIZER_SIGNAL_SWALLOW") == "1"
    module_name, _, path = target.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    step = getattr(owner, name)
    collects_itself = name == "freeze_gc_heap"
    setattr(owner, name, wrapped(step, signum, collects_itself=collects_itself, swallow=swallow))


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    module, args = sys.argv[1], sys.argv[2:]
    install()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
