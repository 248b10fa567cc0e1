"""Start the real launchers as child processes on loopback, and wait on what they log.

Synchronisation is always "wait for a condition, with a deadline": a log line appearing, a
process exiting, a file appearing. Never a fixed sleep.

For any test that needs the real programs: :func:`start_worker` (``python -m dynamo.vllm``
registering one model in a discovery directory), :func:`start_frontend` (``python -m
dynamo.frontend`` on 127.0.0.1, an ephemeral port, watching that directory) and
:func:`listening_url` (the URL a launcher logged it listens on).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

DEFAULT_DEADLINE_S = 60.0
MAKE_TINY_MODEL = Path(__file__).resolve().parents[2] / "scripts" / "make_tiny_model.py"
POLL_S = 0.02


def wait_until(condition: Callable[[], object], *, deadline_s: float, what: str):
    """Return ``condition()``'s first truthy value, or fail after ``deadline_s`` seconds."""
    end = time.monotonic() + deadline_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {deadline_s:.0f}s waiting for {what}")
        time.sleep(POLL_S)  # polling interval of a condition wait, not a synchronisation sleep


class LauncherProcess:
    """One ``python -m <module>`` child with its combined output in a log file."""

    def __init__(
        self,
        name: str,
        module: str,
        args: Sequence[str],
        *,
        log_dir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = Path(log_dir) / f"{name}.log"
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        self._log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_for_log(self, pattern: str, *, deadline_s: float = DEFAULT_DEADLINE_S) -> re.Match:
        regex = re.compile(pattern)

        def found():
            match = regex.search(self.log())
            if match is None and self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited with {self.proc.returncode} before logging "
                    f"{pattern!r}; its log:\n{self.log()}"
                )
            return match

        return wait_until(found, deadline_s=deadline_s, what=f"{self.name} to log {pattern!r}")

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log()))

    def signal(self, signum: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def wait_exit(self, deadline_s: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit within {deadline_s}s:\n{self.log()}")

    def stop(self, deadline_s: float = 15.0) -> int | None:
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


# The line the frontend logs once its listener is open (dynamo.frontend.main).
LISTENING_LINE = r"HTTP service listening on (http://127\.0\.0\.1:\d+)"


def tiny_tokenizer_dir() -> str:
    """The tiny model's tokenizer directory (scripts/make_tiny_model.py --tokenizer-only, built
    once per machine with ``tokenizers`` alone, then cached): the mock worker's ``--model``."""
    global _tiny_tokenizer_dir
    if _tiny_tokenizer_dir is None:
        spec = importlib.util.spec_from_file_location("make_tiny_model", MAKE_TINY_MODEL)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out = os.environ.get("DYNAMO_TINY_TOKENIZER_DIR") or module.DEFAULT_TOKENIZER_OUT
        _tiny_tokenizer_dir = str(module.build(Path(out), tokenizer_only=True))
    return _tiny_tokenizer_dir


_tiny_tokenizer_dir: str | None = None


def mock_worker_env() -> dict[str, str]:
    """The env that makes ``python -m dynamo.vllm`` the mock engine on the tiny tokenizer."""
    return {"DYN_VLLM_ENGINE": "mock", "DYN_VLLM_MODEL": tiny_tokenizer_dir()}


def start_worker(
    name: str,
    log_dir: Path,
    discovery_dir: Path,
    model: str,
    *args: str,
    env: dict[str, str] | None = None,
) -> LauncherProcess:
    """``python -m dynamo.vllm --engine mock --model <tiny tokenizer> --served-model-name MODEL
    --discovery-dir DIR *args``, its output in ``log_dir/<name>.log``."""
    return LauncherProcess(
        name,
        "dynamo.vllm",
        ["--engine", "mock", "--model", tiny_tokenizer_dir(), "--served-model-name", model,
         "--discovery-dir", str(discovery_dir), *args],
        log_dir=log_dir,
        env=env,
    )  # fmt: skip


def start_frontend(
    name: str,
    log_dir: Path,
    discovery_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
) -> LauncherProcess:
    """``python -m dynamo.frontend`` on 127.0.0.1, port 0 (see :func:`listening_url`)."""
    return LauncherProcess(
        name,
        "dynamo.frontend",
        ["--http-host", "127.0.0.1", "--http-port", "0", "--discovery-dir", str(discovery_dir),
         *args],
        log_dir=log_dir,
        env=env,
    )  # fmt: skip


def listening_url(
    process: LauncherProcess,
    pattern: str = LISTENING_LINE,
    *,
    deadline_s: float = DEFAULT_DEADLINE_S,
) -> str:
    """The base URL ``process`` logged it listens on: the first group of ``pattern`` (by default
    the frontend's line; pass e.g. the worker's system-server line for its port)."""
    return process.wait_for_log(pattern, deadline_s=deadline_s).group(1)
