"""The maintenance's trigger, reclaim policy, admission gate and idle maintainer (the layer's
parts a launcher runs on its event loop), and what start_process_gc sets up with it on or off.

Times come from a fake clock wherever the code takes one; the maintainer's own polls are real
(a few milliseconds here), and every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import sysconfig

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dynamo_gc import full_collection_hold, lifecycle, maintainer
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.configuration.gc_options import GcSettings, MaintenanceSettings
from dynamo_gc.freeze import FreezeRecord, freeze_gc_heap
from dynamo_gc.full_collection_hold import FullCollectionHold
from dynamo_gc.gc_builds import GEN2_NEVER
from dynamo_gc.maintainer import (
    DUE_LINE,
    GIVEN_BACK_LINE,
    HELD_LINE,
    MAINTAINED_LINE,
    NOT_HELD_LINE,
    GcMaintainer,
    IdleQuiescence,
)
from dynamo_gc.maintenance import maintain_gc_heap
from dynamo_gc.maintenance_metrics import MaintenanceMetrics
from dynamo_gc.maintenance_trigger import (
    AHEAD_MARGIN,
    AHEAD_MIN_GROWTH,
    IDLE_RECLAIM_EVERY,
    IDLE_RECLAIM_OVERDUE,
    IDLE_RECLAIM_OVERDUE_BUDGETS,
    IDLE_RECLAIM_QUIET_S,
    WITHDRAW_RECLAIM_SHARE,
    MaintenanceTrigger,
    ReclaimPolicy,
)
from dynamo_gc.metrics import DynamoMetrics
from dynamo_gc.pause_logger import install_gc_pause_logger, installed_gc_pause_logger
from dynamo_gc.process_gc import UNSOUND_BUILD_LINE, start_process_gc
from tests.support import wait_until_async
from tests.support.admission import in_flight
from tests.support.clock import FakeClock

DEADLINE_S = 10.0
BUDGET_MS = 50.0


def run(scenario):
    return asyncio.run(asyncio.wait_for(scenario(), 60.0))


def sample(metrics: DynamoMetrics, name: str, **labels) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch):
    monkeypatch.setattr(maintainer, "POLL_S", 0.002)
    monkeypatch.setattr(maintainer, "DUE_POLL_S", 0.001)


@pytest.fixture
def serving():
    freeze_gc_heap(context="start-up")
    lifecycle.mark_serving("test")


# -- the trigger ---------------------------------------------------------------------------------


def test_a_serving_full_collection_of_half_the_budget_makes_maintenance_due():
    clock = FakeClock()
    trigger = MaintenanceTrigger(BUDGET_MS, clock=clock)
    lifecycle.mark_serving("test")
    trigger.on_collection(0, 1.0, {"generation": 0})  # young collections never count
    trigger.on_collection(1, 1.0, {"generation": 1})
    trigger.on_collection(2, 0.0249, {"generation": 2})
    assert not trigger.due and trigger.last_full_pause_s == 0.0249
    trigger.on_collection(2, 0.025, {"generation": 2})
    assert trigger.due and trigger.due_pause_s == 0.025
    clock.advance(3.0)
    trigger.on_collection(2, 0.040, {"generation": 2})
    assert trigger.due_pause_s == 0.025 and trigger.due_for_s() == 3.0  # the first pause keeps it
    trigger.maintained()
    assert not trigger.due and trigger.due_for_s() == 0.0 and trigger.unfrozen_estimate() is None


@pytest.mark.parametrize("phase", ["starting", "draining", "maintaining"])
def test_full_collections_outside_serving_never_make_it_due(phase):
    trigger = MaintenanceTrigger(BUDGET_MS)
    if phase != "starting":
        lifecycle.mark_serving("test")
    if phase == "draining":
        lifecycle.mark_draining("test")
    if phase == "maintaining":
        lifecycle.open_maintenance_window("test", lambda: 0)
    trigger.on_collection(2, 10.0, {"generation": 2, "candidates": 123})
    assert not trigger.due and trigger.serving_full_collections == 0
    assert trigger.maintaining_candidates == (123 if phase == "maintaining" else None)


@pytest.mark.parametrize(
    ("window", "walked"),
    [
        ([200_000, 0], 200_000),  # collect, settle (an empty heap: 0 examined)
        ([200_000, 3], 200_000),  # collect, settle (three objects made after the freeze)
        ([200_000, 1_200_000, 0], 1_200_000),  # collect, reclaim (the whole heap), settle
    ],
)
def test_a_maintenance_calibrates_from_its_walk_not_the_settling_pass(window, walked):
    """3.15's ``candidates``: the maintainer pairs the window's count with its collect's (or
    reclaim's) time; the settling pass after the freeze must not overwrite it with its own
    (bench_gc_hold.py saw None after every 3.15.2 maintenance before)."""
    trigger = MaintenanceTrigger(BUDGET_MS)
    lifecycle.mark_serving("test")
    with lifecycle.maintenance_window("test", lambda: 0):
        for candidates in window:
            trigger.on_collection(2, 0.001, {"generation": 2, "candidates": candidates})
    assert trigger.maintaining_candidates == walked


@pytest.mark.skipif(sys.version_info < (3, 15), reason="CPython 3.15 added candidates")
def test_a_real_maintenance_reports_the_candidates_of_its_collect():
    trigger = MaintenanceTrigger(BUDGET_MS)
    install_gc_pause_logger(0, on_collection=trigger.on_collection)
    freeze_gc_heap(context="start-up")
    lifecycle.mark_serving("test")
    grown = [[index] for index in range(50_000)]  # tracked, made after the freeze
    with lifecycle.maintenance_window("test", lambda: 0) as window:
        assert maintain_gc_heap(window, context="test") is not None
    assert trigger.maintaining_candidates is not None
    assert trigger.maintaining_candidates >= len(grown)


def test_the_estimate_is_the_last_pause_at_the_calibrated_rate_or_315s_candidates():
    trigger = MaintenanceTrigger(BUDGET_MS)
    lifecycle.mark_serving("test")
    trigger.on_collection(2, 0.010, {"generation": 2})
    assert trigger.unfrozen_estimate() is None  # no rate yet
    # The start-up freeze: 90k collected + frozen in 30 ms of collection: 3M objects a second.
    trigger.calibrate_from_freeze(FreezeRecord("start-up", 10_000, 80_000, 45.0, 30.0))
    assert trigger.objects_per_s == pytest.approx(3e6)
    assert trigger.unfrozen_estimate() == 30_000
    assert trigger.walk_estimate_s(300_000) == pytest.approx(0.1)
    trigger.on_collection(2, 0.010, {"generation": 2, "candidates": 41_000})  # CPython 3.15+
    assert trigger.unfrozen_estimate() == 41_000
    trigger.calibrate(None, 1.0)  # nothing known: the rate stays
    assert trigger.objects_per_s == pytest.approx(3e6)


def test_reclaiming_policy():
    clock = FakeClock()
    withdraw = ReclaimPolicy(withdraw=True, budget_s=0.05, clock=clock)
    assert withdraw.decide(None, 0.0) and withdraw.decide(100.0, 0.0)  # never reclaimed yet
    withdraw.done(True)
    # Then by its share of time: a 2 s whole walk once every 2 / WITHDRAW_RECLAIM_SHARE s.
    assert withdraw.decide(None, 0.0)  # no estimate of the walk: reclaim
    clock.advance(2.0 / WITHDRAW_RECLAIM_SHARE - 0.1)
    assert not withdraw.decide(2.0, 0.0)
    clock.advance(0.1)
    assert withdraw.decide(2.0, 0.0)
    withdraw.done(False)
    assert withdraw.decide(2.0, 0.0)  # a maintenance that did not reclaim changes nothing
    idle = ReclaimPolicy(withdraw=False, budget_s=0.05, clock=clock)
    assert idle.decide(0.04, 0.0)  # the whole walk fits the budget
    assert not idle.decide(0.5, 100.0) and not idle.decide(None, 100.0)
    for _ in range(IDLE_RECLAIM_EVERY - 1):
        idle.done(False)
    assert not idle.decide(0.5, IDLE_RECLAIM_QUIET_S / 2)  # due by schedule, not quiet enough
    assert idle.decide(0.5, IDLE_RECLAIM_QUIET_S)
    idle.done(True)
    assert idle.since_reclaim == 0
    # Continuous load: never an idle second. Overdue, it reclaims at an ordinary idle moment
    # when the whole walk is within the bound of budgets; a heap past it stays pinned.
    for _ in range(IDLE_RECLAIM_OVERDUE - 1):
        assert not idle.overdue()
        idle.done(False)
    assert idle.overdue() and not withdraw.overdue()
    assert idle.decide(IDLE_RECLAIM_OVERDUE_BUDGETS * 0.05, 0.0)
    assert not idle.decide(IDLE_RECLAIM_OVERDUE_BUDGETS * 0.05 + 0.01, 0.0)
    assert not idle.decide(None, 0.0)


def test_maintenance_is_due_ahead_of_a_full_collection_predicted_at_the_due_level():
    """Each full collection walks everything grown since the last maintenance: one cycle's
    growth more than the last. The trigger learns one cycle's walk and, when the next full
    collection would reach the due level, marks maintenance due before CPython's count lets
    that one run."""
    clock = FakeClock()
    trigger = MaintenanceTrigger(BUDGET_MS, clock=clock)  # due at 25 ms
    lifecycle.mark_serving("test")
    threshold = 10
    near = threshold + 1 - AHEAD_MARGIN  # the first count within the margin
    trigger.look_ahead(threshold, threshold)
    assert not trigger.due and trigger.next_full_s() is None  # nothing measured yet
    trigger.on_collection(2, 0.010, {"generation": 2})  # the first cycle walks 10 ms
    assert trigger.cycle_walk_s == pytest.approx(0.010)
    trigger.look_ahead(threshold, threshold)
    assert not trigger.due  # the next is predicted at 20 ms, under the 25 ms level
    trigger.on_collection(2, 0.020, {"generation": 2})  # two cycles: 10 ms each
    assert trigger.next_full_s() == pytest.approx(0.030)
    for passes in range(near):
        trigger.look_ahead(passes, threshold)
        assert not trigger.due, passes
    clock.advance(1.0)
    trigger.look_ahead(near, threshold)
    assert trigger.due and trigger.due_reason == "ahead" and trigger.due_for_s() == 0.0
    assert trigger.due_pause_s is None
    # The maintenance walked two cycles and most of a third in 28 ms: 10 ms a cycle again.
    trigger.maintained(0.028, 2 + near / (threshold + 1))
    assert not trigger.due and trigger.full_since_maintained == 0
    assert trigger.next_full_s() == pytest.approx(0.010, rel=0.05)  # from zero again
    # A workload whose one cycle walks past the level is maintained ahead of every cycle.
    trigger.on_collection(2, 0.040, {"generation": 2})
    assert trigger.due and trigger.due_reason == "pause"
    trigger.maintained(0.004, 0.1)  # right after it: 4 ms for a tenth of a cycle
    assert trigger.cycle_walk_s >= trigger.due_at_s
    trigger.look_ahead(near, threshold)
    assert trigger.due and trigger.due_reason == "ahead"


def test_the_lead_grows_with_the_time_quiescence_took_to_reach():
    """A withdrawal that waits for a peer's maintenance takes longer than young collections
    take to come: the trigger marks it due that much earlier, at the pace CPython's count rose."""
    clock = FakeClock()
    trigger = MaintenanceTrigger(BUDGET_MS, clock=clock)
    lifecycle.mark_serving("test")
    trigger.cycle_walk_s = 1.0  # every full collection would be over the level
    for passes in range(4):  # a generation-1 collection every 0.1 s
        trigger.look_ahead(passes, 10)
        clock.advance(0.1)
    assert trigger.pass_interval_s == pytest.approx(0.1) and not trigger.due
    trigger.reached(0.3)  # 0.3 s to a quiescent moment: a lead of 2 x 3 = 6 collections
    for passes in range(4, 7):  # a cycle of 12 + 1: 9 to 7 to go
        trigger.look_ahead(passes, 12)
        assert not trigger.due, passes
        clock.advance(0.1)
    trigger.look_ahead(7, 12)  # 6 to go, within the lead (the margin alone: 4)
    assert trigger.due and trigger.due_reason == "ahead"


