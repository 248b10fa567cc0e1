"""Upstream Dynamo's ``dynamo.vllm.gc_policy`` names work here, with upstream's meaning."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from dynamo.vllm import gc_policy, self_benchmark_args, worker_extension
from dynamo_gc import bench_policy
from tests.unit import upstream_gc_policy_script

POLICY_ENV = ("DYN_FPM_GC_POLICY", "DYN_FPM_GC_FREEZE_INTERVAL_S")


@pytest.fixture
def clean_policy_env(monkeypatch):
    """The script sets the policy's env vars; monkeypatch puts them back afterwards."""
    for name in POLICY_ENV:
        monkeypatch.delenv(name, raising=False)


def test_a_script_written_for_upstreams_api_passes_unchanged(clean_policy_env):
    thresholds = gc.get_threshold()
    upstream_gc_policy_script.run()
    assert not bench_policy.policy_running()
    assert gc.get_threshold() == thresholds  # (the autouse fixture restores the rest)


def test_the_extension_is_one_class_under_both_paths():
    assert gc_policy.FpmGcWorkerExtension is worker_extension.FpmGcWorkerExtension
    assert worker_extension.UPSTREAM_QUALNAME == "dynamo.vllm.gc_policy.FpmGcWorkerExtension"


@pytest.mark.parametrize(
    "first", ["dynamo.vllm.gc_policy", "dynamo.vllm.worker_extension", "dynamo.vllm.ranks"]
)
def test_either_module_imports_first_in_a_fresh_interpreter(first):
    # No import cycle, whichever module a rank happens to resolve first; and importing starts
    # nothing, even with the policy on in the env (upstream starts it on import).
    code = (
        f"import {first}\n"
        "from dynamo.vllm import gc_policy, worker_extension\n"
        "assert gc_policy.FpmGcWorkerExtension is worker_extension.FpmGcWorkerExtension\n"
        "from dynamo_gc import bench_policy\n"
        "assert not bench_policy.policy_running()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**_env_without_policy(), "DYN_FPM_GC_POLICY": "freeze"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def _env_without_policy() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in POLICY_ENV}


@pytest.mark.parametrize("value", ["off", "OFF", " freeze", "Freeze ", "FREEZE"])
def test_the_policy_word_is_read_stripped_and_lowercased(monkeypatch, value):
    monkeypatch.setenv("DYN_FPM_GC_POLICY", value)
    assert gc_policy.start_gc_policy() is (value.strip().lower() == "freeze")
    assert self_benchmark_args.FPM_GC_POLICY.kind.parse(value) == value.strip().lower()


@pytest.mark.parametrize("value", ["always", "", "freeze-now"])
def test_other_policy_words_are_refused_not_taken_for_off(value):
    # Upstream treats every word but "freeze" as off; here a typo is an error (exit 2 on the
    # command line, a WARNING in a rank), listed in docs/upstream.md.
    with pytest.raises(ValueError):
        self_benchmark_args.FPM_GC_POLICY.kind.parse(value)


def test_start_gc_policy_with_the_env_unset_changes_nothing(monkeypatch):
    monkeypatch.delenv("DYN_FPM_GC_POLICY", raising=False)
    thresholds = gc.get_threshold()
    frozen = gc.get_freeze_count()
    assert gc_policy.start_gc_policy() is False
    assert not bench_policy.policy_running()
    assert (gc.get_threshold(), gc.get_freeze_count()) == (thresholds, frozen)


def test_gc_maintain_returns_the_permanent_generations_size(monkeypatch):
    monkeypatch.setenv("DYN_FPM_GC_POLICY", "freeze")
    assert gc_policy.start_gc_policy() is True
    assert gc_policy.gc_maintain() == gc.get_freeze_count()
    assert gc_policy.stop_gc_policy() is None
    assert not bench_policy.policy_running()


def test_gc_maintain_outside_the_policy_leaves_the_heap_as_it_is():
    gc.collect()
    before = gc.get_freeze_count()
    assert gc_policy.gc_maintain() == before  # upstream would unfreeze, collect and freeze
    assert gc.get_freeze_count() == before
