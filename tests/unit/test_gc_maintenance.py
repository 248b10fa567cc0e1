"""Serving-time maintenance in the layer: the phase, the window and its guard, the operation and
what it reports, the settling pass, and the phase label of its own collections.

Every test here that collects or freezes leaves the GC state to tests/conftest.py's restore
(the heap unfrozen, thresholds, callbacks and the phase put back).
"""

from __future__ import annotations

import gc
import logging
import threading

import pytest

from dynamo_gc import freeze, lifecycle
from dynamo_gc.freeze import freeze_gc_heap
from dynamo_gc.lifecycle import Phase
from dynamo_gc.maintenance import maintain_gc_heap
from dynamo_gc.metrics import DynamoMetrics
from dynamo_gc.pause_logger import install_gc_pause_logger
from tests.support.cycles import dead_cycle

REFUSED = "GC heap freeze refused ({}): process is serving requests"


def nothing_in_flight() -> int:
    return 0


def refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("GC heap freeze")]


@pytest.fixture
def serving():
    """A process serving, its start-up heap frozen (as the launchers leave it)."""
    freeze_gc_heap(context="start-up")
    lifecycle.mark_serving("test")


@pytest.fixture
def gc_calls(mocker):
    """Every gc.collect / freeze / unfreeze / get_freeze_count made, in order (they still run)."""
    calls: list[str] = []
    for name in ("collect", "freeze", "unfreeze", "get_freeze_count"):
        real = getattr(gc, name)

        def spy(*args, _real=real, _name=name):
            calls.append(_name)
            return _real(*args)

        mocker.patch.object(gc, name, spy)
    return calls


# -- the phase ---------------------------------------------------------------------------------


def test_serving_maintaining_serving_and_listeners_see_each_step():
    seen: list[Phase] = []
    lifecycle.add_phase_listener(seen.append)
    lifecycle.mark_serving("test")
    with lifecycle.maintenance_window("pause", nothing_in_flight) as window:
        assert lifecycle.current_phase() is Phase.MAINTAINING
        assert lifecycle.window_is_current(window)
        assert lifecycle.serving() and not lifecycle.freeze_allowed()
    assert lifecycle.current_phase() is Phase.SERVING
    assert not window.open and not lifecycle.window_is_current(window)
    assert seen == [Phase.SERVING, Phase.MAINTAINING, Phase.SERVING]


def test_draining_is_reachable_from_maintaining_and_closes_the_window():
    lifecycle.mark_serving("test")
    window = lifecycle.open_maintenance_window("pause", nothing_in_flight)
    lifecycle.mark_draining("SIGTERM")
    assert not window.open and not lifecycle.window_is_current(window)
    lifecycle.close_maintenance_window(window)  # too late: nothing changes
    assert lifecycle.current_phase() is Phase.DRAINING


@pytest.mark.parametrize(
    "before,move",
    [
        pytest.param(
            (), lambda: lifecycle.open_maintenance_window("p", nothing_in_flight), id="starting"
        ),
        pytest.param(
            ("draining",),
            lambda: lifecycle.open_maintenance_window("p", nothing_in_flight),
            id="draining",
        ),
        pytest.param(
            ("maintaining",),
            lambda: lifecycle.open_maintenance_window("p", nothing_in_flight),
            id="a-second-window",
        ),
        pytest.param(("maintaining",), lambda: lifecycle.mark_serving("again"), id="mark-serving"),
    ],
)
def test_nothing_else_goes_back_or_opens_a_window(before, move):
    lifecycle.mark_serving("test") if before else None
    if "draining" in before:
        lifecycle.mark_draining("SIGTERM")
    if "maintaining" in before:
        lifecycle.open_maintenance_window("first", nothing_in_flight)
    phase = lifecycle.current_phase()
    with pytest.raises(RuntimeError):
        move()
    assert lifecycle.current_phase() is phase


# -- the guard ---------------------------------------------------------------------------------


def test_only_the_current_open_window_may_collect_and_freeze(serving, gc_calls, caplog):
    stale = lifecycle.open_maintenance_window("first", nothing_in_flight)
    lifecycle.close_maintenance_window(stale)
    count = gc.get_freeze_count()
    gc_calls.clear()
    with lifecycle.maintenance_window("pause", nothing_in_flight) as window:
        # A freeze the old way, a closed window, something that is no window: all refused.
        assert freeze_gc_heap(context="discovery watcher") is None
        assert maintain_gc_heap(stale, context="second maintainer") is None
        assert maintain_gc_heap(object(), context="forged") is None
        assert gc_calls == []
        assert maintain_gc_heap(window, context="maintainer") is not None
    assert refusals(caplog) == [
        REFUSED.format("discovery watcher"),
        REFUSED.format("second maintainer"),
        REFUSED.format("forged"),
    ]
    assert gc.get_freeze_count() >= count


