"""``python -m dynamo_gc.frontend`` checks upstream's real frontend module before it starts it: a
changed upstream (the route hook gone, no longer called by ``async_main``, another entry-point
group) is an exit 2 naming the installed ai-dynamo version and the symbol."""

from __future__ import annotations

import pytest

from dynamo_gc.upstream import frontend_hooks
from dynamo_gc.upstream.versions import installed_version

pytestmark = pytest.mark.upstream


@pytest.fixture
def upstream_main():
    import dynamo.frontend.main as module

    return module


def test_the_real_upstream_passes_the_checks(upstream_main):
    assert frontend_hooks.checked_frontend_main() is upstream_main
    assert frontend_hooks.upstream_frontend_parse_args() is upstream_main.parse_args


def refused(capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        frontend_hooks.checked_frontend_main()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"ai-dynamo {installed_version()}" in err
    return err


def test_a_missing_route_hook_is_an_exit_2(upstream_main, monkeypatch, capsys):
    monkeypatch.delattr(upstream_main, "load_frontend_route_extensions")
    assert "dynamo.frontend.main.load_frontend_route_extensions is missing" in refused(capsys)


def test_an_async_main_that_no_longer_calls_the_hook_is_an_exit_2(
    upstream_main, monkeypatch, capsys
):
    async def async_main():  # upstream's, without the route-extension call
        return None

    monkeypatch.setattr(upstream_main, "async_main", async_main)
    err = refused(capsys)
    assert "dynamo.frontend.main.async_main no longer calls load_frontend_route_extensions" in err


def test_another_entry_point_group_is_an_exit_2(upstream_main, monkeypatch, capsys):
    monkeypatch.setattr(upstream_main, "FRONTEND_ROUTE_ENTRYPOINT_GROUP", "dynamo.frontend.other")
    assert "FRONTEND_ROUTE_ENTRYPOINT_GROUP is 'dynamo.frontend.other'" in refused(capsys)


@pytest.mark.parametrize(
    ("args", "env", "mode"),
    [
        (["--http-port", "8000"], {}, None),
        (["-i"], {}, "--interactive"),
        (["--kserve-grpc-server"], {}, "--kserve-grpc-server"),
        ([], {"DYN_INTERACTIVE": "1"}, "--interactive"),
        ([], {"DYN_KSERVE_GRPC_SERVER": "true"}, "--kserve-grpc-server"),
        # the flag on the command line wins over upstream's env var, as upstream parses it
        (["--no-interactive"], {"DYN_INTERACTIVE": "1"}, None),
        ([], {"DYN_INTERACTIVE": "0"}, None),
    ],
)
def test_the_no_http_modes_are_read_as_upstream_reads_them(monkeypatch, args, env, mode):
    # Upstream's route-extension check refuses the extension in these modes, flag or env var:
    # the launcher must not add it there (it would be upstream's ValueError, not a freeze).
    for name in ("DYN_INTERACTIVE", "DYN_KSERVE_GRPC_SERVER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert frontend_hooks.non_http_mode(args) == mode


@pytest.mark.parametrize(
    ("args", "env", "workers"),
    [
        ([], {}, 0),
        (["--dyn-chat-processor", "sglang"], {}, 0),
        (["--dyn-chat-processor", "sglang", "--dyn-preprocess-workers", "3"], {}, 3),
        ([], {"DYN_CHAT_PROCESSOR": "sglang", "DYN_PREPROCESS_WORKERS": "2"}, 2),
        # an abbreviation upstream's parser accepts (argparse's default) counts as well
        (["--dyn-chat-processor", "sglang", "--dyn-preprocess", "4"], {}, 4),
        # 1.6.1's vllm processor has no pool of its own to wrap
        (["--dyn-chat-processor", "vllm", "--dyn-preprocess-workers", "2"], {}, 0),
    ],
)
def test_the_pool_the_adapter_must_wrap_is_read_as_upstream_reads_it(
    monkeypatch, args, env, workers
):
    # With a pool asked for, a processor module missing where the adapter looks is an exit 2
    # (upstream moved it), not a pool that runs unfrozen.
    for name in ("DYN_CHAT_PROCESSOR", "DYN_PREPROCESS_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert frontend_hooks.preprocess_pool_requested(args, "test") == workers
