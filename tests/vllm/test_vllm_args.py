"""The worker's options first, every other argument to vLLM's own parser."""

from __future__ import annotations

import importlib.util

import pytest

from dynamo.vllm import backend_args
from dynamo.vllm.engine import EngineUnavailable

VLLM_REST = [
    "--max-model-len", "256",
    "--kv-cache-memory-bytes=64M",
    "--enforce-eager",
    "--seed", "-1",
]  # fmt: skip
MOCK = ["--engine", "mock", "--model", "/tokenizer-dir"]


def test_engine_vllm_keeps_unknown_arguments_in_order_for_vllm():
    config = backend_args.parse_args(
        ["--engine", "vllm", VLLM_REST[0], VLLM_REST[1], "--model", "/m", *VLLM_REST[2:]], env={}
    )
    assert config.model == "/m"
    assert config.engine == "vllm"
    assert config.vllm_args == tuple(VLLM_REST)


def test_engine_vllm_from_env_keeps_unknown_arguments_too():
    config = backend_args.parse_args(
        ["--enforce-eager"], env={"DYN_VLLM_ENGINE": "vllm", "DYN_VLLM_MODEL": "/m"}
    )
    assert config.vllm_args == ("--enforce-eager",)


def test_mock_engine_rejects_unknown_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        backend_args.parse_args([*MOCK, "--max-model-len", "256"], env={})
    assert exc.value.code == 2
    assert "unrecognized arguments: --max-model-len 256" in capsys.readouterr().err


def test_mock_engine_has_no_vllm_arguments():
    assert backend_args.parse_args(MOCK, env={}).vllm_args == ()


@pytest.mark.vllm
def test_vllm_parser_reads_the_rest_with_the_workers_model_and_tp():
    from dynamo.vllm import vllm_args

    config = backend_args.parse_args(
        ["--model", "/m", "--served-model-name", "tiny", "--tensor-parallel-size", "2", *VLLM_REST],
        env={},
    )
    args = vllm_args.engine_args_from_config(
        config, worker_extension_cls="dynamo.vllm.worker_extension.FpmGcWorkerExtension"
    )
    assert args.model == "/m"
    assert args.tensor_parallel_size == 2
    assert args.max_model_len == 256
    assert args.kv_cache_memory_bytes == 64 * 1024 * 1024
    assert args.enforce_eager is True
    assert args.seed == -1
    assert args.served_model_name == ["tiny"]
    assert args.worker_extension_cls == "dynamo.vllm.worker_extension.FpmGcWorkerExtension"


@pytest.mark.vllm
def test_a_vllm_flag_after_the_workers_tp_wins():
    from dynamo.vllm import vllm_args

    config = backend_args.parse_args(
        ["--engine", "vllm", "--model", "/m", "--tensor-parallel-size", "2", "-tp", "1"], env={}
    )
    assert vllm_args.engine_args_from_config(config).tensor_parallel_size == 1


@pytest.mark.vllm
def test_a_bad_vllm_argument_is_engine_unavailable_with_vllms_message(capsys):
    from dynamo.vllm import vllm_engine

    config = backend_args.parse_args(
        ["--engine", "vllm", "--model", "/m", "--no-such-vllm-flag"], env={}
    )
    with pytest.raises(EngineUnavailable, match="--no-such-vllm-flag"):
        vllm_engine.build_vllm_engine(config)
    assert "--no-such-vllm-flag" in capsys.readouterr().err


@pytest.mark.vllm
def test_a_bad_vllm_argument_exits_2_before_anything_starts(tmp_path, mocker, capsys):
    from dynamo.vllm import main as worker_main

    run_worker = mocker.patch.object(worker_main, "run_worker")
    argv = ["--engine", "vllm", "--model", "/m", "--discovery-dir", str(tmp_path / "d")]
    assert worker_main.main([*argv, "--no-such-vllm-flag"]) == 2
    run_worker.assert_not_called()  # no listener, no engine init, no event loop
    assert "--no-such-vllm-flag" in capsys.readouterr().err


def test_vllm_is_the_default_engine_and_the_served_name_is_the_workers_option():
    config = backend_args.parse_args(["--model", "/m", "--served-model-name", "tiny"], env={})
    assert config.engine == "vllm"
    assert config.served_model_name == "tiny"
    assert config.vllm_args == ()  # the worker's option, passed on to vLLM by the adapter


def _help(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        backend_args.parse_args(argv, env={})
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_mock_help_lists_only_the_workers_options(capsys):
    out = _help(capsys, ["--engine", "mock", "--help"])
    assert "--mock-token-ms" in out and "--served-model-name" in out
    assert "vLLM's engine arguments" not in out and "--enforce-eager" not in out


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this environment"
)
def test_vllm_help_without_vllm_says_so_after_the_workers_options(capsys):
    out = _help(capsys, ["--help"])  # no --model needed for help
    worker = out.index("--mock-token-ms")
    note = out.index("vLLM's engine arguments are not listed")
    assert worker < note and "--engine mock" in out[note:]


