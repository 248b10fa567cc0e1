"""Every ai-dynamo release the adapters list as supported, read from its wheel.

``dynamo_gc.upstream.versions.SUPPORTED_VERSIONS`` is every release on PyPI since upstream's
frontend calls route extensions (1.4.0 to 1.6.1). For each one the wheel (downloaded by
scripts/setup_upstream_env.sh, never installed) is parsed and compiled, and every upstream symbol
the adapters rely on is checked there the way the adapters check the installed one at start-up:
it exists, is of the kind the adapter wraps, its caller still looks it up as a module global,
and upstream's steps still come in the order the freeze point needs. The hooks are read from the
adapters' own declarations, so a hook added there is checked here too. The releases run end to
end as well: 1.6.1 (every suite here) and 1.6.0 (frontend and mocker, its own environment in CI).

The release before the first (``LAST_RELEASE_WITHOUT_ROUTE_EXTENSIONS``) is read too: its
frontend has no route extensions and does not read ``DYN_FRONTEND_ROUTE_EXTENSIONS``, which is
why docs/ai-dynamo.md names 1.4.0 as the first release the env-var way works on.

A wheel that is not there skips with the command that downloads it; in CI
(``DYNAMO_REQUIRE_UPSTREAM=1``) it fails.
"""

from __future__ import annotations

import inspect
import os

import pytest

from dynamo_gc import mocker, vllm
from dynamo_gc.upstream import (
    embedding_children,
    frontend_freeze,
    frontend_hooks,
    preprocess_pool,
    stand_down,
)
from dynamo_gc.upstream.hooks import ModuleGlobalHook, looks_up_global
from dynamo_gc.upstream.versions import (
    LAST_RELEASE_WITHOUT_ROUTE_EXTENSIONS,
    ROUTE_EXTENSIONS_SINCE,
    SUPPORTED_VERSIONS,
)
from tests.support.upstream_wheels import WHEELS_ENV, Release, wheel_path, wheels_dir
from tests.upstream.conftest import REQUIRE_ENV

pytestmark = pytest.mark.upstream

# every global the worker adapters wrap: the freeze points and the vLLM worker's signal-handler
# installer (deferred to the freeze point, dynamo_gc.upstream.worker_signals)
WORKER_HOOKS = [*vllm.ADAPTER.checked_hooks, *mocker.ADAPTER.checked_hooks]
# every request path the serving-time maintenance gates (dynamo_gc.upstream.request_gate): the
# frontend's chat processors' and the vLLM worker's handlers'
REQUEST_PATHS = [*vllm.ADAPTER.request_paths]
REQUEST_PATHS += [path for paths in frontend_freeze.REQUEST_PATHS.values() for path in paths]


def open_release(version: str) -> Release:
    path = wheel_path(version)
    if path is None:
        reason = (
            f"no ai-dynamo {version} wheel in {wheels_dir()} (scripts/setup_upstream_env.sh "
            f"downloads it; or: pip download --no-deps ai-dynamo=={version} -d {wheels_dir()}; "
            f"{WHEELS_ENV} names another directory)"
        )
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    return Release(version, path)


@pytest.fixture(params=SUPPORTED_VERSIONS)
def release(request):
    opened = open_release(request.param)
    yield opened
    opened.close()


def test_the_list_starts_at_the_first_release_with_route_extensions():
    assert SUPPORTED_VERSIONS[0] == ROUTE_EXTENSIONS_SINCE


def test_the_release_before_the_first_has_no_route_extensions():
    # ai-dynamo 1.3.1 (and 1.2.1, which an operator tried): upstream's frontend neither calls
    # route extensions nor declares the env var, so DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze runs
    # nothing of the adapter's, and python -m dynamo_gc.frontend refuses naming the hook
    old = open_release(LAST_RELEASE_WITHOUT_ROUTE_EXTENSIONS)
    try:
        main = old.module(frontend_hooks.FRONTEND_MAIN)
        assert main.function(frontend_hooks.ROUTE_HOOK) is None
        assert (
            "DYN_FRONTEND_ROUTE_EXTENSIONS" not in old.module(frontend_hooks.FRONTEND_ARGS).source
        )
        assert frontend_hooks.ROUTE_GROUP not in old.entry_points()
        # nor does it load any entry-point group: nothing installed beside it runs there
        # (docs/ai-dynamo.md says why the adapter ships no .pth start-up hook instead)
        frontend = old.sources_under("dynamo.frontend")
        assert frontend and not [path for path, text in frontend.items() if "entry_points" in text]
    finally:
        old.close()


def test_the_frontend_calls_the_route_extensions_after_make_engine_before_http(release):
    main = release.module(frontend_hooks.FRONTEND_MAIN)
    for name in frontend_hooks.FRONTEND_FUNCTIONS:
        assert main.function(name) is not None, name
    assert main.is_async("async_main")
    async_main = main.function("async_main")
    assert async_main is not None
    assert looks_up_global(async_main, frontend_hooks.ROUTE_HOOK)
    assert main.constant("FRONTEND_ROUTE_ENTRYPOINT_GROUP") == frontend_hooks.ROUTE_GROUP
    # the freeze point: the engine is built, the providers are called, then HTTP starts
    engine = main.first_call("async_main", "make_engine")
    hook = main.first_call("async_main", frontend_hooks.ROUTE_HOOK)
    http = main.first_call("async_main", "run_input")
    assert engine < hook < http
    # the env var operators set is upstream's own
    assert "DYN_FRONTEND_ROUTE_EXTENSIONS" in release.module(frontend_hooks.FRONTEND_ARGS).source


