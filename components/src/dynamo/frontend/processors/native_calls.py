"""A model's long native calls, one at a time, each followed by a turn for the event loop.

Building a model's processor loads its tokenizer: ``tokenizers`` parses tokenizer.json and
builds its vocabulary in Rust holding the GIL, tens of milliseconds for a megabyte tokenizer,
during which no other thread of the frontend runs, its event loop included. Processors are
built on threads, and records arrive together (a deployment's workers start at once; a peer
writes as many as it likes): their native calls followed one another on the GIL, and the event
loop waited for several in a row between two of its turns (issue 37: /health answered in
300 ms while eight models with 1 MB tokenizers arrived).

:func:`native_call` makes them take turns: one at a time, and after each the calling thread
sleeps :data:`LOOP_TURN_S` still holding the turn, so the event loop (which waits for the GIL)
runs before the next long call starts. A /health request then waits for at most one such call
per turn of the loop, not for every model's in a row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# How long the event loop gets between two long native calls (a turn of an idle loop takes
# tens of microseconds; a /health answer a few turns).
LOOP_TURN_S = 0.005

_turn = threading.Lock()


def native_call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)``, a call that holds the GIL for long, in its turn."""
    with _turn:
        try:
            return function(*args, **kwargs)
        finally:
            time.sleep(LOOP_TURN_S)  # the GIL is free and no other long call can start
