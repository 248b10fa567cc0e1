"""The frontend's start-up order and shutdown, on the real ``main`` in this process.

Wrappers record the order of the steps that matter and the GC state at each; the frontend stops
the way it does in production, on a real SIGTERM sent to this process once the discovery watcher
starts (the last start-up step), when the frontend's loop owns the signal.
"""

from __future__ import annotations

import gc
import logging
import os
import signal

import aiohttp
import pytest
from aiohttp import web

from dynamo.common import logging_setup
from dynamo.frontend import main as frontend_main
from dynamo.frontend.process import FrontendProcess
from dynamo.runtime.discovery import file_backend as discovery
from dynamo.runtime.discovery.file_watcher import DiscoveryWatcher
from dynamo_gc import freeze, gc_state, lifecycle, pause_logger
from tests.support.steps import StepRecorder


@pytest.fixture(autouse=True)
def restore_process_state(monkeypatch):
    """main configures logging, attaches metrics observers and (maybe) freezes this process:
    none of it may outlive the test (tests/conftest.py puts the GC state and the phase back)."""
    root = logging.getLogger()
    level = root.level
    yield
    logging_setup.remove_logging_handler()
    root.setLevel(level)


@pytest.fixture
def steps(mocker):
    """Record (step, phase, frozen objects) for each start-up step, in order."""
    recorder = StepRecorder(mocker)  # with pause_logger, mark_serving and mark_draining
    recorder.wrap(FrontendProcess, "start", "build")
    recorder.wrap(freeze, "maybe_freeze_gc_heap", "freeze")
    recorder.wrap(web.SockSite, "start", "listen")
    recorder.wrap(
        DiscoveryWatcher,
        "start",
        "watcher",
        after=lambda: os.kill(os.getpid(), signal.SIGTERM),  # stop once start-up is done
    )
    return recorder.recorded


def run_main(tmp_path, *extra: str) -> int:
    return frontend_main.main(
        [
            "--http-host", "127.0.0.1",
            "--http-port", "0",
            "--discovery-dir", str(tmp_path / "discovery"),
            *extra,
        ]
    )  # fmt: skip


def test_freeze_happens_after_build_and_before_the_listener_opens(tmp_path, steps, caplog):
    caplog.set_level(logging.INFO)
    assert run_main(tmp_path) == 0
    names = [step for step, _, _ in steps]
    assert names == [
        "pause_logger",
        "build",
        "freeze",
        "mark_serving",
        "listen",
        "watcher",
        "mark_draining",
    ]
    by_name = {step: (phase, frozen) for step, phase, frozen in steps}
    assert by_name["freeze"][0] is lifecycle.Phase.STARTING
    assert by_name["mark_serving"][1] > 0  # frozen before admission
    assert by_name["listen"] == (lifecycle.Phase.SERVING, by_name["mark_serving"][1])
    assert caplog.text.count("GC heap frozen (frontend)") == 1
    assert "HTTP service listening on http://127.0.0.1:" in caplog.text
    assert lifecycle.current_phase() is lifecycle.Phase.DRAINING


def test_no_freeze_flag_never_touches_gc_state(tmp_path, steps, mocker, caplog):
    caplog.set_level(logging.INFO)
    touched = {
        name: mocker.patch.object(gc, name, wraps=getattr(gc, name))
        for name in ("collect", "freeze", "unfreeze", "set_threshold", "disable", "enable")
    }
    thresholds, callbacks = gc.get_threshold(), list(gc.callbacks)
    assert run_main(tmp_path, "--no-dyn-freeze-gc-heap") == 0
    assert [name for name, spy in touched.items() if spy.called] == []  # unfreeze included
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == thresholds
    # The one callback main adds observes pauses (for the log and /metrics) and is gone after.
    assert "pause_logger" in [step for step, _, _ in steps]
    assert gc.callbacks == callbacks and pause_logger.installed_gc_pause_logger() is None
    assert "freeze" in [step for step, _, _ in steps]  # asked, and declined
    assert "GC heap freeze disabled (frontend)" in caplog.text


def test_env_var_turns_the_freeze_off_too(tmp_path, steps, monkeypatch):
    monkeypatch.setenv("DYN_FREEZE_GC_HEAP", "off")
    assert run_main(tmp_path) == 0
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--http-port", "70000"],
        ["--http-port", "eighty"],
        ["--dyn-preprocess-workers", "-1"],
        ["--dyn-gc-pause-log-ms", "nan"],
        ["--no-such-flag"],
    ],
)
def test_bad_input_exits_2_before_anything_runs(argv, steps, capsys):
    assert frontend_main.main(argv) == 2  # returned, like the worker's main: no SystemExit
    assert steps == []
    assert "error" in capsys.readouterr().err