def test_the_frontend_options_the_adapter_reads_are_declared(release):
    args = release.module(frontend_hooks.FRONTEND_ARGS)
    add_arguments = args.method("FrontendArgGroup", "add_arguments")
    assert add_arguments is not None
    declared = set(add_arguments.co_consts)
    for flag in frontend_hooks.FRONTEND_OPTIONS.values():
        assert flag in declared, flag


def test_the_preprocess_pool_is_where_the_adapter_wraps_it(release):
    sglang = release.module(preprocess_pool.SGLANG_PROCESSOR)
    assert sglang.function(preprocess_pool.INITIALIZER) is not None
    factory = sglang.method(preprocess_pool.POOL_OWNER, "chat_engine_factory")
    assert factory is not None and looks_up_global(factory, preprocess_pool.INITIALIZER)
    # the vllm processor has no pool of its own, which is why the adapter wraps only sglang's
    vllm_processor = release.module("dynamo.frontend.vllm_processor")
    assert "ProcessPoolExecutor" not in vllm_processor.source
    assert "preprocess_workers is not supported for vllm processor" in vllm_processor.source


@pytest.mark.parametrize("hook", WORKER_HOOKS, ids=lambda hook: hook.symbol)
def test_each_worker_hook_is_where_the_adapter_wraps_it(release, hook: ModuleGlobalHook):
    module = release.module(hook.module)
    defined = module.function(hook.name)
    if defined is not None:
        assert module.is_async(hook.name) == hook.coroutine
    elif module.imports.get(hook.name) == "dynamo.llm":
        # imported from upstream's Rust bindings (dynamo.llm, in ai-dynamo-runtime's wheel):
        # their kind is checked at start-up, on the installed module
        pass
    else:
        # imported from another Python module of the wheel (the worker's signal-handler
        # installer: dynamo.common.utils.graceful_shutdown): defined there, of the same kind
        source = module.imports.get(hook.name)
        assert source is not None and release.has_module(source), hook.symbol
        assert release.module(source).function(hook.name) is not None, f"{source}.{hook.name}"
        assert release.module(source).is_async(hook.name) == hook.coroutine, hook.symbol
    caller = module.caller(hook.caller)
    assert caller is not None, f"{hook.module}.{hook.caller}"
    assert looks_up_global(caller, hook.name)


def test_the_mocker_serves_after_its_engine_is_built(release):
    main = release.module(mocker.ADAPTER.hooks[0].module)
    assert main.first_call("launch_workers", "make_engine") < main.first_call(
        "launch_workers", "run_input"
    )


def test_the_restore_standby_step_runs_before_the_worker_module_is_imported(release):
    target = vllm.ADAPTER.before_engine_import
    assert target is not None
    module_name, _, name = target.partition(":")
    assert release.module(module_name).function(name) is not None
    entry = release.module("dynamo.vllm.__main__")
    assert entry.imports.get(name) == module_name


def test_the_embedding_processes_start_where_the_adapter_reaches_them(release):
    worker_main = release.module(embedding_children.WORKER_MAIN)
    if embedding_children.FUNCTION not in worker_main.imports:
        # before 1.5.0: no --embedding-worker-processes, so no processes to reach
        assert not release.has_module(embedding_children.MODULE)
        for args in ("dynamo.vllm.args", "dynamo.vllm.backend_args"):
            if release.has_module(args):
                assert "--embedding-worker-processes" not in release.module(args).source
        return
    assert worker_main.imports[embedding_children.FUNCTION] == embedding_children.MODULE
    function = release.module(embedding_children.MODULE).function(embedding_children.FUNCTION)
    assert function is not None
    assert embedding_children.command_problem(function) is None
    # the index each child gets in its environment, which the metrics port is offset by
    assert embedding_children.INDEX_ENV in release.module(embedding_children.MODULE).source


def test_no_listed_release_freezes_by_itself(release):
    # the adapters run in full on every listed release; a release with upstream's own freeze
    # module is one they stand down on (dynamo_gc.upstream.stand_down)
    assert not release.has_module(stand_down.UPSTREAM_FREEZE_MODULE)


@pytest.mark.parametrize("path", REQUEST_PATHS, ids=lambda path: path.symbol)
def test_each_request_path_the_maintenance_gates_is_an_async_generator_method(release, path):
    # what request_gate.resolve checks at start-up on the installed class: defined by the class
    # itself, an async generator (the gate counts a request from its first item to its end)
    method = release.module(path.module).method(path.class_name, path.method)
    assert method is not None, path.symbol
    assert method.co_flags & inspect.CO_ASYNC_GENERATOR, path.symbol
