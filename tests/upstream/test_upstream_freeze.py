"""An ai-dynamo that freezes its own processes: the adapters stand down there, with one line.

No release has upstream's freeze yet (its change is unmerged), so each test runs the real 1.6.1
launcher changed in its own process as upstream's change has it: a module of the shape of
``dynamo/common/utils/gc_freeze.py`` (tests/upstream/fixtures/gc_freeze.py) made importable
under that name in the test's process (appended to the installed package's path, nothing
written into the installation), imported by upstream's launcher module and called where the
change calls it (the frontend: right after its route extensions; the worker: before it serves).
Then: one freeze (upstream's), no second pause logger, the adapter's line saying it stands down
and what of its own is not served, and the pair still serves.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from launcher_process import LauncherProcess
from upstream_pair import loopback_env, mocker_args, tiny_model_dir

from tests.upstream.frontend_pair import FROZEN, HTTP_STARTED, Frontend

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

FIXTURES = Path(__file__).parent / "fixtures"
STANDS_DOWN = (
    r"freezes this process's GC heap itself \(dynamo\.common\.utils\.gc_freeze: "
    r"(install_gc_pause_logger, )?maybe_freeze_gc_heap\): the adapter stands down, no second "
    r"freeze and no second pause logger"
)
UPSTREAM_FROZE = r"upstream freeze: (frontend startup|mocker engine built), frozen=[1-9]"
ADAPTER_FROZE = r"GC heap frozen \("
ADAPTER_PAUSE_LOGGER = "GC pause logger installed"

LAUNCH = """\
import os
import runpy
import sys

# upstream's freeze module, as its unmerged change adds it, importable under its own name here
import dynamo.common.utils as utils

utils.__path__.append({fixtures!r})
from dynamo.common.utils.gc_freeze import install_gc_pause_logger, maybe_freeze_gc_heap

{change}

# `python LAUNCH MODULE ARGS` runs as `python -m MODULE ARGS` from here on
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""

# dynamo/frontend/main.py in upstream's change: it imports both functions, installs the pause
# logger after parsing its options, and freezes right after loading the route extensions.
FRONTEND_CHANGE = """
import dynamo.frontend.main as upstream

upstream.install_gc_pause_logger = install_gc_pause_logger
upstream.maybe_freeze_gc_heap = maybe_freeze_gc_heap
load_route_extensions = upstream.load_frontend_route_extensions


def load_then_freeze(names):
    routes = load_route_extensions(names)
    enabled = os.environ.get("DYN_FREEZE_GC_HEAP", "1") not in ("0", "false")
    maybe_freeze_gc_heap(enabled, context="frontend startup")
    return routes


upstream.load_frontend_route_extensions = load_then_freeze
"""

# The mocker as a worker of upstream's change would be: it freezes once its engine is built,
# before it serves it.
MOCKER_CHANGE = """
import dynamo.mocker.main as upstream

upstream.maybe_freeze_gc_heap = maybe_freeze_gc_heap
serve = upstream.run_input


def freeze_then_serve(*args, **kwargs):
    maybe_freeze_gc_heap(True, context="mocker engine built")
    return serve(*args, **kwargs)


upstream.run_input = freeze_then_serve
"""


def launch_script(tmp_path: Path, change: str) -> Path:
    script = tmp_path / "upstream_with_its_own_freeze.py"
    script.write_text(
        LAUNCH.format(fixtures=str(FIXTURES), change=textwrap.dedent(change)), encoding="utf-8"
    )
    return script


@pytest.mark.parametrize(
    ("module", "args", "env", "not_served"),
    [
        (
            "dynamo.frontend",
            [],
            {
                "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze",
                "DYN_GC_PAUSE_LOG_MS": "1",
                "DYN_GC_METRICS_PORT": "0",
            },
            "not served: --dyn-gc-metrics-port / DYN_GC_METRICS_PORT (0)",
        ),
        (
            # the adapter's own options are taken out (upstream's parser would refuse them), the
            # extension is not added; the maintenance stands down with the freeze (it would
            # unfreeze upstream's), so the default processor is no refusal here
            "dynamo_gc.frontend",
            ["--dyn-gc-metrics-port", "0", "--dyn-gc-maintenance", "idle"],
            {"DYN_GC_PAUSE_LOG_MS": "1"},
            "not served: --dyn-gc-metrics-port / DYN_GC_METRICS_PORT (0), "
            "--dyn-gc-maintenance / DYN_GC_MAINTENANCE (idle)",
        ),
        (
            # the launcher and the env var at once: still one line
            "dynamo_gc.frontend",
            [],
            {"DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"},
            None,
        ),
    ],
    ids=["route-extension", "launcher", "both-ways"],
)
def test_the_frontend_adapter_stands_down_where_upstream_freezes(
    frontends, tmp_path, module, args, env, not_served
):
    frontend = frontends(module, args, env, launch=launch_script(tmp_path, FRONTEND_CHANGE))
    frontend.serve_a_chat()

    log = frontend.process.log()
    assert len(re.findall(STANDS_DOWN, log)) == 1, log
    assert len(re.findall(UPSTREAM_FROZE, log)) == 1  # one freeze: upstream's
    assert re.search(ADAPTER_FROZE, log) is None and re.search(FROZEN, log) is None
    assert ADAPTER_PAUSE_LOGGER not in log  # upstream's pause logger only
    assert frontend.position(STANDS_DOWN) < frontend.position(HTTP_STARTED)
    if not_served is None:
        assert "not served" not in log
    else:
        assert not_served in log
        assert "GC metrics served on" not in log


def test_a_worker_adapter_stands_down_where_upstream_freezes(tmp_path):
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    mocker = LauncherProcess(
        "mocker",
        "dynamo_gc.mocker",
        [
            *mocker_args(tiny_model_dir(tmp_path / "model"), speedup_ratio=1000),
            "--gc-metrics-port",
            "0",
        ],
        log_dir=tmp_path,
        env=loopback_env(kv_dir),
        launch=launch_script(tmp_path, MOCKER_CHANGE),
    )
    frontend = Frontend("dynamo.frontend", [], kv_dir=kv_dir, log_dir=tmp_path)
    try:
        frontend.serve_a_chat()  # the model registered and served through upstream's mocker
        log = mocker.log()
        assert len(re.findall(STANDS_DOWN, log)) == 1, log
        assert "not served: --gc-metrics-port / DYN_VLLM_GC_METRICS_PORT (0)" in log
        assert len(re.findall(UPSTREAM_FROZE, log)) == 1
        assert re.search(ADAPTER_FROZE, log) is None
        assert "GC metrics served on" not in log
    finally:
        frontend.stop()
        mocker.stop()