def test_right_after_a_maintenance_nothing_is_due_ahead_until_half_a_cycle_grew():
    """The soak's storm: reaching quiescence took so long against the young collections' pace
    that the lead was longer than a whole cycle, and a maintenance was due again the moment one
    ended. An ``ahead`` maintenance now waits for half a cycle of growth since the last one,
    however long the lead; a pause at the due level still makes it due at once."""
    clock = FakeClock()
    trigger = MaintenanceTrigger(BUDGET_MS, clock=clock)
    lifecycle.mark_serving("test")
    threshold = 10
    trigger.cycle_walk_s = 1.0  # every full collection would be over the level
    for passes in range(4):  # a generation-1 collection every 0.1 s
        trigger.look_ahead(passes, threshold)
        clock.advance(0.1)
    trigger.reached(5.0)  # 5 s to reach quiescence: a lead of 100 collections, > a cycle
    trigger.maintained(0.010, 1.0)
    assert trigger.cycle_walk_s >= trigger.due_at_s
    for passes in range(6):  # under half of the cycle's 11 since the maintenance
        trigger.look_ahead(passes, threshold)
        assert not trigger.due, passes
        clock.advance(0.1)
    assert trigger.cycles_since_maintained(5, threshold) < AHEAD_MIN_GROWTH
    trigger.look_ahead(6, threshold)  # half a cycle grown: the lead applies again
    assert trigger.due and trigger.due_reason == "ahead"
    trigger.maintained(0.010, 6 / (threshold + 1))
    trigger.look_ahead(0, threshold)
    assert not trigger.due
    trigger.on_collection(2, 0.030, {"generation": 2})  # a pause at the due level: at once
    assert trigger.due and trigger.due_reason == "pause"
    # A serving full collection since the maintenance is a whole cycle grown.
    trigger.maintained(0.010, 1.0)
    trigger.on_collection(2, 0.001, {"generation": 2})
    trigger.look_ahead(0, threshold)
    assert trigger.due and trigger.due_reason == "ahead"


