"""The shell blocks of the docs that tests run as written.

A block is marked by an HTML comment on the line before its fence, ``<!-- doc-test: NAME ... -->``
(invisible on the rendered page), so a test finds it by name and fails if it is gone.
:func:`run_block` runs it with bash, errors fatal (``set -euo pipefail``), in a session of its
own: whatever it started in the background is killed with it when the test ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OPERATOR_GUIDE = REPO / "docs" / "operator-guide.md"


def doc_block(name: str, path: Path = OPERATOR_GUIDE) -> str:
    """The text of the ``sh`` block marked ``doc-test: name`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    pattern = rf"<!-- doc-test: {re.escape(name)}\b[^>]*-->\n```(?:sh|bash)\n(.*?)\n```"
    found = re.findall(pattern, text, flags=re.DOTALL)
    assert len(found) == 1, f"{path.name}: {len(found)} blocks marked doc-test: {name}"
    return found[0]


def run_block(
    block: str, *, cwd: Path = REPO, env: Mapping[str, str] | None = None, timeout_s: float
) -> subprocess.CompletedProcess:
    """Run ``block`` as one bash script; its output as text. Everything it started is killed
    (its process group) when it returns or times out."""
    proc = subprocess.Popen(
        ["bash", "-c", "set -euo pipefail\n" + block],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the block ran over {timeout_s} s:\n{out}\n{err}") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what it left in the background
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def activated(python: str) -> dict[str, str]:
    """The env of a shell in which ``python``'s virtual environment is activated."""
    bin_dir = str(Path(python).parent)
    return {
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "VIRTUAL_ENV": str(Path(bin_dir).parent),
    }
