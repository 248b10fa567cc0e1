"""A real etcd server for tests: started on loopback (ephemeral ports), with its own data dir.

Debian's ``etcd-server`` package provides ``/usr/bin/etcd`` (3.4); the package starts no daemon,
so each test that needs etcd starts its own through the ``etcd_server`` fixture (tests/conftest.py).
Without a binary the tests are skipped with a reason saying how to install one, unless
``DYNAMO_REQUIRE_ETCD=1`` (set by .ci/run), which turns "missing" into a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

from launcher_process import wait_until

REQUIRE_ETCD_ENV = "DYNAMO_REQUIRE_ETCD"
ETCD_MISSING_REASON = (
    "no etcd binary found (looked for $DYNAMO_ETCD_BINARY, etcd on PATH, /usr/bin/etcd); install "
    "one with `apt-get install -y etcd-server` (Debian/Ubuntu) or from etcd's release page"
)
START_DEADLINE_S = 20.0
# A port picked free (bound, then closed) can be taken by another process before etcd binds it:
# the CI runs other suites on the same machine. A start that fails so is tried again.
BIND_ATTEMPTS = 5
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def find_etcd() -> str | None:
    for candidate in (os.environ.get("DYNAMO_ETCD_BINARY"), shutil.which("etcd"), "/usr/bin/etcd"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _two_free_ports() -> tuple[int, int]:
    """Two distinct ports free now (both held bound while the second is picked)."""
    with socket.socket() as first, socket.socket() as second:
        first.bind(("127.0.0.1", 0))
        second.bind(("127.0.0.1", 0))
        return first.getsockname()[1], second.getsockname()[1]


def _free(*ports: int) -> bool:
    try:
        for port in ports:
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as etcd binds
                sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def _wait_until_free(*ports: int, deadline_s: float = 10.0) -> None:
    """Wait for the ports to be free; past the deadline the next start attempt finds out."""
    try:
        wait_until(lambda: _free(*ports), deadline_s=deadline_s, poll_s=0.1)
    except TimeoutError:
        pass


class _PortTaken(Exception):
    """etcd exited because another process holds one of its ports."""


class EtcdServer:
    """One single-member etcd; :meth:`stop` and :meth:`start` again keep its data and ports."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.data_dir = directory / "etcd-data"
        self.log_path = directory / "etcd.log"
        self.client_port, self.peer_port = _two_free_ports()
        self.proc: subprocess.Popen | None = None
        self.started_once = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        """Start etcd and wait until it is healthy. If a port was taken meanwhile, the first
        start picks new ones; a restart (which must keep its ports: clients know them) waits
        for them to be free again."""
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                self._start_once()
                self.started_once = True
                return
            except _PortTaken:
                if attempt == BIND_ATTEMPTS:
                    raise RuntimeError(
                        f"etcd could not bind its ports {BIND_ATTEMPTS} times:\n{self.log()}"
                    ) from None
                if not self.started_once:
                    self.client_port, self.peer_port = _two_free_ports()
                else:
                    _wait_until_free(self.client_port, self.peer_port)

    def _start_once(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--name",
                "test",
                "--data-dir",
                str(self.data_dir),
                "--listen-client-urls",
                self.url,
                "--advertise-client-urls",
                self.url,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"test={peer}",
                "--log-level",
                "warn",
            ],  # fmt: skip
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        proc = self.proc

        def healthy() -> bool:
            if self.healthy():
                return True
            if proc.poll() is not None:
                if b"address already in use" in self.log_path.read_bytes()[log_offset:]:
                    self.proc = None
                    raise _PortTaken()
                raise RuntimeError(f"etcd exited with {proc.returncode}:\n{self.log()}")
            return False

        try:
            wait_until(healthy, deadline_s=START_DEADLINE_S, poll_s=0.05)
        except TimeoutError:
            raise RuntimeError(
                f"etcd not healthy after {START_DEADLINE_S} s:\n{self.log()}"
            ) from None

    def healthy(self) -> bool:
        try:
            with _opener.open(self.url + "/health", timeout=1) as response:
                return b'"health":"true"' in response.read()
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
