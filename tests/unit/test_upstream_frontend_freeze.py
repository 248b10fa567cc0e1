"""The ``gc-freeze`` route extension of upstream's frontend, called as upstream calls it.

Upstream calls the provider with no arguments after ``make_engine`` and before HTTP starts, and
serves whatever routes it returns; the real frontend around it is in tests/upstream/. Here: what
one call does to this process (freeze, pause logger, metrics, phase), a second call (both
activation ways at once), bad env values (exit 2 naming the env var, nothing applied), the guard
that refuses the model watcher's later freezes, and ``python -m dynamo_gc.frontend``'s split of
the command line.
"""

from __future__ import annotations

import gc
import logging
import sys
import types
import urllib.request

import pytest

from dynamo_gc import lifecycle
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.freeze import freeze_gc_heap, last_freeze
from dynamo_gc.pause_logger import installed_gc_pause_logger
from dynamo_gc.upstream import (
    frontend_cli,
    frontend_freeze,
    frontend_settings,
    preprocess_pool,
    stand_down,
)
from tests.support.scrape import sample

ENV_VARS = (
    "DYN_FREEZE_GC_HEAP",
    "DYN_GC_PAUSE_LOG_MS",
    "DYN_GC_METRICS_PORT",
    "DYN_GC_METRICS_HOST",
    "DYN_DEBUG_GC_ENDPOINT",
)
# What the provider finds as upstream's frontend module: a release without a freeze of its own.
STOCK_FRONTEND = types.ModuleType("dynamo.frontend.main")


def upstream_freeze_function():
    """A function of upstream's freeze module as its unmerged change names it (the module of
    that shape is tests/upstream/fixtures/; here only where the function comes from matters)."""

    def maybe_freeze_gc_heap(enabled, *, context):
        raise AssertionError("the adapter never calls upstream's freeze")

    maybe_freeze_gc_heap.__module__ = stand_down.UPSTREAM_FREEZE_MODULE
    return maybe_freeze_gc_heap


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    # Upstream's options are read with upstream's own argument group, and its frontend module
    # checked, neither of which this environment (our launchers' `dynamo`) has: here no pool is
    # asked for and the check passes. tests/upstream reads and checks the real ones.
    monkeypatch.setattr(
        frontend_freeze.frontend_hooks, "preprocess_pool_requested", lambda args, program: 0
    )
    monkeypatch.setattr(
        frontend_freeze.frontend_hooks, "checked_frontend_main", lambda program: STOCK_FRONTEND
    )
    frontend_freeze.reset_for_tests()
    yield
    frontend_freeze.reset_for_tests()


def test_a_pool_asked_for_that_cannot_be_found_is_an_exit_2_with_nothing_applied(
    monkeypatch, capsys
):
    # Upstream's options ask for 2 preprocess workers of the sglang processor, and its module is
    # not where the adapter looks (upstream moved it): refused before anything is installed.
    monkeypatch.setattr(
        frontend_freeze.frontend_hooks, "preprocess_pool_requested", lambda args, program: 2
    )
    monkeypatch.delitem(sys.modules, preprocess_pool.SGLANG_PROCESSOR, raising=False)
    frozen_before = gc.get_freeze_count()

    with pytest.raises(SystemExit) as exited:
        frontend_freeze.gc_freeze_routes()

    assert exited.value.code == 2
    assert f"{preprocess_pool.SGLANG_PROCESSOR} was not loaded" in capsys.readouterr().err
    assert gc.get_freeze_count() == frozen_before
    assert installed_gc_pause_logger() is None
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING
    assert frontend_freeze.activation() is None


def test_the_provider_freezes_marks_serving_and_returns_no_routes(caplog):
    caplog.set_level(logging.INFO)
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING

    assert frontend_freeze.gc_freeze_routes() == []

    record = last_freeze()
    assert record is not None and record.context == frontend_freeze.FREEZE_CONTEXT
    assert gc.get_freeze_count() > 0
    assert lifecycle.current_phase() is lifecycle.Phase.SERVING
    activation = frontend_freeze.activation()
    assert activation is not None and activation.frozen == record.frozen
    assert activation.metrics_port is None  # no port unless the operator names one
    messages = [r.getMessage() for r in caplog.records]
    frozen_at = next(i for i, m in enumerate(messages) if m.startswith("GC heap frozen"))
    serving_at = next(i for i, m in enumerate(messages) if "-> serving" in m)
    assert frozen_at < serving_at


