"""The self-benchmark GC policy on a real free-threaded CPython: the detection says the build is
unsound and the policy refuses its periodic freeze (scripts/check_free_threaded.py, run as a
child on that interpreter).

Skipped where no free-threaded interpreter exists (``scripts/setup_pythons.sh --free-threaded``
builds one in minutes; CI does not, see docs/pythons.md), unless
``DYNAMO_REQUIRE_FREE_THREADED=1`` makes that a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import provisioned_pythons
import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "DYNAMO_REQUIRE_FREE_THREADED"


@pytest.fixture
def free_threaded_python() -> str:
    python = provisioned_pythons.free_threaded_interpreter()
    if python is None:
        reason = (
            "no free-threaded CPython (scripts/setup_pythons.sh --free-threaded, or "
            f"{provisioned_pythons.FREE_THREADED_ENV}=/path/to/python3.Xt)"
        )
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    return python


def test_the_policy_refuses_its_periodic_freeze_on_a_free_threaded_build(
    free_threaded_python, tmp_path
):
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "check_free_threaded.py"), "--smoke",
         "--python", free_threaded_python, "--compare", sys.executable, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    (result_file,) = tmp_path.glob("free_threaded-smoke.json")
    result = json.loads(result_file.read_text(encoding="utf-8"))
    assert result["refused"] is True
    free = result["interpreters"][0]
    assert free["py_gil_disabled"] and not free["gil_enabled"]
    policy = free["policy"]
    assert "free-threaded" in policy["unsound_build_reason"]
    assert policy["freeze_threads_during"] == []
    assert policy["thresholds_after"] == policy["thresholds_before"]
