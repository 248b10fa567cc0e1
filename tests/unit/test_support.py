"""The shared test helpers themselves (tests/support): the waits' contract, and the explicit-collect
trace reaching a launcher-style log (the pair tests rely on both)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from tests.support import wait_until, wait_until_async
from tests.support.processes import gc_trace_env

# A child that sets up logging as the launchers do (DYN_LOG, our handler), then collects.
LAUNCHER_LIKE = (
    "import gc\n"
    "from dynamo.common import logging_setup\n"
    "logging_setup.configure_logging(logging_setup.log_levels_from_env())\n"
    "gc.collect()\n"
)


def counter(truthy_from: int):
    calls = []

    def condition():
        calls.append(None)
        return len(calls) if len(calls) >= truthy_from else 0

    return condition, calls


def test_wait_until_returns_the_first_truthy_value():
    condition, calls = counter(3)
    assert wait_until(condition, deadline_s=10, poll_s=0) == 3
    assert len(calls) == 3


def test_wait_until_async_returns_the_first_truthy_value_and_lets_the_loop_run():
    async def scenario():
        ticks = []
        ticker = asyncio.get_running_loop().call_soon(ticks.append, "tick")
        value = await wait_until_async(lambda: ticks and len(ticks), deadline_s=10, poll_s=0)
        ticker.cancel()
        return value

    assert asyncio.run(scenario()) == 1


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_wait_past_its_deadline_fails_naming_what_it_waited_for(form):
    def wait(**kwargs):
        if form == "sync":
            return wait_until(lambda: False, deadline_s=0.05, **kwargs)
        return asyncio.run(wait_until_async(lambda: False, deadline_s=0.05, **kwargs))

    with pytest.raises(TimeoutError, match=r"timed out after 0\.05 s waiting for the answer$"):
        wait(what="the answer")
    # Unnamed: the condition's own name and line say which wait it was.
    with pytest.raises(TimeoutError, match=r"waiting for .*<lambda> \(test_support\.py:\d+\)$"):
        wait()


def test_an_error_in_the_condition_ends_the_wait_at_once():
    def broken():
        raise RuntimeError("the process died")

    with pytest.raises(RuntimeError, match="the process died"):
        wait_until(broken, deadline_s=60)


def run_child(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", LAUNCHER_LIKE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_the_gc_trace_logs_each_explicit_collect_in_the_launchers_format():
    child = run_child(gc_trace_env())
    (line,) = [line for line in child.stderr.splitlines() if "explicit gc.collect()" in line]
    assert " INFO pid=" in line and line.endswith("called from <string>:4"), line


def test_without_the_trace_no_collect_is_logged():
    assert "explicit gc.collect()" not in run_child({}).stderr
