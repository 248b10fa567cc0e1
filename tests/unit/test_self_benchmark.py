"""Self-benchmark configuration: sweep, summary, options, worker extension resolution."""

from __future__ import annotations

import asyncio
import json

import pytest

from dynamo.vllm import backend_args, self_benchmark, self_benchmark_hooks
from dynamo.vllm.mock_engine import MockEngine
from dynamo.vllm.self_benchmark import PointResult, PointWriter, benchmark_points, summarize
from dynamo.vllm.self_benchmark_hooks import (
    WorkerExtensionConflict,
    check_worker_extension,
    resolve_worker_extension,
)
from dynamo.vllm.worker_extension import QUALNAME, FpmGcWorkerExtension
from tests.support.tiny_model import mock_worker_env


class PolicyAwareExtension(FpmGcWorkerExtension):
    """A user extension that keeps the policy's methods (accepted)."""

    def my_call(self) -> str:
        return "mine"


class UnrelatedExtension:
    """A user extension without the policy (a conflict when the policy is on)."""

    def my_call(self) -> str:
        return "mine"


def config_for(*argv: str, env: dict[str, str] | None = None):
    return backend_args.parse_args(
        ["--discovery-dir", "/nonexistent", *argv], env={**mock_worker_env(), **(env or {})}
    )


BENCH_FREEZE = ("--self-benchmark-points", "10", "--fpm-gc-policy", "freeze")


def test_points_are_deterministic_and_cover_the_grid():
    grid = len(self_benchmark.BATCH_SIZES) * len(self_benchmark.SEQ_LENS)
    points = benchmark_points(2 * grid + 5)
    assert points == benchmark_points(2 * grid + 5)
    assert points != benchmark_points(2 * grid + 5, seed=1)
    assert len(points) == 2 * grid + 5
    assert (
        set(points[:grid])
        == set(points[grid : 2 * grid])
        == {(batch, seq) for batch in self_benchmark.BATCH_SIZES for seq in self_benchmark.SEQ_LENS}
    )
    assert benchmark_points(0) == []


@pytest.mark.parametrize(
    "limit, expected",
    [
        (None, self_benchmark.SEQ_LENS),
        (4096, self_benchmark.SEQ_LENS),
        (2048, self_benchmark.SEQ_LENS),
        (255, (16, 32, 64, 128, 255)),
        (256, (16, 32, 64, 128, 256)),
        (16, (16,)),
        (10, (10,)),
    ],
)
def test_sequence_lengths_stop_at_the_engines_longest(limit, expected):
    assert self_benchmark.sequence_lengths(limit) == expected


def test_capped_points_cover_the_capped_grid_and_never_exceed_the_cap():
    lengths = self_benchmark.sequence_lengths(255)
    grid = len(self_benchmark.BATCH_SIZES) * len(lengths)
    points = benchmark_points(grid, max_seq_len=255)
    assert set(points) == {(b, s) for b in self_benchmark.BATCH_SIZES for s in lengths}


class LimitedMockEngine(MockEngine):
    """The real mock engine, with a length limit like vLLM's, recording what it ran."""

    max_seq_len = 100

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[int] = []

    async def forward_pass(self, batch_size: int, seq_len: int) -> None:
        self.ran.append(seq_len)
        await super().forward_pass(batch_size, seq_len)


@pytest.mark.parametrize("engine_class", [LimitedMockEngine, MockEngine])
def test_the_sweep_runs_and_records_lengths_the_engine_takes(tmp_path, engine_class):
    output = tmp_path / "points.jsonl"
    config = config_for("--self-benchmark-points", "40", "--self-benchmark-output", str(output))

    async def scenario():
        engine = engine_class.from_config(config)
        await engine.start()
        try:
            await self_benchmark.run_self_benchmark(engine, config)
        finally:
            await engine.shutdown()
        return engine

    engine = asyncio.run(scenario())
    recorded = [json.loads(line)["seq"] for line in output.read_text().splitlines()]
    assert len(recorded) == 40
    if engine_class is LimitedMockEngine:
        assert recorded == engine.ran  # the JSONL says what ran
        assert max(recorded) == 100 and set(recorded) <= {16, 32, 64, 100}
    else:
        assert max(recorded) > 100  # no limit, no cap


def test_summary_counts_outliers_against_their_own_point():
    results = [
        PointResult(0, 1, 16, 1.0),
        PointResult(1, 1, 16, 1.1),
        PointResult(2, 1, 16, 9.0),  # a pause: 9x its point's median
        PointResult(3, 64, 2048, 20.0),  # big, but not an outlier of its own point
        PointResult(4, 64, 2048, 21.0),
    ]
    summary = summarize(results, gc_policy_name="freeze")
    assert (summary.points, summary.outliers, summary.max_ms) == (5, 1, 21.0)
    assert summary.p50_ms == 9.0
    line = summary.log_line()
    assert "points=5" in line and "outliers=1" in line and "gc_policy=freeze" in line
    assert summarize([], gc_policy_name="off").points == 0


