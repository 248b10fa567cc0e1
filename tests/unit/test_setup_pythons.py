"""scripts/setup_pythons.sh's contract without the network: it refuses what it cannot do (exit 2,
the reason, nothing written), a second run on a provisioned directory only prints the paths,
and scripts/provisioned_pythons.py finds the interpreters where the script puts them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import provisioned_pythons
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "setup_pythons.sh"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "reason"),
    [
        (["--frobnicate"], {}, "unknown argument '--frobnicate'"),
        (["--dir"], {}, "--dir needs a directory"),
        (["--dir", "relative/dir"], {}, "must be an absolute path"),
        (["--dir", str(REPO / "pythons")], {}, "is inside this checkout"),
        ([], {provisioned_pythons.DIR_ENV: str(REPO / "pythons")}, "is inside this checkout"),
    ],
)
def test_what_it_cannot_do_is_refused_with_exit_2_and_nothing_written(args, env, reason):
    result = run(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert "cannot run here" in result.stderr and reason in result.stderr
    assert result.stdout == ""
    assert not (REPO / "pythons").exists()


def _fake_provisioned(directory: Path) -> list[Path]:
    """A directory as a finished run leaves it, the interpreters stand-ins that start."""
    usr_bin = directory / "root" / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    (directory / "root" / "MANIFEST").write_text("# test\n", encoding="utf-8")
    pythons = []
    for major, minor in provisioned_pythons.PROVISIONED_VERSIONS:
        python = usr_bin / f"python{major}.{minor}"
        python.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        python.chmod(0o755)
        pythons.append(python)
    return pythons


def test_a_second_run_prints_the_paths_and_touches_nothing(tmp_path):
    pythons = _fake_provisioned(tmp_path)
    result = run("--dir", str(tmp_path))
    if result.returncode == 2:  # not a Debian-like machine: the refusal says why
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(python) for python in pythons]
    assert "already provisioned" in result.stderr
    assert not (tmp_path / "apt").exists()  # no apt run, so no network


def test_provisioned_pythons_knows_the_scripts_layout_and_versions(tmp_path):
    versions = re.search(r"^VERSIONS=\(([^)]*)\)", SCRIPT.read_text(encoding="utf-8"), re.M)
    assert versions is not None
    assert [tuple(int(part) for part in v.split(".")) for v in versions.group(1).split()] == list(
        provisioned_pythons.PROVISIONED_VERSIONS
    )
    assert provisioned_pythons.provisioned_interpreters({"DYNAMO_PYTHONS_DIR": str(tmp_path)}) == {}
    pythons = _fake_provisioned(tmp_path)
    found = provisioned_pythons.provisioned_interpreters({"DYNAMO_PYTHONS_DIR": str(tmp_path)})
    assert list(found.values()) == [str(python) for python in pythons]
    assert provisioned_pythons.pythons_dir({}) == Path(provisioned_pythons.DEFAULT_DIR)
