"""``scripts/icebox.py`` (``./dev.sh icebox``): the icebox pair comes up, prints a curl command
that works, streams both logs, stops cleanly on SIGTERM, and fails loudly when a child dies."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import wait_until
from tests.support.pair import CLIENT_TIMEOUT_S, expected_content, request
from tests.support.processes import pid_alive

pytestmark = pytest.mark.integration

ICEBOX = Path(__file__).resolve().parents[2] / "scripts" / "icebox.py"
README = ICEBOX.parents[1] / "README.md"
README_URL = "http://127.0.0.1:8000"  # the icebox's default port, as the README says
README_CURL = re.compile(
    r"^curl -s http://127\.0\.0\.1:8000/v1/chat/completions .*?\}'$", re.M | re.S
)
BANNER = re.compile(
    r"frontend (http://127\.0\.0\.1:\d+) \(pid (\d+)\), worker model (\S+) \(pid (\d+)\)"
)


class Icebox:
    def __init__(self, log_dir: Path) -> None:
        self.log_path = log_dir / "icebox.out"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(ICEBOX), "--port", "0"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(self) -> re.Match:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"icebox exited with {self.proc.returncode}:\n{self.output()}")
            return "Ctrl-C stops both" in self.output() and BANNER.search(self.output())

        return wait_until(ready, deadline_s=120, what="the icebox pair to be ready")

    def curl_argv(self) -> list[str]:
        line = next(text for text in self.output().splitlines() if text.strip().startswith("curl "))
        return shlex.split(line)

    def wait_exit(self, deadline_s: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"icebox did not exit:\n{self.output()}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.wait_exit()
        self._log.close()


@pytest.fixture
def icebox(tmp_path):
    box = Icebox(tmp_path)
    yield box
    box.close()


def test_icebox_prints_a_working_curl_command_and_stops_cleanly(icebox):
    banner = icebox.wait_ready()
    url, frontend_pid, model, worker_pid = banner.groups()
    assert model == "icebox-mock"
    output = icebox.output()
    assert "GC heap frozen (frontend)" in output and "GC heap frozen (vllm worker)" in output
    assert re.search(r"logs: \S+frontend\.log and \S+worker\.log", output)

    argv = icebox.curl_argv()
    assert argv[0] == "curl" and argv[2] == url + "/v1/chat/completions"
    body = json.loads(argv[argv.index("-d") + 1])
    if shutil.which("curl"):
        completed = subprocess.run(argv, capture_output=True, timeout=CLIENT_TIMEOUT_S, check=True)
        answer = json.loads(completed.stdout)
    else:  # the same request the printed command sends
        status, answer = request("POST", argv[2], body)
        assert status == 200
    assert answer["choices"][0]["message"]["content"] == expected_content(body)

    # The README's example request, sent as written, answers what the README says it does.
    readme = README.read_text(encoding="utf-8")
    example = shlex.split(README_CURL.search(readme).group(0))
    assert example[2].startswith(README_URL), example[2]
    body = json.loads(example[example.index("-d") + 1])
    status, answer = request("POST", url + example[2][len(README_URL) :], body)
    assert status == 200, answer
    content = answer["choices"][0]["message"]["content"]
    assert content == expected_content(body) and answer["choices"][0]["finish_reason"] == "stop"
    assert f'`"content": {json.dumps(content)}`' in readme, content

    icebox.proc.send_signal(signal.SIGTERM)
    assert icebox.wait_exit() == 0
    output = icebox.output()
    assert "[frontend]" in output and "[worker]" in output
    assert "exit codes: {'frontend': 0, 'worker': 0}" in output
    assert not pid_alive(int(frontend_pid)) and not pid_alive(int(worker_pid))


def test_icebox_exits_nonzero_with_the_last_lines_when_a_child_dies(icebox):
    _, frontend_pid, _, worker_pid = icebox.wait_ready().groups()
    os.kill(int(worker_pid), signal.SIGKILL)
    assert icebox.wait_exit() == 1
    output = icebox.output()
    assert f"the worker exited on its own with code {-signal.SIGKILL}" in output
    assert re.search(r"last lines of \S+worker\.log:\n(  .*\n)*  .*Model registered", output)
    assert not pid_alive(int(frontend_pid))


def test_a_closed_terminal_sighup_stops_the_pair(icebox):
    _, frontend_pid, _, worker_pid = icebox.wait_ready().groups()
    icebox.proc.send_signal(signal.SIGHUP)
    assert icebox.wait_exit() == 0
    output = icebox.output()
    assert "exit codes: {'frontend': 0, 'worker': 0}" in output and "Traceback" not in output
    assert not pid_alive(int(frontend_pid)) and not pid_alive(int(worker_pid))


def test_a_killed_icebox_takes_its_children_with_it(icebox):
    _, frontend_pid, _, worker_pid = icebox.wait_ready().groups()
    icebox.proc.kill()  # no handler runs: the kernel signals the children (PR_SET_PDEATHSIG)
    icebox.wait_exit()
    for pid in (frontend_pid, worker_pid):
        wait_until(lambda pid=pid: not pid_alive(int(pid)), deadline_s=60, what=f"pid {pid} gone")


def test_an_output_pipe_closed_by_its_reader_stops_the_pair_without_a_traceback(tmp_path):
    """``./dev.sh icebox | head``: once head has its lines and exits, the pair stops (it held
    the port before) and no BrokenPipeError traceback is printed."""
    errors = tmp_path / "icebox.err"
    with open(errors, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(ICEBOX), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    try:
        assert proc.stdout is not None
        seen = []
        for raw in proc.stdout:  # like head: read up to the banner's pids, then hang up
            seen.append(raw.decode("utf-8", errors="replace"))
            banner = BANNER.search(seen[-1])
            if banner is not None:
                break
        assert banner is not None, "".join(seen)
        _, frontend_pid, _, worker_pid = banner.groups()
        proc.stdout.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in errors.read_text(encoding="utf-8", errors="replace")
    assert not pid_alive(int(frontend_pid)) and not pid_alive(int(worker_pid))


def test_a_busy_port_names_the_iceboxs_own_option():
    """The icebox's option is --port: a taken port must not be reported as the frontend's
    --http-port / DYN_HTTP_PORT, which nobody typed. Exit 2, nothing started."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(ICEBOX), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    assert result.returncode == 2, result.stderr
    assert f"--port {port}: 127.0.0.1:{port} cannot be used" in result.stderr
    assert "choose another --port (0 picks a free one)" in result.stderr
    assert "http-port" not in result.stderr and "DYN_HTTP_PORT" not in result.stderr
    assert "starting the icebox pair" not in result.stdout + result.stderr
