"""The worker's lifecycle, on the real ``main`` / ``run_worker`` in this process.

Spies record the order of the steps and the process state at each one; the worker stops the
way it does in production, on a real SIGTERM (sent to this process once it has registered, when
the worker's loop owns the signal).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import socket
import sys

import aiohttp
import pytest

from dynamo.common import startup_signals
from dynamo.runtime import request_plane
from dynamo.runtime.discovery import open_discovery
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.model_card import MAX_CONTEXT_LENGTH
from dynamo.vllm import backend_args, engine_factory, worker_process
from dynamo.vllm import main as worker_main
from dynamo.vllm.mock_engine import MockEngine
from dynamo.vllm.request_plane_server import RequestPlaneServer
from dynamo_gc import freeze, gc_state, lifecycle, pause_logger
from tests.support import wait_until_async
from tests.support.steps import StepRecorder
from tests.support.tiny_model import build_tiny_tokenizer, mock_worker_env


def sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture(autouse=True)
def the_mock_engine_on_the_tiny_tokenizer(monkeypatch):
    """``main()`` reads os.environ: every worker here is the mock on the tiny tokenizer."""
    for name, value in mock_worker_env().items():
        monkeypatch.setenv(name, value)


def run_worker(config):
    """The worker's event-loop part, as main() runs it after its checks."""
    discovery = open_discovery(config.discovery)
    return worker_main.run_worker(config, discovery, engine_factory.prepare_engine(config))


@pytest.fixture
def discovery_dir(tmp_path):
    return tmp_path / "discovery"


@pytest.fixture
def steps(mocker):
    """Wrap each lifecycle step to append (step, phase, freeze count) to a list, in order."""
    recorder = StepRecorder(mocker)  # with pause_logger, mark_serving and mark_draining
    recorder.wrap(worker_process, "start_system_server", "system_port")
    recorder.wrap(MockEngine, "start", "engine_init")
    recorder.wrap(freeze, "freeze_gc_heap", "freeze")
    recorder.wrap(RequestPlaneServer, "open", "listen")
    recorder.wrap(RequestPlaneServer, "close", "plane_close")
    recorder.wrap(MockEngine, "shutdown", "engine_shutdown")

    real_register = DiscoveryStore.register
    real_unregister = DiscoveryStore.unregister

    def register(store, record):
        recorder.note("register")
        path = real_register(store, record)
        assert path.exists()
        sigterm_self()  # handled by the worker's loop: the drain starts once this returns
        return path

    def unregister(store, instance_id):
        recorder.note("unregister")
        return real_unregister(store, instance_id)

    mocker.patch.object(DiscoveryStore, "register", register)
    mocker.patch.object(DiscoveryStore, "unregister", unregister)
    return recorder.recorded


def plane_request(request_id: str, record_model: str | None, max_tokens: int = 1) -> dict:
    """A request-plane v2 body; the model is the served name (the tokenizer dir by default)."""
    return {
        "request_id": request_id,
        "model": record_model or mock_worker_env()["DYN_VLLM_MODEL"],
        "token_ids": [41],
        "sampling": {"max_tokens": max_tokens},
    }


def names(recorded) -> list[str]:
    return [step for step, _, _ in recorded]