# -- the admission gate ------------------------------------------------------------------------


def test_the_gate_counts_holds_and_measures_each_wait():
    async def scenario():
        clock = FakeClock()
        gate = AdmissionGate(clock=clock)
        release = asyncio.Event()
        entered: list[str] = []

        async def request(name: str) -> None:
            async with gate.admitted():
                entered.append(name)
                await release.wait()

        first = asyncio.ensure_future(request("first"))
        await wait_until_async(lambda: gate.in_flight == 1, deadline_s=DEADLINE_S)
        assert gate.idle_for_s() == 0.0
        gate.hold()
        held = [asyncio.ensure_future(request(f"held-{i}")) for i in range(2)]
        await wait_until_async(lambda: gate.waiting == 2, deadline_s=DEADLINE_S)
        assert entered == ["first"] and gate.in_flight == 1
        release.set()
        assert await gate.until_idle(1.0)
        clock.advance(0.25)
        assert gate.release() == [0.25, 0.25]  # each one's wait: a pause it saw
        await asyncio.gather(first, *held)
        assert sorted(entered) == ["first", "held-0", "held-1"] and gate.in_flight == 0
        clock.advance(2.0)
        assert gate.idle_for_s() == 2.0

    run(scenario)


def test_until_idle_times_out_and_a_cancelled_wait_is_not_counted():
    async def scenario():
        gate = AdmissionGate()
        async with in_flight(gate) as requests:
            await requests.admitted()
            assert not await gate.until_idle(0.01)
            gate.hold()
            gone = requests.arrive()
            await wait_until_async(lambda: gate.waiting == 1, deadline_s=DEADLINE_S)
            gone.cancel()  # the client hung up while waiting
            await asyncio.gather(gone, return_exceptions=True)
            assert gate.waiting == 0 and gate.release() == [] and gate.in_flight == 1
        assert gate.in_flight == 0

    run(scenario)