def test_point_writer_writes_one_flushed_json_line_per_point(tmp_path):
    path = tmp_path / "points.jsonl"
    writer = PointWriter(str(path))
    writer.write(PointResult(0, 2, 32, 0.5))
    assert json.loads(path.read_text()) == {"point": 0, "batch": 2, "seq": 32, "wall_ms": 0.5}
    writer.write(PointResult(1, 4, 64, 0.75))
    writer.close()
    assert len(path.read_text().splitlines()) == 2


@pytest.mark.parametrize("text", ["inf", "nan", "-1", "0.5", "abc"])
@pytest.mark.parametrize("where", ["flag", "env"])
def test_a_bad_interval_exits_2_naming_flag_and_env(capsys, text, where):
    argv = ["--fpm-gc-freeze-interval-s", text] if where == "flag" else []
    env = {"DYN_FPM_GC_FREEZE_INTERVAL_S": text} if where == "env" else {}
    with pytest.raises(SystemExit) as exited:
        config_for(*argv, env=env)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--fpm-gc-freeze-interval-s" in err and "DYN_FPM_GC_FREEZE_INTERVAL_S" in err
    assert repr(text) in err


def test_a_bad_policy_exits_2_naming_flag_and_env(capsys):
    with pytest.raises(SystemExit) as exited:
        config_for(env={"DYN_FPM_GC_POLICY": "sometimes"})
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--fpm-gc-policy" in err and "DYN_FPM_GC_POLICY" in err


@pytest.mark.parametrize("text", ["1", "2.5", "60"])
def test_good_intervals_parse(text):
    config = config_for(*BENCH_FREEZE, "--fpm-gc-freeze-interval-s", text)
    assert config.fpm_gc_freeze_interval_s == float(text)


@pytest.mark.parametrize("text", ["Extension", "pkg..Ext", "pkg.1Ext", " "])
def test_a_malformed_extension_name_exits_2(capsys, text):
    with pytest.raises(SystemExit) as exited:
        config_for("--worker-extension-cls", text)
    assert exited.value.code == 2
    assert "--worker-extension-cls" in capsys.readouterr().err


def test_benchmark_with_the_policy_injects_the_extension():
    assert resolve_worker_extension(config_for(*BENCH_FREEZE)) == QUALNAME
    explicit = config_for(*BENCH_FREEZE, "--worker-extension-cls", QUALNAME)
    assert resolve_worker_extension(explicit) == QUALNAME


def test_an_extension_that_subclasses_ours_is_accepted():
    name = f"{__name__}.PolicyAwareExtension"
    config = config_for(*BENCH_FREEZE, "--worker-extension-cls", name)
    assert resolve_worker_extension(config) == name


@pytest.mark.parametrize(
    "name", [f"{__name__}.UnrelatedExtension", "dynamo.no_such_module.Extension"]
)
def test_a_conflicting_extension_exits_2_naming_both_options(capsys, name):
    config = config_for(*BENCH_FREEZE, env={"DYN_VLLM_WORKER_EXTENSION_CLS": name})
    with pytest.raises(WorkerExtensionConflict):
        check_worker_extension(config)
    with pytest.raises(SystemExit) as exited:
        resolve_worker_extension(config)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--worker-extension-cls" in err and name in err
    if "Unrelated" in name:
        assert "--fpm-gc-policy" in err and QUALNAME in err


@pytest.mark.parametrize(
    "argv",
    [
        ("--self-benchmark-points", "10", "--fpm-gc-policy", "off"),
        ("--self-benchmark-points", "0"),
        (),
    ],
)
def test_without_the_policy_the_users_extension_is_left_alone(argv):
    name = f"{__name__}.UnrelatedExtension"
    # The policy set without the self-benchmark: through its env var (a flag would exit 2).
    config = config_for(*argv, "--worker-extension-cls", name, env={"DYN_FPM_GC_POLICY": "freeze"})
    assert resolve_worker_extension(config) == name


def test_the_extension_is_injected_in_both_arms_of_the_benchmark_and_never_outside_it():
    # Policy off: the ranks still load it (their pause logger and heap reports), so an A/B's
    # arms differ in the policy alone.
    off = config_for("--self-benchmark-points", "10", "--fpm-gc-policy", "off")
    assert resolve_worker_extension(off) == QUALNAME
    outside = config_for(env={"DYN_FPM_GC_POLICY": "freeze"})  # a flag would exit 2
    assert resolve_worker_extension(outside) is None
    assert resolve_worker_extension(config_for()) is None


def test_policy_env_is_given_to_the_ranks_in_benchmark_mode_only(monkeypatch):
    config = config_for(*BENCH_FREEZE, "--fpm-gc-freeze-interval-s", "2.5")
    expected = {"DYN_FPM_GC_POLICY": "freeze", "DYN_FPM_GC_FREEZE_INTERVAL_S": "2.5"}
    assert self_benchmark_hooks.policy_env_for(config) == expected
    outside = config_for(env={"DYN_FPM_GC_POLICY": "freeze"})
    assert self_benchmark_hooks.policy_env_for(outside) == {}
    for name in expected:
        monkeypatch.delenv(name, raising=False)
    self_benchmark_hooks.export_policy_env(config)
    import os

    assert {name: os.environ[name] for name in expected} == expected
