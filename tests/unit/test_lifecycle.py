"""The serving-phase guard: no freeze once the process admits requests."""

from __future__ import annotations

import gc
import logging

import pytest

from dynamo_gc import lifecycle
from dynamo_gc.freeze import freeze_gc_heap, maybe_freeze_gc_heap
from dynamo_gc.lifecycle import Phase

GC_LOGGER = "dynamo_gc.freeze"


@pytest.fixture
def phase_changes():
    """Record every phase change; the listener is removed again after the test."""
    seen: list[Phase] = []
    lifecycle.add_phase_listener(seen.append)
    yield seen
    lifecycle.remove_phase_listener(seen.append)


def _serve_then_drain() -> None:
    lifecycle.mark_serving("listener open")
    lifecycle.mark_draining("SIGTERM")


def _refusals(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("GC heap freeze refused")]


def test_a_process_starts_in_starting_where_freezing_is_allowed():
    assert lifecycle.current_phase() is Phase.STARTING
    assert lifecycle.freeze_allowed()


def test_phase_values_are_the_names_operators_see():
    assert [p.value for p in Phase] == ["starting", "serving", "maintaining", "draining"]


@pytest.mark.parametrize(
    "advance",
    [
        pytest.param(lambda: lifecycle.mark_serving("listener open"), id="serving"),
        pytest.param(lambda: _serve_then_drain(), id="draining"),
        pytest.param(lambda: lifecycle.mark_draining("SIGTERM"), id="draining-directly"),
    ],
)
def test_freeze_is_refused_once_the_process_has_admitted_requests(advance, mocker, caplog):
    keep = [[i] for i in range(500)]  # something a wrongful freeze would move
    advance()
    assert not lifecycle.freeze_allowed()
    collect = mocker.spy(gc, "collect")
    freeze = mocker.spy(gc, "freeze")
    count = gc.get_freeze_count()
    observed: list = []
    freeze.add_freeze_observer(observed.append)
    last = freeze.last_freeze()
    try:
        result = freeze_gc_heap(context="discovery watcher")
    finally:
        freeze.remove_freeze_observer(observed.append)

    assert result is None
    assert collect.call_count == 0
    assert freeze.call_count == 0
    assert gc.get_freeze_count() == count
    assert observed == []
    assert freeze.last_freeze() is last
    (record,) = _refusals(caplog)
    assert record.levelno == logging.WARNING
    assert record.name == GC_LOGGER
    assert record.getMessage() == (
        "GC heap freeze refused (discovery watcher): process is serving requests"
    )
    del keep


def test_maybe_freeze_enabled_is_refused_too_while_serving(mocker, caplog):
    lifecycle.mark_serving("listener open")
    collect = mocker.spy(gc, "collect")

    assert maybe_freeze_gc_heap(True, context="chat engine factory") is None

    assert collect.call_count == 0
    assert len(_refusals(caplog)) == 1


def test_freeze_is_allowed_before_serving_and_refused_after(caplog):
    caplog.set_level(logging.INFO, logger=GC_LOGGER)
    assert freeze_gc_heap(context="start-up") is not None
    lifecycle.mark_serving("listener open")
    assert freeze_gc_heap(context="late") is None
    messages = [r.getMessage() for r in caplog.records if r.name == GC_LOGGER]
    assert messages[0].startswith("GC heap frozen (start-up)")
    assert messages[-1] == "GC heap freeze refused (late): process is serving requests"


def test_the_phase_cannot_go_back(phase_changes):
    lifecycle.mark_serving("listener open")
    lifecycle.mark_draining("SIGTERM")

    with pytest.raises(RuntimeError, match="cannot go from draining to serving"):
        lifecycle.mark_serving("again")

    assert lifecycle.current_phase() is Phase.DRAINING
    assert not lifecycle.freeze_allowed()
    assert phase_changes == [Phase.SERVING, Phase.DRAINING]


def test_marking_the_same_phase_twice_is_one_change(phase_changes):
    lifecycle.mark_serving("listener open")
    lifecycle.mark_serving("listener open again")
    assert lifecycle.current_phase() is Phase.SERVING
    assert phase_changes == [Phase.SERVING]


def test_listeners_hear_each_change_in_order_until_removed():
    first: list[Phase] = []
    second: list[Phase] = []
    lifecycle.add_phase_listener(first.append)
    lifecycle.add_phase_listener(second.append)
    try:
        lifecycle.mark_serving("listener open")
        lifecycle.remove_phase_listener(second.append)
        lifecycle.remove_phase_listener(second.append)  # removing twice is harmless
        lifecycle.mark_draining("SIGTERM")
    finally:
        lifecycle.remove_phase_listener(first.append)
        lifecycle.remove_phase_listener(second.append)

    assert first == [Phase.SERVING, Phase.DRAINING]
    assert second == [Phase.SERVING]


def test_a_failing_listener_neither_blocks_the_change_nor_other_listeners(phase_changes):
    def broken(phase: Phase) -> None:
        raise RuntimeError("metrics gone")

    lifecycle.add_phase_listener(broken)
    try:
        lifecycle.mark_serving("listener open")
    finally:
        lifecycle.remove_phase_listener(broken)

    assert lifecycle.current_phase() is Phase.SERVING
    assert phase_changes == [Phase.SERVING]


def test_phase_changes_are_logged(caplog):
    caplog.set_level(logging.INFO, logger="dynamo_gc.lifecycle")
    lifecycle.mark_serving("HTTP listener open")
    assert any(
        "starting -> serving" in r.getMessage() and "HTTP listener open" in r.getMessage()
        for r in caplog.records
    )


def test_reset_for_new_process_allows_freezing_again():
    lifecycle.mark_serving("listener open")
    lifecycle.reset_for_new_process()
    assert lifecycle.current_phase() is Phase.STARTING
    assert freeze_gc_heap(context="forked child") is not None


def test_restore_phase_state_puts_back_the_phase_and_listeners_silently():
    before = lifecycle.snapshot_phase_state()
    seen: list[Phase] = []
    lifecycle.add_phase_listener(seen.append)
    lifecycle.mark_serving("listener open")
    assert lifecycle.snapshot_phase_state() == lifecycle.PhaseState(
        Phase.SERVING, (*before.listeners, seen.append)
    )

    lifecycle.restore_phase_state(before)

    assert lifecycle.snapshot_phase_state() == before
    assert lifecycle.current_phase() is before.phase
    lifecycle.mark_serving("again")
    assert seen == [Phase.SERVING]  # removed, and the restore itself notified no one
