"""The worker's options first, every other argument to vLLM's own parser."""

from __future__ import annotations

import importlib.util
import re

import pytest

from dynamo.vllm import backend_args
from dynamo.vllm.engine import EngineUnavailable
from tests.support.processes import run_python

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
    model = str(tmp_path)  # a directory that exists: vLLM's own parser is what refuses
    argv = ["--engine", "vllm", "--model", model, "--discovery-dir", str(tmp_path / "d")]
    assert worker_main.main([*argv, "--no-such-vllm-flag"]) == 2
    run_worker.assert_not_called()  # no listener, no engine init, no event loop
    err = capsys.readouterr().err
    assert "--no-such-vllm-flag" in err
    # vLLM's usage is hundreds of lines: its error comes first and alone, not below them.
    refused = [line for line in err.splitlines() if "error:" in line]
    assert refused[0].startswith("python -m dynamo.vllm --engine vllm: error:"), err
    assert "usage:" not in err and len(err.splitlines()) < 10, err


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
def test_vllm_help_shows_vllms_groups_after_the_workers_options():
    """vLLM's part as ``vllm serve --help`` prints it: a short usage line, its config groups one
    line each and how to see one; not argparse's usage of every flag. Nothing else on stderr
    (vLLM's import used to print a bare "Triton is installed" WARNING into it)."""
    result = run_python("-m", "dynamo.vllm", "--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    worker = out.index("--mock-token-ms")
    vllm = out.index("Every other argument goes to vLLM")
    assert worker < vllm
    part = out[vllm:]
    assert "usage: python -m dynamo.vllm --engine vllm [options]\n" in part
    groups = part[part.index("Config Groups:") :]
    for group in ("ModelConfig", "CacheConfig", "SchedulerConfig"):
        assert re.search(rf"^  {group} ", groups, re.MULTILINE), groups
    assert "--enforce-eager" not in part  # flags are listed by --help=<group>, as in vLLM
    assert "python -m dynamo.vllm --help=all" in part
    assert len(part.splitlines()) < 80, part
    assert "Triton is installed" not in out + result.stderr, result.stderr
    assert result.stderr == "", result.stderr


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("search", "shown", "not_shown"),
    [
        ("--help=CacheConfig", "--kv-cache-memory-bytes", "--max-model-len"),
        ("--help=cacheconfig", "--kv-cache-memory-bytes", "--max-model-len"),  # any case
        ("--help=max_model_len", "--max-model-len", "--kv-cache-memory-bytes"),  # a flag
        ("--help=all", "--enforce-eager", None),
    ],
)
def test_help_with_a_keyword_prints_that_part_of_vllms_arguments(search, shown, not_shown, capsys):
    with pytest.raises(SystemExit) as exc:
        backend_args.parse_args(["--model", "/m", search], env={})
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert shown in out, out
    assert not_shown is None or not_shown not in out
    assert "--mock-token-ms" not in out  # vLLM's part alone, as vLLM prints it
    assert "ignored explicit argument" not in err


def test_help_with_a_keyword_and_the_mock_engine_names_both(capsys):
    with pytest.raises(SystemExit) as exc:
        backend_args.parse_args(["--engine", "mock", "--help=CacheConfig"], env={})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--help=CacheConfig searches vLLM's engine arguments" in err
    assert "--engine / DYN_VLLM_ENGINE is 'mock'" in err


BENCH = ["--model", "/m", "--self-benchmark-points", "10", *VLLM_REST]
POLICY_SCHEDULER = "dynamo.vllm.gc_scheduler.FpmGcScheduler"


def _engine_args(*argv: str, env: dict[str, str] | None = None):
    from dynamo.vllm import vllm_args

    config = backend_args.parse_args(list(argv), env=env or {})
    return vllm_args.engine_args_from_config(config)


@pytest.mark.vllm
@pytest.mark.parametrize("policy", ["freeze", "off"])
def test_the_self_benchmark_gives_engine_core_the_policy_scheduler(policy):
    # Both arms: with the policy off it only installs EngineCore's pause logger and reports.
    args = _engine_args(*BENCH, "--fpm-gc-policy", policy)
    assert args.scheduler_cls == POLICY_SCHEDULER


@pytest.mark.vllm
def test_serving_alone_keeps_vllms_scheduler():
    # The policy without the self-benchmark: from the environment (as a flag it exits 2).
    alone = _engine_args("--model", "/m", env={"DYN_FPM_GC_POLICY": "freeze"})
    assert alone.scheduler_cls is None
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


@pytest.mark.vllm
def test_help_piped_to_head_prints_the_workers_options_fast_and_without_a_traceback(tmp_path):
    """``python -m dynamo.vllm --help | head``: the worker's options come first, flushed; once
    the reader has hung up, vLLM is not imported for a list nobody reads (it was 9 s of imports,
    then a BrokenPipeError traceback)."""
    import subprocess
    import sys

    errors = tmp_path / "help.err"
    with open(errors, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "dynamo.vllm", "--help"],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # like head -1
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    assert first.startswith(b"usage: python -m dynamo.vllm")
    stderr = errors.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if "|" in line]
    assert "vllm" not in imported, "vLLM was imported for a help nobody reads"


@pytest.mark.vllm
def test_the_workers_reasoning_parser_is_the_engines_as_vllm_serve_makes_it():
    """vllm serve's --reasoning-parser reaches the engine's structured-output configuration, so
    a forced call's grammar waits for the reasoning to end; --dyn-reasoning-parser does the
    same (issue 37), alone or beside vLLM's own flag naming the same parser."""
    for argv in (
        ["--dyn-reasoning-parser", "qwen3"],
        ["--dyn-reasoning-parser", "qwen3", "--reasoning-parser", "qwen3"],
    ):
        args = _engine_args("--model", "/m", *argv)
        assert args.reasoning_parser == "qwen3"
        assert args.create_structured_outputs_config().reasoning_parser == "qwen3"
    assert not _engine_args("--model", "/m").reasoning_parser
    # vLLM's own flag alone stays vLLM's (the frontend then parses no reasoning of the card's).
    assert _engine_args("--model", "/m", "--reasoning-parser", "qwen3").reasoning_parser == "qwen3"


@pytest.mark.vllm
def test_vllms_reasoning_parser_naming_another_is_refused_naming_both():
    with pytest.raises(EngineUnavailable) as refused:
        _engine_args(
            "--model", "/m", "--dyn-reasoning-parser", "qwen3", "--reasoning-parser", "deepseek_r1"
        )
    message = str(refused.value)
    assert "--dyn-reasoning-parser / DYN_REASONING_PARSER" in message
    assert "'qwen3'" in message and "--reasoning-parser is 'deepseek_r1'" in message


@pytest.mark.vllm
def test_where_the_grammar_starts_reaches_vllms_generate_only_with_a_grammar():
    from dynamo.runtime.sampling import SamplingOptions, StructuredOutputs
    from dynamo.vllm.vllm_sampling import generate_kwargs

    regex = StructuredOutputs(regex="a+")
    assert generate_kwargs(SamplingOptions(max_tokens=1)) == {}
    assert generate_kwargs(SamplingOptions(max_tokens=1, structured_outputs=regex)) == {}
    for value in (True, False):
        options = SamplingOptions(max_tokens=1, structured_outputs=regex, reasoning_ended=value)
        assert generate_kwargs(options) == {"reasoning_ended": value}
    assert generate_kwargs(SamplingOptions(max_tokens=1, reasoning_ended=True)) == {}
