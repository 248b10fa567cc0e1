"""Upstream's ``--embedding-worker-processes N`` children start through the adapter
(dynamo_gc.upstream.embedding_children), on a real module of upstream's shape written to a
temporary directory: the function looks ``subprocess`` up as a global and starts its children
with ``[sys.executable, "-m", "dynamo.vllm", *sys.argv[1:]]``. The children are real processes.

The check on upstream's real function, in every release's wheel, is
tests/upstream/test_releases.py; on the installed module, tests/upstream/test_vllm_embedding.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import types

import pytest

from dynamo_gc.configuration.gc_options import (
    MAINTENANCE_IDLE,
    MAINTENANCE_OFF,
    GcSettings,
    MaintenanceSettings,
)
from dynamo_gc.upstream import embedding_children
from dynamo_gc.upstream.versions import describe_installed

# Upstream's shape (dynamo/vllm/embedding_worker_processes.py, ai-dynamo 1.5.0-1.6.1): the
# command, the loop over the children's indexes, and the index in each child's environment.
UPSTREAM_LIKE = """
import os
import subprocess
import sys

_INDEX_ENV = "DYN_VLLM_EMBEDDING_PROCESS_INDEX"


def create_shared_embedding_engine_client(process_count):
    children = []
    command = [sys.executable, "-m", "dynamo.vllm", *sys.argv[1:]]
    for process_index in range(1, process_count):
        env = os.environ.copy()
        env[_INDEX_ENV] = str(process_index)
        child = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        children.append(child)
    return children


def start_something_else():
    return subprocess.Popen([sys.executable, "-c", "print('other')"], stdout=subprocess.PIPE)
"""

CHANGED_COMMAND = """
import subprocess
import sys


def create_shared_embedding_engine_client(process_count):
    command = [sys.executable, "-m", "dynamo.vllm.embedding_child", *sys.argv[1:]]
    return [subprocess.Popen(command) for _ in range(1, process_count)]
"""

NOT_A_GLOBAL = """
import sys


def create_shared_embedding_engine_client(process_count):
    from subprocess import Popen

    return [Popen([sys.executable, "-m", "dynamo.vllm", *sys.argv[1:]])]
"""


ON = GcSettings(freeze_gc_heap=True, gc_pause_log_ms=0.0)
NO_MAINTENANCE = MaintenanceSettings(MAINTENANCE_OFF, 0.0)


def upstream_like(tmp_path, source: str) -> types.ModuleType:
    """A module of upstream's name and shape, and a stand-in for ``dynamo.vllm.main`` holding
    its function as upstream's worker module imports it."""
    path = tmp_path / "embedding_worker_processes.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(embedding_children.MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    worker_main = types.ModuleType(embedding_children.WORKER_MAIN)
    worker_main.create_shared_embedding_engine_client = (  # type: ignore[attr-defined]
        module.create_shared_embedding_engine_client
    )
    return worker_main


def refusal(capsys, worker_main) -> str:
    with pytest.raises(SystemExit) as exited:
        embedding_children.install("prog", worker_main, ON, NO_MAINTENANCE, metrics=None)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def upstream_argv(monkeypatch):
    # the first process's own command line, as the adapter leaves it for upstream: its GC flags
    # taken out, upstream's arguments left
    monkeypatch.setattr(sys, "argv", ["python -m dynamo_gc.vllm", "--model", "unused"])


def test_the_children_run_the_adapter_with_the_first_processes_gc_settings(tmp_path, upstream_argv):
    worker_main = upstream_like(tmp_path, UPSTREAM_LIKE)
    assert embedding_children.install(
        "prog",
        worker_main,
        GcSettings(freeze_gc_heap=True, gc_pause_log_ms=5.0),
        NO_MAINTENANCE,
        metrics=("127.0.0.1", 9300),
    )

    children = worker_main.create_shared_embedding_engine_client(3)

    assert [child.args for child in children] == [
        [
            sys.executable,
            "-m",
            "dynamo_gc.vllm",
            "--freeze-gc-heap",
            "--gc-pause-log-ms",
            "5.0",
            "--gc-maintenance",
            "off",  # always named: an env var the child inherits cannot turn it on
            "--gc-metrics-port",
            str(9300 + index),  # as upstream offsets DYN_SYSTEM_PORT by the index
            "--gc-metrics-host",
            "127.0.0.1",
            "--model",
            "unused",
        ]
        for index in (1, 2)
    ]
    for child in children:
        _, err = child.communicate(timeout=120)
        # the adapter took its flags (a bad one would be named here), then looked for
        # upstream's worker, which this environment does not have: the child ran the adapter
        assert child.returncode == 2, err
        assert err.startswith("python -m dynamo_gc.vllm: error: ai-dynamo"), err
        assert "dynamo.vllm.main" in err


