"""Pick and build the engine named by ``--engine``: vLLM (the default, as upstream Dynamo's
``python -m dynamo.vllm`` runs it) or the built-in mock engine, chosen explicitly.

The vLLM adapter is imported only when asked for: importing vLLM pulls in torch (seconds, and
hundreds of thousands of objects), which the mock engine must not pay for. Without vLLM the
worker exits 2 saying so and naming ``--engine mock``; it never falls back on its own.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from dynamo.vllm.backend_args import ENGINE, MODEL
from dynamo.vllm.engine import Engine, EngineUnavailable
from dynamo.vllm.mock_engine import MockEngine, load_mock_config_model
from dynamo.vllm.mock_model import BadModelDirectory

VLLM_MISSING_HINT = (
    "install it into a separate environment with scripts/setup_vllm_env.sh and run the worker "
    "from there, or run the built-in mock engine with --engine mock --model <tokenizer dir>"
)


def prepare_engine(config: argparse.Namespace, *, worker_extension_cls: str | None = None) -> None:
    """Check what can fail in the chosen engine on bad input, before anything starts.

    With ``--engine vllm``: import vLLM (seconds; ``main()`` calls this before the event loop
    exists) and parse vLLM's own arguments (``config.vllm_args``) into
    ``config.vllm_engine_args``, which :func:`build_engine` then uses. Raises
    :class:`EngineUnavailable` when vLLM is missing or an argument is bad (vLLM's parser has
    printed why). With ``--engine mock``: load the tokenizer directory ``--model`` names into
    ``config.mock_model`` (a bad one raises :class:`EngineUnavailable` naming the option).
    """
    if config.engine == "mock":
        try:
            config.mock_model = load_mock_config_model(config)
        except BadModelDirectory as exc:
            raise EngineUnavailable(f"{MODEL.source_label()}: {exc}") from None
    if config.engine == "vllm":
        vllm_engine = _import_vllm_adapter()
        config.vllm_engine_args = vllm_engine.engine_args_from_config(
            config, worker_extension_cls=worker_extension_cls
        )


def build_engine(config: argparse.Namespace, *, worker_extension_cls: str | None = None) -> Engine:
    """The engine for ``config.engine``; raises :class:`EngineUnavailable` when it cannot run here.

    ``worker_extension_cls`` is a qualified class name whose methods every rank's worker gets
    (vLLM's ``worker_extension_cls``); the self-benchmark's GC policy uses it. Building starts
    nothing (``Engine.start`` does), but for vLLM it imports vLLM unless :func:`prepare_engine`
    has: call it off the event loop.
    """
    if config.engine == "mock":
        return MockEngine.from_config(config, worker_extension_cls=worker_extension_cls)
    if config.engine == "vllm":
        vllm_engine = _import_vllm_adapter()
        return vllm_engine.build_vllm_engine(config, worker_extension_cls=worker_extension_cls)
    raise EngineUnavailable(f"unknown engine {config.engine!r} (choose mock or vllm)")


def _import_vllm_adapter() -> ModuleType:
    try:
        importlib.import_module("vllm")
    except ImportError as exc:
        raise EngineUnavailable(
            f"{ENGINE.source_label()} is vllm (the default): vLLM is not installed in this "
            f"Python environment ({exc}); " + VLLM_MISSING_HINT
        ) from exc
    try:
        return importlib.import_module("dynamo.vllm.vllm_engine")
    except ModuleNotFoundError as exc:
        if exc.name != "dynamo.vllm.vllm_engine":
            raise
        raise EngineUnavailable(
            "--engine vllm: this build of dynamo has no vLLM adapter "
            "(dynamo.vllm.vllm_engine); use --engine mock"
        ) from exc


def print_vllm_help() -> None:
    """vLLM's engine arguments, as ``--help`` lists them after the worker's own options."""
    try:
        vllm_engine = _import_vllm_adapter()
    except EngineUnavailable as exc:
        print(f"\nvLLM's engine arguments are not listed: {exc}")
        return
    print("\nEvery other argument goes to vLLM (--engine vllm):\n")
    vllm_engine.vllm_arg_parser().print_help()
