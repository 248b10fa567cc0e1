"""Signals before the event loop (dynamo.common.startup_signals) and a signal during vLLM's
engine init (dynamo.vllm.engine_init): one line, no traceback, nothing left running."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest

from dynamo.common import startup_signals
from dynamo.vllm import engine_init
from dynamo_gc import startup_stop
from dynamo_gc.startup_stop import StartupInterrupted


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_loop_raises_startup_interrupted(signum):
    before = {s: signal.getsignal(s) for s in startup_stop.STOP_SIGNALS}
    with pytest.raises(StartupInterrupted) as caught:
        with startup_stop.interrupting_startup():
            os.kill(os.getpid(), signum)
            signal.sigtimedwait([], 0)  # a pending handler runs at the next bytecode anyway
    assert caught.value.signame == signal.Signals(signum).name
    assert isinstance(caught.value, KeyboardInterrupt)  # Ctrl-C clean-up code runs for both
    assert {s: signal.getsignal(s) for s in startup_stop.STOP_SIGNALS} == before
    assert startup_stop.received() == signal.Signals(signum).name  # recorded, not only raised


def test_handlers_are_left_alone_outside_the_main_thread():
    seen = []

    def run() -> None:
        with startup_stop.interrupting_startup():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [before]


def test_the_report_is_one_log_line_and_exit_0(caplog):
    logger = logging.getLogger("dynamo.test_startup_signals")
    root = logging.getLogger()
    caplog.set_level(logging.INFO)
    assert root.handlers  # caplog's handler: logging is configured
    assert startup_signals.report_interrupted(logger, StartupInterrupted("SIGTERM")) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "Received SIGTERM during start-up: stopped before anything started"
    ]


def test_before_logging_is_configured_the_report_goes_to_stderr(capsys, mocker):
    mocker.patch.object(logging.getLogger(), "handlers", [])
    logger = logging.getLogger("dynamo.test_startup_signals")
    assert startup_signals.report_interrupted(logger, KeyboardInterrupt()) == 0
    assert capsys.readouterr().err == (
        "Received SIGINT during start-up: stopped before anything started\n"
    )


@pytest.mark.parametrize("module", ["dynamo.frontend", "dynamo.vllm"])
def test_a_launcher_stopped_before_its_loop_logs_one_line(module, tmp_path):
    """A real launcher, interrupted while it parses (SIGTERM to itself from its own parse, the
    earliest point main() runs): exit 0, one line, no traceback."""
    script = (
        "import os, signal, sys\n"
        f"from {module}.main import main\n"
        f"import {module}.main as launcher\n"
        "real_parse = (launcher.frontend_args if hasattr(launcher, 'frontend_args') "
        "else launcher.backend_args).parse_args\n"
        "def parse(argv):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real_parse(argv)\n"
        "(launcher.frontend_args if hasattr(launcher, 'frontend_args') "
        "else launcher.backend_args).parse_args = parse\n"
        "sys.exit(main([]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "Received SIGTERM during start-up: stopped before anything started\n"


# -- engine init ---------------------------------------------------------------------------


def _start_sleeping_child(started: threading.Event, stop: threading.Event) -> str:
    """An init that starts a child process and waits on it, as vLLM's waits on EngineCore's
    handshake: it fails once the child is gone."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    started.set()
    child.wait()
    if stop.is_set():
        return "finished after the stop"
    raise RuntimeError(f"the child ended with {child.returncode}")


def test_abandoning_an_init_stops_its_processes_and_ends_it():
    started, stop = threading.Event(), threading.Event()

    async def scenario() -> tuple[object, BaseException | None]:
        spared = engine_init.child_pids()
        init = engine_init.run_in_init_thread(
            lambda: _start_sleeping_child(started, stop), on_orphan=lambda _: None
        )
        await asyncio.to_thread(started.wait, 60)
        new = engine_init.child_pids() - spared
        assert len(new) == 1
        result = await engine_init.abandon_init(init, spared)
        assert not any(psutil.pid_exists(pid) for pid in new)
        assert init.done()  # ended by the stop, not left running at the deadline
        return result, init.exception()

    result, failure = asyncio.run(scenario())
    assert result is None  # the init failed because of the stop: nothing to shut down
    assert "the child ended with -9" in str(failure)  # SIGKILL


