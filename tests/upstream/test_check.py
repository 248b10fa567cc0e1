"""``python -m dynamo_gc.check``: the adapters' start-up checks, run on the installed ai-dynamo
without starting anything (what an image build runs, so that a release the adapters cannot hook
fails the build, not a pod: before 1.4.0 the env-var way runs nothing of the adapter's at all)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.upstream.test_frontend_route_extension import RENAMED_ROUTE_HOOK, changed_upstream

pytestmark = pytest.mark.upstream


def check(*launchers: str, launch: Path | None = None) -> subprocess.CompletedProcess:
    runner = [str(launch), "dynamo_gc.check"] if launch else ["-m", "dynamo_gc.check"]
    return subprocess.run(
        [sys.executable, *runner, *launchers],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_frontend_and_the_mocker_pass_on_the_installed_release():
    done = check("frontend", "mocker")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"ai-dynamo {version('ai-dynamo')}: a supported release (")
    assert lines[1].startswith(
        "  frontend: dynamo.frontend.main.load_frontend_route_extensions is called before HTTP"
    )
    # the frontend's maintenance request paths: checked where their processor imports, named
    # as not checked where it does not (vLLM or SGLang missing)
    assert "; maintenance request paths checked: " in lines[1]
    if find_spec("vllm") is not None:
        assert "checked: vllm" in lines[1]
    else:
        assert "not checked, their modules do not import here: vllm (" in lines[1]
    assert lines[2] == "  mocker: python -m dynamo_gc.mocker wraps dynamo.mocker.main.run_input"


def test_a_frontend_without_route_extensions_fails_the_check_by_name(tmp_path):
    # what ai-dynamo 1.3.1 and older look like to the adapter (their frontend has no route hook)
    done = check("frontend", launch=changed_upstream(tmp_path, RENAMED_ROUTE_HOOK))

    assert done.returncode == 2
    assert (
        f"python -m dynamo_gc.check: error: ai-dynamo {version('ai-dynamo')}: "
        "dynamo.frontend.main.load_frontend_route_extensions is missing (upstream's frontend has "
        "route extensions since 1.4.0)"
    ) in done.stderr


def test_the_vllm_worker_is_checked_where_upstreams_worker_imports_or_refused_by_name():
    done = check("vllm")
    # where upstream's worker module imports, every hook passes; where it does not (vLLM or a
    # dependency of upstream's worker missing), that is the one refusal allowed
    if done.returncode != 0 and "dynamo.vllm.main cannot be imported" in done.stderr:
        assert done.returncode == 2
        assert "python -m dynamo_gc.check: error: " in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert "vllm: python -m dynamo_gc.vllm wraps dynamo.vllm.main.register_vllm_model" in (
            done.stdout
        )
        # the signal-handler installer it defers, and the handlers the maintenance gates
        assert "dynamo.vllm.main.install_signal_handlers" in done.stdout
        assert (
            "--gc-maintenance gates dynamo.vllm.handlers.DecodeWorkerHandler.generate, "
            "dynamo.vllm.handlers.PrefillWorkerHandler.generate"
        ) in done.stdout
        assert "--embedding-worker-processes children start through the adapter" in done.stdout


def test_an_unknown_launcher_is_an_exit_2():
    done = check("router")
    assert done.returncode == 2
    assert "unknown launcher 'router' (choose from frontend, vllm, mocker)" in done.stderr
