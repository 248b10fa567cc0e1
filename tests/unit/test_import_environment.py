"""No module of components/, scripts/ or tests/ changes the process environment when imported
(issue 21, item 1): a helper script that set HF_HUB_OFFLINE at import made the vLLM suite's
result depend on which tests had imported it first.

Every module is imported in a fresh interpreter (tests/support/import_environment.py) and the
environment compared before and after each import; the vLLM environment's run, where the vLLM
modules import too, is tests/vllm/test_import_environment_vllm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHECKER = Path(__file__).resolve().parents[1] / "support" / "import_environment.py"
# Absent from the default environment on purpose: they have their own (scripts/setup_*_env.sh).
OPTIONAL = ("vllm", "sglang", "torch", "transformers")


def import_every_module(python: str = sys.executable) -> dict:
    """The checker's report, run with ``python`` from an unrelated directory."""
    result = subprocess.run(
        [python, str(CHECKER)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=CHECKER.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_environment_untouched(report: dict) -> None:
    assert report["changed"] == {}, f"modules that change the environment: {report['changed']}"
    assert report["failed"] == {}, f"modules that fail to import: {report['failed']}"
    for module, why in report["skipped"].items():
        assert any(f"'{name}" in why for name in OPTIONAL) or "Skipped" in why, (module, why)


def test_importing_every_module_leaves_the_environment_unchanged():
    report = import_every_module()
    assert_environment_untouched(report)
    imported = set(report["imported"])
    # The checker did look: the launchers, the scripts and the tests themselves.
    assert {"dynamo.frontend.main", "make_tiny_model", "tests.conftest"} <= imported


def test_the_checker_names_a_module_that_sets_a_variable_at_import(tmp_path, monkeypatch):
    """What it would have said about the old make_tiny_model.py: run on a copy of the checker
    whose module list has one more module, which sets HF_HUB_OFFLINE at import."""
    module = tmp_path / "sets_env_at_import.py"
    module.write_text('import os\nos.environ.setdefault("HF_HUB_OFFLINE", "1")\n')
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        f"checker = runpy.run_path({str(CHECKER)!r})\n"
        "names = checker['module_names']\n"
        "checker['main'].__globals__['module_names'] = lambda: ['sets_env_at_import', *names()]\n"
        "sys.exit(checker['main']())\n"
    )
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    result = subprocess.run(
        [sys.executable, str(probe)], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["changed"] == {"sets_env_at_import": {"HF_HUB_OFFLINE": [None, "1"]}}