# -- the idle maintainer ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def idle_maintainer(clock, *, hold_bound_s=1.0, pause_log_ms=0.0, hold=None):
    metrics = DynamoMetrics(freeze_enabled=True, process_collectors=False)
    trigger = MaintenanceTrigger(BUDGET_MS, clock=clock)
    gate = AdmissionGate(clock=clock)
    quiescence = IdleQuiescence(gate, hold_bound_s=hold_bound_s, clock=clock)
    task = GcMaintainer(
        trigger,
        quiescence,
        context="frontend",
        pause_log_ms=pause_log_ms,
        metrics=MaintenanceMetrics(metrics.registry, trigger),
        hold=hold,
        clock=clock,
    )
    task.start()
    try:
        yield task, gate, metrics
    finally:
        await task.stop()


def make_due(trigger: MaintenanceTrigger) -> None:
    trigger.on_collection(2, trigger.due_at_s, {"generation": 2})
    assert trigger.due


def break_reach(task: GcMaintainer, monkeypatch) -> list[str]:
    """Make the maintainer's quiescence fail at every attempt (a store that broke); the reasons
    it was asked with."""
    calls: list[str] = []

    async def broken(reason, due_for_s):
        calls.append(reason)
        raise OSError("a store that broke")

    monkeypatch.setattr(task.quiescence, "reach", broken)
    return calls


@contextlib.asynccontextmanager
async def due_under_load(clock, **options):
    """An idle maintainer (``options`` as :func:`idle_maintainer`'s) whose maintenance has been
    due for ``LOAD_DEFER_S`` while one request stays in flight: it never saw an idle moment."""
    async with (
        idle_maintainer(clock, **options) as (task, gate, metrics),
        in_flight(gate) as requests,
    ):
        await requests.admitted()
        make_due(task.trigger)
        clock.advance(maintainer.LOAD_DEFER_S)
        yield task, gate, metrics, requests


def test_an_idle_moment_is_held_maintained_and_reported(serving, caplog):
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock) as (task, gate, metrics):
            clock.advance(1.0)  # nothing in flight for a second
            make_due(task.trigger)
            await wait_until_async(lambda: task.maintenances == 1, deadline_s=DEADLINE_S)
            assert not gate.held and not task.trigger.due
            assert lifecycle.current_phase() is lifecycle.Phase.SERVING
            labels = {"mode": "idle", "reason": "pause"}
            assert sample(metrics, "dynamo_gc_maintenance_total", **labels) == 1
            assert sample(metrics, "dynamo_gc_maintenance_seconds_count", mode="idle") == 1
            count = "dynamo_gc_maintenance_withdrawn_seconds_count"
            assert sample(metrics, count, mode="idle") == 1
            assert sample(metrics, "dynamo_gc_maintenance_due") == 0

    run(scenario)
    (line,) = [r for r in caplog.records if r.msg == MAINTAINED_LINE]
    assert line.getMessage().startswith("GC heap maintained (frontend): mode=idle reason=pause ")
    assert " frozen=~" in line.getMessage() and " held_ms=" in line.getMessage()


