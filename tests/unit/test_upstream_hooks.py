"""The upstream adapters' hook machinery (dynamo_gc.upstream.hooks, .worker_freeze), on real
modules written to a temporary directory: a hooked global is resolved, checked and wrapped, or the
program exits 2 naming the installed ai-dynamo version and the symbol; the wrapper freezes once,
marks the process serving, and calls the original unchanged.

The adapters against upstream's real modules are tested in tests/upstream (their own venv).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import sys
import textwrap

import pytest

from dynamo_gc import lifecycle
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.freeze import FreezeRecord, add_freeze_observer, remove_freeze_observer
from dynamo_gc.upstream import hooks, versions, worker_freeze
from dynamo_gc.upstream.hooks import ModuleGlobalHook

UPSTREAM_LIKE = """
async def register(model):
    return ("registered", model)

def serve(engine):
    return ("served", engine)

async def worker():
    return await register("m")

def launch():
    return [serve(e) for e in ("a", "b")]

def launch_elsewhere():
    return None

class Factory:
    async def create_encoder(self):
        return await register("encoder")

    async def create_other(self):
        return None
"""

_names = itertools.count()


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A fresh module with upstream's shapes (an async global, a sync one, their callers)."""
    name = f"upstream_like_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(UPSTREAM_LIKE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield __import__(name)
    sys.modules.pop(name, None)


def hook(module, name="register", caller="worker", coroutine=True) -> ModuleGlobalHook:
    return ModuleGlobalHook(module=module.__name__, name=name, caller=caller, coroutine=coroutine)


def refusal(capsys, function, *args) -> str:
    with pytest.raises(SystemExit) as exc:
        function(*args)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_a_checked_global_resolves_to_its_module(module):
    assert hooks.resolve("prog", hook(module)) is module


def test_a_caller_may_be_a_method_of_a_class(module, capsys):
    # upstream's multimodal encode worker registers from WorkerFactory's method
    assert hooks.resolve("prog", hook(module, caller="Factory.create_encoder")) is module
    err = refusal(capsys, hooks.resolve, "prog", hook(module, caller="Factory.create_other"))
    assert "Factory.create_other no longer calls the module global register" in err
    err = refusal(capsys, hooks.resolve, "prog", hook(module, caller="Factory.gone"))
    assert "Factory.gone is missing" in err


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda m: delattr(m, "register"), "{m}.register is missing"),
        (lambda m: setattr(m, "register", 42), "{m}.register is not callable (a int)"),
        (lambda m: setattr(m, "register", m.serve), "{m}.register is no longer an async function"),
        (lambda m: delattr(m, "worker"), "{m}.worker is missing"),
        (
            lambda m: setattr(m, "worker", m.launch_elsewhere),
            "{m}.worker no longer calls the module global register",
        ),
    ],
    ids=["missing", "not-callable", "not-async", "caller-missing", "caller-changed"],
)
def test_a_changed_global_exits_2_naming_version_and_symbol(module, capsys, change, problem):
    change(module)
    err = refusal(capsys, hooks.resolve, "python -m prog", hook(module))
    assert err.startswith(f"python -m prog: error: {versions.describe_installed()}: ")
    assert problem.format(m=module.__name__) in err
    assert f"supports ai-dynamo {', '.join(versions.SUPPORTED_VERSIONS)}" in err


def test_a_compiled_awaitable_global_is_checked_as_a_builtin(module, capsys):
    # ai-dynamo's `dynamo.llm.register_model` (what the encode worker awaits) is a pyo3 builtin:
    # not a coroutine function, though it returns an awaitable
    compiled = ModuleGlobalHook(
        module.__name__, "register", "worker", coroutine=True, compiled=True
    )
    module.register = len  # a builtin, as the binding is
    assert hooks.resolve("prog", compiled) is module
    module.register = module.serve  # a Python function that is not async: refused all the same
    err = refusal(capsys, hooks.resolve, "prog", compiled)
    assert f"{module.__name__}.register is no longer an async function" in err
    # a plain (not compiled) async hook still refuses a builtin
    module.register = len
    err = refusal(capsys, hooks.resolve, "prog", hook(module))
    assert f"{module.__name__}.register is no longer an async function" in err


def test_a_module_that_cannot_import_exits_2_with_the_import_error(capsys):
    missing = ModuleGlobalHook("no_such_upstream_module", "f", "g", coroutine=False)
    err = refusal(capsys, hooks.resolve, "prog", missing)
    assert "no_such_upstream_module cannot be imported (ModuleNotFoundError:" in err


def test_the_caller_check_looks_into_nested_code(module):
    # `launch` calls `serve` inside a comprehension (its own code object on 3.11)
    assert hooks.looks_up_global(module.launch, "serve")
    assert hooks.looks_up_global(module.launch.__code__, "serve")
    assert not hooks.looks_up_global(module.launch_elsewhere, "serve")


def test_wrap_replaces_the_global_once_and_unwrap_puts_it_back(module):
    original = module.register
    calls: list[str] = []

    def make(function):
        async def wrapper(*args):
            calls.append("wrapper")
            return await function(*args)

        return wrapper

    assert hooks.wrap("prog", hook(module), make) is original
    assert hooks.wrap("prog", hook(module), make) is original  # a second wrap is not nested
    assert module.register.__wrapped__ is original
    assert asyncio.run(module.worker()) == ("registered", "m")
    assert calls == ["wrapper"]
    hooks.unwrap(hook(module))
    assert module.register is original


def freeze_once(enabled: bool = True) -> worker_freeze.FreezeOnce:
    return worker_freeze.FreezeOnce(
        GcSettings(freeze_gc_heap=enabled, gc_pause_log_ms=0.0),
        context="test, before registering",
        admission="test registers",
    )


def test_the_first_call_freezes_and_marks_serving_later_calls_only_call(module):
    lifecycle.reset_for_new_process()
    freeze = freeze_once()
    hooks.wrap(
        "prog",
        hook(module, "serve", "launch", coroutine=False),
        lambda f: worker_freeze.freezing_wrapper(f, freeze, coroutine=False),
    )
    records: list[FreezeRecord] = []
    add_freeze_observer(records.append)
    try:
        assert module.launch() == [("served", "a"), ("served", "b")]
        assert module.launch() == [("served", "a"), ("served", "b")]
    finally:
        remove_freeze_observer(records.append)
    assert len(records) == 1  # four calls, one freeze
    assert freeze.frozen == records[0].frozen > 0
    assert lifecycle.current_phase() is lifecycle.Phase.SERVING


def test_an_async_global_is_frozen_before_it_runs(module):
    lifecycle.reset_for_new_process()
    freeze = freeze_once()
    seen: list[lifecycle.Phase] = []

    async def register(model):
        seen.append(lifecycle.current_phase())
        return model

    module.register = register
    hooks.wrap(
        "prog",
        hook(module),
        lambda f: worker_freeze.freezing_wrapper(f, freeze, coroutine=True),
    )
    assert asyncio.run(module.worker()) == "m"
    assert seen == [lifecycle.Phase.SERVING]  # upstream's function runs after the freeze
    assert freeze.frozen is not None


def test_off_does_not_freeze_but_still_marks_serving(module):
    lifecycle.reset_for_new_process()
    before = gc.get_freeze_count()
    freeze = freeze_once(enabled=False)
    freeze()
    assert freeze.frozen is None
    assert gc.get_freeze_count() == before
    assert lifecycle.current_phase() is lifecycle.Phase.SERVING
