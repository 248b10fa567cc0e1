#!/usr/bin/env python3
"""Start "the icebox pair": one mock worker and one frontend on loopback, GC heaps frozen.

    ./dev.sh icebox                 # frontend on http://127.0.0.1:8000
    ./dev.sh icebox --port 8080     # another port (0 picks a free one)

The worker (``python -m dynamo.vllm --engine mock --model <tiny tokenizer dir>
--served-model-name icebox-mock --mock-heap-objects 200000``) and the frontend (``python -m
dynamo.frontend``) both run with the GC layer on (freeze at their
quiescent start-up point) and log every GC pause of 20 ms or more. The tokenizer directory is the
tiny model's (``scripts/make_tiny_model.py --tokenizer-only``: built with ``tokenizers`` alone,
in a second, on first use, then cached): the mock engine echoes and counts in its vocabulary, and
the frontend reads its tokenizer and chat template from the model card, as for a real model.
They share a private discovery directory under a fresh temp dir, so no other worker on this
machine joins the pair.

Once the frontend lists the model, this prints a ready-to-paste curl command and where the logs
are, then streams both logs prefixed ``[frontend]`` / ``[worker]``. Ctrl-C (or SIGTERM, or SIGHUP
when the terminal closes, or our output closing: ``| head``) stops the frontend, then the
worker, and exits 0, without a traceback; if this script is killed outright, its children get
SIGTERM from the kernel (Linux). If either dies on its own, the other is stopped and this
exits 1 with the dead one's last log lines.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import make_tiny_model  # scripts/ is on sys.path (this script's own directory)

MODEL = "icebox-mock"
HOST = "127.0.0.1"
PAUSE_LOG_MS = "20"
READY_DEADLINE_S = 120.0
STOP_DEADLINE_S = 45.0  # the frontend drains in-flight requests for up to 30 s
LAST_LINES = 30
SIGNAL_POLL_S = 0.2  # how often the main loop looks at the stop flag
LISTENING = re.compile(r"HTTP service listening on (http://\S+)")
FROZEN = re.compile(r"GC heap frozen \(([^)]*)\): .*")

_print_lock = threading.Lock()
# Set when our output was closed (``./dev.sh icebox | head``, a terminal gone): the pair stops.
output_closed = threading.Event()


def say(text: str, stream=sys.stdout) -> None:
    """One line to our output; a closed output stops the echo (and, via the main loop, the
    pair) instead of a BrokenPipeError traceback from each thread that writes."""
    with _print_lock:
        if output_closed.is_set():
            return
        try:
            print(text, file=stream, flush=True)
        except (BrokenPipeError, OSError):
            output_closed.set()
            # Anything still buffered, and the interpreter's flush at exit, go nowhere.
            for target in (sys.stdout, sys.stderr):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, target.fileno())
                os.close(devnull)


def notice_closed_output() -> bool:
    """Whether our output was closed (a pipe's reader gone reports POLLERR on its write end),
    even while no line is being written."""
    if not output_closed.is_set():
        try:
            poller = select.poll()
            poller.register(sys.stdout.fileno(), 0)  # errors and hang-ups are always reported
            if poller.poll(0):
                output_closed.set()
        except (OSError, ValueError, AttributeError):  # no poll here, or no stdout at all
            pass
    return output_closed.is_set()


def die_with_parent() -> None:
    """In the child, before exec (Linux): SIGTERM when this script dies, even by SIGKILL, so
    no way of ending it leaves the pair running and holding its port."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


class Child:
    """One launcher process: its output goes to its log file and, prefixed, to our stdout."""

    def __init__(self, name: str, args: list[str], log_path: Path, exited: threading.Event):
        self.name = name
        self.log_path = log_path
        self.last_lines: collections.deque[str] = collections.deque(maxlen=LAST_LINES)
        self.lines_seen: list[str] = []  # kept until ready, to find the port and freeze lines
        self._keep_lines = True
        self._exited = exited
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            # Own session: Ctrl-C reaches only this script, which stops the pair in order
            # (frontend first, so no request is routed to a worker that is already gone).
            start_new_session=True,
            preexec_fn=die_with_parent,  # only prctl: safe between fork and exec
        )
        self._pump = threading.Thread(target=self._pump_output, name=f"{name}-log", daemon=True)
        self._pump.start()

    def _pump_output(self) -> None:
        stdout = self.proc.stdout
        assert stdout is not None, "the child is started with stdout=PIPE"
        with open(self.log_path, "w", encoding="utf-8") as log:
            for raw in stdout:
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                log.write(line + "\n")
                log.flush()
                self.last_lines.append(line)
                if self._keep_lines:
                    self.lines_seen.append(line)
                say(f"[{self.name}] {line}")
        self.proc.wait()
        self._exited.set()  # EOF: the child exited (or closed its output, which it never does)

    def stop_keeping_lines(self) -> None:
        self._keep_lines = False
        self.lines_seen = []

    def find(self, pattern: re.Pattern) -> list[re.Match]:
        return [m for m in map(pattern.search, list(self.lines_seen)) if m]

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                say(f"[icebox] {self.name} did not stop within {deadline_s:.0f}s: killing it")
                self.proc.kill()
                self.proc.wait()
        self._pump.join(timeout=5)
        return self.proc.returncode


def fetch_models(base_url: str) -> list[str]:
    # No proxy: the pair is on loopback, and a configured HTTP proxy must not see this traffic.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(base_url + "/v1/models", timeout=2) as response:
            return [m["id"] for m in json.load(response)["data"]]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return []


