"""Fixtures every test gets: GC state and the serving phase are put back after each test."""

from __future__ import annotations

import gc
import importlib.util
import os
from unittest import mock

import pytest

from dynamo_gc import gc_state, lifecycle, startup_stop
from dynamo_gc.bench_policy import stop_gc_policy

# tests/upstream runs in an environment whose `dynamo` is upstream ai-dynamo's (.venv-upstream,
# with the dynamo_gc layer beside it): our launchers are not installed there, so nothing of
# theirs needs putting back. Everywhere else they are, and are imported as before.
OUR_LAUNCHERS = importlib.util.find_spec("dynamo.common.logging_setup") is not None
if OUR_LAUNCHERS:
    from dynamo.common import logging_setup, startup_signals
    from dynamo.runtime import log_budget


@pytest.fixture(scope="session", autouse=True)
def empty_permanent_generation():
    """Start the session with nothing frozen, as every test's restore leaves it.

    CPython 3.12.1 starts each process with 375 of its own objects in the permanent generation;
    without this, a test asserting an empty one passed only when another test's restore had run
    before it in the same process (under xdist, whichever test a worker runs first failed).
    """
    gc.unfreeze()


@pytest.fixture(autouse=True)
def restore_environment():
    """Put back ``os.environ`` after each test. Code under test writes it (the worker exports the
    self-benchmark's policy for its ranks; upstream's policy API is driven through it), and
    every process a later test starts in the same worker inherits it: a leaked
    ``DYN_FPM_GC_POLICY=freeze`` met a prerequisite that test_startup_validation expects unmet.
    ``monkeypatch.delenv`` of an absent variable records nothing to undo, so it is no guard."""
    with mock.patch.dict(os.environ):
        yield


@pytest.fixture(autouse=True)
def restore_gc_state():
    """Put back freeze, thresholds, enabled flag, callbacks, pause logger, GC policy and the
    process phase after each test, and forget a recorded stop signal.

    Also what the library keeps about them: the last freeze record (the heap is unfrozen again,
    so a later test must not see an earlier test's freeze), and freeze observers and phase
    listeners a test forgot to remove.
    """
    saved_gc = gc_state.snapshot_gc_state()
    phase_state = lifecycle.snapshot_phase_state()
    yield
    stop_gc_policy()  # the benchmark policy's thread and saved thresholds are global
    gc_state.restore_gc_state(saved_gc)
    lifecycle.restore_phase_state(phase_state)
    startup_stop.forget()  # a stop signal a test recorded (the record is per process)
    if OUR_LAUNCHERS:
        # A launcher's main() run in-process installs a stderr handler bound to this test's
        # capture.
        logging_setup.remove_logging_handler()
        # ... and, stopped by a signal during start-up, notes it for its __main__'s quick exit.
        startup_signals.forget_stop()
        # Log budgets (module-level ones too) count what earlier tests logged: each test starts
        # with a clean slate, as a new process does.
        log_budget.forget_all()


@pytest.fixture
def etcd_server(tmp_path):
    """A real etcd on loopback for one test (skipped without a binary, unless CI requires it)."""
    import os

    from tests.support.etcd_server import (
        ETCD_MISSING_REASON,
        REQUIRE_ETCD_ENV,
        EtcdServer,
        find_etcd,
    )

    binary = find_etcd()
    if binary is None:
        if os.environ.get(REQUIRE_ETCD_ENV) == "1":
            pytest.fail(f"{REQUIRE_ETCD_ENV}=1 but {ETCD_MISSING_REASON}")
        pytest.skip(ETCD_MISSING_REASON)
    server = EtcdServer(binary, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A copy of the tiny model's tokenizer files (tokenizer.json, tokenizer_config.json,
    template) for this session (tests/support/tiny_model.py)."""
    from tests.support.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer") / "tokenizer")
