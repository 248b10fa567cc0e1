"""Upstream's frontend with ``--dyn-chat-processor vllm``: the process the freeze is for (vLLM's
imports and the processor's set-up put hundreds of thousands of objects on its heap before HTTP
starts). Through the route extension and the launcher; needs vLLM in the upstream environment
(scripts/setup_upstream_env.sh installs it unless ``UPSTREAM_VLLM=0``).

In ai-dynamo 1.6.1 the ``vllm`` processor has no preprocess pool: its ``chat_engine_factory``
refuses ``--dyn-preprocess-workers`` ("Use the sglang processor for worker-pool
preprocessing"), so the pool processes freeze with the ``sglang`` processor only
(tests/unit/test_upstream_preprocess_pool.py covers the wrapper under each start method).
"""

from __future__ import annotations

import pytest

from tests.upstream.frontend_pair import (
    FROZEN,
    HTTP_STARTED,
)
from tests.upstream.needs_vllm import NEEDS_VLLM

pytestmark = [pytest.mark.upstream, pytest.mark.integration, NEEDS_VLLM]

VLLM_ARGS = ["--dyn-chat-processor", "vllm"]
START_DEADLINE_S = 300.0  # vLLM's imports and its model inspection, on a loaded 2-core machine


@pytest.mark.parametrize("way", ["route extension", "launcher"])
def test_the_vllm_processor_frontend_freezes_its_heap_before_http(frontends, way):
    env = {"DYN_DEBUG_GC_ENDPOINT": "1", "DYN_GC_PAUSE_LOG_MS": "50"}
    if way == "route extension":
        frontend = frontends(
            "dynamo.frontend", VLLM_ARGS, {**env, "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze"}
        )
    else:
        frontend = frontends("dynamo_gc.frontend", VLLM_ARGS, env)
    frontend.process.wait_for_log(HTTP_STARTED, deadline_s=START_DEADLINE_S)
    assert 0 <= frontend.position(FROZEN) < frontend.position(HTTP_STARTED)
    frozen_at_start = frontend.debug_gc_state()["frozen_objects"]
    assert frozen_at_start > 100_000  # vLLM's modules, not only upstream's runtime

    # The model registers after HTTP is up: the model watcher's chat_engine_factory builds
    # the per-model state then, unfrozen, and never freezes (the process is serving).
    frontend.wait_model()
    frontend.chat()
    state = frontend.debug_gc_state()
    assert state["phase"] == "serving"
    assert state["frozen_objects"] <= frozen_at_start  # no second freeze added any
    # What stays collectable: the per-model state (about 7k objects with the tiny model)
    # and the requests' garbage, a small fraction of the frozen heap (docs/ai-dynamo.md).
    assert sum(state["generation_objects"]) < frozen_at_start // 10
    assert frontend.process.count(FROZEN) == 1
    assert "freeze refused" not in frontend.process.log()