def test_a_second_activation_in_the_process_freezes_nothing_more(caplog):
    caplog.set_level(logging.INFO)
    frontend_freeze.gc_freeze_routes()
    first = frontend_freeze.activation()
    frozen = gc.get_freeze_count()

    assert frontend_freeze.gc_freeze_routes() == []

    assert frontend_freeze.activation() is first
    assert gc.get_freeze_count() == frozen
    assert sum(r.getMessage().startswith("GC heap frozen") for r in caplog.records) == 1
    assert not any("refused" in r.getMessage() for r in caplog.records)


def test_after_activation_a_freeze_from_the_model_watcher_is_refused(caplog):
    # upstream's chat_engine_factory runs when a model registers, after HTTP is up
    frontend_freeze.gc_freeze_routes()
    activation_freeze = last_freeze()
    frozen = gc.get_freeze_count()
    caplog.set_level(logging.WARNING)

    assert freeze_gc_heap(context="chat_engine_factory") is None

    assert last_freeze() is activation_freeze  # no second freeze recorded
    # None added; the count may fall, since a frozen object whose last reference goes is freed
    # (what an earlier test left referenced in this process decides how many)
    assert gc.get_freeze_count() <= frozen
    assert any("refused (chat_engine_factory)" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("word", ["0", "false", "NO", "off"])
def test_the_env_var_turns_the_freeze_off(monkeypatch, word):
    monkeypatch.setenv("DYN_FREEZE_GC_HEAP", word)
    frontend_freeze.gc_freeze_routes()
    assert gc.get_freeze_count() == 0
    assert last_freeze() is None
    assert lifecycle.current_phase() is lifecycle.Phase.SERVING


def test_the_pause_logger_reads_its_env_var(monkeypatch):
    monkeypatch.setenv("DYN_GC_PAUSE_LOG_MS", "25")
    frontend_freeze.gc_freeze_routes()
    pause_logger = installed_gc_pause_logger()
    assert pause_logger is not None and pause_logger.threshold_ms == 25.0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DYN_FREEZE_GC_HEAP", "maybe"),
        ("DYN_GC_PAUSE_LOG_MS", "-1"),
        ("DYN_GC_PAUSE_LOG_MS", "nan"),
        ("DYN_GC_METRICS_PORT", "70000"),
        ("DYN_GC_METRICS_HOST", "no such host."),
    ],
)
def test_a_bad_env_value_exits_2_naming_it_with_nothing_applied(monkeypatch, capsys, name, value):
    monkeypatch.setenv(name, value)
    callbacks = list(gc.callbacks)

    with pytest.raises(SystemExit) as exited:
        frontend_freeze.gc_freeze_routes()

    assert exited.value.code == 2
    assert name in capsys.readouterr().err
    assert frontend_freeze.activation() is None
    assert gc.get_freeze_count() == 0
    assert gc.callbacks == callbacks
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING


def test_the_launchers_flags_win_over_the_env_vars(monkeypatch):
    monkeypatch.setenv("DYN_FREEZE_GC_HEAP", "1")
    config, rest = frontend_settings.split_args(
        ["--http-port", "8000", "--no-dyn-freeze-gc-heap", "--router-mode", "kv"]
    )
    assert rest == ["--http-port", "8000", "--router-mode", "kv"]
    frontend_freeze.configure(config)

    frontend_freeze.gc_freeze_routes()

    assert gc.get_freeze_count() == 0


