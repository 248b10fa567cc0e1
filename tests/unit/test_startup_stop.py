"""No stop signal during start-up is lost (dynamo_gc.startup_stop, and the launchers' lifecycle
in dynamo.common.launcher): the handler records the signal, and start-up acts on the record at
every phase boundary and before it admits, whether or not an exception or a cancellation got
through (issue 37). Signals here are delivered with ``signal.raise_signal``, which runs the
handler before it returns: inside the finalizer that sends them, deterministically."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

import pytest

from dynamo.common import launcher
from dynamo_gc import lifecycle, startup_stop
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.startup_stop import StartupInterrupted
from tests.support import wait_until_async


class SendsOnFinalize:
    """Sends ``signum`` from its ``__del__``; held only by a cycle, so only a collection runs
    it. ``seen`` tells what the finalizer saw: the exception the handler raised, if any."""

    seen: list[str] = []

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.cycle = self

    def __del__(self) -> None:
        try:
            signal.raise_signal(self.signum)
        except BaseException as exc:
            SendsOnFinalize.seen.append(type(exc).__name__)
            raise  # as the handler's exception would leave any finalizer
        SendsOnFinalize.seen.append("nothing raised")


def finalize_sending(signum: int = signal.SIGINT) -> None:
    """A collection now runs a finalizer that sends ``signum``."""
    SendsOnFinalize(signum)
    gc.collect()


@pytest.fixture(autouse=True)
def fresh_finalizer_log():
    SendsOnFinalize.seen = []


# --- the record ----------------------------------------------------------------------------


def test_the_first_signal_is_kept_and_every_one_counted():
    assert startup_stop.received() is None
    startup_stop.check()  # nothing recorded: no stop
    assert startup_stop.record(signal.SIGTERM) == "SIGTERM"
    assert startup_stop.record(signal.SIGINT) == "SIGINT"
    assert startup_stop.received() == "SIGTERM"
    assert startup_stop.deliveries() == 2
    with pytest.raises(StartupInterrupted) as caught:
        startup_stop.check()
    assert caught.value.signame == "SIGTERM"
    startup_stop.forget()
    assert startup_stop.received() is None and startup_stop.deliveries() == 0


def test_a_signal_whose_exception_a_finalizer_swallows_is_still_recorded(mocker):
    """The issue's loss: the handler raises inside ``__del__``, Python drops the exception,
    start-up carries on; the record is there for the next check. Nothing is printed for it."""
    hook = mocker.Mock()
    mocker.patch.object(sys, "unraisablehook", hook)
    with startup_stop.interrupting_startup():
        finalize_sending(signal.SIGINT)  # returns: the exception did not get through
        assert SendsOnFinalize.seen == ["StartupInterrupted"]
        assert startup_stop.received() == "SIGINT"
        with pytest.raises(StartupInterrupted):
            startup_stop.check()
    hook.assert_not_called()  # no "Exception ignored in ..." for an interruption
    assert sys.unraisablehook is hook  # and the hook is put back


def test_other_unraisable_exceptions_are_still_reported(mocker):
    hook = mocker.Mock()
    mocker.patch.object(sys, "unraisablehook", hook)

    class Broken:
        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            raise ValueError("a real bug in a finalizer")

    with startup_stop.interrupting_startup():
        Broken()
        gc.collect()
    assert hook.call_count == 1
    assert isinstance(hook.call_args.args[0].exc_value, ValueError)


# --- the launchers' lifecycle --------------------------------------------------------------


class Service:
    """A launcher's service whose steps are noted; ``during_start`` runs inside start."""

    freeze_context = "test service"
    admission = "test admission"

    def __init__(self, during_start=None) -> None:
        self.during_start = during_start
        self.steps: list[str] = []

    async def start(self, closer: launcher.Closer) -> None:
        self.steps.append("start")
        closer.push("test part", self.close)
        if self.during_start is not None:
            await self.during_start()
        self.steps.append("started")

    async def close(self) -> None:
        self.steps.append("closed")

    async def admit(self) -> None:
        self.steps.append("admit")

    async def serve(self, signals: launcher.StopSignals) -> int:
        self.steps.append("serve")
        return 0


