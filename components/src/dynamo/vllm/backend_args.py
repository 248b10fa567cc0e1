"""Options of ``python -m dynamo.vllm`` (the worker)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynamo.common.configuration import (
    Choice,
    Surface,
    build_parser,
    choice_option,
    count_option,
    host_option,
    parse_surface,
    port_option,
    prerequisites,
    text_option,
)
from dynamo.common.configuration.launcher_config import (
    LauncherConfig,
    budget_requirement,
    maintenance_problem,
    process_options,
)
from dynamo.common.configuration.prerequisites import Requires
from dynamo.common.configuration.runtime_options import DISCOVERY_OPTIONS, DISCOVERY_REQUIREMENTS
from dynamo.vllm import self_benchmark_args
from dynamo.vllm.mock_options import MOCK_HEAP_EVICT_PERCENT, MOCK_HEAP_GROWTH, MOCK_OPTIONS
from dynamo_gc.configuration.gc_options import (
    WORKER_MAINTENANCE_MODES,
    debug_gc_endpoint_option,
)
from dynamo_gc.configuration.typed import typed_config

PROG = "python -m dynamo.vllm"

REQUEST_PLANE_HOST = host_option(
    "request-plane-host",
    "DYN_VLLM_REQUEST_PLANE_HOST",
    "127.0.0.1",
    "Address the worker's request plane listens on (the frontend connects to it)",
)

REQUEST_PLANE_PORT = port_option(
    "request-plane-port",
    "DYN_VLLM_REQUEST_PLANE_PORT",
    0,
    "Port of the worker's request plane (0 picks a free port)",
)

TENSOR_PARALLEL_SIZE = count_option(
    "tensor-parallel-size",
    "DYN_VLLM_TENSOR_PARALLEL_SIZE",
    1,
    (
        "Ranks every forward pass runs on, in lockstep (a step ends when every rank is done). "
        "vLLM engine: passed on as vLLM's --tensor-parallel-size (a -tp/--tensor-parallel-size "
        "among vLLM's own arguments wins). Mock engine: R rank processes"
    ),
    low=1,
    high=64,
    metavar="R",
)

SYSTEM_HOST = host_option(
    "system-host",
    "DYN_SYSTEM_HOST",
    "0.0.0.0",
    "Address the system server (/live, /health, /metrics) listens on, with --system-port",
)

SYSTEM_PORT = port_option(
    "system-port",
    "DYN_SYSTEM_PORT",
    None,
    (
        "Serve GET /live (liveness: 200 while the process answers, in every phase), GET "
        "/health (readiness: 200 once serving, 503 while starting or draining) and GET "
        "/metrics on this port (unset: no system server; 0 picks a free port and logs it)"
    ),
)

MODEL = text_option(
    "model",
    "DYN_VLLM_MODEL",
    (
        "The model to serve (required). vLLM engine: vLLM's --model (a model directory or a "
        "Hugging Face id). Mock engine: a Hugging Face tokenizer directory (tokenizer.json), "
        "whose vocabulary the mock echoes and counts in, e.g. scripts/make_tiny_model.py "
        "--tokenizer-only"
    ),
    what="model",
    metavar="MODEL",
)

SERVED_MODEL_NAME = text_option(
    "served-model-name",
    "DYN_VLLM_SERVED_MODEL_NAME",
    (
        'The name the worker registers and clients put in "model" (unset: --model). vLLM '
        "engine: passed on as vLLM's --served-model-name"
    ),
    what="model name",
    metavar="NAME",
)

CHAT_TEMPLATE = text_option(
    "chat-template",
    "DYN_VLLM_CHAT_TEMPLATE",
    (
        "A Jinja chat template file the frontend renders instead of the model's own (vLLM "
        "serve's --chat-template); published in the model card (unset: the model's template). "
        "It must be one a frontend renders: a .jinja, .jinja2 or .j2 file once links are "
        "resolved, at most 1 MiB, compiling"
    ),
    what="path",
    metavar="FILE",
)

# Upstream's runtime args (ai-dynamo 1.6.1, common/configuration/groups/runtime_args.py), with
# its env names: the worker names the parsers, the model card carries them to the frontend.
TOOL_CALL_PARSER = text_option(
    "dyn-tool-call-parser",
    "DYN_TOOL_CALL_PARSER",
    (
        "The tool-call parser the frontend runs over this model's output, published in the "
        "model card (upstream's name); the frontend's --tool-call-parser overrides it. With "
        "--engine vllm a name vLLM's ToolParserManager does not have exits 2. Unset: none"
    ),
    what="parser name",
    metavar="NAME",
)

REASONING_PARSER = text_option(
    "dyn-reasoning-parser",
    "DYN_REASONING_PARSER",
    (
        "The reasoning parser the frontend runs over this model's output, published in the "
        "model card (upstream's name); the frontend's --reasoning-parser overrides it. With "
        "--engine vllm a name vLLM's ReasoningParserManager does not have exits 2, and the "
        "engine gets it too, as from vllm serve's --reasoning-parser: a structured output (a "
        "forced tool call, a response_format) starts once the reasoning has ended. Unset: none"
    ),
    what="parser name",
    metavar="NAME",
)

# The process's own: the GC options, the serving-time maintenance's and the drain deadline.
PROCESS_OPTIONS = process_options(
    flag_prefix="", env_prefix="DYN_VLLM_", maintenance_modes=WORKER_MAINTENANCE_MODES
)
ENGINE = choice_option(
    "engine",
    "DYN_VLLM_ENGINE",
    "vllm",
    (
        "Engine behind the worker: vLLM's AsyncLLM (as upstream Dynamo runs it), or the "
        "built-in mock engine (tests, demos, benchmarks without vLLM)"
    ),
    kind=Choice(("vllm", "mock")),
)

OPTIONS = [
    MODEL,
    SERVED_MODEL_NAME,
    ENGINE,
    CHAT_TEMPLATE,
    TOOL_CALL_PARSER,
    REASONING_PARSER,
    TENSOR_PARALLEL_SIZE,
    *DISCOVERY_OPTIONS,
    REQUEST_PLANE_HOST,
    REQUEST_PLANE_PORT,
    *MOCK_OPTIONS,
    *PROCESS_OPTIONS,
    SYSTEM_HOST,
    SYSTEM_PORT,
    DEBUG_GC_ENDPOINT := debug_gc_endpoint_option(
        name="debug-gc-endpoint",
        env_var="DYN_VLLM_DEBUG_GC_ENDPOINT",
        where="the system port (needs --system-port)",
        collect=True,
    ),
]

SURFACE = Surface(
    name="vllm-worker",
    title="vLLM worker (`python -m dynamo.vllm`)",
    program=PROG,
    description=(
        "Inference worker. It initialises its engine, freezes its GC heap, registers its model "
        "for discovery and serves requests from the frontend."
    ),
    options=OPTIONS,
)

# What the command line accepts: the worker's options plus the self-benchmark's (documented on a
# page of their own, see self_benchmark_args).
ALL_OPTIONS = [*OPTIONS, *self_benchmark_args.OPTIONS]

_SYSTEM_PORT_SET = f"{SYSTEM_PORT.source_label()} set"
_MOCK_ENGINE = f"{ENGINE.source_label()} mock"
_SELF_BENCHMARK = f"{self_benchmark_args.SELF_BENCHMARK_POINTS.source_label()} above 0"
_FREEZE_POLICY = f"{self_benchmark_args.FPM_GC_POLICY.source_label()} freeze"

# Options that act only with another one (see dynamo.common.configuration.prerequisites).
REQUIREMENTS = [
    *DISCOVERY_REQUIREMENTS,
    Requires(DEBUG_GC_ENDPOINT, _SYSTEM_PORT_SET, lambda c: c.system_port is not None),
    Requires(SYSTEM_HOST, _SYSTEM_PORT_SET, lambda c: c.system_port is not None),
    *(Requires(option, _MOCK_ENGINE, lambda c: c.engine == "mock") for option in MOCK_OPTIONS),
    Requires(
        MOCK_HEAP_EVICT_PERCENT,
        f"{MOCK_HEAP_GROWTH.source_label()} above 0",
        lambda c: c.mock_heap_growth > 0,
    ),
    budget_requirement(PROCESS_OPTIONS, WORKER_MAINTENANCE_MODES),
    *(
        Requires(option, _SELF_BENCHMARK, lambda c: c.self_benchmark_points > 0)
        for option in (
            self_benchmark_args.SELF_BENCHMARK_OUTPUT,
            self_benchmark_args.FPM_GC_POLICY,
            self_benchmark_args.FPM_GC_FREEZE_INTERVAL_S,
        )
    ),
    Requires(
        self_benchmark_args.FPM_GC_FREEZE_INTERVAL_S,
        _FREEZE_POLICY,
        lambda c: c.fpm_gc_policy == self_benchmark_args.POLICY_FREEZE,
    ),
]
_PARSED = dataclasses.replace(SURFACE, options=ALL_OPTIONS)


HELP_FLAGS = ("-h", "--help")
HELP_SEARCH = "--help="  # vLLM's search of its own arguments: --help=CacheConfig


@dataclass(frozen=True)
class SelfBenchmarkSettings:
    """The self-benchmark's options (see :mod:`dynamo.vllm.self_benchmark_args`)."""

    points: int
    output: str | None
    policy: str
    freeze_interval_s: float
    worker_extension_cls: str | None

    @property
    def enabled(self) -> bool:
        return self.points > 0


