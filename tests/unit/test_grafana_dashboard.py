"""docs/deploy/grafana-dashboard.json reads only what a frontend exports: every series name in
every query is one of the frontend's registry's (GC metrics, the serving-time maintenance's
with it on, and dynamo_frontend_* alike), every label it selects or groups by is one of that
series' labels (or one the scrape adds). The integration suite checks the same names against a
live frontend after traffic (tests/integration/test_metrics.py)."""

from __future__ import annotations

import json

import pytest

from dynamo.frontend.serving.request_metrics import RequestMetrics
from dynamo_gc.maintenance_metrics import MaintenanceMetrics
from dynamo_gc.maintenance_trigger import MaintenanceTrigger
from dynamo_gc.metrics import DynamoMetrics
from tests.support import dashboard


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Series name -> its label names, for every series a frontend's registry exports once one
    request has been served (a labelled family has no series before its first one), with
    serving-time maintenance on (``--dyn-gc-maintenance idle``)."""
    metrics = DynamoMetrics(freeze_enabled=True)
    requests = RequestMetrics(metrics.registry)
    MaintenanceMetrics(metrics.registry, MaintenanceTrigger(50.0))
    with requests.request("chat_completions") as track:
        track.served("a-model")
        track.sent(3)
        track.tokens(1)
        track.tokens(2)
    series: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(set(sample.labels) - {"le"})
    return series


def test_the_dashboard_is_grafana_json_with_panels():
    board = json.loads(dashboard.DASHBOARD.read_text())
    assert board["title"] and board["panels"]
    assert all(panel["targets"] for panel in board["panels"])
    names = set().union(*(dashboard.metric_names(q) for q in dashboard.queries()))
    # Latency and GC pauses on one screen.
    assert {
        "dynamo_frontend_time_to_first_token_seconds_bucket",
        "dynamo_frontend_inter_token_latency_seconds_bucket",
        "dynamo_gc_pause_seconds_bucket",
        "dynamo_gc_frozen_objects",
    } <= names
    # The maintenance's: how often, how long, what waited, what it reclaimed.
    assert {
        "dynamo_gc_maintenance_total",
        "dynamo_gc_maintenance_seconds_bucket",
        "dynamo_gc_maintenance_withdrawn_seconds_bucket",
        "dynamo_gc_maintenance_wait_seconds_bucket",
        "dynamo_gc_maintenance_reclaimed_objects_total",
        "dynamo_gc_unfrozen_objects_estimate",
    } <= names


@pytest.mark.parametrize("expr", dashboard.queries())
def test_every_query_names_series_we_export_with_their_labels(expr, exported):
    names = dashboard.metric_names(expr)
    assert names, expr
    for name in names:
        assert name in exported, f"{name} (in {expr!r}) is not exported"
    for name, labels in dashboard.selected_labels(expr).items():
        assert labels <= exported[name] | dashboard.ADDED_LABELS, (name, labels)
    available = set().union(*(exported[name] for name in names)) | dashboard.ADDED_LABELS
    assert dashboard.grouping_labels(expr) <= available, expr
