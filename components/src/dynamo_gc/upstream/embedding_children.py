"""The extra processes of ``--embedding-worker-processes N`` start through the adapter too.

Upstream's embedding worker shares one vLLM EngineCore between N Dynamo processes: the first is
the one the operator started; ``create_shared_embedding_engine_client`` (in
``dynamo/vllm/embedding_worker_processes.py``, ai-dynamo 1.5.0 on) starts the other N-1 with
``subprocess.Popen([sys.executable, "-m", "dynamo.vllm", *sys.argv[1:]], env=...)``. Each of
them registers the model like the first and serves on its own, so each holds the same heap. Left
alone they would run upstream's worker without the adapter: unfrozen, and without a line saying
so.

The function looks ``subprocess`` up as a module global when it runs, so the adapter replaces
that global of upstream's module (its code stays as installed) with a stand-in whose ``Popen``
(a subclass of the real one) turns exactly that command into ``python -m dynamo_gc.vllm`` with
the first process's GC settings as flags (the operator's flags were taken out of ``sys.argv``,
and flags beat the env vars the child inherits), then upstream's arguments unchanged. Everything
else of ``subprocess`` is the real module's. A metrics port is offset by the process's index
(upstream's ``DYN_VLLM_EMBEDDING_PROCESS_INDEX`` in the child's environment), as upstream offsets
``DYN_SYSTEM_PORT``, so N processes do not collide on one port.

Before anything starts, the function is checked: it looks ``subprocess`` up as a global, and its
code still builds the command from ``sys.executable``, ``-m`` and ``dynamo.vllm``. A release
where that changed is an exit 2 naming the symbol, never children that would silently run
unfrozen; a release without the function (before 1.5.0) has no such processes, and nothing is
done.
"""

from __future__ import annotations

import dis
import subprocess
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

from dynamo_gc.configuration.gc_options import GcSettings, MaintenanceSettings
from dynamo_gc.upstream.versions import refuse

# Where upstream's worker module imports the function from, and the function.
WORKER_MAIN = "dynamo.vllm.main"
FUNCTION = "create_shared_embedding_engine_client"
MODULE = "dynamo.vllm.embedding_worker_processes"
UPSTREAM_ENTRY = "dynamo.vllm"
ADAPTER_ENTRY = "dynamo_gc.vllm"
# The names the command is built from (``sys.executable``, ``sys.argv``, ``subprocess.Popen``)
# and its two words: what the check reads in the function's code.
COMMAND_NAMES = ("subprocess", "Popen", "sys", "executable", "argv")
COMMAND_WORDS = ("-m", UPSTREAM_ENTRY)
# Set by upstream in each child's environment (``_INDEX_ENV``): the child's index, 1..N-1.
INDEX_ENV = "DYN_VLLM_EMBEDDING_PROCESS_INDEX"


def _code_constants(code: types.CodeType) -> set[Any]:
    found = set()
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _code_constants(const)
        elif isinstance(const, str):
            found.add(const)
    return found


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _loads_global(code: types.CodeType, name: str) -> bool:
    """Whether ``code`` (or code nested in it) reads ``name`` as a global when it runs: a
    replaced global is then what it uses (an import inside the function would not be)."""
    for instruction in dis.get_instructions(code):
        if instruction.opname == "LOAD_GLOBAL" and instruction.argval == name:
            return True
    return any(
        _loads_global(const, name) for const in code.co_consts if isinstance(const, types.CodeType)
    )


def command_problem(code: types.CodeType) -> str | None:
    """Why upstream's function (its code object) no longer starts its children as the adapter
    expects, or ``None``. Also what the tests read in every release's wheel."""
    if not _loads_global(code, "subprocess"):
        return "no longer starts its processes with the module global subprocess"
    missing = [name for name in COMMAND_NAMES if name not in _code_names(code)]
    missing += [word for word in COMMAND_WORDS if word not in _code_constants(code)]
    if missing:
        return (
            f"no longer builds its processes' command as [sys.executable, '-m', "
            f"'{UPSTREAM_ENTRY}', *sys.argv[1:]] (missing: {', '.join(missing)})"
        )
    return None