@dataclass(frozen=True)
class WorkerConfig(LauncherConfig):
    """``python -m dynamo.vllm``'s options, parsed: one field per option of
    :data:`ALL_OPTIONS` (held to them by
    :func:`~dynamo_gc.configuration.typed.typed_config`), and ``vllm_args``: the arguments
    the worker does not know, in order, for vLLM's own parser (``--engine vllm``)."""

    model: str
    served_model_name: str | None
    engine: str
    chat_template: str | None
    dyn_tool_call_parser: str | None
    dyn_reasoning_parser: str | None
    tensor_parallel_size: int
    request_plane_host: str
    request_plane_port: int
    mock_token_ms: float
    mock_max_model_len: int | None
    mock_init_ms: float
    mock_heap_objects: int
    mock_heap_growth: int
    mock_heap_evict_percent: int
    system_host: str
    system_port: int | None
    self_benchmark_points: int
    self_benchmark_output: str | None
    fpm_gc_policy: str
    fpm_gc_freeze_interval_s: float
    worker_extension_cls: str | None
    vllm_args: tuple[str, ...]

    @property
    def self_benchmark(self) -> SelfBenchmarkSettings:
        return SelfBenchmarkSettings(
            self.self_benchmark_points,
            self.self_benchmark_output,
            self.fpm_gc_policy,
            self.fpm_gc_freeze_interval_s,
            self.worker_extension_cls,
        )

    @property
    def served_name(self) -> str:
        """The name the worker registers: --served-model-name, else --model."""
        return self.served_model_name or self.model


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> WorkerConfig:
    """The worker's options; with ``--engine vllm`` the rest goes to vLLM.

    The worker's own options are parsed first. With ``--engine vllm`` every argument the worker
    does not know is kept, in order, in ``vllm_args`` for vLLM's own parser (see
    ``dynamo.vllm.vllm_args``), so vLLM's flags work as they are; with the mock engine an
    unknown argument exits 2 as usual. ``--help`` prints the worker's options, then, with
    ``--engine vllm``, vLLM's engine arguments (exit 0).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    words = argv[: argv.index("--")] if "--" in argv else argv
    searches = [word for word in words if word.startswith(HELP_SEARCH)]
    if searches:  # vLLM's --help=<group>: that part of vLLM's arguments, as vLLM prints it
        _print_vllm_help_search(
            [word for word in argv if not word.startswith(HELP_SEARCH)], env, searches[-1]
        )
    if any(word in HELP_FLAGS for word in words):
        _print_help([word for word in argv if word not in HELP_FLAGS], env)
    parsed, rest = parse_surface(_PARSED, argv, env, allow_unknown=True)
    if rest and parsed.engine != "vllm":
        parse_surface(_PARSED, argv, env)  # exits 2, naming the unrecognized arguments
    if parsed.model is None:
        build_parser(_PARSED).error(
            f"{MODEL.source_label()} is required: with --engine vllm the model to load (a "
            "directory or a Hugging Face id), with --engine mock a tokenizer directory"
        )
    config = typed_config(WorkerConfig, parsed, vllm_args=tuple(rest))
    problem = maintenance_problem(config, OPTIONS)
    if problem is not None:
        build_parser(_PARSED).error(problem)
    prerequisites.refuse_command_line_problem(_PARSED, REQUIREMENTS, config, argv)
    return config


def _print_help(argv: list[str], env: Mapping[str, str] | None) -> None:
    """The worker's help, then vLLM's engine arguments when the engine is vLLM; exits 0."""
    config, _ = parse_surface(_PARSED, argv, env, allow_unknown=True)
    from dynamo.vllm.vllm_help import print_vllm_help, quiet_when_output_closed

    with quiet_when_output_closed() as output:
        build_parser(_PARSED).print_help()
        sys.stdout.flush()  # the worker's options now: vLLM's import takes seconds
        if config.engine == "vllm" and output.open():  # `| head` may have all it wants
            print_vllm_help()
    raise SystemExit(0)


def _print_vllm_help_search(argv: list[str], env: Mapping[str, str] | None, word: str) -> None:
    """``--help=<keyword>``: the part of vLLM's arguments it names, as ``vllm serve`` prints
    it; exits 0 (2 with the mock engine, which has no vLLM arguments)."""
    config, _ = parse_surface(_PARSED, argv, env, allow_unknown=True)
    if config.engine != "vllm":
        build_parser(_PARSED).error(
            f"{word} searches vLLM's engine arguments, and {ENGINE.source_label()} is "
            f"{config.engine!r}: use --help for the worker's options"
        )
    from dynamo.vllm.vllm_help import print_vllm_help, quiet_when_output_closed

    with quiet_when_output_closed():
        print_vllm_help(search=word[len(HELP_SEARCH) :])
    raise SystemExit(0)
