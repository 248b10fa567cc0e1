"""Every preprocess pool process of upstream's frontend freezes at the end of its initializer.

The wrapper replaces a module global with a picklable ``functools.partial`` of our own function:
under ``spawn`` and ``forkserver`` the child unpickles it by its qualified name (so it must be
ours, and must find upstream's original in a fresh import), under ``fork`` it inherits it along
with the frontend's ``serving`` phase. Real pools with each start method, the initializer laid
out as upstream's (tests/unit/upstream_pool_target.py).
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import pickle
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from dynamo_gc import lifecycle
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.upstream import preprocess_pool
from dynamo_gc.upstream.preprocess_pool import Initializer
from tests.unit import upstream_pool_target

TARGET = Initializer(upstream_pool_target.__name__, "_init_worker")
ON = GcSettings(freeze_gc_heap=True, gc_pause_log_ms=0.0)
OFF = GcSettings(freeze_gc_heap=False, gc_pause_log_ms=0.0)
START_METHODS = [
    m for m in ("spawn", "forkserver", "fork") if m in multiprocessing.get_all_start_methods()
]


@pytest.fixture(autouse=True)
def unwrapped():
    original = upstream_pool_target._init_worker
    yield
    preprocess_pool.unwrap_initializer(TARGET)
    assert upstream_pool_target._init_worker is original


def run_pool(start_method: str) -> tuple[int, tuple | None, int, str]:
    """Build the pool as upstream does (reading the global now), and ask its process."""
    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context(start_method),
        initializer=upstream_pool_target._init_worker,
        initargs=("model-dir", "parser"),
    )
    try:
        return pool.submit(upstream_pool_target.report).result(timeout=120)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("start_method", START_METHODS)
def test_each_pool_process_runs_upstreams_initializer_then_freezes(start_method):
    # The frontend is serving when the model watcher builds the pool: its own freeze is refused,
    # the new process's is not.
    lifecycle.mark_serving("test: the frontend admits requests")
    frozen_here = gc.get_freeze_count()
    assert preprocess_pool.wrap_initializer(ON, TARGET)

    pid, initargs, frozen, phase = run_pool(start_method)

    assert pid != os.getpid()
    assert initargs == ("model-dir", "parser")  # upstream's initializer ran, with its arguments
    assert frozen > 0
    assert phase == "serving"  # marked after the freeze: a later freeze there is refused
    assert gc.get_freeze_count() == frozen_here  # the serving frontend itself froze nothing


def fresh_interpreters_freeze_count() -> int:
    code = "import gc; print(gc.get_freeze_count())"
    return int(subprocess.check_output([sys.executable, "-c", code], text=True))


@pytest.mark.parametrize("start_method", START_METHODS)
def test_with_the_freeze_off_a_pool_process_is_stock(start_method):
    assert preprocess_pool.wrap_initializer(OFF, TARGET)
    _pid, initargs, frozen, _phase = run_pool(start_method)
    assert initargs == ("model-dir", "parser")
    if start_method == "fork":  # a forked child inherits the parent's count
        assert frozen == gc.get_freeze_count()
    else:  # what a fresh interpreter starts with: 0, but 375 of its own on CPython 3.12.1
        assert frozen == fresh_interpreters_freeze_count()


def test_the_wrapper_pickles_as_ours_so_a_spawned_child_runs_it():
    preprocess_pool.wrap_initializer(ON, TARGET)
    wrapped = upstream_pool_target._init_worker
    assert isinstance(wrapped, functools.partial)
    assert wrapped.func.__module__ == "dynamo_gc.upstream.preprocess_pool"
    assert wrapped.func.__qualname__ == "freezing_init_worker"
    assert pickle.loads(pickle.dumps(wrapped)).func is preprocess_pool.freezing_init_worker


def test_wrapping_twice_keeps_upstreams_original():
    original = upstream_pool_target._init_worker
    assert preprocess_pool.wrap_initializer(ON, TARGET)
    assert preprocess_pool.wrap_initializer(ON, TARGET)
    preprocess_pool.unwrap_initializer(TARGET)
    assert upstream_pool_target._init_worker is original


def test_nothing_to_wrap_when_upstream_did_not_load_the_pool_processor():
    assert preprocess_pool.wrap_initializer(ON, Initializer("no.such.module.loaded")) is False
    assert "no.such.module.loaded" not in sys.modules


def test_a_pool_asked_for_whose_module_upstream_did_not_load_is_an_exit_2(capsys):
    # `--dyn-chat-processor sglang --dyn-preprocess-workers 2` and no processor module where the
    # adapter looks: upstream moved it, and its pool would start unfrozen.
    with pytest.raises(SystemExit) as exited:
        preprocess_pool.wrap_initializer(
            ON, Initializer("no.such.module.loaded"), requested_workers=2
        )
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "no.such.module.loaded was not loaded" in err
    assert "--dyn-preprocess-workers 2" in err and "ai-dynamo" in err


def test_a_module_of_that_name_without_upstreams_pool_is_left_alone():
    assert preprocess_pool.wrap_initializer(ON, Initializer(TARGET.module, "missing")) is False


def test_upstreams_processor_without_the_initializer_is_an_exit_2_naming_it(monkeypatch, capsys):
    monkeypatch.setattr(upstream_pool_target, preprocess_pool.POOL_OWNER, object(), raising=False)
    with pytest.raises(SystemExit) as exited:
        preprocess_pool.wrap_initializer(ON, Initializer(TARGET.module, "missing"))
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{TARGET.module}.missing" in err
    assert "ai-dynamo" in err


class _FactoryWithoutTheGlobal:
    async def chat_engine_factory(self):
        return None


class _FactoryReadingTheGlobal:
    async def chat_engine_factory(self):
        return _init_worker  # noqa: F821 - only its name is read, as upstream's factory reads it


def test_a_factory_that_no_longer_reads_the_global_is_an_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(
        upstream_pool_target, preprocess_pool.POOL_OWNER, _FactoryWithoutTheGlobal, raising=False
    )
    with pytest.raises(SystemExit) as exited:
        preprocess_pool.wrap_initializer(ON, TARGET)
    assert exited.value.code == 2
    assert "chat_engine_factory" in capsys.readouterr().err


def test_a_factory_that_reads_the_global_gets_it_wrapped(monkeypatch):
    monkeypatch.setattr(
        upstream_pool_target, preprocess_pool.POOL_OWNER, _FactoryReadingTheGlobal, raising=False
    )
    assert preprocess_pool.wrap_initializer(ON, TARGET)
    assert isinstance(upstream_pool_target._init_worker, functools.partial)
