"""Through the real frontend process and the official ``openai`` client (issue 29): models whose
chat templates are the issue's bombs (constant folding, a conversation-sized string, nested
``range`` loops sent six times) beside a healthy model served by a real mock worker. The healthy
model answers while the bombs run; each bomb is a 503 naming its model, never a hang or a
500, and the frontend logs one WARNING per cause. The ``vllm`` and ``sglang`` processors run the
same check in their own environments (tests/vllm, tests/sglang)."""

from __future__ import annotations

import pytest

from tests.support.template_bombs import check_template_bombs

pytestmark = pytest.mark.integration


def test_template_bombs_through_the_frontend_process(tmp_path):
    check_template_bombs(tmp_path)
