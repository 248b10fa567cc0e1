"""The synthetic long-lived heap: about as many tracked objects as asked for, and they live.

Measured with ``len(gc.get_objects())`` deltas around the build: a test-time heap walk, never
something the product code does. The counts are taken in a child interpreter with no other
thread: in a pytest-xdist worker, the thread that talks to the controller allocates whenever a
message arrives, and its objects landed between two counts (about 100 of them, a flaky [10000]).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from dynamo.common.utils import synthetic_heap
from dynamo.common.utils.synthetic_heap import TRACKED_PER_UNIT, build_synthetic_heap

# Runs in the child: the tracked-object counts around each step, as JSON on stdout. Only
# objects that survive a full collection are counted (gc.collect() before each count), and
# the collector is off in between, so the only collections are those.
_COUNTS = """
import gc, json, sys
from dynamo.common.utils.synthetic_heap import build_synthetic_heap

def tracked_now():
    gc.collect()
    return len(gc.get_objects())

gc.disable()
sizes = json.loads(sys.argv[1])
counts = [tracked_now()]
heaps = []
for size in sizes:
    heaps.append(build_synthetic_heap(size))
    counts.append(tracked_now())
del heaps
counts.append(tracked_now())
print(json.dumps(counts))
"""


def _counts_around(*sizes: int) -> list[int]:
    """Tracked objects before, after building a heap of each size in turn (all kept alive),
    and after deleting them all, counted in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _COUNTS, json.dumps(sizes)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("target", [10_000, 12_345, 100_000])
def test_it_adds_about_n_tracked_objects_that_survive_a_full_collection(target):
    before, after, released = _counts_around(target)

    assert abs((after - before) - target) <= target // 100, after - before
    assert abs(released - before) <= 10  # and the heap is all reachable from its root


def test_each_unit_adds_the_documented_number_of_tracked_objects():
    _, middle, grown_to, _ = _counts_around(1_000 * TRACKED_PER_UNIT, 2_000 * TRACKED_PER_UNIT)
    grown = grown_to - middle
    # 2000 units plus one root list; allow a few objects of noise from the measurement itself
    assert abs(grown - 2_000 * TRACKED_PER_UNIT) <= 5, grown


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
