"""Ctrl-C and SIGTERM stop a starting worker (and a frontend importing vLLM) within seconds,
in every start-up phase: exit 0, one line saying so, no traceback, no process left behind
(vLLM's EngineCore and its workers included).

Ctrl-C is sent as a terminal sends it, to the launcher's whole process group (vLLM's processes
get it too); SIGTERM to the launcher alone, as Kubernetes sends it. Each test waits for the log
line that marks its phase, then signals. Every process a launcher starts inherits a token in
its environment, which is how a process left behind is found after the launcher has exited.
"""

from __future__ import annotations

import re
import signal
import uuid
from collections.abc import Iterator

import psutil
import pytest

from tests.support import LauncherProcess, wait_until
from tests.support.processes import FINALIZER_SIGNAL_LAUNCH, start_frontend, start_worker

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

# "Within a few seconds": generous for a loaded 2-core machine, far below engine init's 20 s+.
STOP_DEADLINE_S = 10.0
PHASE_DEADLINE_S = 300.0  # how long a phase may take to begin (imports and init on 2 cores)
TOKEN_VAR = "DYNAMO_TEST_STOP_TOKEN"

# The line each phase begins with, in the worker's log.
IMPORTS = r"Worker options: "  # logged just before vLLM is imported
ENGINE_INIT = r"Initializing a V1 LLM engine"  # EngineCore's first line: its process runs
SELF_BENCHMARK = r"Self-benchmark: \d+ points"


def ctrl_c(process: LauncherProcess) -> str:
    process.signal_group(signal.SIGINT)
    return "SIGINT"


def sigterm(process: LauncherProcess) -> str:
    process.signal(signal.SIGTERM)
    return "SIGTERM"


@pytest.fixture
def token() -> Iterator[str]:
    value = uuid.uuid4().hex
    yield value
    for process in processes_with(value):  # a failed test leaves nothing running either
        process.kill()


def processes_with(token: str) -> list[psutil.Process]:
    """The live processes (zombies aside) whose environment carries ``token``."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get(TOKEN_VAR) == token:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def assert_stopped_promptly(process: LauncherProcess, signame: str, token: str) -> None:
    code = process.wait_exit(STOP_DEADLINE_S)  # raises with the log past the deadline
    log = process.log()
    assert code == 0, log
    assert "Traceback" not in log, log
    assert "KeyboardInterrupt" not in log, log
    lines = re.findall(rf"^.*Received {signame} during start-up.*$", log, re.MULTILINE)
    assert len(lines) == 1, log
    after = log[log.index(lines[0]) :]
    # Our lines (``<date> <time> LEVEL pid=N logger: ...``): no WARNING or worse after the stop.
    # vLLM's own shutdown may warn that it force-killed an EngineCore the stop interrupted
    # (its timing, not ours); a traceback anywhere is checked above.
    ours = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) pid=", re.MULTILINE)
    assert ours.search(after) is None, after
    # vLLM's processes never get the terminal's Ctrl-C: the launcher stops them itself.
    assert "trigger received signal=SIGINT" not in log, log
    wait_until(
        lambda: not processes_with(token),
        deadline_s=STOP_DEADLINE_S,
        what="every process of the stopped launcher to end",
    )


def worker(name, tmp_path, tiny_model, token, *args: str) -> LauncherProcess:
    return start_worker(
        name,
        tmp_path,
        tmp_path / "discovery",
        None,
        *args,
        vllm_model=tiny_model,
        env={TOKEN_VAR: token},
        new_session=True,
    )


def test_ctrl_c_during_vllms_import_stops_the_worker(tiny_model, tmp_path, token):
    """(SIGTERM before the event loop takes the same path: tests/unit/test_startup_signals.py.)"""
    process = worker("worker", tmp_path, tiny_model, token)
    try:
        process.wait_for_log(IMPORTS, deadline_s=PHASE_DEADLINE_S)
        assert_stopped_promptly(process, ctrl_c(process), token)
    finally:
        process.stop()


@pytest.mark.parametrize("send", [ctrl_c, sigterm])
def test_a_signal_during_engine_init_stops_the_worker_and_vllms_processes(
    send, tiny_model, tmp_path, token
):
    process = worker("worker", tmp_path, tiny_model, token)
    try:
        process.wait_for_log(ENGINE_INIT, deadline_s=PHASE_DEADLINE_S)
        assert_stopped_promptly(process, send(process), token)
        assert "vLLM AsyncLLM started" not in process.log()  # it was stopped mid-init
    finally:
        process.stop()


def test_a_signal_during_the_self_benchmark_stops_the_worker(tiny_model, tmp_path, token):
    process = worker("worker", tmp_path, tiny_model, token, "--self-benchmark-points", "400")
    try:
        process.wait_for_log(SELF_BENCHMARK, deadline_s=PHASE_DEADLINE_S)
        assert_stopped_promptly(process, ctrl_c(process), token)
        assert "Self-benchmark done" not in process.log()
    finally:
        process.stop()


def vllm_frontend(tmp_path, token: str, **launch) -> LauncherProcess:
    """The frontend with the ``vllm`` chat processor, in a process group of its own; ``launch``:
    ``env`` added to the token's, and ``launch`` (the script that runs it)."""
    env = {TOKEN_VAR: token, **launch.pop("env", {})}
    return start_frontend(
        "frontend", tmp_path, tmp_path / "discovery", "--dyn-chat-processor", "vllm",
        env=env, new_session=True, **launch,
    )  # fmt: skip