def child_flags(
    gc: GcSettings,
    maintenance: MaintenanceSettings,
    metrics: tuple[str, int] | None,
    env: Mapping[str, str] | None,
) -> list[str]:
    """The first process's GC settings as the adapter's flags, for one child: the freeze, the
    pause log, the maintenance (its mode always, so an env var the child inherits cannot turn on
    what the first process's flag turned off; its budget only with it on, where the child's own
    check judges it as the first process's did) and the metrics port."""
    flags = [
        "--freeze-gc-heap" if gc.freeze_gc_heap else "--no-freeze-gc-heap",
        "--gc-pause-log-ms",
        repr(gc.gc_pause_log_ms),
        "--gc-maintenance",
        maintenance.mode,
    ]
    if maintenance.enabled:
        flags += ["--gc-pause-budget-ms", repr(maintenance.pause_budget_ms)]
    if metrics is not None:
        host, port = metrics
        if port > 0:
            index = (env or {}).get(INDEX_ENV, "")
            if not index.isdigit():
                raise RuntimeError(
                    f"dynamo_gc: upstream started an embedding process without {INDEX_ENV}: "
                    "its --gc-metrics-port cannot be told apart from the others'"
                )
            port += int(index)
        flags += ["--gc-metrics-port", str(port), "--gc-metrics-host", host]
    return flags


def adapter_command(args: Sequence[str], flags: Sequence[str]) -> list[str] | None:
    """``args`` as the adapter's command, when it is upstream's ``-m dynamo.vllm`` one."""
    if list(args[:3]) != [sys.executable, "-m", UPSTREAM_ENTRY]:
        return None
    return [sys.executable, "-m", ADAPTER_ENTRY, *flags, *args[3:]]


def subprocess_for_children(
    gc: GcSettings, maintenance: MaintenanceSettings, metrics: tuple[str, int] | None
) -> types.ModuleType:
    """A stand-in for upstream's ``subprocess`` global: the real module, but for ``Popen``."""

    class ChildPopen(subprocess.Popen):
        def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
            if isinstance(args, (list, tuple)):
                flags = child_flags(gc, maintenance, metrics, kwargs.get("env"))
                args = adapter_command(args, flags) or args
            super().__init__(args, *rest, **kwargs)

    class Subprocess(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(subprocess, name)

    stand_in = Subprocess("subprocess", "dynamo_gc's subprocess for upstream's embedding children")
    stand_in.Popen = ChildPopen  # type: ignore[attr-defined]
    stand_in.__dynamo_gc_hook__ = True  # type: ignore[attr-defined]
    return stand_in


def checked_function(program: str, worker_main: types.ModuleType) -> Any | None:
    """Upstream's function, once its command is what the adapter rewrites; ``None`` in a release
    without it (nothing to reach)."""
    function = getattr(worker_main, FUNCTION, None)
    if function is None:
        return None
    code = getattr(function, "__code__", None)
    if code is None or getattr(function, "__module__", None) != MODULE:
        refuse(program, f"{WORKER_MAIN}.{FUNCTION}", f"is no longer {MODULE}'s function")
    problem = command_problem(code)
    if problem is not None:
        refuse(program, f"{MODULE}.{FUNCTION}", problem)
    return function


def install(
    program: str,
    worker_main: types.ModuleType,
    gc: GcSettings,
    maintenance: MaintenanceSettings,
    *,
    metrics: tuple[str, int] | None,
) -> bool:
    """Route upstream's embedding children through the adapter; whether there was anything to
    route (an exit 2 when upstream's function changed)."""
    function = checked_function(program, worker_main)
    if function is None:
        return False
    function.__globals__["subprocess"] = subprocess_for_children(gc, maintenance, metrics)
    return True


def uninstall(worker_main: types.ModuleType) -> None:
    """Put the real ``subprocess`` back (tests)."""
    function = getattr(worker_main, FUNCTION, None)
    if function is not None and getattr(
        function.__globals__.get("subprocess"), "__dynamo_gc_hook__", False
    ):
        function.__globals__["subprocess"] = subprocess
