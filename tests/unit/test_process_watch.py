"""The event-loop watch on child processes' sentinels (dynamo.vllm.process_watch)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal

import pytest

from dynamo.vllm.process_watch import ProcessExit, describe_exit, first_exit

CONTEXT = multiprocessing.get_context("spawn")


def _wait_forever(ready) -> None:
    ready.set()
    signal.pause()


def _exit_with(code: int) -> None:
    os._exit(code)


@pytest.mark.parametrize(
    ("exitcode", "words"),
    [
        (None, "died (exit status not yet known)"),
        (0, "exited with code 0"),
        (3, "exited with code 3"),
        (-9, "was killed by signal SIGKILL (9)"),
        (-11, "was killed by signal SIGSEGV (11)"),
        (-200, "was killed by signal signal 200 (200)"),
    ],
)
def test_describe_exit(exitcode, words):
    assert describe_exit(exitcode) == words


def test_a_killed_process_is_noticed_without_polling():
    async def scenario():
        # Both events stay referenced here until both children have set them: Process.start()
        # drops its args, and a spawn-context Event finalized in the parent unlinks its named
        # semaphore, so a child that unpickles it later dies with FileNotFoundError (exit 1).
        first_ready, second_ready = CONTEXT.Event(), CONTEXT.Event()
        first = CONTEXT.Process(target=_wait_forever, args=(first_ready,), daemon=True)
        second = CONTEXT.Process(target=_wait_forever, args=(second_ready,), daemon=True)
        first.start()
        second.start()
        try:
            for ready in (first_ready, second_ready):
                assert await asyncio.to_thread(ready.wait, 30), "a child did not start"
            watch = asyncio.ensure_future(first_exit([("first", first), ("second", second)]))
            await asyncio.sleep(0)
            assert not watch.done()
            os.kill(second.pid, signal.SIGKILL)
            return second.pid, await asyncio.wait_for(watch, 30)
        finally:
            for process in (first, second):
                process.kill()
                process.join(5)

    pid, ended = asyncio.run(scenario())
    assert ended == ProcessExit("second", pid, -signal.SIGKILL)
    assert ended.describe() == f"second (pid {pid}) was killed by signal SIGKILL (9)"


def test_a_process_that_exits_with_a_code_is_reported_with_it():
    async def scenario():
        process = CONTEXT.Process(target=_exit_with, args=(7,), daemon=True)
        process.start()
        return process.pid, await asyncio.wait_for(first_exit([("child", process)]), 30)

    pid, ended = asyncio.run(scenario())
    assert ended == ProcessExit("child", pid, 7)


def test_a_watch_needs_started_processes():
    with pytest.raises(ValueError):
        asyncio.run(first_exit([]))
    unstarted = CONTEXT.Process(target=_exit_with, args=(0,))
    with pytest.raises(ValueError):
        asyncio.run(first_exit([("unstarted", unstarted)]))