def test_under_load_admission_is_held_while_in_flight_requests_finish(serving, caplog):
    async def scenario():
        clock = FakeClock()
        # due for long, never idle
        async with due_under_load(clock, pause_log_ms=0.001) as (task, gate, metrics, requests):
            await wait_until_async(lambda: gate.held, deadline_s=DEADLINE_S)
            requests.arrive()  # arrives while held: waits
            await wait_until_async(lambda: gate.waiting == 1, deadline_s=DEADLINE_S)
            assert task.maintenances == 0  # never with a request in flight
            clock.advance(0.02)
            requests.finish()
            await wait_until_async(lambda: task.maintenances == 1, deadline_s=DEADLINE_S)
            assert sample(metrics, "dynamo_gc_maintenance_wait_seconds_count") == 1
            assert sample(metrics, "dynamo_gc_maintenance_wait_seconds_sum") == pytest.approx(0.02)

    run(scenario)
    waits = [r for r in caplog.records if r.msg == maintainer.WAIT_LINE]
    assert [r.levelno for r in waits] == [logging.WARNING]
    assert "held 1 request(s) at admission for up to 20.0 ms" in waits[0].getMessage()


def test_the_maintainer_maintains_ahead_of_cpythons_next_full_collection(serving, monkeypatch):
    """The maintainer reads CPython's count of generation-1 collections since the last full one
    (a counter, no walk) and, with the next full collection predicted past the due level,
    maintains before that one may run: no serving full collection comes first."""
    count = [0, 0, 0]
    reads = []

    def get_count() -> tuple[int, ...]:
        reads.append(tuple(count))
        return tuple(count)

    monkeypatch.setattr(maintainer.gc, "get_count", get_count)
    monkeypatch.setattr(maintainer.gc, "get_threshold", lambda: (700, 10, 10))

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock) as (task, gate, metrics):
            clock.advance(1.0)
            task.trigger.cycle_walk_s = 1.0  # one cycle's growth walks past the due level
            count[2] = 10 - AHEAD_MARGIN  # not yet within the margin
            read = len(reads)
            await wait_until_async(lambda: len(reads) >= read + 3, deadline_s=DEADLINE_S)
            assert not task.trigger.due and task.maintenances == 0
            count[2] += 1
            await wait_until_async(lambda: task.maintenances >= 1, deadline_s=DEADLINE_S)
            count[2] = 0  # what the maintenance's own collections do to CPython's count
            labels = {"mode": "idle", "reason": "ahead"}
            assert sample(metrics, "dynamo_gc_maintenance_total", **labels) >= 1
            assert task.trigger.serving_full_collections == 0

    run(scenario)


def test_requests_that_do_not_finish_in_the_bound_reopen_admission_untouched(
    serving, mocker, caplog
):
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")
    collect = mocker.spy(gc, "collect")

    async def scenario():
        clock = FakeClock()
        async with due_under_load(clock, hold_bound_s=0.01) as (task, gate, metrics, requests):
            gave_up = "dynamo_gc_maintenance_gave_up_total"
            await wait_until_async(
                lambda: sample(metrics, gave_up, mode="idle") == 1, deadline_s=DEADLINE_S
            )
            assert not gate.held and task.maintenances == 0 and task.trigger.due

    run(scenario)
    assert collect.call_count == 0
    (line,) = [r for r in caplog.records if r.msg == maintainer.GAVE_UP_LINE]
    assert "1 request(s) still in flight" in line.getMessage()


def test_stopping_the_maintainer_while_it_holds_admission_reopens_it(serving):
    async def scenario():
        clock = FakeClock()
        async with due_under_load(clock, hold_bound_s=30.0) as (task, gate, _, requests):
            await wait_until_async(lambda: gate.held, deadline_s=DEADLINE_S)
            await task.stop()  # the drain begins
            assert not gate.held

    run(scenario)


def test_an_overdue_reclaim_runs_in_a_long_idle_moment(serving, caplog):
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock) as (task, gate, metrics):
            task.reclaim.since_reclaim = IDLE_RECLAIM_EVERY
            clock.advance(IDLE_RECLAIM_QUIET_S)
            await wait_until_async(lambda: task.maintenances == 1, deadline_s=DEADLINE_S)
            assert task.last is not None and task.last.reclaim
            assert sample(metrics, "dynamo_gc_maintenance_total", mode="idle", reason="reclaim")

    run(scenario)
    (line,) = [r for r in caplog.records if r.msg == MAINTAINED_LINE]
    assert "mode=idle reason=reclaim " in line.getMessage()


def test_a_heap_too_large_to_reclaim_under_load_is_said_once(serving, caplog):
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock) as (task, gate, metrics):
            task.reclaim.since_reclaim = IDLE_RECLAIM_OVERDUE
            task.trigger.calibrate(1_000, 1.0)  # 1,000 objects a second: any walk is too long
            task.frozen_estimate = 10_000
            clock.advance(IDLE_RECLAIM_QUIET_S / 2)  # an ordinary idle moment, not a long one
            for done in (1, 2):
                make_due(task.trigger)
                await wait_until_async(
                    lambda done=done: task.maintenances == done, deadline_s=DEADLINE_S
                )
                assert task.last is not None and not task.last.reclaim

    run(scenario)
    said = [r for r in caplog.records if r.msg == maintainer.PINNED_LINE]
    assert [r.levelno for r in said] == [logging.WARNING]
    assert "Use withdraw" in said[0].getMessage()


# -- on or off at start-up ------------------------------------------------------------------------