def test_freeze_after_engine_init_and_before_register_model(steps, discovery_dir):
    frozen_before = gc.get_freeze_count()
    observers_before = gc_state.snapshot_gc_state().freeze_observers
    argv = ["--discovery-dir", str(discovery_dir), "--system-host", "127.0.0.1"]
    assert worker_main.main([*argv, "--system-port", "0"]) == 0

    assert names(steps) == [
        "pause_logger",
        # Both listeners bind before engine init: a taken port fails before it.
        "system_port",
        "listen",
        "engine_init",
        "freeze",
        "mark_serving",
        "register",
        "mark_draining",
        "unregister",
        "plane_close",  # the drain, while the engine still runs
        "engine_shutdown",
        "plane_close",  # the start-up safety net: a no-op by now
    ]
    state = {step: (phase, frozen) for step, phase, frozen in steps}
    # Engine init ran on an unfrozen heap, in the starting phase, with the listener bound but
    # admitting nothing (the phase is not `serving`).
    assert state["listen"] == (lifecycle.Phase.STARTING, frozen_before)
    assert state["engine_init"] == (lifecycle.Phase.STARTING, frozen_before)
    # The freeze ran after engine init, while nothing could be admitted; register_model saw a
    # frozen heap and the serving phase (the frontend may route here as soon as it returns).
    assert state["freeze"][0] is lifecycle.Phase.STARTING
    assert state["register"][0] is lifecycle.Phase.SERVING
    assert state["register"][1] > frozen_before
    # Draining: the record went away after the phase changed and before the engine stopped.
    assert state["unregister"][0] is lifecycle.Phase.DRAINING
    assert list(discovery_dir.iterdir()) == []
    # Once the engine has shut down, the process's GC state is put back: no pause logger left
    # in gc.callbacks, no metrics observer, the heap unfrozen (so exit finalizes it).
    assert pause_logger.installed_gc_pause_logger() is None
    assert gc_state.snapshot_gc_state().freeze_observers == observers_before
    assert gc.get_freeze_count() == frozen_before


def test_the_request_plane_refuses_requests_while_engine_init_runs(discovery_dir, mocker):
    """Bound early, the listener answers 503 (WorkerUnavailable) until the worker serves."""
    config = backend_args.parse_args(["--discovery-dir", str(discovery_dir)], env=mock_worker_env())
    planes: list[RequestPlaneServer] = []
    real_open = RequestPlaneServer.open
    answered = []

    async def record_open(self):
        planes.append(self)
        return await real_open(self)

    async def start(self):
        (plane,) = planes
        async with aiohttp.ClientSession() as session:
            stream = request_plane.generate(
                session, plane.endpoint, plane_request("early", record_model=None)
            )
            with pytest.raises(request_plane.WorkerUnavailable):
                await stream.__anext__()
        answered.append(lifecycle.current_phase())
        sigterm_self()
        await asyncio.Event().wait()  # engine init that only the signal's cancellation ends

    mocker.patch.object(RequestPlaneServer, "open", record_open)
    mocker.patch.object(MockEngine, "start", start)
    assert asyncio.run(run_worker(config)) == 0
    assert answered == [lifecycle.Phase.STARTING]


def taken_port() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


@pytest.mark.parametrize(
    "flag, label",
    [
        ("--request-plane-port", "--request-plane-port / DYN_VLLM_REQUEST_PLANE_PORT"),
        ("--system-port", "--system-port / DYN_SYSTEM_PORT"),
    ],
)
def test_a_taken_port_fails_before_engine_init_with_one_error_line_and_exit_2(
    steps, discovery_dir, caplog, flag, label
):
    caplog.set_level("INFO")
    with taken_port() as listener:
        port = listener.getsockname()[1]
        argv = ["--discovery-dir", str(discovery_dir)]
        if flag == "--system-port":  # --system-host without --system-port exits 2
            argv += ["--system-host", "127.0.0.1"]
        assert worker_main.main([*argv, flag, str(port)]) == 2
    assert "engine_init" not in names(steps) and "register" not in names(steps)
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1, caplog.text
    (error,) = errors
    assert label in error.getMessage() and f"127.0.0.1:{port}" in error.getMessage()
    assert error.exc_info is None  # no traceback
    assert "Draining" not in caplog.text and "Engine init" not in caplog.text
    assert pause_logger.installed_gc_pause_logger() is None


def test_an_unknown_request_plane_host_exits_2_at_parse_time(steps, discovery_dir, capsys):
    argv = ["--discovery-dir", str(discovery_dir), "--request-plane-host", "no-such-host.invalid"]
    assert worker_main.main(argv) == 2
    assert "--request-plane-host / DYN_VLLM_REQUEST_PLANE_HOST" in capsys.readouterr().err
    assert steps == []


def test_a_request_plane_host_that_is_not_local_names_the_host_option(steps, discovery_dir, caplog):
    # 192.0.2.1 (TEST-NET-1) parses and resolves, but no interface here has it: EADDRNOTAVAIL.
    argv = ["--discovery-dir", str(discovery_dir), "--request-plane-host", "192.0.2.1"]
    assert worker_main.main(argv) == 2
    assert "choose another --request-plane-host / DYN_VLLM_REQUEST_PLANE_HOST" in caplog.text
    assert "engine_init" not in names(steps)