def test_a_bad_flag_exits_2_naming_flag_and_env_var(capsys):
    with pytest.raises(SystemExit) as exited:
        frontend_settings.split_args(["--dyn-gc-pause-log-ms", "inf", "--http-port", "8000"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--dyn-gc-pause-log-ms" in err and "DYN_GC_PAUSE_LOG_MS" in err


def test_the_metrics_port_serves_the_gc_metrics(monkeypatch):
    monkeypatch.setenv("DYN_GC_METRICS_PORT", "0")
    monkeypatch.setenv("DYN_GC_METRICS_HOST", "127.0.0.1")
    frontend_freeze.gc_freeze_routes()
    activation = frontend_freeze.activation()
    assert activation is not None and activation.metrics_port

    url = f"http://127.0.0.1:{activation.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()

    assert sample(text, "dynamo_gc_frozen_objects") == (activation.frozen or 0)
    assert "dynamo_gc_freeze_enabled 1.0" in text
    assert 'dynamo_serving_phase{phase="serving"} 1.0' in text
    assert "dynamo_gc_pause_seconds_bucket" in text


def test_upstreams_arguments_get_the_extension_in_the_http_mode_only():
    assert frontend_cli.upstream_argv(["--http-port", "8000"], None) == [
        "--http-port",
        "8000",
        "--frontend-route-extension",
        "gc-freeze",
    ]
    # upstream refuses route extensions where it serves no HTTP (the mode is read with
    # upstream's own argument group: tests/upstream/test_frontend_hooks.py)
    assert frontend_cli.upstream_argv(["--interactive"], "--interactive") == ["--interactive"]
    assert frontend_cli.upstream_argv([], "--kserve-grpc-server") == []


def test_the_settings_the_launcher_configures_are_the_gc_settings():
    config, _ = frontend_settings.split_args(["--dyn-gc-pause-log-ms", "5"])
    assert config.gc == GcSettings(freeze_gc_heap=True, gc_pause_log_ms=5.0)


def test_at_exit_the_heap_is_unfrozen_and_the_pause_logger_leaves(monkeypatch):
    # Frozen objects are never finalized, not even by the final collections at exit.
    monkeypatch.setenv("DYN_GC_PAUSE_LOG_MS", "10")
    frontend_freeze.gc_freeze_routes()
    activation = frontend_freeze.activation()
    assert activation is not None and gc.get_freeze_count() > 0

    activation.process_state.restore()  # what upstream's process runs at exit (atexit)

    assert gc.get_freeze_count() == 0
    assert installed_gc_pause_logger() is None


@pytest.mark.parametrize(
    ("argv", "rest"),
    [
        # everything after `--` is upstream's, even a word that looks like ours
        (
            ["--http-port", "1", "--", "--dyn-freeze-gc-heap"],
            ["--http-port", "1", "--", "--dyn-freeze-gc-heap"],
        ),
        # an abbreviation of ours is not ours: upstream sees (and refuses) it
        (["--dyn-gc-pause", "5"], ["--dyn-gc-pause", "5"]),
        # upstream's negative values and vLLM's flags stay in place, in order
        (
            ["--dyn-chat-processor", "vllm", "--max-model-len", "-1"],
            ["--dyn-chat-processor", "vllm", "--max-model-len", "-1"],
        ),
    ],
)
def test_only_our_exact_flags_are_taken_out(argv, rest):
    config, left = frontend_settings.split_args(argv, env={})
    assert left == rest
    assert config.gc == GcSettings(freeze_gc_heap=True, gc_pause_log_ms=0.0)


@pytest.fixture
def frontend_that_freezes_itself(monkeypatch):
    """Upstream's frontend module as in upstream's own GC-freeze change: it calls a function of
    dynamo.common.utils.gc_freeze."""
    module = types.ModuleType("dynamo.frontend.main")
    module.maybe_freeze_gc_heap = upstream_freeze_function()
    monkeypatch.setattr(
        frontend_freeze.frontend_hooks, "checked_frontend_main", lambda program: module
    )
    return module


def test_where_upstream_freezes_itself_the_provider_stands_down_with_one_line(
    frontend_that_freezes_itself, monkeypatch, caplog
):
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("DYN_GC_PAUSE_LOG_MS", "5")  # upstream's own pause logger reads it

    assert frontend_freeze.gc_freeze_routes() == []
    assert frontend_freeze.gc_freeze_routes() == []  # the env var and the flag both name it

    lines = [r for r in caplog.records if "stands down" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "(dynamo.common.utils.gc_freeze: maybe_freeze_gc_heap)" in lines[0].getMessage()
    assert "no second freeze and no second pause logger" in lines[0].getMessage()
    assert gc.get_freeze_count() == 0 and last_freeze() is None
    assert installed_gc_pause_logger() is None
    assert lifecycle.current_phase() is lifecycle.Phase.STARTING  # upstream's to decide
    assert frontend_freeze.activation() is None


def test_the_stand_down_line_names_the_adapters_settings_nothing_serves(
    frontend_that_freezes_itself, monkeypatch, caplog
):
    monkeypatch.setenv("DYN_GC_METRICS_PORT", "9092")
    monkeypatch.setenv("DYN_DEBUG_GC_ENDPOINT", "1")
    caplog.set_level(logging.INFO)

    assert frontend_freeze.gc_freeze_routes() == []  # no debug route either

    (line,) = [r for r in caplog.records if "stands down" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert line.getMessage().endswith(
        "not served: --dyn-gc-metrics-port / DYN_GC_METRICS_PORT (9092), "
        "--dyn-debug-gc-endpoint / DYN_DEBUG_GC_ENDPOINT"
    )


@pytest.fixture
def launched_on_it(frontend_that_freezes_itself, monkeypatch, caplog):
    """The command lines python -m dynamo_gc.frontend starts that upstream frontend with."""
    started: list[list[str]] = []
    frontend_that_freezes_itself.main = lambda: started.append(list(sys.argv))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(
        frontend_cli.frontend_hooks,
        "checked_frontend_main",
        lambda program=None: frontend_that_freezes_itself,
    )
    return started


def test_the_launcher_hands_an_upstream_that_freezes_itself_the_gc_flags(launched_on_it, caplog):
    started = launched_on_it
    frontend_cli.main(
        ["--http-port", "8000", "--no-dyn-freeze-gc-heap", "--dyn-gc-metrics-port", "9092"]
    )

    # upstream's parser reads the GC flags (the same names); the adapter's own option is gone,
    # and so is the extension
    assert started == [
        [frontend_cli.UPSTREAM_PROGRAM, "--http-port", "8000", "--no-dyn-freeze-gc-heap"]
    ]
    (line,) = [r for r in caplog.records if "stands down" in r.getMessage()]
    assert "not served: --dyn-gc-metrics-port / DYN_GC_METRICS_PORT (9092)" in line.getMessage()
    # upstream calling the provider as well (the env var also set) adds nothing
    assert frontend_freeze.gc_freeze_routes() == []
    assert len([r for r in caplog.records if "stands down" in r.getMessage()]) == 1


def test_where_upstream_freezes_itself_the_maintenance_stands_down_too(
    frontend_that_freezes_itself, monkeypatch, caplog
):
    # the maintenance would unfreeze and re-freeze the heap upstream froze: it does not run,
    # and the line says so (its env vars are the adapter's alone: upstream reads none of them)
    monkeypatch.setenv("DYN_GC_MAINTENANCE", "idle")
    monkeypatch.setenv("DYN_GC_PAUSE_BUDGET_MS", "20")
    caplog.set_level(logging.INFO)

    assert frontend_freeze.gc_freeze_routes() == []

    (line,) = [r for r in caplog.records if "stands down" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert line.getMessage().endswith(
        "not served: --dyn-gc-maintenance / DYN_GC_MAINTENANCE (idle)"
    )
    assert frontend_freeze.activation() is None  # no maintainer, no gate, no pause logger
    assert installed_gc_pause_logger() is None
    assert gc.get_freeze_count() == 0


def test_the_launcher_takes_the_maintenance_flags_out_for_an_upstream_that_freezes_itself(
    launched_on_it, caplog
):
    started = launched_on_it
    frontend_cli.main(
        [
            "--dyn-chat-processor",
            "vllm",
            "--dyn-gc-maintenance",
            "idle",
            "--dyn-gc-pause-budget-ms=20",
            "--dyn-gc-pause-log-ms",
            "5",
        ]
    )

    # upstream's parser has no maintenance option (it would refuse one): taken out
    assert started == [
        [
            frontend_cli.UPSTREAM_PROGRAM,
            "--dyn-chat-processor",
            "vllm",
            "--dyn-gc-pause-log-ms",
            "5",
        ]
    ]
    (line,) = [r for r in caplog.records if "stands down" in r.getMessage()]
    assert "not served: --dyn-gc-maintenance / DYN_GC_MAINTENANCE (idle)" in line.getMessage()


def test_a_release_without_upstreams_freeze_module_is_not_taken_for_one():
    module = types.ModuleType("dynamo.frontend.main")
    module.make_engine = lambda: None  # upstream's other globals come from elsewhere
    module.gc_freeze = types.ModuleType(stand_down.UPSTREAM_FREEZE_MODULE)  # a module, not called
    assert stand_down.upstream_freeze_in(module) is None