def families(metrics: DynamoMetrics) -> set[str]:
    return {f.name for f in text_string_to_metric_families(metrics.render().decode())}


def test_off_sets_up_nothing_of_the_maintenance():
    process = start_process_gc(GcSettings(True, 0.0), MaintenanceSettings("off", BUDGET_MS))
    assert process.maintenance is None
    pause_logger = installed_gc_pause_logger()
    assert pause_logger is not None and pause_logger._on_collection is None
    assert not {n for n in families(process.metrics) if "maintenance" in n or "unfrozen" in n}
    process.state.restore()


def test_on_feeds_the_trigger_and_registers_the_maintenance_metrics():
    process = start_process_gc(GcSettings(True, 0.0), MaintenanceSettings("idle", BUDGET_MS))
    assert process.maintenance is not None
    pause_logger = installed_gc_pause_logger()
    assert pause_logger is not None
    assert pause_logger._on_collection == process.maintenance.trigger.on_collection
    assert {
        "dynamo_gc_maintenance",
        "dynamo_gc_maintenance_seconds",
        "dynamo_gc_maintenance_withdrawn_seconds",
        "dynamo_gc_maintenance_wait_seconds",
        "dynamo_gc_maintenance_reclaimed_objects",
        "dynamo_gc_maintenance_gave_up",
        "dynamo_gc_maintenance_due",
        "dynamo_gc_unfrozen_objects_estimate",
    } <= families(process.metrics)
    process.state.restore()


def test_an_incremental_collector_gets_a_warning_when_maintenance_is_on(mocker, caplog):
    """CPython 3.14.0-3.14.4 (incremental GC) and free-threaded builds: not the collector the
    trigger reads (docs/pythons.md); checked with the version patched, as no such build runs
    here."""
    mocker.patch.object(sysconfig, "get_config_var", return_value=None)
    mocker.patch.object(sys, "version_info", (3, 14, 2, "final", 0))
    process = start_process_gc(GcSettings(True, 0.0), MaintenanceSettings("idle", BUDGET_MS))
    process.state.restore()
    (line,) = [r for r in caplog.records if r.msg == UNSOUND_BUILD_LINE]
    assert line.levelno == logging.WARNING and "3.14.2 (incremental GC)" in line.getMessage()
    caplog.clear()
    start_process_gc(GcSettings(True, 0.0), MaintenanceSettings("off", BUDGET_MS)).state.restore()
    assert not [r for r in caplog.records if r.msg == UNSOUND_BUILD_LINE]


def test_a_failing_step_is_logged_once_and_the_maintainer_goes_on(serving, monkeypatch, caplog):
    monkeypatch.setattr(maintainer, "RETRY_MAX_S", 0.001)

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock) as (task, _gate, _metrics):
            calls = break_reach(task, monkeypatch)
            make_due(task.trigger)
            await wait_until_async(lambda: len(calls) >= 3, deadline_s=DEADLINE_S)
            assert task._task is not None and not task._task.done()

    run(scenario)
    failures = [r for r in caplog.records if "GC maintainer (frontend) failed" in r.getMessage()]
    assert len(failures) == 1


# -- the hold on CPython's automatic full collections ---------------------------------------------

# Thresholds set by the tests below (not any interpreter's stock ones, so a restore that
# hard-codes those reads back differently). Threshold0 is so large that no young collection
# runs during a test: CPython's count of generation-1 collections stays where the last full
# collection left it (0 after the ``serving`` fixture's freeze), so the held trigger's walk
# estimate stays at zero and only the test makes a maintenance due.
HOLDABLE = (55_555, 7, 9)
HELD = (55_555, 7, GEN2_NEVER)
HELD_METRIC = "dynamo_gc_full_collections_held"


@pytest.fixture
def holdable():
    """The collector at :data:`HOLDABLE`, enabled, for the test; put back as it was."""
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(*HOLDABLE)
    gc.enable()
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        (gc.enable if enabled else gc.disable)()


@pytest.fixture
def hold(monkeypatch) -> FullCollectionHold:
    """A hold on a build that can hold (patched so, on every interpreter: what the maintainer
    does with it does not depend on the build)."""
    monkeypatch.setattr(full_collection_hold, "threshold2_ignored_reason", lambda: None)
    return FullCollectionHold("frontend")


def lines(caplog, msg: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.msg == msg]