def curl_command(base_url: str, model: str) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello, icebox!"}],
        "max_tokens": 32,
    }
    return (
        f"curl -s {base_url}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-d {shlex.quote(json.dumps(body))}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="./dev.sh icebox", description=__doc__.split("\n\n")[0].strip()
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="frontend port on 127.0.0.1 (0: pick a free one)"
    )
    parser.add_argument(
        "--preprocess-workers",
        type=int,
        default=0,
        help="frontend preprocess worker processes (each freezes its own heap)",
    )
    parser.add_argument(
        "--mock-heap-objects",
        type=int,
        default=200_000,
        help="the mock worker's synthetic start-up heap, in tracked objects",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535")
    if args.preprocess_workers < 0 or args.mock_heap_objects < 0:
        parser.error("--preprocess-workers and --mock-heap-objects must be >= 0")
    problem = port_problem(args.port)
    if problem is not None:
        # Checked here, so the message names this script's option: the frontend's own would
        # name its --http-port / DYN_HTTP_PORT, which nobody typed.
        parser.error(f"--port {args.port}: {problem}; choose another --port (0 picks a free one)")
    return args


def port_problem(port: int) -> str | None:
    """Why the frontend could not listen on ``HOST:port`` (bound as the frontend binds it), or
    None. A port taken between this check and the frontend's bind still fails, in its words."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            return f"{HOST}:{port} cannot be used ({exc.strerror or exc})"
    return None


def main(argv: list[str] | None = None) -> int:
    # Both launchers would refuse to start beside ai-dynamo; say so once, before anything starts.
    from dynamo.common.coexistence import refuse_beside_upstream

    refuse_beside_upstream("icebox")
    args = parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="icebox-"))
    discovery_dir = run_dir / "discovery"
    # The handler only flips a flag: taking a lock (Event.set) in a signal handler can deadlock
    # against the main thread holding that same lock. The main loop polls the flag.
    stop_requested = False
    wake = threading.Event()  # set by a pump thread when its child exits

    def on_signal(signum, frame):
        nonlocal stop_requested
        stop_requested = True

    # SIGHUP: the terminal was closed. Each stops the pair in order, as Ctrl-C does.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)

    def stopping() -> bool:
        return stop_requested or notice_closed_output()

    tokenizer_dir = make_tiny_model.build(
        make_tiny_model.DEFAULT_TOKENIZER_OUT, tokenizer_only=True
    )
    say(f"[icebox] starting the icebox pair in {run_dir} (model: the tokenizer in {tokenizer_dir})")
    worker = Child(
        "worker",
        [
            "dynamo.vllm",
            "--engine", "mock",
            "--model", str(tokenizer_dir),
            "--served-model-name", MODEL,
            "--mock-heap-objects", str(args.mock_heap_objects),
            "--freeze-gc-heap",
            "--gc-pause-log-ms", PAUSE_LOG_MS,
            "--discovery-dir", str(discovery_dir),
        ],
        run_dir / "worker.log",
        wake,
    )  # fmt: skip
    frontend = Child(
        "frontend",
        [
            "dynamo.frontend",
            "--http-host", HOST,
            "--http-port", str(args.port),
            "--discovery-dir", str(discovery_dir),
            "--dyn-preprocess-workers", str(args.preprocess_workers),
            "--dyn-freeze-gc-heap",
            "--dyn-gc-pause-log-ms", PAUSE_LOG_MS,
        ],
        run_dir / "frontend.log",
        wake,
    )  # fmt: skip
    children = [frontend, worker]  # stop order: frontend first

    def stop_all() -> None:
        for child in children:
            child.stop()

    def died() -> Child | None:
        return next((c for c in children if not c.running()), None)

    def report_death(child: Child) -> int:
        code = child.proc.wait()
        say(f"[icebox] the {child.name} exited on its own with code {code}; stopping the pair")
        stop_all()
        lines = "\n".join(f"  {line}" for line in child.last_lines) or "  (no output)"
        say(f"[icebox] last lines of {child.log_path}:\n{lines}", sys.stderr)
        return 1

    # Ready = the frontend logged its address and lists the model (the worker registered).
    base_url = None
    deadline = time.monotonic() + READY_DEADLINE_S
    while True:
        if stopping():
            say("[icebox] stopped before the pair was ready")
            stop_all()
            return 0
        dead = died()
        if dead is not None:
            return report_death(dead)
        if base_url is None:
            found = frontend.find(LISTENING)
            base_url = found[0].group(1) if found else None
        if base_url is not None and MODEL in fetch_models(base_url):
            break
        if time.monotonic() > deadline:
            say(f"[icebox] the pair was not ready within {READY_DEADLINE_S:.0f}s; stopping it")
            stop_all()
            return 1
        wake.wait(SIGNAL_POLL_S)  # poll interval of the readiness check; a death wakes us

    freezes = [m.group(0) for child in children for m in child.find(FROZEN)]
    for child in children:
        child.stop_keeping_lines()
    banner = [
        "",
        "[icebox] ready: the icebox pair is serving",
        f"[icebox]   frontend {base_url} (pid {frontend.proc.pid}), "
        f"worker model {MODEL} (pid {worker.proc.pid})",
        *(f"[icebox]   {line}" for line in freezes),
        "[icebox] send a chat completion (the mock engine echoes the prompt's tokens up to its "
        'first end-of-text token; with "ignore_eos": true it goes on counting through the '
        "vocabulary):",
        "",
        "  " + curl_command(base_url, MODEL),
        "",
        f"[icebox] logs: {frontend.log_path} and {worker.log_path}",
        "[icebox] Ctrl-C stops both",
        "",
    ]
    say("\n".join(banner))

    while not stopping():
        dead = died()
        if dead is not None:
            return report_death(dead)
        wake.wait(SIGNAL_POLL_S)
    say("[icebox] stopping the frontend, then the worker")
    stop_all()
    codes = {child.name: child.proc.returncode for child in children}
    say(f"[icebox] stopped (exit codes: {codes}); logs kept in {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
