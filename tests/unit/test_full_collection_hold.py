"""CPython's automatic full collections held off while the maintainer serves, and given back
(dynamo_gc.full_collection_hold), and the trigger's held mode (``look_held``: due when the
unfrozen heap's walk, estimated from CPython's counters, reaches the due level).

Every test that touches the collector puts it back itself (thresholds, enabled flag,
``gc.callbacks``, the permanent generation), besides conftest's restore after each test, so
each passes alone and in any order.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest

from dynamo_gc import full_collection_hold, lifecycle
from dynamo_gc.full_collection_hold import CHANGED_LINE, FullCollectionHold
from dynamo_gc.gc_builds import GEN2_NEVER, threshold2_ignored_reason
from dynamo_gc.maintenance_trigger import MaintenanceTrigger
from tests.support.clock import FakeClock
from tests.support.gc_churn import churn_with_survivors, counted_collections

# Not any interpreter's stock thresholds (700/2000, 10, 10): a restore that hard-codes those,
# or mixes the saved ones up, reads back differently.
THRESHOLDS = (555, 7, 9)
HELD = (THRESHOLDS[0], THRESHOLDS[1], GEN2_NEVER)

# A budget whose due level (half of it) is a binary fraction: 1/32 s. The walk estimates below
# are sums and products of binary fractions too, so "reaches the due level" is checked exactly
# at the boundary, not approximately around it.
BUDGET_MS = 62.5
DUE_AT_S = 1 / 32

needs_threshold2 = pytest.mark.skipif(
    threshold2_ignored_reason() is not None,
    reason=f"this build ignores the third threshold: {threshold2_ignored_reason()}",
)


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """The collector at :data:`THRESHOLDS`, enabled, for the test; put back as it was."""
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(*THRESHOLDS)
    gc.enable()
    try:
        yield THRESHOLDS
    finally:
        gc.set_threshold(*saved)
        (gc.enable if enabled else gc.disable)()


@pytest.fixture
def hold(monkeypatch) -> FullCollectionHold:
    """A hold on a build that can hold (the version check is the build's: patched to "can"
    so the contract is tested on every interpreter; the build-dependent behaviour itself is
    tested where it runs: test_while_held_cpython_runs_no_automatic_full_collection)."""
    monkeypatch.setattr(full_collection_hold, "threshold2_ignored_reason", lambda: None)
    return FullCollectionHold("worker")


def changed_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.msg == CHANGED_LINE]


# -- take and give back -------------------------------------------------------------------------


def test_take_holds_the_third_threshold_and_give_back_restores_them_exactly(thresholds, hold):
    assert not hold.held and hold.threshold() == 9
    assert hold.take() is True
    assert hold.held
    assert gc.get_threshold() == HELD  # the first two as they were: young collections go on
    assert gc.isenabled()
    assert hold.threshold() == 9  # CPython's own, not the held GEN2_NEVER
    hold.give_back()
    assert not hold.held
    assert gc.get_threshold() == THRESHOLDS
    gc.set_threshold(555, 7, 12)
    assert hold.threshold() == 12  # not held: whatever CPython's is now


def test_take_twice_is_one_hold(thresholds, hold):
    assert hold.take() is True
    assert hold.take() is True  # held already: the second saves nothing (not GEN2_NEVER)
    assert gc.get_threshold() == HELD and hold.threshold() == 9
    hold.give_back()
    assert gc.get_threshold() == THRESHOLDS and not hold.held


def test_give_back_twice_or_without_a_take_is_harmless(thresholds, hold, caplog):
    hold.give_back()  # never taken
    assert gc.get_threshold() == THRESHOLDS
    hold.take()
    hold.give_back()
    gc.set_threshold(600, 8, 10)  # somebody's setting after the hold ended
    hold.give_back()
    assert gc.get_threshold() == (600, 8, 10)  # the second give_back touched nothing
    assert changed_lines(caplog) == []
    assert hold.take() is True  # and a new hold saves the thresholds of now
    hold.give_back()
    assert gc.get_threshold() == (600, 8, 10)


@pytest.mark.parametrize("theirs", [(600, 8, 10), (555, 7, 9), (555, 7, 0)])
def test_thresholds_changed_while_held_are_kept_and_said_once(thresholds, hold, caplog, theirs):
    """An operator's code or a library set the thresholds while the hold held them (even back
    to the saved ones): theirs stand, and one WARNING names the context and what they are."""
    caplog.set_level(logging.WARNING, logger="dynamo_gc.full_collection_hold")
    hold.take()
    gc.set_threshold(*theirs)
    hold.give_back()
    assert gc.get_threshold() == theirs and not hold.held
    (line,) = changed_lines(caplog)
    assert line.levelno == logging.WARNING
    message = line.getMessage()
    assert message.startswith("GC maintenance (worker): the GC thresholds were changed to ")
    assert f"changed to {theirs} " in message and f"; keeping {theirs} " in message
    hold.give_back()
    assert len(changed_lines(caplog)) == 1 and gc.get_threshold() == theirs


def test_a_change_that_copied_the_held_third_threshold_gets_the_saved_third_back(
    thresholds, hold, caplog
):
    """A library that sets threshold0 the usual way (``t0, t1, t2 = gc.get_threshold()``,
    then ``gc.set_threshold(new_t0, t1, t2)``) while held copies GEN2_NEVER along: its first
    two are kept, the third is the saved one, else full collections stay off after the hold."""
    hold.take()
    _, t1, t2 = gc.get_threshold()
    gc.set_threshold(1000, t1, t2)
    hold.give_back()
    assert gc.get_threshold() == (1000, 7, 9)
    (line,) = changed_lines(caplog)
    assert line.levelno == logging.WARNING
    assert f"changed to {(1000, 7, GEN2_NEVER)} " in line.getMessage()
    assert "; keeping (1000, 7, 9) " in line.getMessage()


# -- take refused -------------------------------------------------------------------------------


def test_a_build_that_ignores_the_third_threshold_is_never_held(thresholds, monkeypatch):
    reason = "CPython 3.14.2 (incremental GC) ignores the third threshold"
    monkeypatch.setattr(full_collection_hold, "threshold2_ignored_reason", lambda: reason)
    hold = FullCollectionHold("frontend")
    assert hold.unavailable == reason
    assert hold.take() is False
    assert not hold.held and gc.get_threshold() == THRESHOLDS and hold.threshold() == 9
    hold.give_back()
    assert gc.get_threshold() == THRESHOLDS


def test_with_automatic_collection_off_there_is_nothing_to_hold(thresholds, hold):
    gc.disable()
    assert hold.take() is False
    assert not hold.held and gc.get_threshold() == THRESHOLDS and not gc.isenabled()
    hold.give_back()
    assert gc.get_threshold() == THRESHOLDS and not gc.isenabled()


def test_somebody_elses_hold_is_not_taken_nor_given_back(thresholds, hold, caplog):
    """The third threshold already at GEN2_NEVER (the benchmark's GC policy holds it): taking
    it would save GEN2_NEVER, and giving that back would leave full collections off for good."""
    gc.set_threshold(*HELD)
    assert hold.take() is False
    assert not hold.held and gc.get_threshold() == HELD
    assert hold.threshold() == GEN2_NEVER  # CPython's own: nothing saved
    hold.give_back()
    assert gc.get_threshold() == HELD and changed_lines(caplog) == []


# -- what holding does to CPython ---------------------------------------------------------------


@pytest.fixture
def unfrozen_heap_empty() -> Iterator[None]:
    """The test process's heap frozen, so CPython's 25% rule (a full collection waits for the
    objects promoted since the last one to reach a quarter of the long-lived ones) is met by
    the test's own survivors; unfrozen after the test."""
    gc.collect()
    gc.freeze()
    try:
        gc.collect()  # the long-lived total: what is left unfrozen, about nothing
        yield
    finally:
        gc.unfreeze()


@needs_threshold2
def test_while_held_cpython_runs_no_automatic_full_collection(
    thresholds, unfrozen_heap_empty, caplog
):
    """Allocation paced by counts (no clock): enough surviving containers for twice threshold2
    + 1 generation-1 collections. Held, young collections run and no full one; given back,
    CPython runs its full collection at the next opportunity; asked for, one runs while held."""
    t0, t1, t2 = THRESHOLDS
    # A tracked object kept per iteration on average; a generation-1 collection every about
    # (t0 + 1) x (t1 + 1) of them: this many make about 4 x (t2 + 2) of them.
    iterations = 4 * (t0 + 1) * (t1 + 1) * (t2 + 2)
    hold = FullCollectionHold("worker")  # the build's own answer: it can hold here
    assert hold.take() is True
    try:
        with counted_collections() as held:
            kept = churn_with_survivors(iterations)
    finally:
        hold.give_back()
    assert held.counts[2] == 0, held.counts
    assert held.counts[1] > 2 * (t2 + 1), held.counts  # past the third threshold twice over
    assert held.counts[0] > held.counts[1], held.counts
    assert gc.get_threshold() == THRESHOLDS
    with counted_collections() as given_back:
        kept += churn_with_survivors(iterations)
    assert given_back.counts[2] >= 1, given_back.counts
    hold.take()
    try:
        with counted_collections() as asked:
            gc.collect()
    finally:
        hold.give_back()
    assert asked.counts[2] == 1  # a full collection somebody asks for still runs
    del kept
    assert gc.get_threshold() == THRESHOLDS and changed_lines(caplog) == []


# -- the trigger's held mode --------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def trigger(clock) -> MaintenanceTrigger:
    lifecycle.mark_serving("test")
    made = MaintenanceTrigger(BUDGET_MS, clock=clock)
    assert made.due_at_s == DUE_AT_S
    return made


def test_held_due_ahead_exactly_when_the_estimated_walk_reaches_the_due_level(trigger, clock):
    """One cycle (threshold + 1 = 8 generation-1 collections) walks 1/16 s; the last full
    collection walked 1/64 s: the walk reaches 1/32 s after 2 of a cycle's 8."""
    threshold = 7
    trigger.cycle_walk_s = 1 / 16
    trigger.last_full_pause_s = 1 / 64
    for passes in (0, 1):
        trigger.look_held(passes, threshold)
        assert not trigger.due, passes
        assert trigger.predicted_walk_s == 1 / 64 + passes / 128
    clock.advance(5.0)
    trigger.look_held(2, threshold)
    assert trigger.predicted_walk_s == DUE_AT_S
    assert trigger.due and trigger.due_reason == "ahead" and trigger.due_pause_s is None
    assert trigger.due_since == clock() and trigger.due_for_s() == 0.0
    clock.advance(1.0)
    trigger.look_held(3, threshold)  # due already: it stays due since then, the walk moves on
    assert trigger.due_for_s() == 1.0 and trigger.predicted_walk_s == 1 / 64 + 3 / 128
    # A maintenance: nothing left unwalked, the walk grows from zero again.
    trigger.maintained()
    trigger.look_held(0, threshold)
    assert not trigger.due and trigger.predicted_walk_s == 0.0
    trigger.look_held(3, threshold)
    assert not trigger.due
    trigger.look_held(4, threshold)  # half a cycle: 1/32 s
    assert trigger.due and trigger.due_reason == "ahead"


def test_held_passes_may_run_past_the_threshold_without_a_full_collection(trigger):
    """Held, CPython's count of generation-1 collections runs past its threshold (no full
    collection resets it): a cycle under the due level is due only once its growth is."""
    threshold = 7
    trigger.cycle_walk_s = 1 / 128  # a quarter of the level a cycle: four cycles to reach it
    trigger.look_held(8 * 4 - 1, threshold)
    assert not trigger.due
    trigger.look_held(8 * 4, threshold)
    assert trigger.due and trigger.predicted_walk_s == DUE_AT_S


def test_before_any_cycle_is_measured_the_walk_is_bootstrapped_from_the_rate(trigger):
    """No cycle measured yet: one cycle is taken as every allocation it counts surviving
    (threshold0 x threshold1 x (threshold + 1)) at the calibrated walk rate, an upper bound."""
    saved = gc.get_threshold()
    gc.set_threshold(512, 8, GEN2_NEVER)  # as held: the first two are CPython's own
    try:
        threshold = 7
        trigger.calibrate(512 * 8 * 8 * 16, 1.0)  # 16 cycles' allocations a second
        assert trigger.held_walk_s(8, threshold) == 1 / 16  # a whole cycle's
        trigger.look_held(3, threshold)
        assert not trigger.due and trigger.predicted_walk_s == 3 / 128
        trigger.look_held(4, threshold)
        assert trigger.due and trigger.due_reason == "ahead"
        assert trigger.predicted_walk_s == DUE_AT_S
        # Once a cycle is measured, it is used instead.
        trigger.maintained()
        trigger.cycle_walk_s = 1 / 8
        assert trigger.held_walk_s(2, threshold) == DUE_AT_S
    finally:
        gc.set_threshold(*saved)


def test_with_no_estimate_at_all_due_where_cpython_would_have_collected(trigger):
    threshold = 9
    for passes in range(threshold + 1):
        trigger.look_held(passes, threshold)
        assert not trigger.due, passes
        assert trigger.predicted_walk_s is None
    trigger.look_held(threshold + 1, threshold)
    assert trigger.due and trigger.due_reason == "ahead" and trigger.due_pause_s is None


def test_the_held_estimate_feeds_the_unfrozen_estimate_and_look_ahead_clears_it(trigger):
    trigger.cycle_walk_s = 1 / 16
    trigger.look_held(4, 7)  # 1/32 s of walk
    assert trigger.unfrozen_estimate() is None  # no walk rate: no count of objects
    trigger.calibrate(3_200_000, 1.0)
    assert trigger.unfrozen_estimate() == 100_000  # 1/32 s at 3.2M objects a second
    trigger.look_held(6, 7)
    assert trigger.unfrozen_estimate() == 150_000
    # Not held any more (given back): CPython's full collections measure the heap again.
    trigger.look_ahead(6, 7)
    assert trigger.predicted_walk_s is None
    assert trigger.unfrozen_estimate() is None  # no serving full collection seen yet
    trigger.on_collection(2, 1 / 64, {"generation": 2})
    assert trigger.unfrozen_estimate() == 50_000  # the last full pause's, as before the hold
    # A maintenance walked it all: until the next look, the estimate is zero, not the
    # walk predicted before it (the gauge is read between the maintainer's polls).
    trigger.look_held(6, 7)
    trigger.maintained()
    assert trigger.unfrozen_estimate() == 0
