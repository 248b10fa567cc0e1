"""``python -m dynamo_gc.frontend <upstream's arguments> [GC flags]``: upstream's real frontend,
our flags taken out and checked first, the same freeze point as the route extension.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.scrape import sample
from tests.upstream.frontend_pair import FROZEN, HTTP_STARTED

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

LAUNCHER = "dynamo_gc.frontend"
# upstream's first line once it has parsed its arguments
UPSTREAM_STARTED = r"Request migration (enabled|disabled)"


def test_the_launcher_freezes_before_http_and_serves(frontends):
    # the route-extension env var unset: the launcher adds the extension itself
    frontend = frontends(LAUNCHER, ["--dyn-gc-pause-log-ms", "1"], {"DYN_FREEZE_GC_HEAP": "0"})
    frontend.serve_a_chat()

    # the flag is absent, so the env var applies: off
    assert frontend.process.count(FROZEN) == 0

    on = frontends(
        LAUNCHER,
        ["--dyn-freeze-gc-heap", "--dyn-gc-pause-log-ms", "1"],
        {"DYN_FREEZE_GC_HEAP": "0"},
    )
    on.serve_a_chat()
    assert 0 <= on.position(FROZEN) < on.position(HTTP_STARTED)
    assert on.process.count(FROZEN) == 1
    assert on.position("GC pause logger installed: WARNING for pauses >= 1 ms") >= 0


def test_no_freeze_flag_restores_stock(frontends):
    frontend = frontends(
        LAUNCHER,
        [
            "--no-dyn-freeze-gc-heap",
            "--dyn-gc-metrics-port",
            "0",
            "--dyn-gc-metrics-host",
            "127.0.0.1",
            "--dyn-debug-gc-endpoint",
        ],
    )
    frontend.serve_a_chat()

    assert frontend.process.count(FROZEN) == 0
    assert 0 <= frontend.position("GC heap freeze disabled") < frontend.position(HTTP_STARTED)
    # What the process itself reports, not only its log: nothing is in the permanent generation.
    metrics = frontend.scrape()
    assert sample(metrics, "dynamo_gc_frozen_objects") == 0
    assert sample(metrics, "dynamo_gc_freeze_enabled") == 0
    state = frontend.debug_gc_state()
    assert state["phase"] == "serving"
    assert state["frozen_objects"] == 0
    assert sum(state["generation_objects"]) > 10_000  # the start-up heap, all still collectable


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--dyn-gc-pause-log-ms", "nan"], {}, "--dyn-gc-pause-log-ms / DYN_GC_PAUSE_LOG_MS"),
        (["--dyn-freeze-gc-heap=0"], {}, "--dyn-freeze-gc-heap / DYN_FREEZE_GC_HEAP"),
        ([], {"DYN_FREEZE_GC_HEAP": "2"}, "--dyn-freeze-gc-heap / DYN_FREEZE_GC_HEAP"),
    ],
)
def test_a_bad_value_exits_2_before_upstream_starts(frontends, args, env, named):
    frontend = frontends(LAUNCHER, args, env)

    assert frontend.process.exit_code(deadline_s=60) == 2

    log = frontend.process.log()
    assert named in log
    assert frontend.position(UPSTREAM_STARTED) == -1


def test_help_shows_the_gc_options_then_upstreams():
    done = subprocess.run(
        [sys.executable, "-m", LAUNCHER, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    ours = out.index("--dyn-freeze-gc-heap, --no-dyn-freeze-gc-heap")
    assert ours < out.index("DYN_GC_PAUSE_LOG_MS") < out.index("--frontend-route-extension")
    assert "--dyn-chat-processor" in out  # upstream's own option
