"""The operator guide's CPU block, run as written (issue 21, item 2): from the repository's root
to a chat answer from the real vLLM engine on the tiny model, asked with curl and with the
official ``openai`` client.

The block's first line is ``scripts/setup_vllm_env.sh``, which on a made environment checks two
stamp files and prints its python; on a stale one it would install (network), so the test
refuses to run it then. The environment keeps the run on loopback and to itself: a free HTTP
port, a discovery directory of its own (other runs on this machine use the default one), the
hub offline, ``mktemp`` under the test's directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from bench_common import OFFLINE_ENV
from launcher_process import free_port

from tests.support.doc_blocks import REPO, doc_block, run_block

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

# The block's budget: it adds ~1 min to the vLLM suite here (issue 21: at most ~2).
BLOCK_TIMEOUT_S = 600.0


def vllm_env_is_current() -> bool:
    """Whether scripts/setup_vllm_env.sh would only check its stamps (no install)."""
    venv = Path(os.environ.get("VLLM_VENV", REPO / ".venv-vllm"))
    # The script's own stamp: both distributions' pyproject.toml, concatenated, through cksum.
    both = (REPO / "pyproject.toml").read_bytes() + (
        REPO / "components/pyproject.toml"
    ).read_bytes()
    checksum = (
        subprocess.run(["cksum"], input=both, capture_output=True, check=True)
        .stdout.split()[0]
        .decode()
    )
    return (venv / f".project-{checksum}").exists() and any(venv.glob(".vllm-*"))


def test_the_cpu_block_answers_with_curl_and_the_openai_client(tmp_path, capsys):
    if not vllm_env_is_current():
        pytest.fail("run scripts/setup_vllm_env.sh first: the block's first line would install")
    # vLLM's engine talks to its EngineCore over ZMQ IPC sockets in VLLM_RPC_BASE_PATH, by
    # default the temporary directory, and a socket's path has at most 107 characters: the
    # test's own directory can be deeper than that allows (CI's basetemp under the checkout
    # was), so the sockets get a short directory of their own.
    rpc_dir = tempfile.mkdtemp(prefix="rpc-")
    env = {
        **OFFLINE_ENV,
        "HTTP_PORT": str(free_port()),
        "TMPDIR": str(tmp_path),
        "VLLM_RPC_BASE_PATH": rpc_dir,
        "DYN_DISCOVERY_DIR": str(tmp_path / "discovery"),
    }
    started = time.monotonic()
    try:
        result = run_block(doc_block("cpu-real-model"), env=env, timeout_s=BLOCK_TIMEOUT_S)
    finally:
        shutil.rmtree(rpc_dir, ignore_errors=True)
    took_s = time.monotonic() - started
    logs = re.search(r"logs: (\S+)", result.stdout)
    # The block prints where its logs are only at its end; after a failure they are the one
    # mktemp directory under the test's TMPDIR.
    logs_dir = Path(logs.group(1)) if logs else next(tmp_path.glob("tmp.*"), tmp_path)
    worker_log = (logs_dir / "worker.log").read_text() if (logs_dir / "worker.log").exists() else ""
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{worker_log[-4000:]}"
    curl_line, rest = result.stdout.split("\n", 1)  # curl's JSON, then the block's echo
    answer = json.loads(curl_line)
    content = answer["choices"][0]["message"]["content"]
    assert answer["model"] == "my-model" and content, answer
    # Greedy both times: the openai client printed the curl's answer, word for word.
    assert rest == f"{content}\nlogs: {logs.group(1)}\n", result.stdout
    assert re.search(r"KV cache on CPU: .* as neither --kv-cache-memory-bytes", worker_log)
    with capsys.disabled():
        print(f"\nthe operator guide's CPU block ran in {took_s:.0f} s")
