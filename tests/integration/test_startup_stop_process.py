"""A stop signal during start-up is never lost (issue 37), shown on the real launchers.

Each test runs ``python -m dynamo.frontend`` or ``python -m dynamo.vllm`` (mock engine) through
tests/support/finalizer_signal.py, which delivers SIGINT or SIGTERM from inside a finalizer that
a garbage collection runs at one chosen start-up step: the handler runs right there, inside
``__del__``, where an exception it raises is printed and dropped by Python. Before the loop that
is what happened to 4 of 40 Ctrl-Cs (the frontend went on to serve); on the loop, a
cancellation can be swallowed the same way by code on its way, which the tests do on purpose.
Every time the process must stop with one line and exit 0, having admitted nothing: no
listener, no phase ``serving`` (unless the stop came after it, right before the registration),
no record in discovery. Deterministic: the signal is sent from the finalizer itself, and the
tests wait only for the process to end.
"""

from __future__ import annotations

import re

import pytest

from tests.support.processes import FINALIZER_SIGNAL_LAUNCH, start_frontend, start_worker

pytestmark = pytest.mark.integration

STOP_DEADLINE_S = 120.0  # the whole start-up, then the stop, on a loaded 2-core machine
SENT = "finalizer: sending {signame}"
RECORDED_IN_FINALIZER = "finalizer: recorded {signame}"
# A launcher that logs one of these has admitted (or is about to): the stop was lost.
ADMITTED = re.compile(r"HTTP service listening|Model registered")


def signal_at(target: str, signame: str = "SIGINT", *, swallow: bool = False) -> dict[str, str]:
    env = {"FINALIZER_SIGNAL_AT": target, "FINALIZER_SIGNAL": signame}
    if swallow:
        env["FINALIZER_SIGNAL_SWALLOW"] = "1"
    return env


def assert_stopped_with_one_line(process, signame: str) -> str:
    # Ends as soon as the process exits, or fails at once when it admits.
    admitted = process.stopped_or_logged(ADMITTED, deadline_s=STOP_DEADLINE_S)
    log = process.log()
    assert admitted is None, log
    code = process.proc.returncode
    assert code == 0, log
    assert SENT.format(signame=signame) in log, log  # the signal came from the finalizer
    assert len(re.findall(rf"Received {signame} during start-up", log)) == 1, log
    # Python's "Exception ignored in ..." report would be a traceback for a normal stop.
    assert "Traceback" not in log and "Exception ignored" not in log, log
    return log


def frontend(tmp_path, env: dict[str, str], *args: str):
    return start_frontend(
        "frontend",
        tmp_path,
        tmp_path / "discovery",
        *args,
        env=env,
        launch=FINALIZER_SIGNAL_LAUNCH,
    )


def worker(tmp_path, env: dict[str, str], *args: str):
    return start_worker(
        "worker",
        tmp_path,
        tmp_path / "discovery",
        "m",
        *args,
        env=env,
        launch=FINALIZER_SIGNAL_LAUNCH,
    )


def assert_frontend_admitted_nothing(log: str) -> None:
    assert "HTTP service listening" not in log, log
    assert "Serving phase starting -> serving" not in log, log
    assert "Discovery watcher started" not in log, log


def assert_worker_registered_nothing(log: str, tmp_path) -> None:
    assert "Model registered" not in log, log
    discovery = tmp_path / "discovery"
    assert not discovery.exists() or list(discovery.iterdir()) == [], log


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_lost_in_a_finalizer_before_the_loop_stops_the_frontend(tmp_path, signame):
    """The issue's case: the handler's exception is raised inside a finalizer during the chat
    processor's import and dropped there; the record stops start-up after the import."""
    env = signal_at("dynamo.frontend.main:import_chat_processor", signame)
    log = assert_stopped_with_one_line(frontend(tmp_path, env), signame)
    assert "GC heap frozen" not in log, log  # stopped before the freeze, too
    assert_frontend_admitted_nothing(log)


def test_a_signal_during_the_freezes_collection_stops_the_frontend_before_it_listens(tmp_path):
    """On the loop the handler records at once, inside the finalizer the freeze's collection
    runs; the check after the freeze stops start-up before the phase turns ``serving``."""
    env = signal_at("dynamo_gc.freeze:freeze_gc_heap")
    log = assert_stopped_with_one_line(frontend(tmp_path, env), "SIGINT")
    assert RECORDED_IN_FINALIZER.format(signame="SIGINT") in log, log
    assert "GC heap frozen (frontend)" in log, log  # the stop came during it
    assert_frontend_admitted_nothing(log)


def test_a_swallowed_cancellation_still_stops_the_frontend(tmp_path):
    """Start-up's first step catches the cancellation the signal sends; the check after the
    start-up phase stops it all the same, before the freeze."""
    env = signal_at("dynamo.frontend.process:FrontendProcess.start", swallow=True)
    log = assert_stopped_with_one_line(frontend(tmp_path, env), "SIGINT")
    assert "step: swallowed a cancellation" in log, log
    assert "GC heap frozen" not in log, log
    assert_frontend_admitted_nothing(log)


def test_a_signal_lost_in_a_finalizer_before_the_loop_stops_the_worker(tmp_path):
    env = signal_at("dynamo.vllm.engine_factory:prepare_engine")
    log = assert_stopped_with_one_line(worker(tmp_path, env), "SIGINT")
    assert "Engine init" not in log, log
    assert_worker_registered_nothing(log, tmp_path)


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_during_the_freezes_collection_stops_the_worker_before_it_registers(
    tmp_path, signame
):
    env = signal_at("dynamo_gc.freeze:freeze_gc_heap", signame)
    log = assert_stopped_with_one_line(worker(tmp_path, env), signame)
    assert RECORDED_IN_FINALIZER.format(signame=signame) in log, log
    assert "GC heap frozen (vllm worker)" in log, log
    assert "Serving phase starting -> serving" not in log, log
    assert_worker_registered_nothing(log, tmp_path)


def test_a_cancellation_swallowed_right_before_the_registration_still_stops_the_worker(
    tmp_path,
):
    """The last moment: the phase is ``serving`` and the registration is the next step; the
    cancellation is swallowed, and the check right before ``register_model`` stops it."""
    env = signal_at("dynamo.vllm.worker_process:WorkerProcess.admit", swallow=True)
    log = assert_stopped_with_one_line(worker(tmp_path, env), "SIGINT")
    assert "step: swallowed a cancellation" in log, log
    assert_worker_registered_nothing(log, tmp_path)