def run(service: Service, *, freeze: bool = True) -> int:
    settings = GcSettings(freeze_gc_heap=freeze, gc_pause_log_ms=0)
    process_gc = launcher.start_process_gc(settings)
    try:
        return asyncio.run(launcher.run_lifecycle(service, gc=settings, process_gc=process_gc))
    finally:
        process_gc.state.restore()


def stop_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "Received" in r.getMessage()]


def test_a_signal_recorded_before_the_loop_stops_start_up_before_it_begins(caplog):
    caplog.set_level(logging.INFO)
    startup_stop.record(signal.SIGINT)  # its exception was lost before the loop ran
    service = Service()
    assert run(service) == 0
    assert service.steps == []
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING
    assert stop_lines(caplog) == ["Received SIGINT during start-up: stopping"]


def test_a_swallowed_cancellation_stops_start_up_at_the_next_boundary(caplog):
    caplog.set_level(logging.INFO)
    frozen_before = gc.get_freeze_count()

    async def swallow_the_stop() -> None:
        finalize_sending(signal.SIGTERM)  # on the loop: recorded, then the loop cancels
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # code on the way that catches it

    service = Service(swallow_the_stop)
    assert run(service) == 0
    assert SendsOnFinalize.seen == ["nothing raised"]  # the loop's handler only records
    assert service.steps == ["start", "started", "closed"]  # no freeze, no admission
    assert gc.get_freeze_count() == frozen_before
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING
    assert stop_lines(caplog) == ["Received SIGTERM during start-up: stopping"]


def test_a_signal_during_the_freezes_collection_stops_before_the_phase_turns_serving(
    mocker, caplog
):
    """The freeze's ``gc.collect()`` runs the finalizer that sends the signal: a synchronous
    step, so the loop cannot act on it before the next; the record can, and does."""
    caplog.set_level(logging.INFO)
    on_signal = mocker.spy(launcher.StopSignals, "_on_signal")

    async def leave_a_finalizer() -> None:
        SendsOnFinalize(signal.SIGINT)  # garbage for the freeze to collect

    service = Service(leave_a_finalizer)
    service.close = lambda: wait_until_async(lambda: on_signal.call_count, deadline_s=30)
    assert run(service) == 0
    assert SendsOnFinalize.seen == ["nothing raised"]
    assert "GC heap frozen (test service)" in caplog.text  # it happened during the freeze
    assert service.steps == ["start", "started"]  # and nothing was admitted
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING
    assert gc.get_freeze_count() == 0  # the stopped process's heap is unfrozen again
    # The loop's own handler ran later (while the parts closed): the same signal, one line.
    assert on_signal.call_count == 1
    assert stop_lines(caplog) == ["Received SIGINT during start-up: stopping"]


def test_a_second_signal_while_stopping_is_still_reported(mocker, caplog):
    caplog.set_level(logging.INFO)
    on_signal = mocker.spy(launcher.StopSignals, "_on_signal")

    async def two_signals() -> None:
        finalize_sending(signal.SIGINT)
        await wait_until_async(lambda: on_signal.call_count, deadline_s=30)

    async def close_after_another() -> None:
        signal.raise_signal(signal.SIGTERM)
        await wait_until_async(lambda: on_signal.call_count == 2, deadline_s=30)

    service = Service(two_signals)
    service.close = close_after_another
    assert run(service) == 0
    assert stop_lines(caplog) == [
        "Received SIGINT during start-up: stopping",
        "Received SIGTERM while stopping (after SIGINT): ignored",
    ]


def test_the_handlers_before_the_loop_come_back_after_it():
    with startup_stop.interrupting_startup():
        before = {s: signal.getsignal(s) for s in startup_stop.STOP_SIGNALS}
        assert run(Service()) == 0
        assert {s: signal.getsignal(s) for s in startup_stop.STOP_SIGNALS} == before
