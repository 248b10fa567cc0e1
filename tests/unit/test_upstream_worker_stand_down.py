"""A worker adapter where the installed ai-dynamo freezes the worker itself: it stands down
before it installs anything (no freeze, no pause logger, no maintenance, upstream's signal
handlers its own), with one line naming what of its own is not served, and upstream's command
line keeps the GC flags it shares but none of the adapter's own (metrics, maintenance), which
upstream's parser would refuse.

Upstream's worker here is a module of the hooked shape written to a temporary directory (the
global the adapter wraps, its caller, the signal-handler installer, and a function of upstream's
freeze module as its unmerged change names it); the real launcher with a fixture of that module
is tests/upstream/test_upstream_freeze.py.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import textwrap

import pytest

from dynamo_gc import lifecycle
from dynamo_gc.pause_logger import installed_gc_pause_logger
from dynamo_gc.upstream import stand_down, worker_cli, worker_settings
from dynamo_gc.upstream.hooks import ModuleGlobalHook

WORKER = f"""
async def register_vllm_model(*args):
    raise AssertionError("nothing registers in this test")


def install_signal_handlers():
    raise AssertionError("upstream's handlers are installed by upstream, not here")


def maybe_freeze_gc_heap(enabled, *, context):
    raise AssertionError("the adapter never calls upstream's freeze")


maybe_freeze_gc_heap.__module__ = {stand_down.UPSTREAM_FREEZE_MODULE!r}


def worker():
    install_signal_handlers()
    return register_vllm_model
"""

# upstream's `python -m` entry: records the command line it was given
ENTRY = """
import sys

import stand_down_record

stand_down_record.argv.append(list(sys.argv))
"""


@pytest.fixture
def adapter(tmp_path, monkeypatch):
    (tmp_path / "stand_down_worker.py").write_text(textwrap.dedent(WORKER))
    (tmp_path / "stand_down_entry.py").write_text(textwrap.dedent(ENTRY))
    (tmp_path / "stand_down_record.py").write_text("argv = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("stand_down_worker", "stand_down_entry", "stand_down_record"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return worker_cli.WorkerAdapter(
        surface=worker_settings.VLLM_SURFACE,
        hooks=(
            ModuleGlobalHook(
                module="stand_down_worker",
                name="register_vllm_model",
                caller="worker",
                coroutine=True,
            ),
        ),
        entry_module="stand_down_entry",
        freeze_context="a worker that freezes itself",
        admission="a worker that freezes itself registers",
        signal_hook=ModuleGlobalHook(
            module="stand_down_worker",
            name="install_signal_handlers",
            caller="worker",
            coroutine=False,
        ),
    )


def test_the_worker_adapter_stands_down_with_its_maintenance_and_metrics(
    adapter, monkeypatch, caplog
):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv("DYN_VLLM_GC_MAINTENANCE", raising=False)
    monkeypatch.delenv("DYN_VLLM_GC_METRICS_PORT", raising=False)
    caplog.set_level(logging.INFO)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    worker_cli.run(
        adapter,
        [
            "--model",
            "tiny",
            "--freeze-gc-heap",
            "--gc-pause-log-ms",
            "5",
            "--gc-metrics-port",
            "0",
            "--gc-maintenance",
            "idle",
            "--gc-pause-budget-ms",
            "20",
        ],
    )

    import stand_down_record

    # upstream's parser reads the GC flags it shares; the adapter's own are taken out
    assert stand_down_record.argv == [
        [
            worker_settings.VLLM_PROGRAM,
            "--model",
            "tiny",
            "--freeze-gc-heap",
            "--gc-pause-log-ms",
            "5",
        ]
    ]
    (line,) = [r for r in caplog.records if "stands down" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert line.getMessage().endswith(
        "not served: --gc-metrics-port / DYN_VLLM_GC_METRICS_PORT (0), "
        "--gc-maintenance / DYN_VLLM_GC_MAINTENANCE (idle)"
    )
    assert "GC metrics served on" not in caplog.text
    # nothing of the adapter's: no freeze, no pause logger, no wrapped global, signals as found
    import stand_down_worker

    assert stand_down_worker.register_vllm_model.__module__ == "stand_down_worker"
    assert stand_down_worker.install_signal_handlers.__module__ == "stand_down_worker"
    assert installed_gc_pause_logger() is None
    assert gc.get_freeze_count() == 0
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers


def test_the_adapters_own_options_are_what_an_upstream_that_freezes_itself_is_not_given():
    surface = worker_settings.VLLM_SURFACE
    argv = [
        "--gc-maintenance=idle",
        "--model",
        "tiny",
        "--gc-pause-budget-ms",
        "20",
        "--gc-metrics-host",
        "127.0.0.1",
        "--freeze-gc-heap",
    ]

    assert worker_settings.without_adapter_options(surface, argv) == [
        "--model",
        "tiny",
        "--freeze-gc-heap",
    ]
    # the mocker has no maintenance options: a --gc-maintenance there is upstream's to refuse
    assert worker_settings.without_adapter_options(
        worker_settings.MOCKER_SURFACE, ["--gc-maintenance", "idle", "--gc-metrics-port", "0"]
    ) == ["--gc-maintenance", "idle"]
