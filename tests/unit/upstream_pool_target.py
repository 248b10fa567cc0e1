"""A pool initializer laid out as upstream's sglang processor lays out its own: a module global
that the pool reads when it is built, with the initializer's arguments passed as ``initargs``.

The wrapper's tests point it here (tests/unit/test_upstream_preprocess_pool.py): its job is
to survive each start method's pickling and to run in the child, which this module lets them
observe from the child (its pid, what the initializer got, the frozen count, the phase).
"""

from __future__ import annotations

import gc
import os

from dynamo_gc import lifecycle

initialized_with: tuple | None = None


def _init_worker(*initargs) -> None:
    global initialized_with
    initialized_with = initargs


def report() -> tuple[int, tuple | None, int, str]:
    return os.getpid(), initialized_with, gc.get_freeze_count(), lifecycle.current_phase().value
