"""Rank processes: vLLM-style extension injection, lockstep RPC, errors, cancellation, shutdown."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import time

import pytest

from dynamo.vllm import ranks
from dynamo.vllm.ranks import RankError, RankGroup, inject_worker_extension
from dynamo.vllm.worker_extension import QUALNAME, FpmGcWorkerExtension

EXTENSION_CALLS = [
    "fpm_gc_maintain",
    "fpm_gc_pause_log",
    "fpm_gc_report",
    "fpm_gc_start",
    "fpm_gc_state",
    "fpm_gc_stop",
]


class WorkerBase:
    pass


def fresh_worker_class(**attrs) -> type:
    # A new class per test: injection changes the class it is given, as vLLM's does.
    return type("Worker", (WorkerBase,), {"execute_model": lambda self: "stepped", **attrs})


def test_injection_appends_the_extension_to_the_bases_like_vllm():
    worker_class = fresh_worker_class()
    calls = inject_worker_extension(worker_class, QUALNAME)
    assert calls == EXTENSION_CALLS
    assert worker_class.__bases__ == (WorkerBase, FpmGcWorkerExtension)
    worker = worker_class()
    assert worker.execute_model() == "stepped"
    assert worker.fpm_gc_state()["policy_running"] is False
    # A second injection (another worker of the same process) changes nothing.
    assert inject_worker_extension(worker_class, QUALNAME) == []
    assert worker_class.__bases__ == (WorkerBase, FpmGcWorkerExtension)


def test_injection_refuses_an_extension_that_clashes_with_the_worker():
    worker_class = fresh_worker_class(fpm_gc_state=lambda self: {})
    with pytest.raises(TypeError, match="fpm_gc_state"):
        inject_worker_extension(worker_class, QUALNAME)
    assert worker_class.__bases__ == (WorkerBase,)


@pytest.mark.parametrize(
    ("qualname", "error"),
    [
        ("dynamo.vllm.worker_extension.QUALNAME", TypeError),  # a string, not a class
        ("dynamo.no_such_module.Extension", ModuleNotFoundError),
        ("dynamo.vllm.worker_extension.Missing", AttributeError),
        ("Extension", ValueError),
    ],
)
def test_injection_of_a_bad_name_fails(qualname, error):
    with pytest.raises(error):
        inject_worker_extension(fresh_worker_class(), qualname)


def test_step_time_grows_with_the_point():
    assert ranks.step_time_s(1, 16) < ranks.step_time_s(8, 16) < ranks.step_time_s(8, 2048)


def test_a_step_allocates_cyclic_request_state_and_keeps_some_for_a_few_steps():
    worker = ranks.MockRankWorker(0, 1)
    assert worker.execute_forward(8, 64) == 8
    survivors = worker._in_flight[-1]
    assert len(survivors) == 8 // ranks.SURVIVOR_STRIDE
    assert survivors[0]["state"]["request"] is survivors[0]
    assert len(survivors[0]["block_table"]) == 64 // ranks.BLOCK_TOKENS
    for _ in range(ranks.SURVIVOR_STEPS):
        worker.execute_forward(1, 16)
    assert all(batch is not survivors for batch in worker._in_flight)


async def started_group(size: int, extension: str | None = QUALNAME, **kwargs) -> RankGroup:
    group = RankGroup(size, worker_extension_cls=extension, **kwargs)
    await group.start()
    return group


def test_collective_rpc_runs_on_every_rank_and_returns_by_rank():
    async def scenario():
        group = await started_group(2)
        try:
            pids = await group.collective_rpc("ping")
            steps = await group.collective_rpc("execute_forward", (4, 32))
            states = await group.collective_rpc("fpm_gc_state")
        finally:
            await group.shutdown()
        return group, pids, steps, states

    group, pids, steps, states = asyncio.run(scenario())
    assert pids == group.pids and len(set(pids)) == 2 and os.getpid() not in pids
    assert steps == [4, 4]
    assert [state["pid"] for state in states] == pids


def test_an_exception_in_a_rank_names_the_rank_and_leaves_the_group_usable():
    async def scenario():
        group = await started_group(2)
        try:
            with pytest.raises(RankError) as bad_args:
                await group.collective_rpc("execute_forward", ("eight", 16))
            with pytest.raises(RankError) as no_method:
                await group.collective_rpc("no_such_method")
            return bad_args.value, no_method.value, await group.collective_rpc("ping")
        finally:
            await group.shutdown()

    bad_args, no_method, pids = asyncio.run(scenario())
    assert bad_args.ranks == (0, 1)
    assert "rank 0:" in str(bad_args) and "rank 1:" in str(bad_args)
    assert "TypeError" in str(bad_args)
    assert "AttributeError" in str(no_method) and "no_such_method" in str(no_method)
    assert len(pids) == 2


def test_without_the_extension_its_methods_are_missing():
    async def scenario():
        group = await started_group(1, extension=None)
        try:
            with pytest.raises(RankError, match="fpm_gc_start"):
                await group.collective_rpc("fpm_gc_start")
        finally:
            await group.shutdown()

    asyncio.run(scenario())


def test_a_bad_extension_fails_start_naming_the_rank_and_leaves_no_process():
    group = RankGroup(2, worker_extension_cls="dynamo.no_such_module.Extension")

    async def scenario():
        with pytest.raises(RankError) as failed:
            await group.start()
        return failed.value

    error = asyncio.run(scenario())
    assert error.ranks == (0, 1)
    assert "ModuleNotFoundError" in str(error)
    assert all(not proc.is_alive() for proc in group._procs)


def test_a_dead_rank_is_reported_by_the_next_rpc():
    async def scenario():
        group = await started_group(2)
        try:
            victim = group.pids[1]
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(RankError) as died:
                await group.collective_rpc("ping")
            return died.value
        finally:
            await group.shutdown()

    error = asyncio.run(scenario())
    assert error.ranks == (1,)
    assert "was killed by signal SIGKILL (9)" in str(error)


def test_the_watch_names_the_rank_that_dies_while_nothing_calls_the_ranks():
    async def scenario():
        group = await started_group(2)
        try:
            watch = asyncio.ensure_future(group.watch())
            await asyncio.sleep(0)  # the watch is armed; nothing has died
            assert not watch.done()
            victim = group.pids[0]
            os.kill(victim, signal.SIGKILL)
            ended = await asyncio.wait_for(watch, 10)
            # Level-triggered: a second watch returns at once for the rank already gone.
            again = await asyncio.wait_for(group.watch(), 10)
            return victim, ended, again
        finally:
            await group.shutdown()

    victim, ended, again = asyncio.run(scenario())
    assert (ended.label, ended.pid, ended.exitcode) == ("rank 0", victim, -signal.SIGKILL)
    assert ended.describe() == f"rank 0 (pid {victim}) was killed by signal SIGKILL (9)"
    assert again == ended


def test_a_cancelled_watch_leaves_no_reader_and_shutdown_ends_the_ranks_quietly():
    async def scenario():
        group = await started_group(2)
        loop = asyncio.get_running_loop()
        sentinels = [proc.sentinel for proc in group._procs]
        watch = asyncio.ensure_future(group.watch())
        await asyncio.sleep(0)
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch
        # No reader left: adding one again would replace it silently; remove_reader says.
        assert not any(loop.remove_reader(fd) for fd in sentinels)
        await group.shutdown()

    asyncio.run(scenario())


def test_a_cancelled_rpc_does_not_hand_its_reply_to_the_next_call():
    async def scenario():
        group = await started_group(2)
        try:

            async def cancelled_step():
                # Cancelled at its first suspension, after the message reached every rank.
                asyncio.current_task().cancel()
                await group.collective_rpc("execute_forward", (5, 16))

            with pytest.raises(asyncio.CancelledError):
                await asyncio.ensure_future(cancelled_step())
            assert group._pending  # the ranks still owe the cancelled call's replies
            return group.pids, await group.collective_rpc("ping")
        finally:
            await group.shutdown()

    pids, answer = asyncio.run(scenario())
    assert answer == pids  # not [5, 5], the cancelled step's late reply


def test_shutdown_is_idempotent_and_the_group_refuses_calls_after_it():
    async def scenario():
        group = await started_group(2)
        await group.shutdown()
        await group.shutdown()
        with pytest.raises(RuntimeError):
            await group.collective_rpc("ping")
        return group

    group = asyncio.run(scenario())
    assert [proc.exitcode for proc in group._procs] == [0, 0]


class SlowExitExtension:
    """Loaded into the ranks by qualified name: makes one rank slow to exit once told to."""

    rank: int  # set by the rank's worker class, which this extension is mixed into

    def exit_slowly(self, rank: int, seconds: float) -> None:
        if self.rank == rank:
            # Simulated slow teardown (an engine freeing its caches), not synchronisation.
            atexit.register(time.sleep, seconds)


SLOW_EXIT = f"{__name__}.SlowExitExtension"


def test_shutdown_kills_only_the_stuck_rank_and_gives_an_exiting_one_its_own_deadline(caplog):
    """Rank 0 is stuck (stopped); rank 1 takes the shutdown but needs longer than the deadline
    to exit. Only rank 0 is killed: rank 1's exit does not depend on what rank 0 used up."""
    caplog.set_level(logging.WARNING, logger="dynamo.vllm.ranks")
    deadline_s = 1.0

    async def scenario():
        group = await started_group(2, SLOW_EXIT, shutdown_deadline_s=deadline_s)
        await group.collective_rpc("exit_slowly", (1, deadline_s * 1.5))
        os.kill(group.pids[0], signal.SIGSTOP)  # a rank stuck in a step: it cannot answer
        await group.shutdown()
        return group

    group = asyncio.run(scenario())
    assert group._procs[0].exitcode == -signal.SIGKILL
    assert group._procs[1].exitcode == 0
    assert f"Rank process {group.pids[0]} did not exit in time" in caplog.text
    assert str(group.pids[1]) not in caplog.text


