"""A launcher run as a child process, its output in a log file, and the wait with a deadline.

The one copy of both, for the benchmark scripts (serving_pair.py starts the serving A/B's pairs
with it, self_benchmark_sweep.py its sweeping workers) and for the tests (tests/support imports
it; pytest puts scripts/ on ``sys.path``, as the scripts do for each other).

Synchronisation is always "wait for a condition, with a deadline": a log line appearing, a
process exiting, an answer over HTTP. Never a fixed sleep: :func:`wait_until` (and its form for
a running event loop, :func:`wait_until_async`) polls the condition and fails with a message
naming what it waited for.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Generic, TypeVar, cast

POLL_S = 0.01  # the polling interval of a condition wait, not a synchronisation sleep
LOG_DEADLINE_S = 60.0
STOP_DEADLINE_S = 15.0
CTRL_C = signal.SIGINT  # what a terminal sends its foreground process group

T = TypeVar("T")


class _Attempts(Generic[T]):
    """The contract both waits share: try the condition, keep its first truthy value, and
    raise ``TimeoutError`` once a falsy try comes after the deadline."""

    def __init__(self, condition: Callable[[], T | None], deadline_s: float, what: str | None):
        self.condition = condition
        self.deadline_s = deadline_s
        self.what = what
        self.end = time.monotonic() + deadline_s
        self.value: T | None = None

    def succeeded(self) -> bool:
        self.value = self.condition()
        if self.value:
            return True
        if time.monotonic() > self.end:
            raise TimeoutError(f"timed out after {self.deadline_s:g} s waiting for {self._what()}")
        return False

    def _what(self) -> str:
        if self.what is not None:
            return self.what
        code = getattr(self.condition, "__code__", None)
        if code is None:
            return repr(self.condition)
        return (
            f"{self.condition.__qualname__} ({Path(code.co_filename).name}:{code.co_firstlineno})"
        )


def wait_until(
    condition: Callable[[], T | None],
    *,
    deadline_s: float,
    what: str | None = None,
    poll_s: float = POLL_S,
) -> T:
    """Return ``condition()``'s first truthy value; raise ``TimeoutError`` (naming ``what``, by
    default the condition's own name and line) once ``deadline_s`` seconds have passed.

    The condition is always tried once more after the deadline, so a slow poll never fails a
    condition that came true meanwhile; an exception it raises ends the wait at once.
    """
    attempts = _Attempts(condition, deadline_s, what)
    while not attempts.succeeded():
        time.sleep(poll_s)  # the polling interval (see POLL_S)
    return cast(T, attempts.value)  # truthy, so not None


async def wait_until_async(
    condition: Callable[[], T | None],
    *,
    deadline_s: float,
    what: str | None = None,
    poll_s: float = POLL_S,
) -> T:
    """:func:`wait_until` on the running event loop: the loop runs between two polls."""
    attempts = _Attempts(condition, deadline_s, what)
    while not attempts.succeeded():
        await asyncio.sleep(poll_s)  # the polling interval (see POLL_S)
    return cast(T, attempts.value)  # truthy, so not None


def free_port() -> int:
    """A loopback port free now (another process may take it before it is bound again)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LauncherProcess:
    """``python -m MODULE ARGS`` as a child, its output (stdout and stderr) in ``<name>.log``.

    ``env`` is added to this process's environment. ``launch`` runs the module through a script
    instead of ``-m`` (``python LAUNCH MODULE ARGS``: scripts/bench_launch.py); ``python`` is the
    interpreter (another virtual environment's, for the real vLLM engine). ``new_session``
    makes the child the leader of a process group of its own, which :meth:`signal_group`
    signals as a terminal's Ctrl-C does (the child and every process it started).
    """

    def __init__(
        self,
        name: str,
        module: str,
        args: Sequence[str],
        *,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        launch: Path | None = None,
        cwd: Path | None = None,
        new_session: bool = False,
    ) -> None:
        self.name = name
        self.log_path = Path(log_dir) / f"{name}.log"
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        runner = [str(launch)] if launch is not None else ["-m"]
        self._log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [python, *runner, module, *args],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            cwd=cwd,
            start_new_session=new_session,
        )
        self._own_group = new_session

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_bytes(self, start: int = 0, end: int | None = None) -> bytes:
        """The log's bytes from ``start`` (a :meth:`log_size` taken earlier) to ``end``."""
        with open(self.log_path, "rb") as handle:
            handle.seek(start)
            return handle.read() if end is None else handle.read(end - start)

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log()))

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` with the end of the log if the process has exited."""
        if self.proc.poll() is not None:
            tail = self.log_bytes()[-3000:].decode(errors="replace")
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def wait_for_log(
        self, pattern: str, *, deadline_s: float = LOG_DEADLINE_S, poll_s: float = POLL_S
    ) -> re.Match:
        """The first match of ``pattern`` in the log; fails at once if the process exits first
        (a long log is better read less often: ``poll_s``)."""
        regex = re.compile(pattern)

        def found() -> re.Match | None:
            match = regex.search(self.log())
            if match is None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before logging "
                    f"{pattern!r}; its log:\n{self.log()}"
                )
            return match

        return wait_until(
            found, deadline_s=deadline_s, what=f"{self.name} to log {pattern!r}", poll_s=poll_s
        )

    def stopped_or_logged(self, pattern: str | re.Pattern, *, deadline_s: float) -> re.Match | None:
        """Wait until the process exits or logs ``pattern`` (whichever comes first: a test of a
        stop fails at once when the process goes on to what the stop should have prevented),
        then :meth:`stop` it; the match, or None when it exited without logging it."""
        regex = re.compile(pattern)
        try:
            wait_until(
                lambda: self.proc.poll() is not None or regex.search(self.log()),
                deadline_s=deadline_s,
                what=f"{self.name} to exit (or log {regex.pattern!r})",
            )
        finally:
            self.stop()
        return regex.search(self.log())

    def signal(self, signum: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def signal_group(self, signum: int = CTRL_C) -> None:
        """``signum`` to the child's whole process group, as a terminal sends Ctrl-C (only for
        a child started with ``new_session``: the group is otherwise the caller's own)."""
        if not self._own_group:
            raise RuntimeError(f"{self.name} shares its caller's process group")
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signum)

    def wait_exit(self, deadline_s: float = 30.0) -> int:
        """The exit code; ``TimeoutError`` with the log if the process is still running."""
        try:
            return self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(
                f"{self.name} did not exit within {deadline_s:g} s:\n{self.log()}"
            ) from None

    def exit_code(self, deadline_s: float = 30.0) -> int:
        """:meth:`wait_exit` for a process that must end on its own, then :meth:`stop` (which
        closes the log, and ends a process still running past the deadline)."""
        try:
            return self.wait_exit(deadline_s)
        finally:
            self.stop()

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> int | None:
        """SIGTERM, then SIGKILL after the deadline; always closes the log file."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=deadline_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=deadline_s)
            return self.proc.returncode
        finally:
            self._log_file.close()
