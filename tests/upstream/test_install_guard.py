"""``pip install ./components`` (this project's own launchers, a top-level ``dynamo`` package)
into an ai-dynamo environment is refused before anything is built or installed: pip has no
conflict metadata, and that install used to succeed silently and overwrite ai-dynamo's files.

The refusal is the build backend's (components/build_backend/dynamo_build_backend.py), run here
as pip runs it for an operator: in an isolated build environment, with this environment (the one
with ai-dynamo) as the target. ``--dry-run``: even a broken guard installs nothing here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

import pytest

pytestmark = pytest.mark.upstream

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "components"


def pip(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        check=False,
    )


def launchers_installed() -> bool:
    try:
        distribution("dynamo-gc-launchers")
    except PackageNotFoundError:
        return False
    return True


def test_pip_install_of_the_launchers_is_refused_naming_the_layer_and_the_repair():
    done = pip("install", "--dry-run", "--no-deps", str(LAUNCHERS))

    assert done.returncode != 0
    assert (
        f"dynamo-gc-launchers: refusing to build for {sys.prefix}, which has "
        f"ai-dynamo {version('ai-dynamo')}"
    ) in done.stderr, done.stderr
    assert "install the GC layer instead: pip install <checkout>" in done.stderr
    assert "pip install --force-reinstall --no-deps ai-dynamo==X ai-dynamo-runtime==X" in (
        done.stderr
    )
    assert not launchers_installed()


def test_a_wheel_for_another_environment_can_still_be_built(tmp_path):
    done = pip(
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        str(tmp_path),
        str(LAUNCHERS),
        env={"DYNAMO_BUILD_BESIDE_AI_DYNAMO": "1"},
    )

    assert done.returncode == 0, done.stderr
    assert list(tmp_path.glob("dynamo_gc_launchers-*.whl"))
    assert not launchers_installed()  # built, not installed
