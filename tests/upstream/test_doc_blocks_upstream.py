"""docs/ai-dynamo.md's blocks, run as written: installing ai-dynamo and the layer into a fresh
virtual environment, and the one-machine example (upstream's frontend with the ``gc-freeze``
route extension, the mocker through ``python -m dynamo_gc.mocker``, a ``curl``).

The install block downloads nothing new in CI (pip's cache holds what the upstream environment
was just built from) but writes a whole environment (~700 MB, a few minutes): it runs where the
installed ai-dynamo is the release it installs, once per CI run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from launcher_process import free_port
from upstream_pair import loopback_env

from tests.support.doc_blocks import REPO, activated, doc_block, run_block

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

PAGE = REPO / "docs" / "ai-dynamo.md"
FRONTEND_FROZEN = (
    r"GC heap frozen \(upstream frontend, before HTTP admits requests\): collected=\d+ "
    r"frozen=[1-9]\d*"
)
MOCKER_FROZEN = r"GC heap frozen \(upstream mocker, after make_engine, before run_input\)"


def run_the_example(python: str, tmp_path: Path):
    """The one-machine block in ``python``'s environment: its answer and its freeze lines."""
    env = {**activated(python), "HTTP_PORT": str(free_port()), "TMPDIR": str(tmp_path)}
    result = run_block(doc_block("ai-dynamo-local", PAGE), env=env, timeout_s=300)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    lines = result.stdout.strip().splitlines()
    answer = json.loads(lines[0])
    assert answer["model"] == "tiny"
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")
    return lines


def test_the_one_machine_example_serves_with_both_processes_frozen(tmp_path):
    lines = run_the_example(sys.executable, tmp_path)

    assert any(re.search(FRONTEND_FROZEN, line) for line in lines), lines
    assert any(re.search(MOCKER_FROZEN, line) for line in lines), lines


def test_a_fresh_environment_set_up_as_the_page_says_serves_frozen(tmp_path):
    block = doc_block("ai-dynamo-install", PAGE)
    pinned = set(re.findall(r"ai-dynamo(?:-runtime)?==([0-9.]+)", block))
    assert len(pinned) == 1, pinned
    (release,) = pinned
    if version("ai-dynamo") != release:
        pytest.skip(
            f"the page installs ai-dynamo {release}; this environment has {version('ai-dynamo')} "
            "(the block runs in the environment of that release)"
        )
    venv = tmp_path / "ai-dynamo"
    env = {
        "PYTHON": sys.executable,  # a venv's python makes a venv of its base interpreter
        "VENV": str(venv),
        "CHECKOUT": str(REPO),
        "TMPDIR": str(tmp_path),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    installed = run_block(block, env=env, timeout_s=900)
    assert installed.returncode == 0, f"{installed.stdout}\n{installed.stderr}"
    # the block ends with the adapters' own check of what it installed
    assert f"ai-dynamo {release}: a supported release" in installed.stdout
    assert "  mocker: python -m dynamo_gc.mocker wraps dynamo.mocker.main.run_input" in (
        installed.stdout
    )

    python = str(venv / "bin" / "python")
    lines = run_the_example(python, tmp_path)

    assert any(re.search(FRONTEND_FROZEN, line) for line in lines), lines
    assert any(re.search(MOCKER_FROZEN, line) for line in lines), lines

    # The page's uninstall section: with gc-freeze still named, upstream's frontend does not
    # start once the distribution is gone (so the name goes first).
    removed = subprocess.run(
        [python, "-m", "pip", "uninstall", "--yes", "dynamo-gc"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert removed.returncode == 0, removed.stderr
    started = subprocess.run(
        [python, "-m", "dynamo.frontend", "--discovery-backend", "file", "--http-port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            **loopback_env(tmp_path / "kv"),
            "DYN_FRONTEND_ROUTE_EXTENSIONS": "gc-freeze",
        },
        check=False,
    )
    assert started.returncode != 0
    assert "Unknown frontend route extension 'gc-freeze'" in started.stdout + started.stderr
    assert "Available: <none>" in started.stdout + started.stderr