def test_a_signal_while_the_frontend_imports_vllm_stops_it(tmp_path, token):
    process = vllm_frontend(tmp_path, token)
    try:
        process.wait_for_log(r"Chat processor vllm: importing", deadline_s=PHASE_DEADLINE_S)
        assert_stopped_promptly(process, ctrl_c(process), token)
        assert "HTTP service listening" not in process.log()
    finally:
        process.stop()


def init_processes(process: LauncherProcess) -> list[psutil.Process]:
    """The processes vLLM's engine init has spawned (EngineCore, before and after it names
    itself), multiprocessing's resource tracker aside."""
    found = []
    for child in psutil.Process(process.pid).children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "resource_tracker" not in command:
            found.append(child)
    return found


def blocks_sigint(pid: int) -> bool:
    """Whether SIGINT is blocked in ``pid``'s main thread (``SigBlk`` in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigBlk:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError(f"no SigBlk line for {pid}")


def test_ctrl_c_as_enginecore_starts_leaves_the_stop_to_the_worker(tiny_model, tmp_path, token):
    """Ctrl-C the moment EngineCore's process exists, while it still imports (before vLLM's
    own handler): it has SIGINT blocked from its first instruction, so the group's Ctrl-C is
    the worker's alone to act on. One line, no EngineCore traceback, nothing left running."""
    process = worker("worker", tmp_path, tiny_model, token)
    try:
        process.wait_for_log(r"Engine init: starting", deadline_s=PHASE_DEADLINE_S)
        spawned = wait_until(
            lambda: init_processes(process),
            deadline_s=PHASE_DEADLINE_S,
            what="vLLM's EngineCore process to be spawned",
        )
        assert all(blocks_sigint(child.pid) for child in spawned)
        assert_stopped_promptly(process, ctrl_c(process), token)
        assert "vLLM AsyncLLM started" not in process.log()
    finally:
        process.stop()


def test_a_signal_lost_in_a_finalizer_while_the_frontend_imports_vllm_stops_it(tmp_path, token):
    """Issue 37's case: the handler's exception is raised inside a finalizer a collection
    runs while the ``vllm`` chat processor is imported, and Python drops it there. The record
    stops the frontend once the import is done: it never listens."""
    process = vllm_frontend(
        tmp_path,
        token,
        env={"FINALIZER_SIGNAL_AT": "dynamo.frontend.main:import_processor_libraries"},
        launch=FINALIZER_SIGNAL_LAUNCH,
    )
    try:
        code = process.wait_exit(PHASE_DEADLINE_S)
        log = process.log()
        assert code == 0, log
        assert "finalizer: sending SIGINT" in log, log
        assert len(re.findall(r"Received SIGINT during start-up", log)) == 1, log
        assert "Chat processor vllm: imported" in log, log  # the import went on, then it stopped
        assert "Traceback" not in log and "Exception ignored" not in log, log
        assert "HTTP service listening" not in log and "GC heap frozen" not in log, log
    finally:
        process.stop()
