"""``--dyn-chat-processor vllm``: vLLM's heap is imported before the start-up freeze.

Marked ``vllm`` (needs vLLM in this environment). Where vLLM is missing, the frontend must
exit 2 naming the flag, the env var and what to install: checked here unmarked.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.support.processes import LISTENING_LINE, start_frontend

FROZEN = r"GC heap frozen \(frontend\): collected=\d+ frozen=(\d+)"


@pytest.mark.vllm
@pytest.mark.integration
def test_the_vllm_processor_heap_is_frozen_before_the_listener_opens(tmp_path):
    frontend = start_frontend(
        "frontend", tmp_path, tmp_path / "discovery", "--dyn-chat-processor", "vllm"
    )
    try:
        frontend.wait_for_log(LISTENING_LINE, deadline_s=180)
        log = frontend.log()
    finally:
        assert frontend.stop() == 0
    frozen = re.search(FROZEN, log)
    assert frozen is not None, log
    assert int(frozen.group(1)) > 300_000, frozen.group(0)  # vLLM's import heap, not ~50k
    assert frozen.start() < re.search(LISTENING_LINE, log).start()
    assert "Chat processor vllm: imported vLLM" in log


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_vllm_processor_exits_2_naming_flag_env_var_and_the_fix(tmp_path):
    frontend = start_frontend(
        "frontend", tmp_path, tmp_path / "discovery", env={"DYN_CHAT_PROCESSOR": "vllm"}
    )
    assert frontend.exit_code(60) == 2
    log = frontend.log()
    assert "--dyn-chat-processor / DYN_CHAT_PROCESSOR" in log and "Install vLLM" in log
    assert "Traceback" not in log and "HTTP service listening" not in log
