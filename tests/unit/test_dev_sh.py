"""``./dev.sh`` without a command (or with an unknown one) prints its usage, the comment block
at its top, and nothing else: no line of its shell code (it printed ``set -euo pipefail``);
``./dev.sh help`` (``-h``, ``--help``) prints it on stdout with exit 0."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

DEV_SH = Path(__file__).resolve().parents[2] / "dev.sh"


def header() -> list[str]:
    """The comment block after the shebang, as an operator should see it."""
    lines = []
    for line in DEV_SH.read_text(encoding="utf-8").splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return lines


@pytest.mark.parametrize("args", [[], ["no-such-command"]])
def test_usage_is_the_header_and_nothing_else(args):
    result = subprocess.run(
        ["bash", str(DEV_SH), *args], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    if args:
        assert lines.pop(0) == "dev.sh: unknown command 'no-such-command'"
    assert lines == header(), result.stderr
    assert "./dev.sh test" in result.stderr and "set -euo" not in result.stderr


@pytest.mark.parametrize("word", ["help", "-h", "--help"])
def test_help_prints_the_usage_with_exit_0(word):
    result = subprocess.run(
        ["bash", str(DEV_SH), word], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == header()


def test_the_header_counts_its_commands_right():
    text = "\n".join(header())
    assert "two commands (icebox and test" in text and "helpers for" in text
    listed = [line.split()[1] for line in header() if line.strip().startswith("./dev.sh ")]
    assert listed == ["icebox", "test", "lint", "venv", "help"]
