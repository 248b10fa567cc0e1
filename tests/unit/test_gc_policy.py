"""The benchmark-scoped GC policy in this process: start/stop, gen2 off, deferred garbage, thread"""

from __future__ import annotations

import gc
import logging
import sys
import sysconfig
import threading

import pytest

from dynamo_gc import bench_policy, bench_policy_config
from tests.support import wait_until
from tests.support.cycles import dead_cycle
from tests.support.gc_churn import churn_length, collections_during_churn


def policy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == bench_policy.FREEZE_THREAD_NAME]


def test_start_and_stop_are_idempotent_and_restartable():
    assert bench_policy.start_policy() is True
    assert bench_policy.start_policy() is False
    assert bench_policy.policy_running()
    assert bench_policy.stop_policy() is True
    assert bench_policy.stop_policy() is False
    assert not bench_policy.policy_running()
    assert bench_policy.start_policy() is True
    assert bench_policy.policy_running()
    assert bench_policy.stop_policy() is True


@pytest.mark.parametrize("thresholds", [(123, 4, 5), (2000, 10, 10), (700, 10, 10)])
def test_thresholds_are_restored_exactly(thresholds):
    gc.set_threshold(*thresholds)
    bench_policy.start_policy()
    assert gc.get_threshold() == (thresholds[0], thresholds[1], bench_policy.GEN2_NEVER)
    bench_policy.stop_policy()
    assert gc.get_threshold() == thresholds


def test_stock_thresholds_of_this_interpreter_come_back():
    stock = gc.get_threshold()  # 3.13 raised threshold0 to 2000: nothing may assume 700
    bench_policy.start_policy()
    bench_policy.stop_policy()
    assert gc.get_threshold() == stock


def test_stop_leaves_the_enabled_flag_as_it_was():
    gc.disable()
    bench_policy.start_policy()
    bench_policy.stop_policy()
    assert not gc.isenabled()


def test_without_the_policy_the_workload_triggers_gen2():
    counts = collections_during_churn(churn_length())
    assert counts[2] >= 1, counts


def test_threshold2_of_zero_does_not_disable_gen2():
    # Why the policy uses INT_MAX: 0 makes gen2 eligible after every gen1 collection.
    iterations = churn_length()
    t0, t1, _ = gc.get_threshold()
    gc.set_threshold(t0, t1, 0)
    counts = collections_during_churn(iterations)
    assert counts[2] >= 1, counts


def test_policy_stops_automatic_gen2_but_not_young_collections():
    iterations = churn_length()
    bench_policy.start_policy()
    counts = collections_during_churn(iterations)
    assert counts[2] == 0, counts
    assert counts[0] > 0 and counts[1] > 0, counts


def test_stop_reclaims_a_cycle_that_died_in_the_frozen_heap():
    bench_policy.start_policy()
    ref = dead_cycle()
    gc.freeze()  # what the background thread does each interval
    gc.collect()
    assert ref() is not None  # frozen: no collection reaches it while the policy runs
    bench_policy.stop_policy()
    assert ref() is None


def test_gc_maintain_reclaims_deferred_cycles_and_keeps_the_policy():
    bench_policy.start_policy()
    ref = dead_cycle()
    gc.freeze()
    gc.collect()
    assert ref() is not None
    collected = bench_policy.maintain()
    assert ref() is None
    assert collected >= 1
    assert bench_policy.policy_running()
    assert gc.get_freeze_count() > 0  # frozen again after the window
    assert gc.get_threshold()[2] == bench_policy.GEN2_NEVER


def test_gc_maintain_outside_the_policy_touches_nothing():
    ref = dead_cycle()
    gc.freeze()
    assert bench_policy.maintain() == 0
    assert ref() is not None
    assert gc.get_freeze_count() > 0


def test_background_thread_freezes_survivors_and_stops():
    if bench_policy.unsound_build_reason():
        pytest.skip("no periodic freeze on this build")
    bench_policy.start_policy(interval_s=0.01)
    (thread,) = policy_threads()
    assert thread.daemon
    frozen_at_start = gc.get_freeze_count()
    survivors = [{"n": [i]} for i in range(1000)]
    policy = bench_policy._running
    # Two freezes after the survivors exist: on a loaded machine the thread may have frozen twice
    # already between start_policy() and here (seen on 3.14 under a load of 9).
    done = policy.periodic_freezes + 2
    wait_until(lambda: policy.periodic_freezes >= done, deadline_s=10, what="two periodic freezes")
    assert gc.get_freeze_count() >= frozen_at_start + len(survivors)
    bench_policy.stop_policy()
    assert not thread.is_alive()
    assert policy_threads() == []


def test_restarting_does_not_leak_threads():
    for _ in range(3):
        bench_policy.start_policy()
        bench_policy.stop_policy()
    assert policy_threads() == []


@pytest.mark.parametrize(
    ("serving_freeze", "frozen_before", "frozen_after"),
    [(False, False, False), (True, False, True), (False, True, True)],
)
def test_stop_refreezes_only_for_serving_or_a_heap_frozen_before(
    serving_freeze, frozen_before, frozen_after
):
    if frozen_before:
        gc.collect()
        gc.freeze()
    bench_policy.start_policy()
    bench_policy.stop_policy(serving_freeze=serving_freeze)
    assert bench_policy.heap_is_frozen() is frozen_after


