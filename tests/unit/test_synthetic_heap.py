"""The synthetic long-lived heap: about as many tracked objects as asked for, and they live.

Measured with ``len(gc.get_objects())`` deltas around the build: a test-time heap walk, never
something the product code does.
"""

from __future__ import annotations

import gc

import pytest

from dynamo.common.utils import synthetic_heap
from dynamo.common.utils.synthetic_heap import TRACKED_PER_UNIT, build_synthetic_heap


def _tracked_now() -> int:
    gc.collect()
    return len(gc.get_objects())


@pytest.mark.parametrize("target", [10_000, 12_345, 100_000])
def test_it_adds_about_n_tracked_objects_that_survive_a_full_collection(target):
    gc.disable()  # the only collections are the explicit ones in _tracked_now
    before = _tracked_now()

    heap = build_synthetic_heap(target)

    after = _tracked_now()  # gc.collect() first: only objects that survive it are counted
    assert abs((after - before) - target) <= target // 100, after - before
    del heap
    assert abs(_tracked_now() - before) <= 10  # and the heap is all reachable from its root


def test_each_unit_adds_the_documented_number_of_tracked_objects():
    gc.disable()
    small = build_synthetic_heap(1_000 * TRACKED_PER_UNIT)
    middle = _tracked_now()
    large = build_synthetic_heap(2_000 * TRACKED_PER_UNIT)
    grown = _tracked_now() - middle
    # 2000 units plus one root list; allow a few objects of noise from the measurement itself
    assert abs(grown - 2_000 * TRACKED_PER_UNIT) <= 5, grown
    del small, large


def test_every_container_of_a_unit_stays_tracked():
    # An all-atomic dict or tuple would be untracked and cost the collector nothing.
    unit = synthetic_heap._unit(7)
    vocab_entry, registry_entry, config = unit
    containers = [
        unit,
        vocab_entry,
        vocab_entry["tok7"],
        vocab_entry["merges"],
        vocab_entry["merges"][1],
        registry_entry,
        config,
        config.options,
        config.options["rank"],
        config.children,
    ]
    gc.collect()
    assert len({id(c) for c in containers}) == TRACKED_PER_UNIT
    assert all(gc.is_tracked(c) for c in containers)


@pytest.mark.parametrize("target", [0, -5])
def test_nothing_is_built_for_a_target_of_zero_or_less(target):
    assert build_synthetic_heap(target) == []


def test_a_tiny_target_still_builds_one_unit():
    assert len(build_synthetic_heap(3)) == 1


@pytest.mark.parametrize("enabled", [True, False])
def test_no_collection_runs_during_the_build_and_the_enabled_flag_is_restored(enabled):
    starts: list[int] = []
    (gc.enable if enabled else gc.disable)()
    gc.callbacks.append(lambda phase, info: starts.append(1) if phase == "start" else None)

    build_synthetic_heap(50_000)  # ~70 gen0 collections' worth of allocations when enabled

    assert starts == []
    assert gc.isenabled() is enabled
