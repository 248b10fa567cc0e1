"""A Ctrl-C while an adapter prepares upstream's launcher is never lost (issue 37;
dynamo_gc.upstream.interrupts): upstream's real mocker and frontend, through ``python -m
dynamo_gc.mocker`` / ``dynamo_gc.frontend``, with SIGINT delivered from inside a finalizer that a
collection runs while the adapter resolves upstream's modules (tests/support/finalizer_signal.py:
the handler runs inside ``__del__``, where Python prints and drops what it raises). Python's own
handler would have lost it there and upstream would have gone on to serve; the adapter's record
stops it before upstream's launcher runs: one line, exit 0, nothing registered or listening.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launcher_process import LauncherProcess
from upstream_pair import HTTP_STARTED, loopback_env, mocker_args, tiny_model_dir

from tests.upstream.frontend_pair import Frontend

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

# tests/support/processes.py names it too, but imports our launchers, which this environment lacks.
FINALIZER_SIGNAL_LAUNCH = Path(__file__).resolve().parents[1] / "support" / "finalizer_signal.py"
STOP_DEADLINE_S = 120.0
# What upstream logs once it builds or serves (the stop was lost if any appears).
ADMITTED = re.compile(
    r"Creating mocker worker|Registered endpoint|KVStoreDiscovery::register|" + HTTP_STARTED
)


def assert_stopped_before_upstream(process: LauncherProcess, program: str) -> None:
    admitted = process.stopped_or_logged(ADMITTED, deadline_s=STOP_DEADLINE_S)
    log = process.log()
    assert admitted is None, log
    assert process.proc.returncode == 0, log
    assert "finalizer: sending SIGINT" in log, log
    line = f"{program}: received SIGINT during start-up: stopped before admitting anything"
    assert log.count(line) == 1, log
    assert "Traceback" not in log and "Exception ignored" not in log, log


def test_a_lost_ctrl_c_stops_the_mocker_adapter_before_upstream_starts(tmp_path):
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    process = LauncherProcess(
        "mocker",
        "dynamo_gc.mocker",
        mocker_args(tiny_model_dir(tmp_path / "model"), speedup_ratio=1000),
        log_dir=tmp_path,
        env={**loopback_env(kv_dir), "FINALIZER_SIGNAL_AT": "dynamo_gc.upstream.hooks:resolve"},
        launch=FINALIZER_SIGNAL_LAUNCH,
    )
    assert_stopped_before_upstream(process, "python -m dynamo_gc.mocker")
    assert list(kv_dir.iterdir()) == []


def test_a_lost_ctrl_c_stops_the_frontend_adapter_before_upstream_starts(tmp_path):
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    frontend = Frontend(
        "dynamo_gc.frontend",
        [],
        kv_dir=kv_dir,
        log_dir=tmp_path,
        env={"FINALIZER_SIGNAL_AT": "dynamo_gc.upstream.frontend_hooks:checked_frontend_main"},
        launch=FINALIZER_SIGNAL_LAUNCH,
    )
    assert_stopped_before_upstream(frontend.process, "python -m dynamo_gc.frontend")
