"""A stop signal during an upstream launcher's start-up is never lost where the adapters run
(dynamo_gc.upstream.interrupts, the worker adapters' FreezeOnce, the ``gc-freeze`` route
extension; issue 37): recorded while the adapter prepares upstream, checked before upstream
starts, before the freeze and before the phase turns ``serving``. The adapters against real
upstream processes: tests/upstream."""

from __future__ import annotations

import gc
import signal
import textwrap

import pytest

from dynamo_gc import lifecycle, startup_stop
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.startup_stop import StartupInterrupted
from dynamo_gc.upstream import frontend_freeze, interrupts, worker_freeze
from dynamo_gc.upstream.frontend_settings import FrontendGcConfig
from tests.support.processes import run_python


class SendsOnFinalize:
    """Sends SIGINT from its ``__del__`` (``raise_signal``: the handler runs before it returns,
    inside the finalizer); held only by a cycle, so only a collection runs it."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)


@pytest.fixture
def recording_sigint():
    """SIGINT only recorded meanwhile (as a loop's handler does): a test can send it."""
    previous = signal.signal(signal.SIGINT, startup_stop.record_only)
    yield
    signal.signal(signal.SIGINT, previous)


def freeze_once() -> worker_freeze.FreezeOnce:
    return worker_freeze.FreezeOnce(
        GcSettings(freeze_gc_heap=True, gc_pause_log_ms=0.0),
        context="test, before registering",
        admission="test registers",
    )


def test_a_recorded_stop_keeps_the_worker_from_freezing_and_registering():
    lifecycle.reset_for_new_process()
    registered = []
    wrapped = worker_freeze.freezing_wrapper(registered.append, freeze_once(), coroutine=False)
    frozen_before = gc.get_freeze_count()
    startup_stop.record(signal.SIGINT)  # its interruption was lost on the way
    with pytest.raises(StartupInterrupted):
        wrapped("model")
    with pytest.raises(StartupInterrupted):  # and on any later call
        wrapped("model")
    assert registered == []
    assert gc.get_freeze_count() == frozen_before
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING


def test_a_signal_during_the_workers_freeze_stops_it_before_serving(recording_sigint):
    lifecycle.reset_for_new_process()
    freeze = freeze_once()
    # No automatic collection may finalize the garbage before the freeze's own does (which one
    # comes depends on what earlier tests allocated); conftest puts the GC state back.
    gc.disable()
    SendsOnFinalize()  # garbage the freeze's collection finalizes
    with pytest.raises(StartupInterrupted):
        freeze()
    assert freeze.frozen is not None  # the freeze happened, then the stop
    assert gc.get_freeze_count() == 0  # and the heap is unfrozen again
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING


@pytest.fixture
def extension(monkeypatch):
    # As tests/unit/test_upstream_frontend_freeze.py: this environment has no upstream frontend
    # to read the pool's options from or check (tests/upstream has).
    monkeypatch.setattr(
        frontend_freeze.frontend_hooks, "preprocess_pool_requested", lambda args, program: 0
    )
    frontend_freeze.reset_for_tests()
    frontend_freeze.configure(
        FrontendGcConfig(
            gc=GcSettings(freeze_gc_heap=True, gc_pause_log_ms=0.0),
            metrics_host="127.0.0.1",
            metrics_port=None,
            debug_gc_endpoint=False,
        )
    )
    yield
    frontend_freeze.reset_for_tests()


def test_a_recorded_stop_keeps_the_route_extension_from_activating(extension):
    lifecycle.reset_for_new_process()
    startup_stop.record(signal.SIGTERM)
    with pytest.raises(StartupInterrupted):
        frontend_freeze.gc_freeze_routes()
    assert frontend_freeze.activation() is None
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING


def test_a_signal_during_the_extensions_freeze_stops_it_before_serving(extension, recording_sigint):
    lifecycle.reset_for_new_process()
    SendsOnFinalize()
    callbacks_before = list(gc.callbacks)
    with pytest.raises(StartupInterrupted):
        frontend_freeze.gc_freeze_routes()
    assert frontend_freeze.activation() is None
    assert gc.get_freeze_count() == 0
    assert gc.callbacks == callbacks_before  # the pause logger has left again
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING


def test_hand_over_gives_sigint_back_to_python_and_checks_the_record():
    with startup_stop.interrupting_startup(interrupts.SIGNALS):
        assert signal.getsignal(signal.SIGINT) is startup_stop.record_and_interrupt
        interrupts.hand_over()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    startup_stop.record(signal.SIGINT)
    with pytest.raises(StartupInterrupted):
        interrupts.hand_over()


def test_an_adapters_main_stopped_by_a_lost_ctrl_c_says_one_line():
    """A real process: Ctrl-C arrives in a finalizer while the adapter prepares upstream (the
    interruption is dropped there), and the adapter stops at the hand-over, before upstream's
    launcher runs: exit 0, one line, no traceback."""
    script = textwrap.dedent(
        """
        import gc, signal, sys
        from dynamo_gc.upstream import interrupts

        class SendsOnFinalize:
            def __init__(self):
                self.cycle = self
            def __del__(self):
                signal.raise_signal(signal.SIGINT)

        @interrupts.stoppable("python -m dynamo_gc.test")
        def main():
            SendsOnFinalize()
            gc.collect()  # the handler's exception is raised in __del__, and dropped
            print("prepared upstream", flush=True)
            interrupts.hand_over()
            print("upstream's launcher runs", flush=True)

        main()
        """
    )
    result = run_python("-c", script, timeout_s=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "prepared upstream\n"
    assert result.stderr == (
        "python -m dynamo_gc.test: received SIGINT during start-up: stopped before admitting "
        "anything\n"
    )
