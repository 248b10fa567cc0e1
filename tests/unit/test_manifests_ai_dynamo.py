"""The ai-dynamo examples (docs/deploy/ai-dynamo/, docs/ai-dynamo.md) use only names that exist.

Their programs are upstream's (``python -m dynamo.frontend``) or the adapter's launcher
(``python -m dynamo_gc.frontend``): each DYN_* env var is one of the adapter's options (and its
value is one the adapter accepts), or one of upstream's own names listed below. An upstream
frontend that is meant to freeze names the ``gc-freeze`` extension.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dynamo_gc import mocker as upstream_mocker
from dynamo_gc import vllm as upstream_vllm
from dynamo_gc.configuration.values import parse_bool_word
from dynamo_gc.upstream import frontend_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy" / "ai-dynamo"
PAGE = REPO / "docs" / "ai-dynamo.md"

# ai-dynamo 1.6.1's own env vars that the examples and the page name, each with where it is read.
UPSTREAM_ENV_VARS = {
    "DYN_FRONTEND_ROUTE_EXTENSIONS": "dynamo/frontend/frontend_args.py: --frontend-route-extension",
    "DYN_HTTP_PORT": "dynamo/frontend/frontend_args.py: --http-port",
    "DYN_DISCOVERY_BACKEND": "dynamo/frontend/frontend_args.py: --discovery-backend",
    "DYN_FILE_KV": "the runtime's file discovery backend: where its records live",
    "DYN_TCP_RPC_HOST": "the runtime's TCP request plane: the address it binds and advertises",
    "DYN_TCP_RESPONSE_STREAM_HOST": "the runtime's TCP response stream: the same for responses",
    "DYN_EVENT_PLANE_HOST": "the runtime's event plane: the same for events",
    "DYN_SDK_DISABLE_ANSI_LOGGING": "the runtime's logging: plain text instead of colours",
    "DYN_LOG": "the runtime's log level",
}
# The worker adapters' env vars, from their declarations (python -m dynamo_gc.vllm / .mocker).
WORKER_ENV_VARS = {
    option.env_var
    for surface in (upstream_vllm.SURFACE, upstream_mocker.SURFACE)
    for option in surface.options
}
PROGRAMS = ("dynamo.frontend", "dynamo_gc.frontend")
DYN_NAME = re.compile(r"\bDYN_[A-Z0-9_]*[A-Z0-9]\b")


def ours() -> dict:
    return {option.env_var: option for option in frontend_settings.SURFACE.options}


def frontend_services() -> list[tuple[str, str, dict[str, str]]]:
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            for name, service in document["spec"]["services"].items():
                container = service["extraPodSpec"]["mainContainer"]
                command = [*container.get("command", []), *container.get("args", [])]
                program = next((w for w in command if w in PROGRAMS), None)
                env = {e["name"]: str(e["value"]) for e in service.get("envs", [])}
                if program is not None:
                    found.append((f"{path.name} {name}", program, env))
    return found


def test_there_is_an_ai_dynamo_frontend_example():
    assert frontend_services()


@pytest.mark.parametrize(
    ("where", "program", "env"), frontend_services(), ids=lambda v: str(v)[:40]
)
def test_every_env_var_exists_and_its_value_is_accepted(where, program, env):
    declared = ours()
    for name, value in env.items():
        if name in UPSTREAM_ENV_VARS:
            continue
        assert name in declared, f"{where}: {name} is neither the adapter's nor upstream's"
        option = declared[name]
        if option.kind is None:
            parse_bool_word(value)
        else:
            option.kind.parse(value)
    # the real parser, as the extension reads them
    frontend_settings.from_env({k: v for k, v in env.items() if k in declared})
    if program == "dynamo.frontend":
        assert "gc-freeze" in env.get("DYN_FRONTEND_ROUTE_EXTENSIONS", "").split(), where


def test_the_page_names_only_env_vars_that_exist():
    known = set(ours()) | set(UPSTREAM_ENV_VARS) | WORKER_ENV_VARS
    unknown = set(DYN_NAME.findall(PAGE.read_text(encoding="utf-8"))) - known
    assert not unknown, f"{PAGE}: env vars nothing declares: {sorted(unknown)}"