@pytest.mark.vllm
def test_vllm_help_shows_vllms_options_after_the_workers(capsys):
    out = _help(capsys, ["--engine", "vllm", "--help"])
    worker = out.index("--mock-token-ms")
    vllm = out.index("--enforce-eager")
    assert worker < out.index("Every other argument goes to vLLM") < vllm
    assert "--kv-cache-memory-bytes" in out[worker:]


BENCH = ["--model", "/m", "--self-benchmark-points", "10", *VLLM_REST]
POLICY_SCHEDULER = "dynamo.vllm.gc_scheduler.FpmGcScheduler"


def _engine_args(*argv: str):
    from dynamo.vllm import vllm_args

    return vllm_args.engine_args_from_config(backend_args.parse_args(list(argv), env={}))


@pytest.mark.vllm
@pytest.mark.parametrize("policy", ["freeze", "off"])
def test_the_self_benchmark_gives_engine_core_the_policy_scheduler(policy):
    # Both arms: with the policy off it only installs EngineCore's pause logger and reports.
    args = _engine_args(*BENCH, "--fpm-gc-policy", policy)
    assert args.scheduler_cls == POLICY_SCHEDULER


@pytest.mark.vllm
def test_serving_alone_keeps_vllms_scheduler():
    assert _engine_args("--model", "/m", "--fpm-gc-policy", "freeze").scheduler_cls is None
    user = "vllm.v1.core.sched.scheduler.Scheduler"
    assert _engine_args("--model", "/m", "--scheduler-cls", user).scheduler_cls == user


@pytest.mark.vllm
def test_a_subclass_of_the_policy_scheduler_is_accepted():
    user = f"{__name__}.policy_aware_scheduler"
    args = _engine_args(*BENCH, "--fpm-gc-policy", "freeze", "--scheduler-cls", user)
    assert args.scheduler_cls == user


@pytest.mark.vllm
@pytest.mark.parametrize(
    "user", ["vllm.v1.core.sched.scheduler.Scheduler", "dynamo.no_such_module.Scheduler"]
)
def test_a_conflicting_scheduler_exits_2_naming_both_options(capsys, user):
    with pytest.raises(SystemExit) as exited:
        _engine_args(*BENCH, "--fpm-gc-policy", "freeze", "--scheduler-cls", user)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--scheduler-cls" in err and user in err
    if "no_such_module" not in user:
        assert "--fpm-gc-policy" in err and POLICY_SCHEDULER in err


@pytest.mark.vllm
def test_with_the_policy_off_a_users_scheduler_is_kept():
    user = "vllm.v1.core.sched.scheduler.Scheduler"
    args = _engine_args(*BENCH, "--fpm-gc-policy", "off", "--scheduler-cls", user)
    assert args.scheduler_cls == user


def __getattr__(name: str):
    # A module attribute made on first use, so importing this module never imports vLLM.
    if name == "policy_aware_scheduler":
        from dynamo.vllm.gc_scheduler import FpmGcScheduler

        return type("PolicyAwareScheduler", (FpmGcScheduler,), {})
    raise AttributeError(name)


@pytest.mark.vllm
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_policy_scheduler_schedules_on_the_base_vllm_would_pick(async_scheduling):
    from types import SimpleNamespace

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from dynamo.vllm.gc_scheduler import FpmGcAsyncScheduler, FpmGcScheduler

    config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))
    # __new__ alone: what EngineCore's Scheduler(vllm_config=...) call constructs.
    scheduler = FpmGcScheduler.__new__(FpmGcScheduler, vllm_config=config)
    assert isinstance(scheduler, FpmGcScheduler)
    assert isinstance(scheduler, AsyncScheduler) is async_scheduling
    assert issubclass(FpmGcAsyncScheduler, FpmGcScheduler)


@pytest.mark.vllm
def test_a_control_request_writes_its_report_only_where_call_engine_core_would(tmp_path, caplog):
    import json
    import tempfile

    from dynamo.vllm import gc_scheduler

    elsewhere = tmp_path / "not-ours.json"
    gc_scheduler._run_control({"command": "report", "report_path": str(elsewhere)})
    assert not elsewhere.exists()
    assert "report path" in caplog.text and "not one of ours" in caplog.text
    with tempfile.TemporaryDirectory(prefix=gc_scheduler.REPORT_DIR_PREFIX) as ours:
        path = f"{ours}/report.json"
        gc_scheduler._run_control({"command": "report", "report_path": path})
        with open(path, encoding="utf-8") as report:
            assert json.load(report)["command"] == "report"