@pytest.mark.parametrize("phase", ["starting", "draining"])
def test_the_hold_is_taken_only_while_serving(phase, holdable, hold, mocker, caplog):
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")
    gc.collect()  # CPython's count of generation-1 collections from 0: nothing due by itself
    if phase == "draining":
        lifecycle.mark_serving("test")
        lifecycle.mark_draining("test")

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock, hold=hold) as (task, gate, metrics):
            looks = mocker.spy(task, "_reason")
            await wait_until_async(lambda: looks.call_count >= 3, deadline_s=DEADLINE_S)
            assert not hold.held and gc.get_threshold() == HOLDABLE
            assert sample(metrics, HELD_METRIC) == 0
            if phase == "draining":
                return
            lifecycle.mark_serving("test")
            await wait_until_async(lambda: hold.held, deadline_s=DEADLINE_S)
            assert gc.get_threshold() == HELD and sample(metrics, HELD_METRIC) == 1
            seen = looks.call_count
            await wait_until_async(lambda: looks.call_count >= seen + 3, deadline_s=DEADLINE_S)
            assert hold.held and gc.get_threshold() == HELD

    run(scenario)
    assert gc.get_threshold() == HOLDABLE and not hold.held
    said = lines(caplog, HELD_LINE)
    if phase == "draining":
        assert said == []
        return
    assert [r.levelno for r in said] == [logging.INFO]  # once, however many polls held it
    message = said[0].getMessage()
    assert message.startswith("GC maintenance (frontend): CPython's automatic full collections")
    assert f"(thresholds {HOLDABLE} -> {HELD})" in message
    assert lines(caplog, NOT_HELD_LINE) == []


def test_while_held_the_trigger_is_told_cpythons_own_threshold(serving, holdable, hold, mocker):
    assert maintainer._young_passes(None) == (gc.get_count()[2], 9)
    assert maintainer._young_passes(hold) == (gc.get_count()[2], 9)
    assert hold.take()
    assert gc.get_threshold()[2] == GEN2_NEVER
    assert maintainer._young_passes(hold) == (gc.get_count()[2], 9)  # the saved one
    hold.give_back()

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock, hold=hold) as (task, gate, metrics):
            held = mocker.spy(task.trigger, "look_held")
            ahead = mocker.spy(task.trigger, "look_ahead")
            await wait_until_async(lambda: held.call_count >= 3, deadline_s=DEADLINE_S)
            assert {call.args[1] for call in held.call_args_list} == {9}
            assert ahead.call_count == 0  # held: the held mode only
            assert task.maintenances == 0 and not task.trigger.due

    run(scenario)


def test_stop_gives_the_hold_back_exactly(serving, holdable, hold, caplog):
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock, hold=hold) as (task, gate, metrics):
            await wait_until_async(lambda: hold.held, deadline_s=DEADLINE_S)
            assert gc.get_threshold() == HELD and sample(metrics, HELD_METRIC) == 1
            lifecycle.mark_draining("test")
            await task.stop()  # first at the drain
            assert gc.get_threshold() == HOLDABLE and not hold.held
            assert sample(metrics, HELD_METRIC) == 0

    run(scenario)
    assert lines(caplog, GIVEN_BACK_LINE) == []  # for good, not "until the next maintenance"


def test_cancel_gives_the_hold_back_at_once(serving, holdable, hold):
    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock, hold=hold) as (task, gate, metrics):
            await wait_until_async(lambda: hold.held, deadline_s=DEADLINE_S)
            running = task._task
            assert running is not None
            task.cancel()  # the event loop is ending: the task's own finally may never run
            assert gc.get_threshold() == HOLDABLE and not hold.held
            assert sample(metrics, HELD_METRIC) == 0
            await asyncio.gather(running, return_exceptions=True)
            assert running.cancelled() and gc.get_threshold() == HOLDABLE

    run(scenario)


def test_a_failing_step_gives_the_hold_back_until_the_next_maintenance(
    serving, holdable, hold, monkeypatch, mocker, caplog
):
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")
    monkeypatch.setattr(maintainer, "RETRY_MAX_S", 0.001)

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock, hold=hold) as (task, gate, metrics):
            await wait_until_async(lambda: hold.held, deadline_s=DEADLINE_S)
            working = task.quiescence.reach
            calls = break_reach(task, monkeypatch)
            make_due(task.trigger)
            await wait_until_async(lambda: len(calls) >= 3, deadline_s=DEADLINE_S)
            # Nobody runs the held-off full collections while the maintainer fails: CPython
            # does, and the hold is not taken again while it keeps failing.
            assert not hold.held and gc.get_threshold() == HOLDABLE
            assert sample(metrics, HELD_METRIC) == 0
            monkeypatch.setattr(task.quiescence, "reach", working)
            taken = mocker.spy(hold, "take")
            clock.advance(1.0)  # an idle moment
            await wait_until_async(lambda: task.maintenances == 1, deadline_s=DEADLINE_S)
            await wait_until_async(lambda: hold.held, deadline_s=DEADLINE_S)
            assert taken.call_count == 1  # taken again after the maintenance, not before
            assert gc.get_threshold() == HELD and sample(metrics, HELD_METRIC) == 1

    run(scenario)
    (given_back,) = lines(caplog, GIVEN_BACK_LINE)  # once, however many steps failed
    assert given_back.levelno == logging.WARNING
    assert given_back.getMessage() == (
        "GC maintenance (frontend): CPython's automatic full collections run again (the "
        "maintainer failed) until the next maintenance"
    )
    assert len(lines(caplog, HELD_LINE)) == 1  # said for the first hold only


