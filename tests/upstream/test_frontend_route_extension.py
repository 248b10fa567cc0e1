"""An unchanged upstream ``python -m dynamo.frontend`` with
``DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze`` (the entry point of the dynamo-gc distribution):
upstream's real frontend and mocker on loopback, the official ``openai`` client.
"""

from __future__ import annotations

import pytest

from tests.upstream.frontend_pair import (
    FROZEN,
    HTTP_STARTED,
)

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

UPSTREAM = "dynamo.frontend"


def test_the_extension_freezes_before_http_and_the_frontend_serves(frontends):
    frontend = frontends(
        UPSTREAM,
        [],
        {
            "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze",
            "DYN_GC_PAUSE_LOG_MS": "1",
            "DYN_GC_METRICS_PORT": "0",
            "DYN_GC_METRICS_HOST": "127.0.0.1",
            "DYN_DEBUG_GC_ENDPOINT": "1",
        },
    )
    frontend.serve_a_chat()

    assert 0 <= frontend.position(FROZEN) < frontend.position(HTTP_STARTED)
    assert frontend.process.count(FROZEN) == 1
    assert frontend.position("GC pause logger installed: WARNING for pauses >= 1 ms") >= 0
    metrics = frontend.scrape()
    assert 'dynamo_serving_phase{phase="serving"} 1.0' in metrics
    assert "dynamo_gc_freeze_enabled 1.0" in metrics
    frozen = next(
        float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("dynamo_gc_frozen_objects ")
    )
    assert frozen > 10_000  # upstream's start-up heap (tens of thousands of objects)
    state = frontend.debug_gc_state()  # the extension's route, on upstream's HTTP port
    assert state["phase"] == "serving"
    assert state["frozen_objects"] > 10_000  # a frozen object whose last reference goes is freed


def test_both_activation_ways_at_once_freeze_once(frontends):
    frontend = frontends(
        UPSTREAM,
        ["--frontend-route-extension", "dynamo_gc.upstream.frontend_freeze:gc_freeze_routes"],
        {"DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"},
    )
    frontend.serve_a_chat()

    assert frontend.process.count(FROZEN) == 1
    assert frontend.position("GC freeze extension already active") >= 0
    assert "refused" not in frontend.process.log()


def test_the_env_var_off_restores_stock(frontends):
    frontend = frontends(
        UPSTREAM, [], {"DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze", "DYN_FREEZE_GC_HEAP": "0"}
    )
    frontend.serve_a_chat()

    assert frontend.process.count(FROZEN) == 0
    assert 0 <= frontend.position("GC heap freeze disabled") < frontend.position(HTTP_STARTED)


@pytest.mark.parametrize(
    ("name", "value"), [("DYN_GC_PAUSE_LOG_MS", "-5"), ("DYN_FREEZE_GC_HEAP", "maybe")]
)
def test_a_bad_env_value_exits_2_before_http_starts(frontends, name, value):
    frontend = frontends(UPSTREAM, [], {"DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze", name: value})

    assert frontend.process.exit_code(deadline_s=120) == 2

    log = frontend.process.log()
    assert name in log and repr(value) in log
    assert frontend.position(HTTP_STARTED) == -1
    assert frontend.process.count(FROZEN) == 0
