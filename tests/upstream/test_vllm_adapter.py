"""``python -m dynamo_gc.vllm``: upstream's vLLM worker with the freeze before
``register_vllm_model``, checked on upstream's code: the hooks' facts on the real module's file
(compiled, not imported), the wrap on the imported module, bad values and ``--help``, and the
checkpoint/restore standby. Where upstream's module does not import (a vLLM environment without
torchvision: scripts/setup_upstream_env.sh says why it has one), the adapter must refuse loudly,
naming the version and why, rather than run without freezing; the same test checks that path.
The adapter running upstream's worker on the real engine is test_vllm_worker_live.py's.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import types
from importlib.metadata import version
from pathlib import Path

import pytest
from launcher_process import LauncherProcess, wait_until

from dynamo_gc.upstream.hooks import looks_up_global
from dynamo_gc.vllm import ADAPTER

pytestmark = pytest.mark.upstream

HOOK, ENCODE_HOOK = ADAPTER.hooks


def compiled_functions(path: Path) -> dict[str, types.CodeType]:
    """The top-level functions of a module's file, compiled (their code objects), not run."""
    module_code = compile(path.read_text(), str(path), "exec")
    return {
        const.co_name: const for const in module_code.co_consts if isinstance(const, types.CodeType)
    }


def test_upstreams_worker_looks_up_the_wrapped_global_at_call_time():
    spec = importlib.util.find_spec(HOOK.module)
    assert spec is not None and spec.origin is not None
    functions = compiled_functions(Path(spec.origin))
    # the caller names the global (so a replaced global is what it calls) ...
    assert looks_up_global(functions[HOOK.caller], HOOK.name)
    # ... and the global is an async def, as the adapter's wrapper is
    assert functions[HOOK.name].co_flags & inspect.CO_COROUTINE
    # the factory awaits what it was handed on both paths, decode and prefill
    factory_spec = importlib.util.find_spec("dynamo.vllm.worker_factory")
    assert factory_spec is not None and factory_spec.origin is not None
    factory_source = Path(factory_spec.origin).read_text()
    assert factory_source.count("await self.register_vllm_model(") >= 2


def compiled_methods(path: Path, class_name: str) -> dict[str, types.CodeType]:
    """The methods of one class of a module's file, compiled, not run."""
    class_code = compiled_functions(path)[class_name]
    return {
        const.co_name: const for const in class_code.co_consts if isinstance(const, types.CodeType)
    }


def test_the_encode_worker_registers_through_the_factory_modules_global():
    # the multimodal encode worker calls dynamo.llm.register_model directly, never
    # register_vllm_model: the adapter wraps worker_factory's global too (one freeze for both)
    spec = importlib.util.find_spec(ENCODE_HOOK.module)
    assert spec is not None and spec.origin is not None
    class_name, method = ENCODE_HOOK.caller.split(".")
    methods = compiled_methods(Path(spec.origin), class_name)
    assert looks_up_global(methods[method], ENCODE_HOOK.name)
    assert "from dynamo.llm import" in Path(spec.origin).read_text()


