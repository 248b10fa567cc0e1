"""Allocation that drives CPython's automatic collections by counts, and a counter of them.

Deterministic: CPython paces its young collections by net allocations of tracked objects
(freeing one decrements the count), so a given number of iterations of
:func:`churn_with_survivors` makes a given number of young collections, whatever the machine's
speed. The counter is a ``gc.callbacks`` entry that counts and does nothing else (no heap walk).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


class GenerationCounter:
    """A gc.callbacks entry counting collections per generation (no heap walk)."""

    def __init__(self) -> None:
        self.counts = [0, 0, 0]

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.counts[info["generation"]] += 1


@contextlib.contextmanager
def counted_collections() -> Iterator[GenerationCounter]:
    """A :class:`GenerationCounter` in ``gc.callbacks`` for the block, removed after it (also
    when the block raises)."""
    counter = GenerationCounter()
    gc.callbacks.append(counter)
    try:
        yield counter
    finally:
        gc.callbacks.remove(counter)


def collections_during_churn(iterations: int) -> list[int]:
    """Collections per generation while :func:`churn_with_survivors` runs (its survivors are
    kept until the count is taken)."""
    with counted_collections() as counter:
        kept = churn_with_survivors(iterations)
    del kept
    return counter.counts


def churn_length() -> int:
    """Iterations that, with stock thresholds, must end in an automatic gen2 collection.

    Call it before changing thresholds. Enough gen1 collections to pass threshold2, and
    survivors well past a quarter of today's heap (CPython's 25% rule). Each iteration leaves
    one tracked object alive on average, and only survivors pace young collections (freeing a
    tracked object decrements the gen0 count).
    """
    gc.collect()  # long_lived_total := today's heap
    t0, t1, t2 = gc.get_threshold()
    return max(len(gc.get_objects()) * 3, 2 * t0 * t1 * (t2 + 2))


def churn_with_survivors(iterations: int) -> list:
    """Allocate like a growing long-lived heap: one in three items survives (three tracked
    containers each: one tracked object kept per iteration, on average)."""
    kept = []
    for i in range(iterations):
        item = {"i": [i], "meta": {}}
        if i % 3 == 0:
            kept.append(item)
    return kept