def test_a_freeze_from_another_thread_during_a_maintenance_is_refused(serving, caplog):
    """The discovery watcher's chat engine factory runs in a thread: it never freezes."""
    results: list = []
    with lifecycle.maintenance_window("pause", nothing_in_flight):
        factory = threading.Thread(
            target=lambda: results.append(freeze_gc_heap(context="chat engine factory"))
        )
        factory.start()
        factory.join()
    assert results == [None]
    assert refusals(caplog) == [REFUSED.format("chat engine factory")]


def test_a_request_in_flight_refuses_the_maintenance_and_touches_no_gc_state(
    serving, gc_calls, caplog
):
    in_flight = [1]
    count, last = gc.get_freeze_count(), freeze.last_freeze()
    gc_calls.clear()
    with lifecycle.maintenance_window("pause", lambda: in_flight[0]) as window:
        assert maintain_gc_heap(window, context="vllm worker", reclaim=True) is None
    assert gc_calls == []
    assert gc.get_freeze_count() == count and freeze.last_freeze() is last
    (line,) = caplog.records
    assert line.levelno == logging.WARNING
    assert line.getMessage() == "GC heap freeze refused (vllm worker): 1 request(s) in flight"


# -- the operation -------------------------------------------------------------------------------


def test_a_maintenance_freezes_what_was_made_since_and_settles(serving, gc_calls):
    made_since = [[i] for i in range(5000)]
    young = dead_cycle()
    before = gc.get_freeze_count()
    gc_calls.clear()
    with lifecycle.maintenance_window("pause", nothing_in_flight) as window:
        record = maintain_gc_heap(window, context="frontend")
    assert record is not None and not record.reclaim
    # collect, freeze, then the settling pass; no walk of the permanent generation unasked.
    assert gc_calls == ["collect", "freeze", "collect"]
    assert young() is None and record.collected >= 1 and record.reclaimed == 0
    assert record.frozen is None
    assert gc.get_freeze_count() >= before + len(made_since)
    assert record.took_ms >= record.collect_ms >= 0 and record.reclaim_ms is None


def test_a_reclaim_returns_the_cyclic_garbage_the_freeze_pinned(serving, gc_calls):
    pinned = dead_cycle()  # garbage the start-up freeze could not see: it froze it alive
    holder = [pinned()]
    gc.collect()
    gc.freeze()
    holder.clear()  # now cyclic garbage, but frozen: no collection reaches it
    gc.collect()
    assert pinned() is not None
    young = dead_cycle()
    observed: list = []
    freeze.add_freeze_observer(observed.append)
    gc_calls.clear()
    with lifecycle.maintenance_window("pause", nothing_in_flight) as window:
        record = maintain_gc_heap(window, context="vllm worker", reclaim=True, count_frozen=True)
    assert gc_calls == ["collect", "unfreeze", "collect", "freeze", "collect", "get_freeze_count"]
    assert pinned() is None and young() is None
    assert record is not None and record.reclaim
    assert record.collected >= 1 and record.reclaimed >= 1  # reported apart
    assert record.frozen is not None and 0 < gc.get_freeze_count() <= record.frozen
    assert record.reclaim_ms is not None
    # A counted maintenance is the process's last freeze (the freeze metrics follow it).
    (seen,) = observed
    assert seen.context == "vllm worker" and seen.frozen == record.frozen
    assert freeze.last_freeze() is seen


def test_a_maintenances_own_collections_are_labelled_maintaining_not_serving(serving):
    metrics = DynamoMetrics(freeze_enabled=True, process_collectors=False).attach()
    install_gc_pause_logger(0, on_pause=metrics.observe_pause)
    serving_before = metrics.pauses.count(2, Phase.SERVING)
    with lifecycle.maintenance_window("pause", nothing_in_flight) as window:
        maintain_gc_heap(window, context="frontend", reclaim=True)
    assert metrics.pauses.count(2, Phase.MAINTAINING) == 3  # collect, reclaim, settle
    assert metrics.pauses.count(2, Phase.SERVING) == serving_before
    metrics.detach()


def test_a_maintenances_pauses_log_at_info_not_as_serving_pauses(serving, caplog):
    caplog.set_level(logging.INFO, logger="dynamo_gc.pause_logger")
    install_gc_pause_logger(0.000001)
    with lifecycle.maintenance_window("pause", nothing_in_flight) as window:
        maintain_gc_heap(window, context="frontend")
    pauses = [r for r in caplog.records if r.getMessage().startswith("GC gen")]
    assert pauses and all(r.levelno == logging.INFO for r in pauses)


def test_a_reclaim_whose_collection_raises_leaves_the_heap_frozen(serving, mocker):
    frozen = gc.get_freeze_count()
    real_collect = gc.collect
    calls = []

    def collect(*args):
        calls.append(args)
        if len(calls) == 2:  # the whole-heap collection, after the unfreeze
            raise MemoryError
        return real_collect(*args)

    mocker.patch.object(gc, "collect", collect)
    with lifecycle.maintenance_window("pause", nothing_in_flight) as window:
        with pytest.raises(MemoryError):
            maintain_gc_heap(window, context="vllm worker", reclaim=True)
    assert gc.get_freeze_count() >= frozen