def run_adapter(args: list[str], code: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "dynamo_gc.vllm"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def probe() -> subprocess.CompletedProcess:
    """Upstream's worker module imported in a fresh Python (tens of seconds: vLLM and torch)."""
    return run_adapter([], code=f"import {HOOK.module}")


def test_the_adapter_wraps_the_real_module_or_refuses_by_name(probe):
    if probe.returncode == 0:
        wrapped = run_adapter(
            [],
            code=(
                "import inspect\n"
                "from dynamo_gc.upstream import hooks, worker_freeze\n"
                "from dynamo_gc.configuration.gc_options import GcSettings\n"
                "from dynamo_gc.vllm import ADAPTER\n"
                "import dynamo.vllm.main as upstream\n"
                "original = upstream.register_vllm_model\n"
                "freeze = worker_freeze.FreezeOnce(GcSettings(True, 0.0), context='t', "
                "admission='t')\n"
                "hooks.wrap('t', ADAPTER.hooks[0], lambda f: worker_freeze.freezing_wrapper("
                "f, freeze, coroutine=True))\n"
                "assert upstream.register_vllm_model is not original\n"
                "assert upstream.register_vllm_model.__wrapped__ is original\n"
                "assert inspect.iscoroutinefunction(upstream.register_vllm_model)\n"
            ),
        )
        assert wrapped.returncode == 0, wrapped.stderr
        return
    result = run_adapter(["--model", "unused"])
    assert result.returncode == 2, result.stderr
    installed = version("ai-dynamo")
    assert f"ai-dynamo {installed}: dynamo.vllm.main cannot be imported" in result.stderr
    # the import error that stopped it, as upstream's own import reports it
    last_line = probe.stderr.strip().splitlines()[-1]
    assert last_line.split(":", 1)[1].strip() in result.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--gc-pause-log-ms", "-1"], "DYN_VLLM_GC_PAUSE_LOG_MS"),
        (["--no-freeze-gc-heap=1"], "--freeze-gc-heap"),
    ],
    ids=["negative", "valued-boolean"],
)
def test_bad_values_exit_2_before_upstream_is_imported(args, named):
    result = run_adapter([*args, "--model", "unused"])
    assert result.returncode == 2
    assert named in result.stderr
    assert "dynamo.vllm.main" not in result.stderr  # the hook was never resolved


def test_help_shows_the_gc_options_first(probe):
    result = run_adapter(["--help"])
    assert "--no-freeze-gc-heap" in result.stdout
    assert "DYN_VLLM_FREEZE_GC_HEAP" in result.stdout
    if probe.returncode == 0:
        assert result.returncode == 0, result.stderr
        assert "--model" in result.stdout[result.stdout.index("DYN_VLLM_FREEZE_GC_HEAP") :]
    else:
        assert result.returncode == 2  # upstream's help needs upstream's module
        assert "dynamo.vllm.main cannot be imported" in result.stderr


# One line per module imported, on stderr (python -X importtime): vLLM, torch or upstream's worker
# module among them means the standby process imported what upstream keeps out of it.
ENGINE_IMPORTED = re.compile(
    r"^import time:.*\|\s+(vllm|torch|dynamo\.vllm\.main)(\.\S+)?\s*$", re.MULTILINE
)


def test_restore_standby_runs_upstreams_standby_before_vllm_is_imported(tmp_path):
    # Checkpoint/restore: the new pod runs the same command with SNAPSHOT_RESTORE_STANDBY=1, and
    # upstream's __main__ then captures the env and execs `sleep infinity` *before* importing
    # dynamo.vllm.main ("restore standby mode must ... hold without importing vLLM"). The
    # adapter resolves its hooks by importing that module, so it must let upstream's standby
    # step run first.
    control = tmp_path / "snapshot-control"
    standby = LauncherProcess(
        "standby",
        "dynamo_gc.vllm",
        ["--gc-pause-log-ms", "5", "--model", "unused"],
        log_dir=tmp_path,
        env={
            "SNAPSHOT_RESTORE_STANDBY": "1",
            "DYN_SNAPSHOT_CONTROL_DIR": str(control),
            "PYTHONPROFILEIMPORTTIME": "1",
        },
    )
    cmdline = Path(f"/proc/{standby.pid}/cmdline")
    try:

        def holding() -> bool:
            standby.check_alive()
            return cmdline.read_bytes() == b"sleep\0infinity\0"

        wait_until(holding, deadline_s=120, what="the adapter to exec upstream's standby sleep")
        context = json.loads((control / "restore-context.json").read_text())
        assert "env" in context
        log = standby.log()
        assert "| dynamo_gc" in log  # the import profile was on
        assert ENGINE_IMPORTED.search(log) is None, ENGINE_IMPORTED.search(log)
    finally:
        standby.stop()


def test_restore_standby_still_checks_the_gc_options_first(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "dynamo_gc.vllm", "--gc-pause-log-ms", "-1", "--model", "unused"],
        env={
            **os.environ,
            "SNAPSHOT_RESTORE_STANDBY": "1",
            "DYN_SNAPSHOT_CONTROL_DIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "DYN_VLLM_GC_PAUSE_LOG_MS" in result.stderr
    assert not (tmp_path / "restore-context.json").exists()
