"""vLLM's own arguments for ``python -m dynamo.vllm --engine vllm``.

The worker parses its own options first; every argument it does not know is handed, in order, to
vLLM's own parser (``AsyncEngineArgs.add_cli_args`` on vLLM's ``FlexibleArgumentParser``), so
vLLM's flags work as they are::

    python -m dynamo.vllm --engine vllm --model PATH --max-model-len 256 \\
        --kv-cache-memory-bytes 64M --enforce-eager

Five of the worker's options are vLLM's too and reach it from the worker: ``--model`` (the
model to load), ``--served-model-name`` (the name the worker registers; unset: ``--model``),
``--tensor-parallel-size`` (passed on when not 1), ``--worker-extension-cls`` and
``--dyn-reasoning-parser`` (vLLM's ``--reasoning-parser``: :func:`reasoning_parser_for_engine`).
With the self-benchmark, vLLM's ``--scheduler-cls`` is the GC policy's scheduler
(:mod:`dynamo.vllm.gc_scheduler`).

Importing this module imports vLLM (seconds): the worker does it only for ``--engine vllm``.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm.engine.arg_utils import AsyncEngineArgs

from dynamo.vllm.backend_args import REASONING_PARSER, WorkerConfig
from dynamo.vllm.engine import EngineUnavailable
from dynamo.vllm.vllm_help import vllm_arg_parser


def parse_vllm_args(rest: Sequence[str]) -> AsyncEngineArgs:
    """vLLM's engine arguments from the arguments the worker did not recognise.

    Bad input exits 2 with vLLM's own message, as ``vllm serve`` would.
    """
    namespace = vllm_arg_parser().parse_args(list(rest))
    return AsyncEngineArgs.from_cli_args(namespace)


def engine_args_from_config(
    config: WorkerConfig, *, worker_extension_cls: str | None = None
) -> AsyncEngineArgs:
    """The worker's config (its options plus ``config.vllm_args``) as vLLM engine arguments."""
    argv = ["--model", config.model]
    if config.served_model_name:
        argv += ["--served-model-name", config.served_model_name]
    if config.tensor_parallel_size != 1:
        # First, so an explicit vLLM -tp/--tensor-parallel-size later in the rest still wins.
        argv += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    rest = list(config.vllm_args)
    try:
        engine_args = parse_vllm_args(argv + rest)
    except SystemExit as exc:
        if exc.code in (0, None):
            raise
        # vLLM's parser has printed the reason; the worker's usual exit path turns this into 2.
        raise EngineUnavailable(f"--engine vllm: invalid vLLM arguments {rest}") from None
    reasoning_parser_for_engine(config, engine_args)
    if worker_extension_cls is not None:
        engine_args.worker_extension_cls = worker_extension_cls
    if config.self_benchmark.enabled:
        # EngineCore runs the self-benchmark's GC policy through its scheduler (a conflicting
        # user --scheduler-cls exits 2 here, before anything starts).
        from dynamo.vllm.self_benchmark_hooks import resolve_scheduler_cls

        engine_args.scheduler_cls = resolve_scheduler_cls(config, engine_args.scheduler_cls)
    return engine_args


def reasoning_parser_for_engine(config: WorkerConfig, engine_args: AsyncEngineArgs) -> None:
    """``--dyn-reasoning-parser`` is the engine's reasoning parser too, as ``vllm serve
    --reasoning-parser`` makes it: vLLM hands it to its structured-output configuration, and a
    grammar (a forced tool call's, a response_format's) then starts only once the reasoning
    has ended; without it the grammar applies from the first token and the model never
    reasons. vLLM's own ``--reasoning-parser`` naming another parser is refused (exit 2)."""
    name = config.dyn_reasoning_parser
    if name is None:
        return
    given = engine_args.reasoning_parser
    if given and given != name:
        raise EngineUnavailable(
            f"{REASONING_PARSER.source_label()} is {name!r} but vLLM's --reasoning-parser is "
            f"{given!r}: the frontend would parse the output with one and the engine's "
            "structured outputs wait for the other; give one name (--dyn-reasoning-parser "
            "alone is enough)"
        )
    engine_args.reasoning_parser = name


def served_name_of(engine_args: AsyncEngineArgs) -> str:
    """vLLM's first --served-model-name, else --model (what vLLM itself reports)."""
    names = engine_args.served_model_name
    if isinstance(names, str):
        names = [names]
    return names[0] if names else engine_args.model
