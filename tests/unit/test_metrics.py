"""The GC metrics: what the pause logger, the freeze and the phase put on the registry."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from dynamo_gc import freeze, gc_state, lifecycle, metrics, pause_logger
from dynamo_gc.metrics import DynamoMetrics

# The contract with dashboards and alerts: renaming a metric or a label breaks them.
STABLE_FAMILIES = {
    "dynamo_gc_pause_seconds": ("histogram", {"generation", "phase"}),
    "dynamo_gc_frozen_objects": ("gauge", set()),
    "dynamo_gc_freeze_seconds": ("gauge", set()),
    "dynamo_gc_freeze_enabled": ("gauge", set()),
    "dynamo_serving_phase": ("gauge", {"phase"}),
}


@pytest.fixture
def process_metrics():
    # As in a fresh process: no freeze yet (earlier tests in this process may have frozen;
    # tests/conftest.py puts the record back after the test).
    gc_state.restore_gc_state(replace(gc_state.snapshot_gc_state(), last_freeze=None))
    built = []

    def build(**kwargs) -> DynamoMetrics:
        kwargs.setdefault("freeze_enabled", True)
        built.append(DynamoMetrics(**kwargs).attach())
        return built[-1]

    yield build
    for each in built:
        each.detach()


def scrape(m: DynamoMetrics) -> dict:
    """{family name: family} parsed back from the exposition, as Prometheus would read it."""
    return {f.name: f for f in text_string_to_metric_families(m.render().decode())}


def sample(m: DynamoMetrics, name: str, **labels) -> float:
    family_name = name
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name[: -len(suffix)] in STABLE_FAMILIES:
            family_name = name[: -len(suffix)]
    found = [
        s.value for s in scrape(m)[family_name].samples if s.name == name and s.labels == labels
    ]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


def pause_count(m: DynamoMetrics, generation: int, phase: str = "starting") -> float:
    return sample(m, "dynamo_gc_pause_seconds_count", generation=str(generation), phase=phase)


def test_pause_histogram_counts_each_collection_by_generation(process_metrics):
    m = process_metrics()
    gc.disable()  # only our explicit collections run (the fixture re-enables)
    pause_logger.install_gc_pause_logger(0, on_pause=m.observe_pause)
    gc.collect(0)
    gc.collect(1)
    gc.collect(2)
    gc.collect(2)
    assert [pause_count(m, g) for g in range(3)] == [1, 1, 2]
    assert sample(m, "dynamo_gc_pause_seconds_sum", generation="2", phase="starting") > 0
    assert (
        sample(m, "dynamo_gc_pause_seconds_bucket", generation="2", le="+Inf", phase="starting")
        == 2
    )


def test_pause_log_threshold_zero_still_records(process_metrics, caplog):
    m = process_metrics()
    gc.disable()
    caplog.set_level("WARNING")
    pause_logger.install_gc_pause_logger(0.0, on_pause=m.observe_pause)
    gc.collect()
    assert pause_count(m, 2) == 1
    assert not [r for r in caplog.records if "GC gen" in r.getMessage()]


def test_buckets_span_a_tenth_of_a_millisecond_to_ten_seconds(process_metrics):
    m = process_metrics()
    m.observe_pause(1, 0.0001)  # on a bound: counted in that bucket ("le")
    m.observe_pause(1, 0.0002)
    m.observe_pause(1, 3.0)
    m.observe_pause(1, 20.0)  # beyond the last bound: +Inf only
    bucket = {
        s.labels["le"]: s.value
        for s in scrape(m)["dynamo_gc_pause_seconds"].samples
        if s.name.endswith("_bucket")
        and s.labels["generation"] == "1"
        and s.labels["phase"] == "starting"
    }
    assert min(map(float, bucket)) == 0.0001
    assert max(float(le) for le in bucket if le != "+Inf") == 10.0
    assert bucket["0.0001"] == 1
    assert bucket["0.00025"] == 2
    assert bucket["2.5"] == 2
    assert bucket["5.0"] == 3
    assert bucket["10.0"] == 3
    assert bucket["+Inf"] == 4
    assert sample(
        m, "dynamo_gc_pause_seconds_sum", generation="1", phase="starting"
    ) == pytest.approx(23.0003)
    assert pause_count(m, 0) == 0 and pause_count(m, 2) == 0


def test_frozen_objects_gauge_equals_the_freeze_record(process_metrics):
    m = process_metrics()
    assert sample(m, "dynamo_gc_frozen_objects") == 0  # nothing frozen in this process yet
    frozen = freeze.freeze_gc_heap(context="metrics test")
    record = freeze.last_freeze()
    assert frozen is not None and frozen > 0
    assert sample(m, "dynamo_gc_frozen_objects") == record.frozen == frozen
    assert sample(m, "dynamo_gc_freeze_seconds") == pytest.approx(record.took_ms / 1000.0)


def test_metrics_built_after_the_freeze_report_it(process_metrics):
    freeze.freeze_gc_heap(context="before metrics")
    record = freeze.last_freeze()
    m = process_metrics()
    assert sample(m, "dynamo_gc_frozen_objects") == record.frozen


def test_a_scrape_walks_no_heap(process_metrics, mocker):
    m = process_metrics()
    freeze.freeze_gc_heap(context="metrics test")
    walks = [
        mocker.patch.object(gc, "get_freeze_count", side_effect=AssertionError("heap walk")),
        mocker.patch.object(gc, "get_objects", side_effect=AssertionError("heap walk")),
    ]
    m.observe_pause(2, 0.5)
    assert b"dynamo_gc_frozen_objects" in m.render()
    assert not any(walk.called for walk in walks)


def test_freeze_enabled_gauge(process_metrics):
    assert sample(process_metrics(freeze_enabled=True), "dynamo_gc_freeze_enabled") == 1
    assert sample(process_metrics(freeze_enabled=False), "dynamo_gc_freeze_enabled") == 0


def test_phase_gauge_follows_the_lifecycle(process_metrics):
    m = process_metrics()

    def phases():
        return {p.value: sample(m, "dynamo_serving_phase", phase=p.value) for p in lifecycle.Phase}

    assert phases() == {"starting": 1, "serving": 0, "maintaining": 0, "draining": 0}
    lifecycle.mark_serving("test")
    assert phases() == {"starting": 0, "serving": 1, "maintaining": 0, "draining": 0}
    with lifecycle.maintenance_window("test", lambda: 0):
        assert phases() == {"starting": 0, "serving": 0, "maintaining": 1, "draining": 0}
    assert phases() == {"starting": 0, "serving": 1, "maintaining": 0, "draining": 0}
    lifecycle.mark_draining("test")
    assert phases() == {"starting": 0, "serving": 0, "maintaining": 0, "draining": 1}


def test_detached_metrics_stop_following(process_metrics):
    m = process_metrics()
    m.detach()
    lifecycle.mark_serving("test")
    freeze.freeze_gc_heap(context="ignored")  # refused while serving: no record either way
    assert sample(m, "dynamo_serving_phase", phase="starting") == 1


def test_metric_names_and_labels_are_stable(process_metrics):
    families = scrape(process_metrics())
    for name, (kind, labels) in STABLE_FAMILIES.items():
        assert families[name].type == kind, name
        for s in families[name].samples:
            assert set(s.labels) - {"le"} == labels, (name, s)
    assert {s.labels["phase"] for s in families["dynamo_serving_phase"].samples} == {
        "starting",
        "serving",
        "maintaining",
        "draining",
    }
    assert {s.labels["generation"] for s in families["dynamo_gc_pause_seconds"].samples} == {
        "0",
        "1",
        "2",
    }
    dynamo = {name for name in families if name.startswith("dynamo_")}
    assert dynamo == set(STABLE_FAMILIES), "a new dynamo_* metric: add it to STABLE_FAMILIES"
    # The standard collectors ride along on our registry.
    assert "python_gc_collections" in families
    assert "process_cpu_seconds" in families


def test_each_instance_has_its_own_registry(process_metrics):
    first, second = process_metrics(), process_metrics()
    first.observe_pause(0, 0.001)
    assert pause_count(first, 0) == 1
    assert pause_count(second, 0) == 0
    assert REGISTRY.get_sample_value("dynamo_gc_pause_seconds_count", {"generation": "0"}) is None


def test_debug_collect_reports_the_generation_2_collection(process_metrics):
    m = process_metrics()
    pause_logger.install_gc_pause_logger(0, on_pause=m.observe_pause)
    before = pause_count(m, 2)
    result = metrics.debug_gc_collect(m)
    assert result["generation"] == 2
    assert result["gen2_collections_delta"] == 1
    assert (
        result["pause_histogram_gen2_count_after"]
        == result["pause_histogram_gen2_count_before"] + 1
    )
    assert pause_count(m, 2) >= before + 1
    assert gc.isenabled()  # switched off only around the call


def test_debug_collect_shows_a_histogram_that_is_not_fed(process_metrics):
    m = process_metrics()  # no pause logger: the histogram cannot see the collection
    result = metrics.debug_gc_collect(m)
    assert result["gen2_collections_delta"] == 1
    assert result["pause_histogram_gen2_count_after"] == result["pause_histogram_gen2_count_before"]


def test_pauses_are_labelled_with_the_phase_they_happened_in(process_metrics):
    m = process_metrics()
    m.observe_pause(2, 0.4)  # the freeze's own collection, at start-up
    lifecycle.mark_serving("test")
    m.observe_pause(2, 0.01)
    m.observe_pause(0, 0.001)
    assert pause_count(m, 2, phase="starting") == 1
    assert pause_count(m, 2, phase="serving") == 1
    assert pause_count(m, 0, phase="serving") == 1
    assert pause_count(m, 2, phase="draining") == 0
    assert m.pauses.count(2) == 2
    assert m.pauses.count(2, lifecycle.Phase.SERVING) == 1


def test_debug_state_reports_thresholds_freeze_and_phase():
    state = metrics.debug_gc_state()
    assert state["thresholds"] == list(gc.get_threshold())
    assert state["isenabled"] == gc.isenabled()
    assert state["phase"] == "starting"
    frozen = freeze.freeze_gc_heap(context="debug state test")
    assert metrics.debug_gc_state()["frozen_objects"] == gc.get_freeze_count() >= frozen - 100


def test_debug_state_counts_the_tracked_objects_of_each_generation():
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection may move objects between the two readings
    try:
        gc.collect()
        kept = [[] for _ in range(5000)]  # new tracked containers: generation 0
        state = metrics.debug_gc_state()
        assert state["counts"][0] >= len(kept)
        young, middle, old = state["generation_objects"]
        assert young >= len(kept)
        assert old > young  # the collection above left the whole heap in generation 2
        gc.collect()
        assert metrics.debug_gc_state()["generation_objects"][2] >= old + len(kept) - 100
        del kept
    finally:
        if was_enabled:
            gc.enable()


def test_debug_state_carries_the_pause_loggers_counters():
    assert metrics.debug_gc_state()["pause_logger"] is None
    gc.disable()
    pause_logger.install_gc_pause_logger(1000.0)
    gc.collect()
    state = metrics.debug_gc_state()["pause_logger"]
    assert state["collections"] == [0, 0, 1] and state["threshold_ms"] == 1000.0
