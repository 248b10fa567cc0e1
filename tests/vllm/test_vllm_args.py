"""The worker's options first, every other argument to vLLM's own parser."""

from __future__ import annotations

import pytest

from dynamo.vllm import backend_args
from dynamo.vllm.engine import EngineUnavailable

VLLM_REST = [
    "--max-model-len", "256",
    "--kv-cache-memory-bytes=64M",
    "--enforce-eager",
    "--seed", "-1",
    "--served-model-name", "tiny",
]  # fmt: skip


def test_engine_vllm_keeps_unknown_arguments_in_order_for_vllm():
    config = backend_args.parse_args(
        ["--engine", "vllm", VLLM_REST[0], VLLM_REST[1], "--model", "/m", *VLLM_REST[2:]], env={}
    )
    assert config.model == "/m"
    assert config.engine == "vllm"
    assert config.vllm_args == VLLM_REST


def test_engine_vllm_from_env_keeps_unknown_arguments_too():
    config = backend_args.parse_args(["--enforce-eager"], env={"DYN_VLLM_ENGINE": "vllm"})
    assert config.vllm_args == ["--enforce-eager"]


def test_mock_engine_rejects_unknown_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        backend_args.parse_args(["--max-model-len", "256"], env={})
    assert exc.value.code == 2
    assert "unrecognized arguments: --max-model-len 256" in capsys.readouterr().err


def test_mock_engine_has_no_vllm_arguments():
    assert backend_args.parse_args([], env={}).vllm_args == []


@pytest.mark.vllm
def test_vllm_parser_reads_the_rest_with_the_workers_model_and_tp():
    from dynamo.vllm import vllm_engine

    config = backend_args.parse_args(
        ["--engine", "vllm", "--model", "/m", "--tensor-parallel-size", "2", *VLLM_REST], env={}
    )
    args = vllm_engine.engine_args_from_config(
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
    from dynamo.vllm import vllm_engine

    config = backend_args.parse_args(
        ["--engine", "vllm", "--model", "/m", "--tensor-parallel-size", "2", "-tp", "1"], env={}
    )
    assert vllm_engine.engine_args_from_config(config).tensor_parallel_size == 1


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
