"""Our launchers refuse to start where ai-dynamo is installed, and say what to run instead.

The installed distribution is real metadata: a ``*.dist-info`` directory on the path, found by
``importlib.metadata`` exactly as an installed ai-dynamo is (no mock of the lookup).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynamo.common import coexistence

REPO = Path(__file__).resolve().parents[2]
ADAPTERS = (
    "python -m dynamo_gc.frontend",
    "python -m dynamo_gc.vllm",
    "python -m dynamo_gc.mocker",
)
# Modules that a launcher's real start imports, and a refusal must come before.
HEAVY = ("aiohttp", "pydantic", "tokenizers", "jinja2", "prometheus_client", "dynamo.vllm.main")


def fake_distribution(site: Path, name: str, version: str) -> Path:
    """An installed distribution as pip leaves one: ``name-version.dist-info/METADATA``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )
    return site


@pytest.fixture(params=["ai-dynamo", "ai-dynamo-runtime"])
def upstream_site(request, tmp_path):
    """A directory holding one installed ai-dynamo distribution, and its name."""
    return fake_distribution(tmp_path / "site", request.param, "1.6.1"), request.param


def test_nothing_found_without_ai_dynamo():
    assert coexistence.installed_upstream() == []
    assert coexistence.upstream_problem("python -m dynamo.frontend") is None
    coexistence.refuse_beside_upstream("python -m dynamo.vllm")  # returns: nothing to refuse


def test_found_from_real_metadata_on_the_path(upstream_site, monkeypatch, capsys):
    site, name = upstream_site
    monkeypatch.syspath_prepend(str(site))
    assert coexistence.installed_upstream() == [(name, "1.6.1")]
    with pytest.raises(SystemExit) as raised:
        coexistence.refuse_beside_upstream("python -m dynamo.frontend")
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m dynamo.frontend: error: ai-dynamo is installed")
    assert f"{name} 1.6.1" in err
    assert "DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze" in err
    assert "docs/ai-dynamo.md" in err
    for adapter in ADAPTERS:
        assert adapter in err


def _run(argv: list[str], site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _imported(importtime_err: str) -> set[str]:
    """Module names from ``-X importtime``'s lines (``import time: self | cumulative | name``)."""
    names = set()
    for line in importtime_err.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.mark.parametrize(
    "argv, program, adapter",
    [
        (["-m", "dynamo.frontend", "--help"], "python -m dynamo.frontend", "dynamo_gc.frontend"),
        (["-m", "dynamo.vllm", "--engine", "mock"], "python -m dynamo.vllm", "dynamo_gc.vllm"),
        (["scripts/icebox.py", "--port", "0"], "icebox", "dynamo_gc.mocker"),
    ],
    ids=["frontend", "worker", "icebox"],
)
def test_each_launcher_exits_2_at_once_beside_ai_dynamo(upstream_site, argv, program, adapter):
    site, name = upstream_site
    done = _run(argv, site)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert errors and errors[0].startswith(f"{program}: error: ai-dynamo is installed"), errors
    assert f"{name} 1.6.1" in errors[0] and f"python -m {adapter}" in errors[0]
    assert done.stdout == ""  # not even --help: nothing of this tree ran
    imported = _imported(done.stderr)
    assert "dynamo.common.coexistence" in imported  # the -X importtime lines are read right
    assert imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))
