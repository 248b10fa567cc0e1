"""The ai-dynamo examples (docs/deploy/ai-dynamo/, docs/ai-dynamo.md) use only names that exist.

Their frontends run upstream's program (``python -m dynamo.frontend``) or the adapter's launcher
(``python -m dynamo_gc.frontend``), their vLLM workers the adapter's launcher
(``python -m dynamo_gc.vllm``, never upstream's ``dynamo.vllm``, which would not freeze): each
DYN_* env var is one of that program's options (and its value is one the adapter accepts), or one
of upstream's own names listed below. An upstream frontend that is meant to freeze names the
``gc-freeze`` extension. Every ``pip install`` they
show brings the distribution's requirements (pyproject.toml), which ``dynamo_gc`` imports.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import tomllib
import yaml

from dynamo_gc import mocker as upstream_mocker
from dynamo_gc import vllm as upstream_vllm
from dynamo_gc.configuration.values import parse_bool_word
from dynamo_gc.upstream import frontend_settings, worker_settings

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
    "DYN_VLLM_HEADLESS": "dynamo/vllm/backend_args.py: --headless",
    "DYN_FPM_GC_POLICY": "dynamo/vllm/gc_policy.py: the self-benchmark's GC policy (freeze)",
}
# The worker adapters' env vars, from their declarations (python -m dynamo_gc.vllm / .mocker).
WORKER_ENV_VARS = {
    option.env_var
    for surface in (upstream_vllm.SURFACE, upstream_mocker.SURFACE)
    for option in surface.options
}
PYPROJECT = REPO / "pyproject.toml"
PROGRAMS = ("dynamo.frontend", "dynamo_gc.frontend")
VLLM_WORKER = "dynamo_gc.vllm"
UPSTREAM_VLLM_WORKER = "dynamo.vllm"
DYN_NAME = re.compile(r"\bDYN_[A-Z0-9_]*[A-Z0-9]\b")


def ours() -> dict:
    return {option.env_var: option for option in frontend_settings.SURFACE.options}


def services() -> list[tuple[str, list[str], dict[str, str]]]:
    """Every service of the examples: where, its command line (command, then args), its env."""
    found = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            for name, service in document["spec"]["services"].items():
                container = service["extraPodSpec"]["mainContainer"]
                command = [*container.get("command", []), *container.get("args", [])]
                env = {e["name"]: str(e["value"]) for e in service.get("envs", [])}
                found.append((f"{path.name} {name}", [str(word) for word in command], env))
    return found


def module_run(command: list[str]) -> tuple[str, list[str]] | None:
    """``python3 -m MODULE ARGS`` as ``(MODULE, ARGS)``; ``None`` for another command."""
    if len(command) >= 3 and command[0].startswith("python") and command[1] == "-m":
        return command[2], command[3:]
    return None


def frontend_services() -> list[tuple[str, str, dict[str, str]]]:
    found = []
    for where, command, env in services():
        run = module_run(command)
        if run is not None and run[0] in PROGRAMS:
            found.append((where, run[0], env))
    return found


def vllm_worker_services() -> list[tuple[str, list[str], dict[str, str]]]:
    """The examples' vLLM workers: ``(where, upstream's arguments, env)``."""
    found = []
    for where, command, env in services():
        run = module_run(command)
        if run is not None and run[0] == VLLM_WORKER:
            found.append((where, run[1], env))
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


def test_there_is_an_ai_dynamo_vllm_worker_example_and_it_runs_the_adapter():
    assert vllm_worker_services()
    for where, command, _ in services():
        run = module_run(command)
        # upstream's own worker command has no hook: that worker would never be frozen
        assert run is None or run[0] != UPSTREAM_VLLM_WORKER, where


@pytest.mark.parametrize(
    ("where", "upstream_args", "env"), vllm_worker_services(), ids=lambda v: str(v)[:40]
)
def test_every_worker_env_var_is_the_adapters_and_its_value_is_accepted(where, upstream_args, env):
    declared = {option.env_var for option in upstream_vllm.SURFACE.options}
    assert {"DYN_VLLM_FREEZE_GC_HEAP", "DYN_VLLM_GC_PAUSE_LOG_MS"} <= set(env), where
    for name in env:
        assert name in declared or name in UPSTREAM_ENV_VARS, (
            f"{where}: {name} is neither the vLLM adapter's nor upstream's"
        )
    # the real parser, as python -m dynamo_gc.vllm reads its command line and env
    config, rest = worker_settings.split_args(
        upstream_vllm.SURFACE, upstream_args, {k: v for k, v in env.items() if k in declared}
    )
    assert rest == upstream_args, f"{where}: the adapter would take some of upstream's arguments"
    assert config.gc.freeze_gc_heap is parse_bool_word(env["DYN_VLLM_FREEZE_GC_HEAP"])


def test_the_page_names_only_env_vars_that_exist():
    known = set(ours()) | set(UPSTREAM_ENV_VARS) | WORKER_ENV_VARS
    unknown = set(DYN_NAME.findall(PAGE.read_text(encoding="utf-8"))) - known
    assert not unknown, f"{PAGE}: env vars nothing declares: {sorted(unknown)}"


PIP_INSTALL = re.compile(r"\bpip3? install\b")
UPSTREAM_DISTRIBUTIONS = {"ai-dynamo", "ai-dynamo-runtime"}


def documented_installs() -> list[tuple[str, list[str]]]:
    """Every ``pip install`` the page's code blocks and the examples' image recipes (YAML comment
    lines) show, as ``(where, its arguments)``: each one installs this distribution."""
    found = []
    sources = [(PAGE, "```")] + [(path, None) for path in sorted(DEPLOY.glob("*.yaml"))]
    for path, fence in sources:
        in_code = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            text = line.strip()
            if fence is not None and text.startswith(fence):
                in_code = not in_code
                continue
            if fence is None:
                if not text.startswith("#"):
                    continue
                text = text.lstrip("#").strip()
            elif not in_code:
                continue
            match = PIP_INSTALL.search(text)
            if match is None:
                continue
            words = shlex.split(text[match.end() :], comments=True)
            found.append((f"{path.name}:{number}", words))
    return found


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_requirements() -> set[str]:
    """The names of the dynamo-gc distribution's requirements, as pyproject.toml declares them."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    assert project["name"] == "dynamo-gc"
    names = set()
    for requirement in project["dependencies"]:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert name is not None, requirement
        names.add(normalized(name.group(0)))
    return names


def test_the_page_and_every_example_show_how_to_install_the_add_on():
    where = {place.split(":")[0] for place, _ in documented_installs()}
    assert PAGE.name in where
    assert {path.name for path in DEPLOY.glob("*.yaml")} <= where


@pytest.mark.parametrize(("where", "words"), documented_installs(), ids=lambda v: str(v)[:40])
def test_every_documented_install_brings_the_distributions_requirements(where, words):
    # dynamo_gc imports them, and upstream's images do not all have them (ConfigArgParse is in
    # none): an install without them leaves the frontend failing on the extension's import.
    requirements = distribution_requirements()
    assert requirements, "pyproject.toml declares no requirements: this check checks nothing"
    if "--no-deps" not in words:
        return  # pip resolves the requirements itself
    named = {
        normalized(re.match(r"[A-Za-z0-9._-]*", word).group(0))  # type: ignore[union-attr]
        for word in words
        if not word.startswith("-")
    }
    if named <= UPSTREAM_DISTRIBUTIONS:
        return  # ai-dynamo's own install (its route on the page, its repair), not this one
    missing = requirements - named
    assert not missing, f"{where}: pip install {' '.join(words)} leaves out {missing}"