@pytest.mark.parametrize("text", ["inf", "nan", "-1", "0.5", "abc"])
def test_a_rank_with_a_bad_interval_env_warns_and_uses_the_default(monkeypatch, capfd, text):
    monkeypatch.setenv("DYN_FPM_GC_POLICY", "freeze")
    monkeypatch.setenv("DYN_FPM_GC_FREEZE_INTERVAL_S", text)

    async def scenario():
        group = await started_group(1)
        try:
            started = await group.collective_rpc("fpm_gc_start")
            states = await group.collective_rpc("fpm_gc_state")
            stopped = await group.collective_rpc("fpm_gc_stop")
            after = await group.collective_rpc("fpm_gc_state")
        finally:
            await group.shutdown()
        return started, states, stopped, after

    started, states, stopped, after = asyncio.run(scenario())
    assert started == [True] and stopped == [None]  # upstream's return types
    assert not after[0]["policy_running"]
    assert states[0]["policy_running"] and states[0]["interval_s"] == 60.0
    assert f"Ignoring DYN_FPM_GC_FREEZE_INTERVAL_S={text!r}" in capfd.readouterr().err


def test_a_rank_whose_env_turns_the_policy_off_does_not_start_it(monkeypatch, capfd):
    monkeypatch.setenv("DYN_FPM_GC_POLICY", "off")

    async def scenario():
        group = await started_group(1)
        try:
            return (
                await group.collective_rpc("fpm_gc_start"),
                await group.collective_rpc("fpm_gc_state"),
            )
        finally:
            await group.shutdown()

    started, states = asyncio.run(scenario())
    assert started == [False]
    assert states[0]["policy_running"] is False
    assert "GC policy not started" in capfd.readouterr().err