def test_help_returns_0(steps, capsys):
    assert frontend_main.main(["--help"]) == 0
    assert steps == [] and "--discovery-dir" in capsys.readouterr().out


def test_a_missing_discovery_dir_is_created(tmp_path, steps):
    assert run_main(tmp_path) == 0
    assert (tmp_path / "discovery").is_dir()


def test_a_discovery_dir_that_is_a_file_exits_2_naming_the_option(tmp_path, steps, capsys):
    a_file = tmp_path / "discovery"
    a_file.write_text("not a directory")
    assert run_main(tmp_path) == 2
    assert steps == []  # before logging, the pause logger, the pool, the listener
    err = capsys.readouterr().err
    assert "--discovery-dir / DYN_DISCOVERY_DIR" in err and str(a_file) in err
    assert "not a directory" in err


def test_an_unreadable_discovery_dir_exits_2(tmp_path, steps, capsys, mocker):
    (tmp_path / "discovery").mkdir()
    # Tests may run as root, which chmod cannot lock out: the listing itself is made to fail.
    mocker.patch.object(
        discovery.os, "scandir", side_effect=PermissionError(13, "Permission denied")
    )
    assert run_main(tmp_path) == 2
    assert steps == []
    err = capsys.readouterr().err
    assert "--discovery-dir / DYN_DISCOVERY_DIR" in err and "Permission denied" in err


def test_shutdown_undoes_the_gc_state_after_everything_else(tmp_path, steps, caplog):
    """No pause line after the final one; frozen objects can be finalized at exit."""
    caplog.set_level(logging.INFO)
    observers = gc_state.snapshot_gc_state().freeze_observers
    listeners = lifecycle.snapshot_phase_state().listeners
    callbacks = list(gc.callbacks)
    assert run_main(tmp_path, "--dyn-gc-pause-log-ms", "0.001") == 0
    assert "GC heap frozen (frontend)" in caplog.text
    assert gc.get_freeze_count() == 0  # unfrozen
    assert gc.callbacks == callbacks and pause_logger.installed_gc_pause_logger() is None
    assert gc_state.snapshot_gc_state().freeze_observers == observers
    assert lifecycle.snapshot_phase_state().listeners == listeners
    gc.collect()  # would log a pause line if the logger were still installed
    messages = [r.getMessage() for r in caplog.records]
    assert messages[-1] == "Frontend exiting with code 0"


def test_one_part_failing_to_close_does_not_skip_the_others(tmp_path, steps, mocker, caplog):
    closed: list[str] = []
    real_cleanup, real_close = web.AppRunner.cleanup, aiohttp.ClientSession.close

    async def cleanup(runner):
        closed.append("runner")
        await real_cleanup(runner)

    async def close(session):
        closed.append("session")
        await real_close(session)

    async def broken_stop(watcher):
        closed.append("watcher")
        raise OSError("the watcher could not stop")

    mocker.patch.object(web.AppRunner, "cleanup", cleanup)
    mocker.patch.object(aiohttp.ClientSession, "close", close)
    mocker.patch.object(DiscoveryWatcher, "stop", broken_stop)
    with caplog.at_level(logging.ERROR):
        code = run_main(tmp_path)
    assert code == 1  # not a clean shutdown, and it says so
    # The watcher is stopped first (and raises); the listener, the drain and the session after.
    assert closed == ["watcher", "runner", "session"], closed
    assert "Shutdown: closing the discovery watcher failed" in caplog.text
    assert pause_logger.installed_gc_pause_logger() is None  # the GC state is put back regardless


def test_a_taken_port_exits_2_after_logging_why(tmp_path, steps, caplog):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        caplog.set_level(logging.INFO)
        code = frontend_main.main(
            ["--http-host", "127.0.0.1", "--http-port", str(port),
             "--discovery-dir", str(tmp_path)]
        )  # fmt: skip
    assert code == 2
    assert f"Cannot listen on http://127.0.0.1:{port}" in caplog.text
    assert "choose another --http-port / DYN_HTTP_PORT" in caplog.text


def test_a_host_that_is_no_address_here_exits_2_naming_the_host_option(tmp_path, steps, caplog):
    # 192.0.2.1 (TEST-NET-1) parses and resolves, but no interface here has it: EADDRNOTAVAIL.
    caplog.set_level(logging.INFO)
    code = frontend_main.main(
        ["--http-host", "192.0.2.1", "--http-port", "0", "--discovery-dir", str(tmp_path)]
    )
    assert code == 2
    assert "choose another --http-host / DYN_HTTP_HOST" in caplog.text
