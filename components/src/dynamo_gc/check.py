"""``python -m dynamo_gc.check [frontend] [vllm] [mocker]``: check the installed ai-dynamo now.

Each adapter checks upstream's hooked symbols when its process starts. This runs the same checks
without starting anything, for an image build (``RUN pip install ... && python -m dynamo_gc.check
frontend vllm``): a release the adapters cannot hook fails the build instead of a pod. It matters
most for the ``gc-freeze`` route extension: before ai-dynamo 1.4.0 upstream's frontend ignores
``DYN_FRONTEND_ROUTE_EXTENSIONS``, so nothing of the adapter's ever runs in that process and
nothing there can say it serves unfrozen; this check says so at build time (exit 2 naming the
missing route hook).

One line per launcher checked on stdout; a refusal is the adapters' own (exit 2, the version and
the symbol). The ``vllm`` check imports upstream's worker module, so vLLM must import there. The
request paths the serving-time maintenance gates are checked too: the worker's handlers, and the
frontend's chat processors where their module imports (the ``vllm`` and ``sglang`` processors
need vLLM and SGLang; one that does not import is named as not checked).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

from dynamo_gc.upstream import (
    embedding_children,
    frontend_freeze,
    frontend_hooks,
    hooks,
    request_gate,
    stand_down,
    versions,
)

PROGRAM = "python -m dynamo_gc.check"
LAUNCHERS = ("frontend", "vllm", "mocker")


def _check_frontend() -> str:
    module = frontend_hooks.checked_frontend_main(PROGRAM)
    own = stand_down.upstream_freeze_in(module)
    if own is not None:
        return f"frontend: upstream freezes it itself ({own}); the adapter would stand down"
    return (
        f"frontend: {frontend_hooks.FRONTEND_MAIN}.{frontend_hooks.ROUTE_HOOK} is called before "
        "HTTP starts: DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze and python -m dynamo_gc.frontend "
        f"freeze there; {_check_processors()}"
    )


def _check_processors() -> str:
    """The chat processors' request paths (the frontend's maintenance), where they import."""
    checked, not_checked = [], []
    for processor, paths in frontend_freeze.REQUEST_PATHS.items():
        try:
            for path in paths:
                importlib.import_module(path.module)
        except ImportError as exc:
            not_checked.append(f"{processor} ({type(exc).__name__}: {exc})")
            continue
        for path in paths:
            request_gate.resolve(PROGRAM, path)  # exit 2 when it moved
        checked.append(processor)
    line = f"maintenance request paths checked: {', '.join(checked) or 'none'}"
    if not_checked:
        line += f"; not checked, their modules do not import here: {', '.join(not_checked)}"
    return line


def _check_worker(name: str) -> str:
    adapter = importlib.import_module(f"dynamo_gc.{name}").ADAPTER
    for hook in adapter.checked_hooks:
        hooks.resolve(PROGRAM, hook)
    for path in adapter.request_paths:
        request_gate.resolve(PROGRAM, path)
    upstream = importlib.import_module(adapter.hooks[0].module)
    children = ""
    if adapter.embedding_children and embedding_children.checked_function(PROGRAM, upstream):
        children = "; --embedding-worker-processes children start through the adapter"
    own = stand_down.upstream_freeze_in(upstream)
    if own is not None:
        return f"{name}: upstream freezes it itself ({own}); the adapter would stand down"
    wrapped = ", ".join(hook.symbol for hook in adapter.checked_hooks)
    gated = ""
    if adapter.request_paths:
        gated = "; --gc-maintenance gates " + ", ".join(p.symbol for p in adapter.request_paths)
    return f"{name}: python -m dynamo_gc.{name} wraps {wrapped}{gated}{children}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Check the installed ai-dynamo against the adapters' hooks (exit 2 if not).",
    )
    parser.add_argument(
        "launchers",
        nargs="*",
        metavar="{" + ",".join(LAUNCHERS) + "}",
        help="which of upstream's launchers to check (default: frontend)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.launchers if name not in LAUNCHERS]
    if unknown:  # argparse's choices would also refuse the empty default
        parser.error(f"unknown launcher {unknown[0]!r} (choose from {', '.join(LAUNCHERS)})")
    listed = versions.installed_version() in versions.SUPPORTED_VERSIONS
    print(
        f"{versions.describe_installed()}: "
        + ("a supported release" if listed else "not one of the checked releases")
        + f" ({', '.join(versions.SUPPORTED_VERSIONS)})",
        flush=True,
    )
    for launcher in dict.fromkeys(args.launchers or ["frontend"]):
        line = _check_frontend() if launcher == "frontend" else _check_worker(launcher)
        print(f"  {line}", flush=True)


if __name__ == "__main__":
    main()
