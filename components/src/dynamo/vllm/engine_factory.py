"""Pick and build the engine named by ``--engine``: vLLM (the default, as upstream Dynamo's
``python -m dynamo.vllm`` runs it) or the built-in mock engine, chosen explicitly.

The vLLM adapter is imported only when asked for: importing vLLM pulls in torch (seconds, and
hundreds of thousands of objects), which the mock engine must not pay for. Without vLLM the
worker exits 2 saying so and naming ``--engine mock``; it never falls back on its own.

Building an engine has two steps. :func:`prepare_engine` runs before the event loop exists and
checks everything that bad input can break (vLLM's own arguments, the mock's model directory);
what it derives is held by the builder it returns, never written back to the configuration.
Calling the builder creates the engine (nothing starts before ``Engine.start``).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType

from dynamo.vllm.backend_args import ENGINE, MODEL, WorkerConfig
from dynamo.vllm.engine import Engine, EngineUnavailable
from dynamo.vllm.mock_engine import MockEngine, load_mock_config_model
from dynamo.vllm.mock_model import BadModelDirectory
from dynamo.vllm.vllm_help import VLLM_MISSING_HINT

EngineBuilder = Callable[[], Engine]


def prepare_engine(
    config: WorkerConfig, *, worker_extension_cls: str | None = None
) -> EngineBuilder:
    """Check what can fail in the chosen engine on bad input, before anything starts; return
    the engine's builder.

    With ``--engine vllm``: import vLLM (seconds; ``main()`` calls this before the event loop
    exists) and parse vLLM's own arguments (``config.vllm_args``). With ``--engine mock``: load
    the tokenizer directory ``--model`` names. Raises :class:`EngineUnavailable` when vLLM is
    missing, an argument is bad (vLLM's parser has printed why) or the mock's directory is not a
    model's (the message names the option).

    ``worker_extension_cls`` is a qualified class name whose methods every rank's worker gets
    (vLLM's ``worker_extension_cls``); the self-benchmark's GC policy uses it.
    """
    if config.engine == "mock":
        try:
            model = load_mock_config_model(config)
        except BadModelDirectory as exc:
            raise EngineUnavailable(f"{MODEL.source_label()}: {exc}") from None
        return functools.partial(
            MockEngine.from_config, config, model=model, worker_extension_cls=worker_extension_cls
        )
    if config.engine == "vllm":
        _import_vllm()
        vllm_args = importlib.import_module("dynamo.vllm.vllm_args")
        vllm_engine = importlib.import_module("dynamo.vllm.vllm_engine")
        engine_args = vllm_args.engine_args_from_config(
            config, worker_extension_cls=worker_extension_cls
        )
        return functools.partial(
            vllm_engine.VllmEngine, engine_args, chat_template=config.chat_template
        )
    raise EngineUnavailable(f"unknown engine {config.engine!r} (choose mock or vllm)")


def build_engine(config: WorkerConfig, *, worker_extension_cls: str | None = None) -> Engine:
    """The engine for ``config.engine`` (:func:`prepare_engine`, then its builder)."""
    return prepare_engine(config, worker_extension_cls=worker_extension_cls)()


def _import_vllm() -> ModuleType:
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise EngineUnavailable(
            f"{ENGINE.source_label()} is vllm (the default): vLLM is not installed in this "
            f"Python environment ({exc}); " + VLLM_MISSING_HINT
        ) from exc
