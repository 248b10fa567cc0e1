"""An unchanged upstream ``python -m dynamo.frontend`` with
``DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze`` (the entry point of the dynamo-gc distribution):
upstream's real frontend and mocker on loopback, the official ``openai`` client.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path

import pytest

from dynamo_gc.upstream.frontend_hooks import EXTENSION_PROGRAM
from dynamo_gc.upstream.versions import SUPPORTED_VERSIONS
from tests.support.scrape import sample
from tests.upstream.frontend_pair import FROZEN, HTTP_STARTED

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

UPSTREAM = "dynamo.frontend"
EXTENSION_PATH = "dynamo_gc.upstream.frontend_freeze:gc_freeze_routes"
UNCHECKED = "was not checked with this adapter"
# Run before upstream's frontend starts, in its process: what a changed upstream would look like.
LAUNCH_AFTER = """\
import runpy
import sys

import dynamo.frontend.main as upstream

{prelude}

# `python LAUNCH dynamo.frontend ARGS` runs as `python -m dynamo.frontend ARGS` from here on
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def changed_upstream(tmp_path: Path, prelude: str) -> Path:
    """A script that changes the real upstream module in-process, then runs upstream's frontend."""
    script = tmp_path / "changed_upstream.py"
    script.write_text(LAUNCH_AFTER.format(prelude=textwrap.dedent(prelude)))
    return script


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
    frozen = sample(metrics, "dynamo_gc_frozen_objects")
    assert frozen > 10_000  # upstream's start-up heap (tens of thousands of objects)
    state = frontend.debug_gc_state()  # the extension's route, on upstream's HTTP port
    assert state["phase"] == "serving"
    assert state["frozen_objects"] > 10_000  # a frozen object whose last reference goes is freed
    # upstream's own command is checked as the launcher checks it: 1.6.1 is a listed version
    assert UNCHECKED not in frontend.process.log()


# ai-dynamo 1.7.0 is not on PyPI, so a moved symbol is the real 1.6.1 module changed in-process
# before upstream's frontend runs, as a new version would have it.
RENAMED_ROUTE_HOOK = """
    # upstream renames its route-extension loader (async_main calls it by the new name)
    upstream.load_route_extensions = upstream.load_frontend_route_extensions
    del upstream.load_frontend_route_extensions
    code = upstream.async_main.__code__
    upstream.async_main.__code__ = code.replace(
        co_names=tuple(
            "load_route_extensions" if name == "load_frontend_route_extensions" else name
            for name in code.co_names
        )
    )
"""
RENAMED_GROUP = """
    upstream.FRONTEND_ROUTE_ENTRYPOINT_GROUP = "dynamo.frontend.http_routes"
"""


@pytest.mark.parametrize(
    ("prelude", "args", "env", "symbol"),
    [
        (
            RENAMED_ROUTE_HOOK,
            [],
            {"DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"},
            "dynamo.frontend.main.load_frontend_route_extensions is missing",
        ),
        (
            # the entry-point name is then upstream's own error; the module:function path
            # reaches the provider, which names what moved
            RENAMED_GROUP,
            ["--frontend-route-extension", EXTENSION_PATH],
            {},
            "dynamo.frontend.main.FRONTEND_ROUTE_ENTRYPOINT_GROUP is "
            "'dynamo.frontend.http_routes', not 'dynamo.frontend.routes'",
        ),
    ],
    ids=["route-hook-renamed", "entry-point-group-renamed"],
)
def test_a_changed_upstream_stops_the_frontend_with_exit_2_naming_version_and_symbol(
    frontends, tmp_path, prelude, args, env, symbol
):
    frontend = frontends(UPSTREAM, args, env, launch=changed_upstream(tmp_path, prelude))

    assert frontend.process.exit_code(deadline_s=120) == 2

    log = frontend.process.log()
    expected = f"{EXTENSION_PROGRAM}: error: ai-dynamo {version('ai-dynamo')}: {symbol}"
    assert expected in log, log
    assert f"this adapter supports ai-dynamo {', '.join(SUPPORTED_VERSIONS)}" in log
    # never a frontend that serves unfrozen
    assert frontend.position(HTTP_STARTED) == -1
    assert frontend.process.count(FROZEN) == 0
    assert "GC pause logger installed" not in log  # refused with nothing of the adapter applied


