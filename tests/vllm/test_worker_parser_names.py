"""With ``--engine vllm`` the worker checks ``--dyn-tool-call-parser`` /
``--dyn-reasoning-parser`` against vLLM's own registries (ToolParserManager,
ReasoningParserManager) before anything starts: an unknown name is exit 2 naming the option
and listing vLLM's names."""

from __future__ import annotations

import pytest

from dynamo.vllm import backend_args, engine_factory
from dynamo.vllm.engine import EngineUnavailable

pytestmark = pytest.mark.vllm


def config(*args: str):
    return backend_args.parse_args(["--engine", "vllm", "--model", "some-model", *args], env={})


@pytest.mark.parametrize(
    ("flag", "env", "known"),
    [
        ("--dyn-tool-call-parser", "DYN_TOOL_CALL_PARSER", "hermes"),
        ("--dyn-reasoning-parser", "DYN_REASONING_PARSER", "deepseek_r1"),
    ],
)
def test_a_name_vllm_lacks_is_refused_listing_vllms_names(flag, env, known):
    engine_factory._import_vllm()
    with pytest.raises(EngineUnavailable) as refused:
        engine_factory._check_vllm_parsers(config(flag, "qwen99"))
    message = str(refused.value)
    assert f"{flag} / {env}" in message and "'qwen99'" in message and known in message
    engine_factory._check_vllm_parsers(config(flag, known))  # vLLM's own name passes
