"""scripts/setup_sglang_env.sh on the venv these tests run in: a second run installs nothing,
logs on stderr and prints the venv's python as its last stdout line, exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dynamo

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "setup_sglang_env.sh"


@pytest.mark.skipif(
    Path(list(dynamo.__path__)[0]).resolve() != (REPO / "components/src/dynamo").resolve(),
    reason="this venv's dynamo is another checkout's: the script would re-install it",
)
def test_a_second_run_changes_nothing_and_prints_the_venvs_python():
    venv = Path(sys.prefix)
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "SGLANG_VENV": str(venv)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines() == [f"{venv}/bin/python"]
    assert "installing" not in result.stderr and "ready in" in result.stderr
