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
from pathlib import Path
from types import ModuleType

from dynamo.vllm.backend_args import (
    ENGINE,
    MODEL,
    REASONING_PARSER,
    TOOL_CALL_PARSER,
    WorkerConfig,
)
from dynamo.vllm.cpu_kv_cache import apply_cpu_default
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
        problem = vllm_model_problem(config.model)
        if problem is not None:
            raise EngineUnavailable(f"{MODEL.source_label()} is {config.model!r}: {problem}")
        _import_vllm()
        _check_vllm_parsers(config)
        vllm_args = importlib.import_module("dynamo.vllm.vllm_args")
        vllm_engine = importlib.import_module("dynamo.vllm.vllm_engine")
        engine_args = vllm_args.engine_args_from_config(
            config, worker_extension_cls=worker_extension_cls
        )
        # On CPU, a KV cache that fits when the operator gives no size (one INFO line says so).
        apply_cpu_default(engine_args)
        return functools.partial(
            vllm_engine.VllmEngine, engine_args, chat_template=config.chat_template
        )
    raise EngineUnavailable(f"unknown engine {config.engine!r} (choose mock or vllm)")


def _check_vllm_parsers(config: WorkerConfig) -> None:
    """With vLLM importable, a parser name its registries (ToolParserManager,
    ReasoningParserManager) do not have is the operator's mistake: exit 2 listing its names."""
    if config.dyn_tool_call_parser is None and config.dyn_reasoning_parser is None:
        return
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    for option, value, manager, what in (
        (TOOL_CALL_PARSER, config.dyn_tool_call_parser, ToolParserManager, "tool-call"),
        (REASONING_PARSER, config.dyn_reasoning_parser, ReasoningParserManager, "reasoning"),
    ):
        names = sorted(manager.list_registered())
        if value is not None and value not in names:
            raise EngineUnavailable(
                f"{option.source_label()}: vLLM has no {what} parser {value!r}; its parsers "
                f"are: {', '.join(names)}"
            )


def vllm_model_problem(model: str) -> str | None:
    """Why vLLM cannot load ``model``, when that is plain before importing it: not a path that
    exists here, and not a Hugging Face model id either (vLLM would try it as one and fail with
    Hugging Face's "Repo id must be in the form ..." after seconds of imports), or None."""
    if Path(model).expanduser().exists():
        return None  # a model directory (or a GGUF file): vLLM checks what is in it
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # vLLM brings huggingface_hub; without it vLLM's import says why
        return None
    try:
        validate_repo_id(model)
    except HFValidationError:
        return (
            "no such file or directory, and not a Hugging Face model id (namespace/name) either: "
            "give the directory of a downloaded model (config.json, weights, tokenizer)"
        )
    return None


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
