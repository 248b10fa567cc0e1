"""The serving-time maintenance through the upstream adapters, in this process: the options of
the adapters that can host it (and of the one that cannot), the gate on a request path of
upstream's (a class of this test's standing in for upstream's), the maintainer an adapter
starts, and the refusals. Upstream's real frontend and worker: tests/upstream.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import types
from types import SimpleNamespace

import pytest

from dynamo.vllm import backend_args
from dynamo_gc import lifecycle
from dynamo_gc.admission import AdmissionGate
from dynamo_gc.configuration.gc_options import GcSettings, MaintenanceSettings
from dynamo_gc.configuration.gc_surfaces import (
    FRONTEND_GC,
    VLLM_WORKER_GC,
    WORKER_GC,
    split_surface_args,
    surface_settings_from_env,
)
from dynamo_gc.freeze import freeze_gc_heap
from dynamo_gc.upstream import (
    frontend_cli,
    frontend_freeze,
    frontend_settings,
    request_gate,
    served_maintenance,
)
from dynamo_gc.upstream.request_gate import RequestPath
from dynamo_gc.vllm import ADAPTER as VLLM_ADAPTER
from dynamo_gc.vllm import ungated
from tests.support import wait_until_async

PROG = "python -m dynamo_gc.test"
MODULE = "upstream_stand_in"
PATH = RequestPath(MODULE, "Handler", "generate")
DEADLINE_S = 10.0


# -- the options ---------------------------------------------------------------------------------


def test_the_vllm_adapter_offers_idle_under_our_workers_names_and_the_mocker_nothing():
    ours = {option.dest: option for option in backend_args.SURFACE.options}
    mode, budget = VLLM_WORKER_GC.maintenance
    assert (mode.flag, mode.env_var) == ("--gc-maintenance", "DYN_VLLM_GC_MAINTENANCE")
    assert (budget.flag, budget.env_var) == ("--gc-pause-budget-ms", "DYN_VLLM_GC_PAUSE_BUDGET_MS")
    assert (mode.flag, mode.env_var) == (
        ours["gc_maintenance"].flag,
        ours["gc_maintenance"].env_var,
    )
    assert budget == ours["gc_pause_budget_ms"]
    assert "withdraw" not in mode.metavar and "idle" in mode.metavar
    assert WORKER_GC.maintenance == ()
    assert {o.env_var for o in FRONTEND_GC.maintenance} == {
        "DYN_GC_MAINTENANCE",
        "DYN_GC_PAUSE_BUDGET_MS",
    }
    assert set(VLLM_WORKER_GC.options) <= set(VLLM_ADAPTER.surface.options)


def test_the_maintenance_options_come_out_of_upstreams_command_line():
    argv = ["--model", "m", "--gc-maintenance", "idle", "--gc-pause-budget-ms=20", "--x"]
    settings, rest = split_surface_args(argv, VLLM_WORKER_GC, {}, prog=PROG)
    assert settings.maintenance == MaintenanceSettings("idle", 20.0)
    assert rest == ["--model", "m", "--x"]
    env = {"DYN_VLLM_GC_MAINTENANCE": "idle", "DYN_VLLM_GC_PAUSE_BUDGET_MS": "30"}
    assert surface_settings_from_env(VLLM_WORKER_GC, env, prog=PROG).maintenance == (
        MaintenanceSettings("idle", 30.0)
    )
    # The mocker declares none: the words stay upstream's, whose parser judges them.
    mocker, rest = split_surface_args(["--gc-maintenance", "idle"], WORKER_GC, {}, prog=PROG)
    assert not mocker.maintenance.enabled and rest == ["--gc-maintenance", "idle"]


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (["--gc-maintenance", "withdraw"], {}, "--gc-maintenance"),
        (["--gc-maintenance", "idle", "--no-freeze-gc-heap"], {}, "needs the start-up GC freeze"),
        ([], {"DYN_VLLM_GC_MAINTENANCE": "idle", "DYN_VLLM_FREEZE_GC_HEAP": "0"}, "freeze"),
        (["--gc-pause-budget-ms", "20"], {}, "acts only with --gc-maintenance"),
        (["--gc-maintenance", "idle", "--gc-pause-budget-ms", "0"], {}, "--gc-pause-budget-ms"),
    ],
)
def test_maintenance_options_that_cannot_work_exit_2_naming_them(argv, env, says, capsys):
    with pytest.raises(SystemExit) as exited:
        split_surface_args(argv, VLLM_WORKER_GC, env, prog=PROG)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert says in error and "DYN_VLLM_" in error


def test_a_budget_from_the_env_with_the_maintenance_off_is_ignored_with_a_warning(caplog):
    settings, _ = split_surface_args([], VLLM_WORKER_GC, {"DYN_VLLM_GC_PAUSE_BUDGET_MS": "20"})
    assert not settings.maintenance.enabled
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "DYN_VLLM_GC_PAUSE_BUDGET_MS=20 ignored" in warning.getMessage()


def test_the_frontend_reads_the_maintenance_from_env_and_flags(capsys):
    config = frontend_settings.from_env({"DYN_GC_MAINTENANCE": "idle"})
    assert config.maintenance == MaintenanceSettings("idle", 50.0)
    config, rest = frontend_settings.split_args(
        ["--dyn-gc-maintenance", "idle", "--dyn-gc-pause-budget-ms", "25", "--http-port", "1"], {}
    )
    assert config.maintenance == MaintenanceSettings("idle", 25.0)
    assert rest == ["--http-port", "1"]
    for argv, env in (
        (["--dyn-gc-maintenance", "idle", "--no-dyn-freeze-gc-heap"], {}),
        (["--dyn-gc-pause-budget-ms", "25"], {}),
        (["--dyn-gc-maintenance", "withdraw"], {}),
    ):
        with pytest.raises(SystemExit) as exited:
            frontend_settings.split_args(argv, env)
        assert exited.value.code == 2
        assert "--dyn-gc-" in capsys.readouterr().err


# -- the gate on upstream's request path ---------------------------------------------------------


class Handler:
    """Stands in for an upstream handler: each request is an async generator of items."""

    def __init__(self) -> None:
        self.closed = 0

    async def generate(self, request, context=None):
        try:
            for item in request:
                await asyncio.sleep(0)
                yield item
        finally:
            self.closed += 1

    def not_a_generator(self, request):
        return request


@pytest.fixture
def upstream_module(monkeypatch):
    module = types.ModuleType(MODULE)
    module.Handler = type("Handler", (Handler,), {"generate": Handler.generate})
    monkeypatch.setitem(sys.modules, MODULE, module)
    yield module
    request_gate.ungate((PATH,))


def test_a_gated_request_path_counts_each_request_in_flight_and_waits_while_held(
    upstream_module,
):
    gate = AdmissionGate()
    request_gate.gate_requests(PROG, (PATH,), gate)
    handler = upstream_module.Handler()

    async def scenario():
        stream = handler.generate([1, 2, 3])
        assert await stream.__anext__() == 1
        assert gate.in_flight == 1
        assert [item async for item in stream] == [2, 3]
        assert gate.in_flight == 0 and handler.closed == 1
        # A client gone mid-stream: upstream's generator closed at once, the count with it.
        stream = handler.generate([1, 2, 3])
        await stream.__anext__()
        await stream.aclose()
        assert gate.in_flight == 0 and handler.closed == 2
        # Held: a new request waits before upstream's method starts.
        gate.hold()
        waiting = asyncio.ensure_future(handler.generate([7]).__anext__())
        await wait_until_async(lambda: gate.waiting == 1, deadline_s=DEADLINE_S)
        assert gate.in_flight == 0
        (wait,) = gate.release()
        assert await waiting == 7 and wait >= 0

    asyncio.run(scenario())
    request_gate.ungate((PATH,))
    assert upstream_module.Handler.__dict__["generate"] is Handler.generate


@pytest.mark.parametrize(
    ("path", "says"),
    [
        (RequestPath("no_such_upstream_module", "Handler", "generate"), "cannot be imported"),
        (RequestPath(MODULE, "Gone", "generate"), "is missing"),
        (RequestPath(MODULE, "Handler", "absent"), "is missing"),
        (RequestPath(MODULE, "Handler", "not_a_generator"), "async generator"),
    ],
)
def test_a_request_path_that_moved_exits_2_naming_it(upstream_module, path, says, capsys):
    upstream_module.Handler.not_a_generator = Handler.not_a_generator
    with pytest.raises(SystemExit) as exited:
        request_gate.gate_requests(PROG, (PATH, path), AdmissionGate())
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert says in error and path.module in error
    assert upstream_module.Handler.__dict__["generate"] is Handler.generate  # nothing replaced


# -- what an adapter starts ----------------------------------------------------------------------


def observed_idle(**extra):
    """The stand-in's adapter with the freeze and ``idle`` maintenance on (a 50 ms budget)."""
    return served_maintenance.observe(
        PROG,
        GcSettings(freeze_gc_heap=True, gc_pause_log_ms=0.0),
        MaintenanceSettings("idle", 50.0),
        paths=(PATH,),
        context="upstream stand-in",
        **extra,
    )


