"""Through the real frontend process and the official ``openai`` client (issues 29 and 37):
models whose chat templates are the issue's bombs (constant folding, a conversation-sized
string, nested ``range`` loops sent six times) or fail (``1 // 0``, a lone surrogate) beside a
healthy model served by a real mock worker. The healthy model answers while the bombs run; each
bomb is a 503 naming its model, each failure the model's 502, never a hang, a 500 or a
traceback, and the frontend logs one WARNING per cause. The ``vllm`` and ``sglang`` processors
run the same check in their own environments (tests/vllm, tests/sglang)."""

from __future__ import annotations

import openai
import pytest

from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support.processes import listening_url, start_frontend
from tests.support.template_bombs import FAILING, check_template_bombs
from tests.support.template_failures import REFUSING
from tests.support.tiny_model import tiny_card, tiny_tokenizer_dir

pytestmark = pytest.mark.integration


def test_template_bombs_through_the_frontend_process(tmp_path):
    check_template_bombs(tmp_path)


def test_failing_templates_without_render_processes_are_502s_without_a_traceback(tmp_path):
    """``--dyn-template-processes 0``: templates render on the frontend's threads, where the
    issue's failures used to be 500s with a traceback each."""
    discovery = tmp_path / "discovery"
    store = DiscoveryStore(discovery)
    for name, source in {**FAILING, "refusing": REFUSING}.items():
        path = tmp_path / f"{name}.jinja"
        path.write_text(source, encoding="utf-8")
        card = tiny_card(tiny_tokenizer_dir(), name, chat_template_path=str(path))
        store.register(ModelRecord(model=name, endpoint="http://127.0.0.1:9", card=card))
    frontend = start_frontend("frontend", tmp_path, discovery, "--dyn-template-processes", "0")
    try:
        url = listening_url(frontend)
        for name in (*FAILING, "refusing"):
            frontend.wait_for_log(rf"Model added: model={name} ")
        http = openai.DefaultHttpx2Client(trust_env=False, timeout=60.0)
        with openai.OpenAI(
            base_url=url + "/v1", api_key="unused", http_client=http, max_retries=0
        ) as api:
            errors = {}
            for name in (*FAILING, "refusing"):
                for _ in range(3):
                    with pytest.raises(openai.APIStatusError) as raised:
                        api.chat.completions.create(
                            model=name, messages=[{"role": "user", "content": "hi"}]
                        )
                    errors.setdefault(name, []).append(raised.value)
    finally:
        code = frontend.stop()
    assert code == 0, frontend.log()
    for name in FAILING:
        for error in errors[name]:
            assert error.status_code == 502 and isinstance(error.body, dict), error
            assert error.body["code"] == "chat_template_failed" and f"`{name}`" in str(error)
    for error in errors["refusing"]:
        assert error.status_code == 400 and isinstance(error.body, dict)
        assert error.body["code"] == "chat_template_error"
    log = frontend.log()
    assert "Traceback" not in log
    assert log.count("-> 502 chat_template_failed") == 1, log
