"""Ctrl-C while an adapter prepares upstream's launcher: recorded, so that it cannot be lost.

``python -m dynamo_gc.vllm`` (``.mocker``, ``.frontend``) spends upstream's first seconds in its
own code: resolving the hooked symbols imports upstream's modules, and with them vLLM (~20 s on
a CPU). Python's own Ctrl-C there is a ``KeyboardInterrupt`` wherever the import is, which a
finalizer that a collection runs meanwhile prints and drops ("Exception ignored in ..."): the
worker then went on to register its model. So, until upstream's own code takes over:

* SIGINT is recorded and interrupts (:func:`dynamo_gc.startup_stop.interrupting_startup`); an
  interruption that got through ends the adapter with one line and exit 0 (:func:`stoppable`);
* :func:`hand_over` checks the record before upstream starts, and gives SIGINT back to
  Python's own handler: from there on signals are upstream's (its ``asyncio.Runner`` and its
  loop handlers behave exactly as without the adapter);
* the adapter's freeze points check the record again before they freeze and before the
  process is marked ``serving`` (:class:`dynamo_gc.upstream.worker_freeze.FreezeOnce`, the
  ``gc-freeze`` route extension), so a stop recorded at any time before upstream admits stops it.

SIGTERM keeps Python's default (the process ends at once): a stop that cannot be lost.
"""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from dynamo_gc import startup_stop

T = TypeVar("T")

SIGNALS = (signal.SIGINT,)


def stoppable(program: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate an adapter's ``main``: SIGINT is recorded and interrupts until :func:`hand_over`;
    a :class:`~dynamo_gc.startup_stop.StartupInterrupted` that reaches ``main`` (from before
    upstream started, or from a freeze point) ends the process with one line, exit 0."""

    def decorate(main: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(main)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            try:
                with startup_stop.interrupting_startup(SIGNALS):
                    return main(*args, **kwargs)
            except startup_stop.StartupInterrupted as exc:
                print(
                    f"{program}: received {exc.signame} during start-up: stopped before "
                    "admitting anything",
                    file=sys.stderr,
                    flush=True,
                )
                raise SystemExit(0) from None

        return wrapper

    return decorate


def hand_over() -> None:
    """Right before upstream's launcher runs: stop if a signal was recorded, else give SIGINT
    back to Python's own handler (upstream's from here on)."""
    startup_stop.check()
    for signum in SIGNALS:
        if signal.getsignal(signum) is startup_stop.record_and_interrupt:
            signal.signal(signum, signal.default_int_handler)