def test_an_adapter_maintains_its_process_once_a_maintenance_is_due(upstream_module):
    adapter_gc = observed_idle()
    assert adapter_gc.gate is not None and adapter_gc.maintenance is not None
    adapter_gc.frozen(freeze_gc_heap(context="start-up"))
    lifecycle.mark_serving("test")
    handler = upstream_module.Handler()

    async def scenario():
        maintainer = adapter_gc.serve(None)
        assert maintainer is not None and adapter_gc.serve(None) is maintainer  # once
        try:
            assert [item async for item in handler.generate([1])] == [1]
            trigger = adapter_gc.maintenance.trigger
            trigger.on_collection(2, trigger.due_at_s, {"generation": 2})
            await wait_until_async(lambda: maintainer.maintenances == 1, deadline_s=DEADLINE_S)
        finally:
            await maintainer.stop()

    asyncio.run(scenario())
    adapter_gc.metrics.detach()


def test_a_worker_registering_what_no_gated_path_serves_exits_2(upstream_module, capsys):
    adapter_gc = observed_idle(ungated=ungated)
    embedding = SimpleNamespace(realtime=False, embedding_worker=True, classify_worker=False)
    with pytest.raises(SystemExit) as exited:
        adapter_gc.serve(((None, None, None, embedding), {}))
    assert exited.value.code == 2
    assert "embedding worker" in capsys.readouterr().err and adapter_gc.maintainer is None
    adapter_gc.metrics.detach()


