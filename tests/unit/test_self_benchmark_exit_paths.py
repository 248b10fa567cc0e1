"""Every exit path of the self-benchmark leaves GC state as it was, here and in each rank.

The engine is the real mock engine with R=2 rank processes; rank state is read in the ranks
themselves (``collective_rpc("fpm_gc_state")``). A thin probe around the engine records the state
at point K (proving the policy did run) and then fails there in the way each test asks.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading

import pytest

from dynamo.vllm import backend_args, self_benchmark, self_benchmark_hooks
from dynamo.vllm.mock_engine import MockEngine
from dynamo.vllm.ranks import RankError
from dynamo.vllm.self_benchmark import run_self_benchmark
from dynamo.vllm.worker_extension import QUALNAME
from dynamo_gc import bench_policy
from tests.support.tiny_model import mock_worker_env

POINTS = 30
FAIL_AT = 12
RANKS = 2
# What "as before" means in a rank: its GC state, not its pid or counters.
# "heap_frozen", not the raw count: 3.12.1 starts with 375 interpreter objects frozen.
RANK_STATE_KEYS = (
    "thresholds",
    "isenabled",
    "heap_frozen",
    "policy_running",
    "freeze_thread_alive",
)
MAIN_THRESHOLDS = (555, 7, 9)
# The rank methods that change GC state (the others only read it or install the pause logger).
POLICY_METHODS = {
    "fpm_gc_start",
    "fpm_gc_stop",
    "fpm_gc_maintain",
}  # custom, so a hard-coded restore would show


class Boom(RuntimeError):
    pass


def main_state() -> dict:
    return {
        "thresholds": gc.get_threshold(),
        "isenabled": gc.isenabled(),
        "heap_frozen": bench_policy.heap_is_frozen(),
        "policy_running": bench_policy.policy_running(),
        "policy_threads": [
            t.name for t in threading.enumerate() if t.name == bench_policy.FREEZE_THREAD_NAME
        ],
    }


def rank_states(states: list[dict]) -> list[dict]:
    return [{key: state[key] for key in RANK_STATE_KEYS} for state in states]


class Probe:
    """The real engine, plus: at point ``at``, record GC state everywhere, then ``fail``."""

    def __init__(self, engine: MockEngine, *, at: int = FAIL_AT, fail: str | None = None) -> None:
        self.engine = engine
        self.at = at
        self.fail = fail
        self.calls = 0
        self.rpc_methods: list[str] = []
        self.main_during: dict | None = None
        self.ranks_during: list[dict] | None = None

    async def collective_rpc(self, method, args=()):
        self.rpc_methods.append(method)
        return await self.engine.collective_rpc(method, args)

    async def forward_pass(self, batch_size: int, seq_len: int) -> None:
        if self.calls == self.at:
            self.main_during = main_state()
            self.ranks_during = await self.engine.collective_rpc("fpm_gc_state")
            if self.fail == "main":
                raise Boom(f"forward pass failed at point {self.at}")
            if self.fail == "rank":
                await self.engine.collective_rpc("execute_forward", ("a batch", seq_len))
            if self.fail == "keyboard":
                raise KeyboardInterrupt
            if self.fail == "cancel":
                task = asyncio.current_task()
                assert task is not None  # a coroutine of a running task
                task.cancel()  # delivered at the rank step's first await
        self.calls += 1
        await self.engine.forward_pass(batch_size, seq_len)


def benchmark_config(tmp_path, *extra: str):
    # A 1 s freeze interval for the policy, unless it is off (the interval needs the policy on).
    interval = [] if "off" in extra else ["--fpm-gc-freeze-interval-s", "1"]
    return backend_args.parse_args(
        [
            "--discovery-dir",
            str(tmp_path / "discovery"),
            "--self-benchmark-points",
            str(POINTS),
            "--self-benchmark-output",
            str(tmp_path / "points.jsonl"),
            "--tensor-parallel-size",
            str(RANKS),
            *interval,
            *extra,
        ],
        env=mock_worker_env(),
    )


def run_benchmark(config, monkeypatch, *, fail: str | None = None, at: int = FAIL_AT):
    """Run the benchmark on a fresh R=2 mock engine; GC state before/during/after and outcome."""
    for name, value in self_benchmark_hooks.policy_env_for(config).items():
        monkeypatch.setenv(name, value)
    extension = self_benchmark_hooks.resolve_worker_extension(config)

    async def scenario():
        engine = MockEngine.from_config(config, worker_extension_cls=extension)
        await engine.start()
        try:
            probe = Probe(engine, at=at, fail=fail)
            ranks_before = await engine.collective_rpc("fpm_gc_state")
            main_before = main_state()
            outcome: BaseException | None = None
            try:
                if fail == "cancel":
                    # Its own task, so the cancellation ends that task, not this one.
                    await asyncio.ensure_future(run_self_benchmark(probe, config))
                else:
                    await run_self_benchmark(probe, config)
            except (Exception, KeyboardInterrupt, asyncio.CancelledError) as exc:  # noqa: BLE001 - the outcome under test is whatever the run raised
                outcome = exc
            main_after = main_state()
            ranks_after = await engine.collective_rpc("fpm_gc_state")
            return probe, outcome, (main_before, main_after), (ranks_before, ranks_after)
        finally:
            await engine.shutdown()

    gc.set_threshold(*MAIN_THRESHOLDS)
    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("fail", "raised"),
    [
        (None, type(None)),
        ("main", Boom),
        ("rank", RankError),
        ("keyboard", KeyboardInterrupt),
        ("cancel", asyncio.CancelledError),
    ],
)
def test_every_exit_path_restores_gc_state_here_and_in_each_rank(
    tmp_path, monkeypatch, fail, raised
):
    config = benchmark_config(tmp_path, "--fpm-gc-policy", "freeze", "--no-freeze-gc-heap")
    probe, outcome, (main_before, main_after), (ranks_before, ranks_after) = run_benchmark(
        config, monkeypatch, fail=fail
    )
    assert type(outcome) is raised  # the benchmark's own error propagates

    # The policy did run, here and in every rank (otherwise "restored" would prove nothing).
    assert probe.main_during["policy_running"]
    assert probe.main_during["thresholds"] == (555, 7, bench_policy.GEN2_NEVER)
    assert probe.main_during["policy_threads"] == [bench_policy.FREEZE_THREAD_NAME]
    assert len(probe.ranks_during) == RANKS
    for state in probe.ranks_during:
        assert state["policy_running"] and state["freeze_thread_alive"]
        assert state["thresholds"][2] == bench_policy.GEN2_NEVER
        assert state["freeze_count"] > 0

    assert main_after == main_before
    assert main_after["thresholds"] == MAIN_THRESHOLDS
    assert rank_states(ranks_after) == rank_states(ranks_before)
    assert {state["pid"] for state in ranks_after} == {state["pid"] for state in ranks_before}

    lines = (tmp_path / "points.jsonl").read_text().splitlines()
    assert len(lines) == (POINTS if fail is None else FAIL_AT)  # flushed as it went
    assert [json.loads(line)["point"] for line in lines] == list(range(len(lines)))


def test_success_with_the_serving_freeze_leaves_stock_thresholds_and_a_frozen_heap(
    tmp_path, monkeypatch
):
    config = benchmark_config(tmp_path, "--fpm-gc-policy", "freeze")
    assert config.freeze_gc_heap
    probe, outcome, (main_before, main_after), (ranks_before, ranks_after) = run_benchmark(
        config, monkeypatch
    )
    assert outcome is None
    assert main_after["thresholds"] == MAIN_THRESHOLDS
    assert main_after["heap_frozen"]  # ready for the serving freeze, not a second walk
    assert not main_after["policy_running"] and main_after["policy_threads"] == []
    assert rank_states(ranks_after) == rank_states(ranks_before)


def test_with_the_policy_off_gc_is_never_touched(tmp_path, monkeypatch):
    # The user's extension (ours, to read rank state) is loaded, but the policy never starts.
    config = benchmark_config(
        tmp_path,
        "--fpm-gc-policy",
        "off",
        "--no-freeze-gc-heap",
        "--worker-extension-cls",
        QUALNAME,
    )
    probe, outcome, (main_before, main_after), (ranks_before, ranks_after) = run_benchmark(
        config, monkeypatch
    )
    assert outcome is None
    # Only the diagnostics ran in the ranks (their pause logger, their heap reports).
    assert not POLICY_METHODS & set(probe.rpc_methods), probe.rpc_methods
    assert "fpm_gc_report" in probe.rpc_methods
    assert probe.main_during == main_before
    assert rank_states(probe.ranks_during) == rank_states(ranks_before)
    assert main_after == main_before


def test_long_sweeps_get_untimed_maintain_windows_everywhere(tmp_path, monkeypatch, mocker):
    monkeypatch.setattr(self_benchmark, "MAINTAIN_EVERY_POINTS", 10)
    maintain = mocker.spy(bench_policy, "maintain")
    config = benchmark_config(tmp_path, "--fpm-gc-policy", "freeze", "--no-freeze-gc-heap")
    probe, outcome, _, _ = run_benchmark(config, monkeypatch)
    assert outcome is None
    assert maintain.call_count == (POINTS - 1) // 10
    assert probe.rpc_methods.count("fpm_gc_maintain") == (POINTS - 1) // 10
    policy_calls = [method for method in probe.rpc_methods if method in POLICY_METHODS]
    assert policy_calls[0] == "fpm_gc_start" and policy_calls[-1] == "fpm_gc_stop"