def test_bad_interval_given_by_a_caller_is_refused():
    with pytest.raises(ValueError):
        bench_policy.start_policy(interval_s=float("nan"))
    assert not bench_policy.policy_running()


@pytest.mark.parametrize("text", ["inf", "nan", "-1", "0.5", "abc", ""])
def test_bad_interval_env_warns_and_uses_the_default(text, caplog):
    caplog.set_level(logging.WARNING, logger="dynamo_gc.bench_policy")
    config = bench_policy.policy_config_from_env({"DYN_FPM_GC_FREEZE_INTERVAL_S": text})
    assert config.interval_s == 60.0
    assert f"DYN_FPM_GC_FREEZE_INTERVAL_S={text!r}" in caplog.text


def test_bad_policy_env_warns_and_uses_off(caplog):
    caplog.set_level(logging.WARNING, logger="dynamo_gc.bench_policy")
    config = bench_policy.policy_config_from_env({"DYN_FPM_GC_POLICY": "always"})
    assert config.policy == "off" and not config.enabled
    assert "DYN_FPM_GC_POLICY='always'" in caplog.text


def test_good_env_values_are_read(caplog):
    config = bench_policy.policy_config_from_env(
        {"DYN_FPM_GC_POLICY": "freeze", "DYN_FPM_GC_FREEZE_INTERVAL_S": "2.5"}
    )
    assert config == bench_policy_config.PolicyConfig("freeze", 2.5)
    assert config.enabled
    assert bench_policy.policy_config_from_env(bench_policy_config.policy_env(config)) == config
    assert caplog.records == []


def test_start_without_interval_reads_the_env(monkeypatch):
    monkeypatch.setenv("DYN_FPM_GC_FREEZE_INTERVAL_S", "7")
    bench_policy.start_policy()
    assert bench_policy.gc_policy_state()["interval_s"] == 7.0


@pytest.mark.parametrize(
    ("version", "unsound"),
    [
        ((3, 14, 0, "final", 0), True),
        ((3, 14, 4, "final", 0), True),
        ((3, 14, 0, "beta", 1), True),
        ((3, 14, 5, "final", 0), False),
        ((3, 13, 2, "final", 0), False),
        ((3, 10, 13, "final", 0), False),
    ],
)
def test_incremental_gc_versions_are_unsound(mocker, version, unsound):
    mocker.patch.object(sysconfig, "get_config_var", return_value=None)
    mocker.patch.object(sys, "version_info", version)
    reason = bench_policy.unsound_build_reason()
    assert (reason is not None) is unsound
    if unsound:
        assert f"3.14.{version[2]}" in reason


def test_free_threaded_build_is_unsound(mocker):
    mocker.patch.object(
        sysconfig,
        "get_config_var",
        side_effect=lambda name: 1 if name == "Py_GIL_DISABLED" else None,
    )
    assert "free-threaded" in bench_policy.unsound_build_reason()


def test_unsound_build_runs_without_the_periodic_freeze(mocker, caplog):
    caplog.set_level(logging.WARNING, logger="dynamo_gc.bench_policy")
    mocker.patch.object(bench_policy, "unsound_build_reason", return_value="test build")
    thresholds = gc.get_threshold()
    assert bench_policy.start_policy() is True
    assert policy_threads() == []
    assert "not sound on this build (test build)" in caplog.text
    bench_policy.stop_policy()
    assert gc.get_threshold() == thresholds


@pytest.mark.parametrize(
    ("version", "gil_disabled", "honoured"),
    [
        ((3, 14, 0, "final", 0), None, False),
        ((3, 14, 4, "final", 0), None, False),
        ((3, 14, 5, "final", 0), None, True),
        ((3, 13, 2, "final", 0), None, True),
        ((3, 13, 2, "final", 0), 1, False),
        ((3, 10, 13, "final", 0), None, True),
    ],
)
def test_the_start_line_says_gen2_is_off_only_where_threshold2_is_honoured(
    mocker, caplog, version, gil_disabled, honoured
):
    caplog.set_level(logging.INFO, logger="dynamo_gc.bench_policy")
    mocker.patch.object(
        sysconfig,
        "get_config_var",
        side_effect=lambda name: gil_disabled if name == "Py_GIL_DISABLED" else None,
    )
    mocker.patch.object(sys, "version_info", version)
    assert bench_policy.start_policy() is True
    bench_policy.stop_policy()
    (started,) = [r.getMessage() for r in caplog.records if "GC policy started" in r.getMessage()]
    assert ("automatic gen2 off" in started) is honoured, started
    if not honoured:
        assert "automatic full collections still run" in started, started


def test_this_interpreter_is_detected_as_it_is():
    gil_disabled = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    incremental = sys.version_info[:2] == (3, 14) and sys.version_info[2] <= 4
    assert (bench_policy.unsound_build_reason() is not None) is (gil_disabled or incremental)


def test_the_interpreters_own_startup_residue_is_not_a_frozen_heap(mocker):
    # CPython 3.12.1 starts with 375 objects in the permanent generation.
    mocker.patch.object(bench_policy.gc, "get_freeze_count", return_value=375)
    assert not bench_policy.heap_is_frozen()
    mocker.patch.object(bench_policy.gc, "get_freeze_count", return_value=38_000)
    assert bench_policy.heap_is_frozen()