def test_an_unlisted_version_with_its_symbols_in_place_runs_with_a_warning(frontends, tmp_path):
    # The installed version taken off the adapter's list: what a newer, unchecked ai-dynamo
    # whose hooked symbols are all still there looks like to the provider.
    prelude = """
        from dynamo_gc.upstream import versions
        versions.SUPPORTED_VERSIONS = ("0.0.0",)
    """
    frontend = frontends(
        UPSTREAM,
        [],
        {"DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"},
        launch=changed_upstream(tmp_path, prelude),
    )
    frontend.serve_a_chat()

    warning = re.escape(
        f"{EXTENSION_PROGRAM}: ai-dynamo {version('ai-dynamo')} {UNCHECKED} (checked: 0.0.0)"
    )
    assert 0 <= frontend.position(warning) < frontend.position(FROZEN)
    assert frontend.position(FROZEN) < frontend.position(HTTP_STARTED)


def test_both_activation_ways_at_once_freeze_once(frontends):
    frontend = frontends(
        UPSTREAM,
        ["--frontend-route-extension", EXTENSION_PATH],
        {"DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"},
    )
    frontend.serve_a_chat()

    assert frontend.process.count(FROZEN) == 1
    assert frontend.position("GC freeze extension already active") >= 0
    assert "refused" not in frontend.process.log()


def test_the_env_var_off_restores_stock(frontends):
    frontend = frontends(
        UPSTREAM,
        [],
        {
            "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze",
            "DYN_FREEZE_GC_HEAP": "0",
            "DYN_GC_METRICS_PORT": "0",
            "DYN_GC_METRICS_HOST": "127.0.0.1",
            "DYN_DEBUG_GC_ENDPOINT": "1",
        },
    )
    frontend.serve_a_chat()

    assert frontend.process.count(FROZEN) == 0
    assert 0 <= frontend.position("GC heap freeze disabled") < frontend.position(HTTP_STARTED)
    # what the process reports, not only its log: nothing in the permanent generation
    assert sample(frontend.scrape(), "dynamo_gc_frozen_objects") == 0
    assert frontend.debug_gc_state()["frozen_objects"] == 0


@pytest.mark.parametrize(
    ("name", "value"), [("DYN_GC_PAUSE_LOG_MS", "-5"), ("DYN_FREEZE_GC_HEAP", "maybe")]
)
def test_a_bad_env_value_exits_2_before_http_starts(frontends, name, value):
    frontend = frontends(UPSTREAM, [], {"DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze", name: value})

    assert frontend.process.exit_code(deadline_s=120) == 2

    log = frontend.process.log()
    assert name in log and repr(value) in log
    # the operator ran upstream's command: the error names the extension and the env var that
    # put it there, and says where the options are listed (not a --help of a program not run)
    assert f"{EXTENSION_PROGRAM}: error: " in log
    assert (
        "python -m dynamo.frontend, gc-freeze route extension (DYN_FRONTEND_ROUTE_EXTENSIONS)"
        in log
    )
    assert "(the gc-freeze route extension reads these env vars; " in log
    assert "run python -m dynamo_gc.frontend --help" not in log
    assert frontend.position(HTTP_STARTED) == -1
    assert frontend.process.count(FROZEN) == 0


def test_upstreams_own_command_takes_the_options_as_env_vars_only():
    # README.md's table: on upstream's unchanged command the extension reads env vars; upstream's
    # parser refuses the flags (they are python -m dynamo_gc.frontend's)
    done = subprocess.run(
        [sys.executable, "-m", UPSTREAM, "--dyn-freeze-gc-heap", "--http-port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"},
        check=False,
    )
    assert done.returncode != 0
    assert "Unknown arguments specified: ['--dyn-freeze-gc-heap']" in done.stdout + done.stderr
