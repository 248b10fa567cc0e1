"""The operator guide's how-to blocks, run as written (issue 21, item 6: "every command shown in
the docs is run by a test"). The real-model blocks run in tests/vllm/test_doc_blocks_vllm.py."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from launcher_process import free_port

from tests.support.doc_blocks import activated, doc_block, run_block
from tests.support.etcd_server import ETCD_MISSING_REASON, REQUIRE_ETCD_ENV, find_etcd

pytestmark = pytest.mark.integration


def test_the_etcd_how_to_block_reaches_a_chat_answer_over_etcd(tmp_path):
    """The block starts its own etcd: here on free ports instead of its defaults (other tests,
    and other engineers, share this machine's loopback). Its install line is a no-op here:
    skipped without an etcd binary, failed when CI requires one (as the etcd_server fixture)."""
    if find_etcd() is None:
        if os.environ.get(REQUIRE_ETCD_ENV) == "1":
            pytest.fail(f"{REQUIRE_ETCD_ENV}=1 but {ETCD_MISSING_REASON}")
        pytest.skip(ETCD_MISSING_REASON)
    env = {
        **activated(sys.executable),  # as the block says: the environment ./dev.sh made
        "ETCD_PORT": str(free_port()),
        "ETCD_PEER_PORT": str(free_port()),
        "HTTP_PORT": str(free_port()),
        "TMPDIR": str(tmp_path),  # its mktemp -d: logs and etcd's data, removed with tmp_path
    }
    result = run_block(doc_block("etcd-how-to"), env=env, timeout_s=180)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    answer = json.loads(result.stdout.strip().splitlines()[0])
    message = answer["choices"][0]["message"]
    assert (answer["model"], message["content"]) == ("etcd-demo", "<|user|>\nHello"), answer
    logs = re.search(r"logs: (\S+)", result.stdout).group(1)
    with open(f"{logs}/worker.log", encoding="utf-8") as log:
        worker_log = log.read()
    assert "Discovery: etcd backend" in worker_log and "Model registered:" in worker_log
    assert "Model unregistered:" in worker_log  # stopped before etcd: its lease revoked