def test_a_discovery_dir_that_is_a_file_exits_2_before_anything_runs(steps, tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert worker_main.main(["--discovery-dir", str(not_a_dir)]) == 2
    assert steps == []
    err = capsys.readouterr().err
    assert "--discovery-dir / DYN_DISCOVERY_DIR" in err and repr(str(not_a_dir)) in err, err
    assert "not a directory" in err and "Traceback" not in err


def test_the_discovery_dir_is_created_before_anything_runs(steps, tmp_path, mocker):
    nested = tmp_path / "a" / "b" / "discovery"
    seen = []
    mocker.patch.object(worker_main, "run_worker", lambda *_: seen.append(nested.is_dir()))
    mocker.patch.object(worker_main.asyncio, "run", lambda result: 0)
    assert worker_main.main(["--discovery-dir", str(nested)]) == 0
    assert seen == [True] and list(nested.iterdir()) == []  # the write probe left nothing


def test_a_benchmark_output_in_a_missing_directory_exits_2_before_anything_runs(
    steps, discovery_dir, tmp_path, capsys
):
    output = tmp_path / "missing" / "points.jsonl"
    argv = ["--discovery-dir", str(discovery_dir), "--self-benchmark-points", "3"]
    assert worker_main.main([*argv, "--self-benchmark-output", str(output)]) == 2
    assert steps == []
    err = capsys.readouterr().err
    assert "--self-benchmark-output / DYN_VLLM_SELF_BENCHMARK_OUTPUT" in err, err
    assert repr(str(output)) in err and "No such file or directory" in err


def test_freeze_refused_if_it_ran_after_mark_serving(steps, discovery_dir, mocker, caplog):
    """The guard is what makes the order matter: the same freeze after mark_serving is refused."""
    caplog.set_level("INFO")
    real_freeze = freeze.maybe_freeze_gc_heap

    def freeze_late(enabled, *, context):
        lifecycle.mark_serving("test: too early")
        return real_freeze(enabled, context=context)

    mocker.patch.object(freeze, "maybe_freeze_gc_heap", freeze_late)
    frozen_before = gc.get_freeze_count()
    assert worker_main.main(["--discovery-dir", str(discovery_dir)]) == 0
    assert "GC heap freeze refused (vllm worker)" in caplog.text
    assert gc.get_freeze_count() == frozen_before


def test_no_freeze_gc_heap_never_touches_gc_state(steps, discovery_dir, mocker, caplog):
    # The pause logger's gc.callbacks entry is governed by --gc-pause-log-ms and metrics, not by
    # this option; everything the freeze could touch is checked here.
    caplog.set_level("INFO")
    spies = {
        name: mocker.spy(gc, name)
        for name in ("collect", "freeze", "unfreeze", "set_threshold", "disable", "enable")
    }
    frozen_before = gc.get_freeze_count()
    thresholds_before = gc.get_threshold()

    assert worker_main.main(["--discovery-dir", str(discovery_dir), "--no-freeze-gc-heap"]) == 0

    assert "register" in names(steps)  # it did start and serve
    assert "freeze" not in names(steps)
    for name, spy in spies.items():
        assert spy.call_count == 0, f"gc.{name} was called"
    assert gc.get_freeze_count() == frozen_before
    assert gc.get_threshold() == thresholds_before
    assert "GC heap freeze disabled (vllm worker)" in caplog.text
    assert "GC heap frozen" not in caplog.text


def test_engine_vllm_without_vllm_exits_2_naming_the_mock_engine(
    steps, discovery_dir, mocker, caplog
):
    mocker.patch.dict(sys.modules, {"vllm": None})  # `import vllm` raises ImportError
    frozen_before = gc.get_freeze_count()
    assert worker_main.main(["--discovery-dir", str(discovery_dir), "--engine", "vllm"]) == 2
    assert "--engine mock" in caplog.text
    assert "scripts/setup_vllm_env.sh" in caplog.text
    assert "engine_init" not in names(steps) and "register" not in names(steps)
    assert gc.get_freeze_count() == frozen_before
    assert not discovery_dir.exists() or list(discovery_dir.iterdir()) == []


@pytest.mark.parametrize(
    "argv, env",
    [
        (["--mock-token-ms", "nan"], {}),
        (["--engine", "tpu"], {}),
        ([], {"DYN_VLLM_GC_PAUSE_LOG_MS": "nan"}),
        ([], {"DYN_VLLM_FREEZE_GC_HEAP": "maybe"}),
    ],
)
def test_bad_input_exits_2_before_anything_runs(
    steps, discovery_dir, monkeypatch, capsys, argv, env
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert worker_main.main(["--discovery-dir", str(discovery_dir), *argv]) == 2
    assert steps == []
    assert "error:" in capsys.readouterr().err
    assert not discovery_dir.exists()


def test_signal_during_engine_init_stops_without_registering(steps, discovery_dir, mocker, caplog):
    caplog.set_level("INFO")
    engine_shutdowns = []

    async def start_until_signalled(self):
        sigterm_self()
        await asyncio.Event().wait()  # engine init that only a cancellation ends

    async def shutdown(self):
        engine_shutdowns.append(self)

    mocker.patch.object(MockEngine, "start", start_until_signalled)
    mocker.patch.object(MockEngine, "shutdown", shutdown)
    frozen_before = gc.get_freeze_count()

    assert worker_main.main(["--discovery-dir", str(discovery_dir)]) == 0
    # The listener was bound before engine init, and closed without a drain: it never served.
    assert names(steps) == ["pause_logger", "listen", "plane_close"]  # no freeze, no register
    assert "Draining" not in caplog.text and "Request plane closed" not in caplog.text
    assert len(engine_shutdowns) == 1
    assert gc.get_freeze_count() == frozen_before
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING
    # One line says so; the process then exits without the interpreter's teardown.
    said = [r.getMessage() for r in caplog.records if "SIGTERM" in r.getMessage()]
    assert said == ["Received SIGTERM during start-up: stopping"]
    assert startup_signals.was_stopped_during_startup()


def spy_on_engine_and_registration(mocker) -> tuple[list[MockEngine], asyncio.Event]:
    """The worker's mock engines as they start, and an event set once its record is published
    (the real methods still run)."""
    engines: list[MockEngine] = []
    registered = asyncio.Event()
    real_start = MockEngine.start
    real_register = DiscoveryStore.register

    async def start(self):
        engines.append(self)
        await real_start(self)

    def register(store, record):
        path = real_register(store, record)
        registered.set()
        return path

    mocker.patch.object(MockEngine, "start", start)
    mocker.patch.object(DiscoveryStore, "register", register)
    return engines, registered


def test_drain_aborts_requests_still_running_after_the_grace_period(discovery_dir, mocker):
    """SIGTERM while a request streams: record removed at once, request aborted after grace."""
    config = backend_args.parse_args(
        [
            "--discovery-dir",
            str(discovery_dir),
            "--mock-token-ms",
            "60000",
            "--drain-timeout",
            "0.2",
        ],  # fmt: skip
        env=mock_worker_env(),
    )
    engines, registered = spy_on_engine_and_registration(mocker)

    async def scenario():
        worker = asyncio.ensure_future(run_worker(config))
        await registered.wait()
        (record,) = DiscoveryStore(discovery_dir).read_all().values()
        (engine,) = engines
        async with aiohttp.ClientSession() as session:
            stream = request_plane.generate(
                session, record.endpoint, plane_request("slow", record.model, max_tokens=2)
            )
            first_item = asyncio.ensure_future(stream.__anext__())
            await wait_until_async(
                lambda: engine.requests_started == 1, deadline_s=30
            )  # in the engine, mid-step
            sigterm_self()
            with pytest.raises(request_plane.WorkerUnavailable):
                await first_item
        return await worker, engine

    exit_code, engine = asyncio.run(scenario())
    assert exit_code == 0
    assert engine.requests_aborted == 1
    assert list(discovery_dir.iterdir()) == []


def test_a_rank_that_dies_while_serving_returns_1_with_the_gc_state_put_back(
    discovery_dir, mocker, caplog
):
    """In this process: the record goes, the stream in flight ends in-band, the heap frozen at
    start-up is unfrozen and the pause logger removed, run_worker returns 1."""
    caplog.set_level(logging.INFO)
    config = backend_args.parse_args(
        ["--discovery-dir", str(discovery_dir), "--mock-token-ms", "60000",
         "--tensor-parallel-size", "2"],
        env=mock_worker_env(),
    )  # fmt: skip
    engines, registered = spy_on_engine_and_registration(mocker)
    callbacks_before = list(gc.callbacks)

    async def scenario():
        worker = asyncio.ensure_future(run_worker(config))
        await registered.wait()
        frozen_while_serving = gc.get_freeze_count()
        (record,) = DiscoveryStore(discovery_dir).read_all().values()
        (engine,) = engines
        victim = engine._ranks.pids[1]
        async with aiohttp.ClientSession() as session:
            stream = request_plane.generate(
                session, record.endpoint, plane_request("doomed", record.model, max_tokens=2)
            )
            first_item = asyncio.ensure_future(stream.__anext__())
            await wait_until_async(lambda: engine.requests_started == 1, deadline_s=30)
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(request_plane.WorkerUnavailable, match="the engine died"):
                await first_item
        return await asyncio.wait_for(worker, 30), victim, frozen_while_serving

    exit_code, victim, frozen_while_serving = asyncio.run(scenario())
    assert exit_code == 1
    assert frozen_while_serving > 0 and gc.get_freeze_count() == 0
    assert gc.callbacks == callbacks_before
    assert list(discovery_dir.iterdir()) == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"Worker stopped: the engine died: rank 1 (pid {victim}) was killed by signal "
        "SIGKILL (9) while serving"
    ]


def test_parser_names_go_into_the_model_card(steps, discovery_dir, mocker):
    """Upstream's --dyn-tool-call-parser / --dyn-reasoning-parser: published in the card for
    the frontend (the mock engine has no registry of its own to check them against)."""
    spy = mocker.spy(DiscoveryStore, "register")
    argv = ["--discovery-dir", str(discovery_dir), "--dyn-tool-call-parser", "hermes"]
    env_argv = [*argv, "--dyn-reasoning-parser", "deepseek_r1"]
    assert worker_main.main(env_argv) == 0
    card = spy.call_args.args[1].card
    assert (card.tool_call_parser, card.reasoning_parser) == ("hermes", "deepseek_r1")


@pytest.mark.parametrize("flag", ["--dyn-tool-call-parser", "--dyn-reasoning-parser"])
def test_a_parser_name_that_is_not_a_name_exits_2_naming_the_option(
    steps, discovery_dir, capsys, flag
):
    argv = ["--discovery-dir", str(discovery_dir), flag, "qwen 2.5; rm"]
    assert worker_main.main(argv) == 2
    env = "DYN_TOOL_CALL_PARSER" if "tool" in flag else "DYN_REASONING_PARSER"
    assert f"{flag} / {env}" in capsys.readouterr().err
    assert steps == []


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--served-model-name", "m" * 600], "--served-model-name / DYN_VLLM_SERVED_MODEL_NAME"),
        (["--served-model-name", "m" * 513], "--served-model-name / DYN_VLLM_SERVED_MODEL_NAME"),
    ],
    ids=["600 characters", "one over the record's 512"],
)
def test_a_served_name_a_frontend_would_refuse_exits_2_naming_the_option(
    steps, discovery_dir, capsys, argv, option
):
    """Issue 29: the frontend refuses a record whose model name is over 512 characters; the
    worker used to log "Worker serving" and never be served. The same schema refuses it here."""
    assert worker_main.main(["--discovery-dir", str(discovery_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert option in err and "a frontend would refuse it" in err, err
    assert "'model'" in err and "512" in err, err
    assert steps == [] and not discovery_dir.exists()


def test_a_served_name_at_the_record_limit_serves(steps, discovery_dir, mocker):
    spy = mocker.spy(DiscoveryStore, "register")
    argv = ["--discovery-dir", str(discovery_dir), "--served-model-name", "m" * 512]
    assert worker_main.main(argv) == 0
    assert spy.call_args.args[1].model == "m" * 512


def test_an_engine_resolved_card_a_frontend_would_refuse_is_never_registered(
    steps, discovery_dir, mocker, caplog
):
    """What only the engine knows (its card) is judged at registration by the same schema: a
    card the frontend would refuse stops the worker (exit 2) before its record is written."""
    real_card = MockEngine.model_card.fget

    def bad_card(engine):
        return real_card(engine).model_copy(update={"tokenizer_path": ""})

    mocker.patch.object(MockEngine, "model_card", property(bad_card))
    assert worker_main.main(["--discovery-dir", str(discovery_dir)]) == 2
    assert "register" not in names(steps)
    assert "card: tokenizer_path" in caplog.text and "--model / DYN_VLLM_MODEL" in caplog.text


def test_a_model_whose_context_is_over_the_cards_bound_is_never_registered(
    steps, discovery_dir, tmp_path, monkeypatch, caplog
):
    """Issue 37: a frontend refuses a card claiming more than MAX_CONTEXT_LENGTH tokens; a
    model whose config claims 2^31 is an exit 2 naming the field, not a worker that serves a
    model no frontend routes to (nor a traceback)."""
    model = build_tiny_tokenizer(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2**31 - 1}))
    monkeypatch.setenv("DYN_VLLM_MODEL", str(model))
    assert worker_main.main(["--discovery-dir", str(discovery_dir)]) == 2
    assert "register" not in names(steps)
    assert "card: context_length" in caplog.text and str(MAX_CONTEXT_LENGTH) in caplog.text
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(
    ("name", "size", "why"),
    [
        ("t.txt", 100, "is not a Jinja file (.jinja, .jinja2, .j2)"),
        ("big.jinja", 1024 * 1024 + 100 * 1024, "over the frontend's bound of 1048576"),
    ],
    ids=["not a Jinja file", "1.1 MiB"],
)
def test_a_chat_template_a_frontend_would_refuse_exits_2_naming_the_option(
    steps, discovery_dir, tmp_path, capsys, name, size, why
):
    """Issue 29: the worker logged "Worker serving" with a ``t.txt`` template or a 1.1 MiB
    ``.jinja``, while every frontend refused the model. The frontend's file rules, checked at
    start-up: exit 2 naming the option, before anything runs."""
    template = tmp_path / name
    template.write_text("{{ messages[0].content }}".ljust(size), encoding="utf-8")
    argv = ["--discovery-dir", str(discovery_dir), "--chat-template", str(template)]
    assert worker_main.main(argv) == 2
    err = capsys.readouterr().err
    assert "--chat-template / DYN_VLLM_CHAT_TEMPLATE" in err and repr(str(template)) in err, err
    assert "a frontend would refuse it" in err and why in err, err
    assert steps == [] and not discovery_dir.exists()


def test_a_chat_template_linked_to_a_file_that_is_not_jinja_exits_2(
    steps, discovery_dir, tmp_path, capsys
):
    """The suffix is judged as the frontend judges it: after every link is followed."""
    target = tmp_path / "secret.txt"
    target.write_text("{{ 1 }}", encoding="utf-8")
    link = tmp_path / "template.jinja"
    link.symlink_to(target)
    argv = ["--discovery-dir", str(discovery_dir), "--chat-template", str(link)]
    assert worker_main.main(argv) == 2
    err = capsys.readouterr().err
    assert "is not a Jinja file" in err and f"resolves to {str(target)!r}" in err, err


def test_a_chat_template_at_the_frontends_bound_serves(steps, discovery_dir, tmp_path, mocker):
    spy = mocker.spy(DiscoveryStore, "register")
    template = tmp_path / "t.j2"
    template.write_text("{{ messages[0].content }}".ljust(1024 * 1024), encoding="utf-8")
    argv = ["--discovery-dir", str(discovery_dir), "--chat-template", str(template)]
    assert worker_main.main(argv) == 0
    assert spy.call_args.args[1].card.chat_template_path == str(template)
