"""The sglang flags on the real ``main``: bad input is exit 2 naming the flag and env var.

Unmarked tests run everywhere (they stop before anything is imported); the ones marked
``sglang`` need SGLang, whose registries are the source of the parser names.
"""

from __future__ import annotations

import logging

import pytest

from dynamo.common import logging_setup
from dynamo.frontend import main as frontend_main


@pytest.fixture(autouse=True)
def restore_logging():
    """main configures logging before it checks what needs SGLang imported."""
    root = logging.getLogger()
    level = root.level
    yield
    logging_setup.remove_logging_handler()
    root.setLevel(level)


def run_main(tmp_path, *extra: str, env: dict[str, str] | None = None, monkeypatch=None) -> int:
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    return frontend_main.main(
        ["--http-host", "127.0.0.1", "--http-port", "0",
         "--discovery-dir", str(tmp_path / "discovery"), *extra]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("processor", "flag", "value", "label"),
    [
        (
            "hf",
            "--tool-call-parser",
            "qwen25",
            "--tool-call-parser / DYN_FRONTEND_TOOL_CALL_PARSER",
        ),
        ("vllm", "--chat-template", "x.jinja", "--chat-template / DYN_CHAT_TEMPLATE"),
        ("hf", "--chat-template", "x.jinja", "--chat-template / DYN_CHAT_TEMPLATE"),
    ],
)
def test_the_sglang_flags_with_another_processor_exit_2(
    tmp_path, capsys, processor, flag, value, label
):
    code = run_main(tmp_path, "--dyn-chat-processor", processor, flag, value)
    assert code == 2
    err = capsys.readouterr().err
    assert label in err and "--dyn-chat-processor / DYN_CHAT_PROCESSOR sglang" in err
    assert f"{processor!r}" in err


def test_an_env_var_with_the_default_processor_exits_2_too(tmp_path, capsys, monkeypatch):
    env = {"DYN_FRONTEND_REASONING_PARSER": "qwen3"}
    assert run_main(tmp_path, env=env, monkeypatch=monkeypatch) == 2
    err = capsys.readouterr().err
    assert "--reasoning-parser / DYN_FRONTEND_REASONING_PARSER" in err
    # The error names every processor that has parsers, vllm as well as sglang.
    assert "--dyn-chat-processor / DYN_CHAT_PROCESSOR sglang or vllm" in err


@pytest.mark.parametrize("processor", ["hf", "vllm", "sglang"])
def test_the_workers_parser_env_vars_are_not_the_frontends(processor):
    """Issue 29: DYN_TOOL_CALL_PARSER / DYN_REASONING_PARSER are the worker's (upstream's
    names); in an environment shared with workers the frontend neither exits 2 (hf) nor takes
    them as overrides of every model's card (vllm, sglang)."""
    from dynamo.frontend.frontend_args import parse_args

    shared = {"DYN_TOOL_CALL_PARSER": "hermes", "DYN_REASONING_PARSER": "qwen3"}
    config = parse_args(["--dyn-chat-processor", processor], shared)
    assert (config.tool_call_parser, config.reasoning_parser) == (None, None)
    own = {"DYN_FRONTEND_TOOL_CALL_PARSER": "hermes", "DYN_FRONTEND_REASONING_PARSER": "qwen3"}
    config = parse_args(["--dyn-chat-processor", processor], own)
    assert (config.tool_call_parser, config.reasoning_parser) == ("hermes", "qwen3")


@pytest.mark.sglang
@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--tool-call-parser", "qwen99"], {},
         ["--tool-call-parser / DYN_FRONTEND_TOOL_CALL_PARSER", "'qwen99'", "qwen25", "hermes"]),
        ([], {"DYN_FRONTEND_REASONING_PARSER": "nope"},
         ["--reasoning-parser / DYN_FRONTEND_REASONING_PARSER", "'nope'", "deepseek-r1", "qwen3"]),
        (["--tool-call-parser", "response_template"], {},
         ["--tool-call-parser / DYN_FRONTEND_TOOL_CALL_PARSER", "cannot be used here"]),
        (["--chat-template", "chatml"], {},
         ["--chat-template / DYN_CHAT_TEMPLATE", "built-in chat template names"]),
    ],
)  # fmt: skip
def test_bad_sglang_options_exit_2_naming_flag_env_var_and_sglangs_names(
    tmp_path, capsys, monkeypatch, args, env, expected
):
    code = run_main(
        tmp_path, "--dyn-chat-processor", "sglang", *args, env=env, monkeypatch=monkeypatch
    )
    assert code == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err