def test_off_and_a_free_metrics_port_are_handed_on_as_they_are(tmp_path, upstream_argv):
    worker_main = upstream_like(tmp_path, UPSTREAM_LIKE)
    embedding_children.install(
        "prog",
        worker_main,
        GcSettings(freeze_gc_heap=False, gc_pause_log_ms=0.0),
        NO_MAINTENANCE,
        metrics=("0.0.0.0", 0),
    )

    (child,) = worker_main.create_shared_embedding_engine_client(2)
    child.communicate(timeout=120)

    assert child.args[3:11] == [
        "--no-freeze-gc-heap",
        "--gc-pause-log-ms",
        "0.0",
        "--gc-maintenance",
        "off",
        "--gc-metrics-port",
        "0",  # each child picks a free port and logs it
        "--gc-metrics-host",
    ]


def test_other_commands_of_the_module_are_left_alone(tmp_path, upstream_argv):
    worker_main = upstream_like(tmp_path, UPSTREAM_LIKE)
    embedding_children.install("prog", worker_main, ON, NO_MAINTENANCE, metrics=None)
    module = sys.modules.get(embedding_children.MODULE)
    assert module is None  # the real upstream module is not touched here
    globals_ = worker_main.create_shared_embedding_engine_client.__globals__

    other = globals_["start_something_else"]()
    out, _ = other.communicate(timeout=60)

    assert other.args == [sys.executable, "-c", "print('other')"]
    assert out.strip() == b"other"
    # the rest of subprocess is the real module's
    assert globals_["subprocess"].PIPE is subprocess.PIPE
    assert issubclass(globals_["subprocess"].Popen, subprocess.Popen)


def test_uninstall_puts_the_real_subprocess_back(tmp_path):
    worker_main = upstream_like(tmp_path, UPSTREAM_LIKE)
    globals_ = worker_main.create_shared_embedding_engine_client.__globals__
    embedding_children.install("prog", worker_main, ON, NO_MAINTENANCE, metrics=None)
    assert globals_["subprocess"] is not subprocess

    embedding_children.uninstall(worker_main)

    assert globals_["subprocess"] is subprocess


def test_a_child_without_its_index_cannot_get_a_metrics_port_of_its_own():
    with pytest.raises(RuntimeError, match="DYN_VLLM_EMBEDDING_PROCESS_INDEX"):
        embedding_children.child_flags(ON, NO_MAINTENANCE, ("127.0.0.1", 9300), env={})


def test_the_maintenance_is_handed_on_with_its_budget():
    flags = embedding_children.child_flags(
        ON, MaintenanceSettings(MAINTENANCE_IDLE, 25.0), None, env=None
    )

    assert flags == [
        "--freeze-gc-heap",
        "--gc-pause-log-ms",
        "0.0",
        "--gc-maintenance",
        "idle",
        "--gc-pause-budget-ms",
        "25.0",
    ]


def test_the_childs_maintenance_flags_are_what_the_adapter_parses_back():
    # what the child's own parser makes of them: the first process's settings, whatever the
    # child inherits in its env (DYN_VLLM_GC_MAINTENANCE=idle here, overridden by the flag)
    from dynamo_gc.upstream import worker_settings

    for maintenance in (NO_MAINTENANCE, MaintenanceSettings(MAINTENANCE_IDLE, 40.0)):
        flags = embedding_children.child_flags(
            ON, maintenance, ("127.0.0.1", 9300), env={"DYN_VLLM_EMBEDDING_PROCESS_INDEX": "2"}
        )
        config, rest = worker_settings.split_args(
            worker_settings.VLLM_SURFACE,
            [*flags, "--model", "unused"],
            env={"DYN_VLLM_GC_MAINTENANCE": "idle", "DYN_VLLM_GC_PAUSE_BUDGET_MS": "5"},
        )
        assert (config.gc, config.maintenance.mode, rest) == (
            ON,
            maintenance.mode,
            ["--model", "unused"],
        )
        if maintenance.enabled:  # off: the inherited budget is ignored (one WARNING)
            assert config.maintenance.pause_budget_ms == maintenance.pause_budget_ms
        assert (config.metrics_host, config.metrics_port) == ("127.0.0.1", 9302)


def test_a_release_without_the_function_has_nothing_to_reach():
    worker_main = types.ModuleType(embedding_children.WORKER_MAIN)  # ai-dynamo 1.4.x
    assert not embedding_children.install("prog", worker_main, ON, NO_MAINTENANCE, metrics=None)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        (
            CHANGED_COMMAND,
            "no longer builds its processes' command as [sys.executable, '-m', 'dynamo.vllm', "
            "*sys.argv[1:]] (missing: dynamo.vllm)",
        ),
        (NOT_A_GLOBAL, "no longer starts its processes with the module global subprocess"),
    ],
    ids=["another-command", "popen-imported-locally"],
)
def test_a_changed_upstream_function_is_an_exit_2_naming_it(tmp_path, capsys, source, problem):
    err = refusal(capsys, upstream_like(tmp_path, source))
    assert (
        f"prog: error: {describe_installed()}: "
        f"{embedding_children.MODULE}.{embedding_children.FUNCTION} {problem}"
    ) in err