def test_overdue_gives_the_hold_back_until_the_next_maintenance(
    serving, holdable, hold, mocker, caplog
):
    """Due for DUE_WARNING_S without a quiescent moment (a request always in flight): the
    heap has grown unwalked long enough, CPython collects it again until a maintenance runs."""
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")

    async def scenario():
        clock = FakeClock()
        async with (
            idle_maintainer(clock, hold_bound_s=0.01, hold=hold) as (task, gate, metrics),
            in_flight(gate) as requests,
        ):
            await requests.admitted()
            await wait_until_async(lambda: hold.held, deadline_s=DEADLINE_S)
            held = mocker.spy(task.trigger, "look_held")
            ahead = mocker.spy(task.trigger, "look_ahead")
            make_due(task.trigger)
            clock.advance(maintainer.DUE_WARNING_S - 0.5)
            seen = held.call_count
            await wait_until_async(lambda: held.call_count >= seen + 3, deadline_s=DEADLINE_S)
            assert hold.held and ahead.call_count == 0  # due for 59.5 s: still held
            clock.advance(0.5)
            await wait_until_async(lambda: not hold.held, deadline_s=DEADLINE_S)
            assert gc.get_threshold() == HOLDABLE and sample(metrics, HELD_METRIC) == 0
            # Given back until the next maintenance: polls go on, not held, the stock mode.
            await wait_until_async(lambda: ahead.call_count >= 3, deadline_s=DEADLINE_S)
            assert not hold.held and task.maintenances == 0
            requests.finish()
            await wait_until_async(lambda: gate.in_flight == 0, deadline_s=DEADLINE_S)
            clock.advance(1.0)  # an idle moment at last
            await wait_until_async(lambda: task.maintenances == 1, deadline_s=DEADLINE_S)
            await wait_until_async(lambda: hold.held, deadline_s=DEADLINE_S)
            assert gc.get_threshold() == HELD and sample(metrics, HELD_METRIC) == 1

    run(scenario)
    assert gc.get_threshold() == HOLDABLE
    assert len(lines(caplog, DUE_LINE)) == 1
    (given_back,) = lines(caplog, GIVEN_BACK_LINE)
    assert given_back.levelno == logging.WARNING
    assert "run again (no maintenance for 60 s) until the next maintenance" in (
        given_back.getMessage()
    )


def test_where_the_build_cannot_hold_the_maintainer_says_so_once(
    serving, holdable, monkeypatch, mocker, caplog
):
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")
    reason = "CPython 3.14.2 (incremental GC) ignores the third threshold"
    monkeypatch.setattr(full_collection_hold, "threshold2_ignored_reason", lambda: reason)

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock, hold=FullCollectionHold("frontend")) as (
            task,
            gate,
            metrics,
        ):
            held = mocker.spy(task.trigger, "look_held")
            ahead = mocker.spy(task.trigger, "look_ahead")
            await wait_until_async(lambda: ahead.call_count >= 3, deadline_s=DEADLINE_S)
            assert held.call_count == 0 and gc.get_threshold() == HOLDABLE
            assert sample(metrics, HELD_METRIC) == 0
            assert {call.args[1] for call in ahead.call_args_list} == {9}

    run(scenario)
    (said,) = lines(caplog, NOT_HELD_LINE)
    assert said.levelno == logging.INFO and reason in said.getMessage()
    assert lines(caplog, HELD_LINE) == []


def test_the_process_maintainer_holds_full_collections_in_its_context():
    process = start_process_gc(GcSettings(True, 0.0), MaintenanceSettings("idle", BUDGET_MS))
    try:
        parts = process.maintenance
        assert parts is not None
        task = parts.maintainer(
            parts.idle_quiescence(AdmissionGate()), context="worker", pause_log_ms=0.0
        )
        assert isinstance(task.hold, FullCollectionHold) and task.hold.context == "worker"
        assert not task.hold.held
        assert HELD_METRIC in families(process.metrics)
    finally:
        process.state.restore()


def test_a_hold_refused_at_first_and_taken_later_says_both(serving, holdable, hold, caplog):
    """Somebody else held the third threshold when serving began (a refused take: one
    NOT_HELD line); once they gave it back, the maintainer's own take succeeds and says so."""
    caplog.set_level(logging.INFO, logger="dynamo_gc.maintainer")
    gc.set_threshold(HOLDABLE[0], HOLDABLE[1], GEN2_NEVER)  # another holder's

    async def scenario():
        clock = FakeClock()
        async with idle_maintainer(clock, hold=hold) as (task, gate, metrics):
            await wait_until_async(
                lambda: lines(caplog, NOT_HELD_LINE) != [], deadline_s=DEADLINE_S
            )
            assert not hold.held
            gc.set_threshold(*HOLDABLE)  # the other holder gives it back
            await wait_until_async(lambda: hold.held, deadline_s=DEADLINE_S)
            assert gc.get_threshold() == HELD

    run(scenario)
    assert len(lines(caplog, NOT_HELD_LINE)) == 1 and len(lines(caplog, HELD_LINE)) == 1
    assert gc.get_threshold() == HOLDABLE
