"""The vLLM worker adapter's start-up signals (dynamo_gc.upstream.worker_signals): SIGINT and
SIGTERM start the stop and raise ``StartupInterrupted`` until the freeze point; the stop ends the
process and its children even where the exception is swallowed (pyzmq's poll does); upstream's
``install_signal_handlers`` call is recorded and made at the freeze point with its arguments, and
the handlers that were in place come back. The adapter on upstream's real worker, stopped during
its engine init, is tests/upstream/test_vllm_worker_live.py's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.upstream import worker_freeze, worker_signals

PROGRAM = "python -m dynamo_gc.vllm"


@pytest.fixture
def stops(mocker):
    """The stop's thread target recorded instead of run (it ends the process it runs in)."""
    return mocker.patch.object(worker_signals, "_stop")


@pytest.fixture
def signals(stops):
    """StartupSignals installed in this (main) thread; the previous handlers back after."""
    before = {signum: signal.getsignal(signum) for signum in worker_signals.STOP_SIGNALS}
    startup = worker_signals.StartupSignals(PROGRAM)
    startup.install()
    yield startup
    for signum, handler in before.items():
        signal.signal(signum, handler)


def deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0)  # a bytecode boundary after the kill: the handler has run by the next line


@pytest.mark.parametrize("signum", worker_signals.STOP_SIGNALS, ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_during_start_up_starts_the_stop_and_raises(signals, stops, signum):
    with pytest.raises(worker_signals.StartupInterrupted) as raised:
        deliver(signum)
    signame = signal.Signals(signum).name
    assert raised.value.signame == signame
    assert isinstance(raised.value, KeyboardInterrupt)  # clean-up on Ctrl-C runs for SIGTERM
    assert signals.stopping
    signals._stopper.join(timeout=10)
    stops.assert_called_once_with(signame, PROGRAM)


def test_a_second_signal_starts_no_second_stop(signals, stops):
    with pytest.raises(worker_signals.StartupInterrupted):
        deliver(signal.SIGTERM)
    deliver(signal.SIGINT)  # nothing raised: the stop is under way
    signals._stopper.join(timeout=10)
    assert stops.call_count == 1


def test_the_freeze_point_refuses_once_a_stop_began(signals, stops):
    with pytest.raises(worker_signals.StartupInterrupted):
        deliver(signal.SIGTERM)
    with pytest.raises(worker_signals.StartupInterrupted):  # no freeze, no registration
        signals.hand_over()


def test_upstreams_handlers_are_installed_at_the_hand_over_with_their_arguments(signals):
    calls: list[tuple] = []

    def install_signal_handlers(loop, runtime, endpoints, shutdown_event=None):
        calls.append((loop, runtime, endpoints, shutdown_event))

    deferred = signals.defer(install_signal_handlers)
    endpoints: list = []
    assert deferred("loop", "runtime", endpoints, shutdown_event="event") is None
    assert calls == []  # recorded, not run: start-up still stops at once
    endpoints.append("generate")  # upstream fills the list after the call; the same list is used
    signals.hand_over()
    assert calls == [("loop", "runtime", ["generate"], "event")]
    signals.hand_over()
    assert len(calls) == 1  # once
    deferred("loop2", "runtime2", [])  # a call after the hand-over is upstream's at once
    assert calls[-1] == ("loop2", "runtime2", [], None)


def test_the_hand_over_puts_the_previous_handlers_back(stops):
    previous = signal.getsignal(signal.SIGTERM)
    # What SIGINT was before (Python's default_int_handler, or SIG_IGN where the shell that
    # started the run ignores it, as a CI job's non-interactive shell does for background jobs)
    previous_interrupt = signal.getsignal(signal.SIGINT)
    startup = worker_signals.StartupSignals(PROGRAM)
    startup.install()
    try:
        assert signal.getsignal(signal.SIGTERM) != previous
    finally:
        startup.hand_over()
    assert signal.getsignal(signal.SIGTERM) == previous
    assert signal.getsignal(signal.SIGINT) == previous_interrupt
    assert not startup.stopping


def test_the_freeze_runs_the_hand_over_first_and_once():
    order: list[str] = []
    freeze = worker_freeze.FreezeOnce(
        GcSettings(freeze_gc_heap=False, gc_pause_log_ms=0.0),
        context="test",
        admission="test",
        before=lambda: order.append("hand over"),
    )
    freeze()
    freeze()
    assert order == ["hand over"]


# A process that starts a child, installs the handlers, then swallows what the signal raises (as
# pyzmq's poll does while vLLM waits for its EngineCore) and goes on waiting.
SWALLOWING_START_UP = textwrap.dedent(
    """
    import multiprocessing, os, signal, sys, time
    from dynamo_gc.upstream import worker_signals

    if __name__ == "__main__":
        child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(120,))
        child.start()
        print(child.pid, flush=True)
        worker_signals.StartupSignals("python -m dynamo_gc.vllm").install()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0)
        except BaseException:
            pass  # swallowed
        time.sleep(120)  # "start-up goes on": only the stop can end this in time
    """
)


def test_the_stop_ends_the_process_and_its_children_even_when_the_exception_is_swallowed():
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SWALLOWING_START_UP],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30  # the child's 120 s sleep did not hold it
    assert done.stderr.splitlines() == [
        "Received SIGTERM during start-up (python -m dynamo_gc.vllm, before the model is "
        "registered): stopping; nothing was frozen or registered"
    ]
    child = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while worker_signals._alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not worker_signals._alive(child)
