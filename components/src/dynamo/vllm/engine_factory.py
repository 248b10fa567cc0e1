"""Pick and build the engine named by ``--engine``.

The vLLM adapter is imported only when asked for: importing vLLM pulls in torch (seconds, and
hundreds of thousands of objects), which the mock engine must not pay for.
"""

from __future__ import annotations

import argparse
import importlib

from dynamo.vllm.engine import Engine, EngineUnavailable
from dynamo.vllm.mock_engine import MockEngine

VLLM_MISSING_HINT = (
    "install it into a separate environment with scripts/setup_vllm_env.sh and run the worker "
    "from there, or use the built-in engine with --engine mock"
)


def build_engine(
    config: argparse.Namespace, *, worker_extension_cls: str | None = None
) -> Engine:
    """The engine for ``config.engine``; raises :class:`EngineUnavailable` when it cannot run here.

    ``worker_extension_cls`` is a qualified class name whose methods every rank's worker gets
    (vLLM's ``worker_extension_cls``); the self-benchmark's GC policy uses it.
    """
    if config.engine == "mock":
        return MockEngine.from_config(config, worker_extension_cls=worker_extension_cls)
    if config.engine == "vllm":
        return _build_vllm_engine(config, worker_extension_cls=worker_extension_cls)
    raise EngineUnavailable(f"unknown engine {config.engine!r} (choose mock or vllm)")


def _build_vllm_engine(
    config: argparse.Namespace, *, worker_extension_cls: str | None
) -> Engine:
    try:
        importlib.import_module("vllm")
    except ImportError as exc:
        raise EngineUnavailable(
            f"--engine vllm: vLLM is not installed in this Python environment ({exc}); "
            + VLLM_MISSING_HINT
        ) from exc
    try:
        vllm_engine = importlib.import_module("dynamo.vllm.vllm_engine")
    except ModuleNotFoundError as exc:
        if exc.name != "dynamo.vllm.vllm_engine":
            raise
        raise EngineUnavailable(
            "--engine vllm: this build of dynamo has no vLLM adapter "
            "(dynamo.vllm.vllm_engine); use --engine mock"
        ) from exc
    return vllm_engine.build_vllm_engine(config, worker_extension_cls=worker_extension_cls)
