"""Which words the worker's single "engine died" line uses when vLLM and the process watch race.

A killed EngineCore is noticed twice: by the worker's watch on the process's sentinel and by a
request that meets vLLM's EngineDeadError ("EngineCore encountered an issue. See stack trace").
Whichever comes first, the line names how the process ended when it did end (the signal), and
vLLM's words only when the core lives on. The process here is a real child killed with SIGKILL;
the object around it has the attributes through which the worker finds vLLM's EngineCore
processes (the whole engine dying is tests/vllm/test_vllm_engine_death.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import time
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm


def _sleep_forever() -> None:
    while True:
        time.sleep(60)


def _engine_shape(process) -> SimpleNamespace:
    return SimpleNamespace(
        engine_core=SimpleNamespace(
            resources=SimpleNamespace(engine_manager=SimpleNamespace(processes=[process]))
        )
    )


@pytest.fixture
def core():
    process = multiprocessing.get_context("spawn").Process(
        target=_sleep_forever, name="EngineCore_DP0", daemon=True
    )
    process.start()
    yield process
    process.kill()
    process.join(30)


def _engine_around(process):
    from dynamo.vllm.vllm_engine import VllmEngine

    engine = VllmEngine.__new__(VllmEngine)  # no vLLM engine: only what wait_until_dead reads
    engine._engine = _engine_shape(process)
    engine._reported_dead = asyncio.Event()
    engine._dead_reason = ""
    return engine


def test_vllm_reporting_first_still_names_the_signal_that_killed_the_core(core):
    async def scenario() -> str:
        engine = _engine_around(core)
        waiting = asyncio.ensure_future(engine.wait_until_dead())
        await asyncio.sleep(0)  # the worker is waiting before anything dies
        # vLLM's client notices first: a request meets EngineDeadError...
        engine._report_dead("EngineCore encountered an issue. See stack trace (above)")
        # ...and the core's end reaches the worker a moment later.
        core.kill()
        return await waiting

    reason = asyncio.run(scenario())
    assert reason == (
        f"vLLM's EngineCore_DP0 process (pid {core.pid}) was killed by signal "
        f"SIGKILL ({signal.SIGKILL.value}) while serving"
    )


def test_a_core_that_lives_on_is_reported_in_vllms_words(core):
    async def scenario() -> str:
        engine = _engine_around(core)
        engine._report_dead("EngineCore encountered an issue")
        return await engine.wait_until_dead()

    reason = asyncio.run(scenario())
    assert (
        reason
        == "vLLM's engine reported itself dead while serving: EngineCore encountered an issue"
    )
    assert core.is_alive()