def test_which_upstream_workers_the_vllm_adapter_counts():
    decode = SimpleNamespace(realtime=False, embedding_worker=False, classify_worker=False)
    assert ungated(((None, None, None, decode), {})) is None
    assert ungated(((), {"config": decode})) is None
    assert "realtime" in ungated(
        ((), {"config": SimpleNamespace(**{**vars(decode), "realtime": True})})
    )
    assert "cannot tell" in ungated(((None, None), {}))  # the encode worker's register_model
    assert "cannot tell" in ungated(None)


def test_the_frontend_refuses_maintenance_with_a_processor_that_serves_in_rust(monkeypatch, capsys):
    monkeypatch.setattr(frontend_freeze.frontend_hooks, "chat_processor", lambda a, p: "dynamo")
    config = frontend_settings.from_env({"DYN_GC_MAINTENANCE": "idle"})
    with pytest.raises(SystemExit) as exited:
        frontend_freeze.maintained_paths(config, "prog", [])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("prog: error: --dyn-gc-maintenance idle / DYN_GC_MAINTENANCE=idle")
    assert "--dyn-chat-processor vllm or sglang" in error
    monkeypatch.setattr(frontend_freeze.frontend_hooks, "chat_processor", lambda a, p: "vllm")
    assert (
        frontend_freeze.maintained_paths(config, "prog", [])
        == (frontend_freeze.REQUEST_PATHS["vllm"])
    )


def test_the_launcher_refuses_that_maintenance_before_upstream_starts(monkeypatch, capsys):
    # python -m dynamo_gc.frontend: the refusal names the program the operator ran, and comes
    # before upstream's main (which would build the engine first)
    started = []
    upstream = types.ModuleType("dynamo.frontend.main")
    upstream.main = lambda: started.append(True)
    monkeypatch.setattr(
        frontend_cli.frontend_hooks, "checked_frontend_main", lambda p=None: upstream
    )
    monkeypatch.setattr(frontend_cli.frontend_hooks, "chat_processor", lambda a, p: "dynamo")
    monkeypatch.setattr(sys, "argv", list(sys.argv))

    with pytest.raises(SystemExit) as exited:
        frontend_cli.main(["--dyn-gc-maintenance", "idle", "--http-port", "8000"])

    assert exited.value.code == 2 and started == []
    assert capsys.readouterr().err.startswith(
        "python -m dynamo_gc.frontend: error: --dyn-gc-maintenance idle"
    )
