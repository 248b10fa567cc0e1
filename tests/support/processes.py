"""The real launchers as child processes on loopback: the one worker starter, the frontend's.

:func:`start_worker` (``python -m dynamo.vllm`` registering one model in a discovery directory:
the mock engine on the tiny tokenizer, or the real vLLM engine on a model directory),
:func:`start_frontend` (``python -m dynamo.frontend`` on 127.0.0.1, an ephemeral port, watching
that directory; optionally with the explicit-collect trace of tests/support/gc_trace) and
:func:`listening_url` (the URL a launcher logged it listens on); :func:`run_python` runs this
interpreter to its end (a module's ``--check`` or ``--help``, a snippet). Each returns the generic
:class:`LauncherProcess` of scripts/launcher_process.py, which any other child can use directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from bench_common import OFFLINE_ENV, VLLM_ARGS
from launcher_process import LOG_DEADLINE_S, LauncherProcess

from tests.support.tiny_model import tiny_tokenizer_dir

# The line the frontend logs once its listener is open (dynamo.frontend.main).
LISTENING_LINE = r"HTTP service listening on (http://127\.0\.0\.1:\d+)"
# A directory whose sitecustomize.py logs every explicit gc.collect() of the process.
GC_TRACE_DIR = Path(__file__).resolve().parent / "gc_trace"
# Runs a launcher with a stop signal sent from inside a finalizer at a chosen start-up step.
FINALIZER_SIGNAL_LAUNCH = Path(__file__).resolve().parent / "finalizer_signal.py"


def start_worker(
    name: str,
    log_dir: Path,
    discovery_dir: Path | None,
    model: str | None,
    *args: str,
    env: Mapping[str, str] | None = None,
    mock_token_ms: float | None = None,
    vllm_model: str | None = None,
    new_session: bool = False,
    launch: Path | None = None,
    python: str = sys.executable,
) -> LauncherProcess:
    """A worker serving ``model`` (``--served-model-name``; ``None``: the engine's default
    name), publishing in ``discovery_dir`` (``None``: no ``--discovery-dir``, as with etcd), its
    output in ``log_dir/<name>.log``; ``args`` come after the starter's own, so they may
    override them.

    By default the mock engine on the tiny tokenizer (``mock_token_ms`` sets its pace). With
    ``vllm_model`` (a model directory) the real vLLM engine, with the small-footprint arguments
    and offline environment of the benchmarks (bench_common.VLLM_ARGS, OFFLINE_ENV).
    ``launch``: a script that runs the module (:class:`LauncherProcess`), e.g.
    :data:`FINALIZER_SIGNAL_LAUNCH`; ``python``: the interpreter (another environment's: the
    vLLM one for a real engine behind a frontend of the SGLang one).
    """
    named = [] if model is None else ["--served-model-name", model]
    directory = [] if discovery_dir is None else ["--discovery-dir", str(discovery_dir)]
    if vllm_model is None:
        pace = [] if mock_token_ms is None else ["--mock-token-ms", f"{mock_token_ms:g}"]
        argv = ["--engine", "mock", "--model", tiny_tokenizer_dir(), *named, *directory,
                *pace, *args]  # fmt: skip
        return LauncherProcess(
            name,
            "dynamo.vllm",
            argv,
            log_dir=log_dir,
            env=env,
            new_session=new_session,
            launch=launch,
        )
    argv = ["--engine", "vllm", "--model", vllm_model, *named, *directory,
            "--request-plane-host", "127.0.0.1", *args, *VLLM_ARGS]  # fmt: skip
    return LauncherProcess(
        name,
        "dynamo.vllm",
        argv,
        log_dir=log_dir,
        env={**OFFLINE_ENV, **(env or {})},
        new_session=new_session,
        launch=launch,
        python=python,
    )


def start_frontend(
    name: str,
    log_dir: Path,
    discovery_dir: Path | None,
    *args: str,
    env: Mapping[str, str] | None = None,
    trace_gc_collect: bool = False,
    new_session: bool = False,
    launch: Path | None = None,
) -> LauncherProcess:
    """``python -m dynamo.frontend`` on 127.0.0.1, port 0 (see :func:`listening_url`).

    ``trace_gc_collect``: the process logs ``explicit gc.collect() called from FILE:LINE`` for
    every explicit collection (tests/support/gc_trace, put first on its ``PYTHONPATH``).
    ``launch``: a script that runs the module (:class:`LauncherProcess`).
    """
    directory = [] if discovery_dir is None else ["--discovery-dir", str(discovery_dir)]
    argv = ["--http-host", "127.0.0.1", "--http-port", "0", *directory, *args]
    child_env = dict(env or {})
    if trace_gc_collect:
        child_env.update(gc_trace_env(child_env))
    return LauncherProcess(
        name,
        "dynamo.frontend",
        argv,
        log_dir=log_dir,
        env=child_env,
        new_session=new_session,
        launch=launch,
    )


def gc_trace_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``PYTHONPATH`` with :data:`GC_TRACE_DIR` first, ahead of the one ``env`` (or this
    process's environment) sets."""
    inherited = (env or {}).get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(GC_TRACE_DIR), inherited) if p)}


def listening_url(
    process: LauncherProcess,
    pattern: str = LISTENING_LINE,
    *,
    deadline_s: float = LOG_DEADLINE_S,
) -> str:
    """The base URL ``process`` logged it listens on: the first group of ``pattern`` (by default
    the frontend's line; pass e.g. the worker's system-server line for its port)."""
    return process.wait_for_log(pattern, deadline_s=deadline_s).group(1)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie still does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_python(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """This interpreter run with ``args`` to its end, its output captured as text and its stdin
    closed (a child that asked for input would fail at once, not wait for the timeout)."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