def sigint_blocked_in(status: str) -> bool:
    blocked = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
    return bool(int(blocked.split()[1], 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
def test_the_inits_processes_never_get_the_terminals_ctrl_c():
    """A process the init starts begins with SIGINT blocked (vLLM's EngineCore printed its own
    KeyboardInterrupt traceback when Ctrl-C reached it during its imports); this process's main
    thread, which acts on Ctrl-C, keeps it."""
    read_status = [sys.executable, "-c", "print(open('/proc/self/status').read())"]

    async def scenario() -> str:
        init = engine_init.run_in_init_thread(
            lambda: subprocess.run(read_status, capture_output=True, text=True, check=True),
            on_orphan=lambda _: None,
        )
        return (await init).stdout

    assert sigint_blocked_in(asyncio.run(scenario()))
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_an_init_that_finished_meanwhile_hands_its_engine_over():
    async def scenario() -> object:
        init = engine_init.run_in_init_thread(lambda: "engine", on_orphan=lambda _: None)
        await asyncio.wait_for(asyncio.shield(init), 60)
        return await engine_init.abandon_init(init, engine_init.child_pids())

    assert asyncio.run(scenario()) == "engine"


def test_an_init_ending_after_the_loop_releases_its_result():
    release, orphaned = threading.Event(), []

    def create() -> str:
        release.wait(60)
        return "engine"

    done = threading.Event()

    def on_orphan(engine: object) -> None:
        orphaned.append(engine)
        done.set()

    async def scenario() -> None:
        engine_init.run_in_init_thread(create, on_orphan=on_orphan)

    asyncio.run(scenario())  # the loop closes with the init still running
    release.set()
    assert done.wait(60)
    assert orphaned == ["engine"]


def test_a_process_orphaned_during_the_init_is_still_stopped(tmp_path):
    """EngineCore starts its workers, then is killed: its worker must not escape the stop."""
    pid_file = tmp_path / "grandchild.pid"
    spawn_grandchild = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
    )  # and exits at once: the grandchild is an orphan
    stop = threading.Event()

    def create() -> None:
        subprocess.run([sys.executable, "-c", spawn_grandchild], check=True)
        stop.wait(60)

    from tests.support import wait_until

    async def scenario() -> int:
        with engine_init.adopting_orphans():
            spared = engine_init.child_pids()
            init = engine_init.run_in_init_thread(create, on_orphan=lambda _: None)
            await asyncio.to_thread(lambda: wait_for_file(pid_file))
            grandchild = int(pid_file.read_text())
            # Adopted, not init's: once its parent has exited it is this process's child. Waited
            # for, not read once: the file is written before that parent exits, and a scan of
            # /proc that reads the grandchild while its parent lives and the parent after it
            # was reaped sees the grandchild under neither (pids wrap: it can be the lower one).
            await asyncio.to_thread(
                lambda: wait_until(
                    lambda: grandchild in engine_init.child_pids(),
                    deadline_s=60,
                    what=f"process {grandchild} adopted by this process",
                )
            )
            abandoning = asyncio.ensure_future(engine_init.abandon_init(init, spared))
            await asyncio.to_thread(lambda: wait_gone(grandchild))
            stop.set()  # the init ends too
            assert await abandoning is None
            return grandchild

    grandchild = asyncio.run(scenario())
    # Adopted, so this process reaps it: killed by SIGKILL.
    _, status = os.waitpid(grandchild, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def wait_for_file(path) -> None:
    from tests.support import wait_until

    wait_until(lambda: path.exists() and path.read_text(), deadline_s=60, what=str(path))


def wait_gone(pid: int) -> None:
    from tests.support import wait_until

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(gone, deadline_s=60, what=f"process {pid} to be killed")


def test_a_normal_exit_raises_system_exit():
    assert not startup_signals.was_stopped_during_startup()
    with pytest.raises(SystemExit) as exc:
        startup_signals.exit_process(3)
    assert exc.value.code == 3


def test_after_a_stop_during_start_up_the_process_exits_at_once(tmp_path):
    """The atexit callbacks run and the output is flushed; the interpreter's teardown does not
    (a finaliser that would print at teardown prints nothing)."""
    script = (
        "import atexit, sys\n"
        "from dynamo.common import startup_signals\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "class Finalised:\n"
        "    def __del__(self):\n"
        "        print('torn down')\n"
        "keep = Finalised()\n"
        "print('buffered', end='')\n"
        "startup_signals.stopped_during_startup()\n"
        "startup_signals.exit_process(0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "bufferedatexit ran\n"
