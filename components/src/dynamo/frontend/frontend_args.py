"""Options of ``python -m dynamo.frontend``."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dynamo.common.bind_errors import is_host_error
from dynamo.common.configuration import (
    Choice,
    Option,
    Surface,
    build_parser,
    choice_option,
    count_option,
    host_option,
    parse_surface,
    port_option,
    prerequisites,
)
from dynamo.common.configuration.launcher_config import (
    LauncherConfig,
    budget_requirement,
    maintenance_problem,
    process_options,
)
from dynamo.common.configuration.runtime_options import DISCOVERY_OPTIONS, DISCOVERY_REQUIREMENTS
from dynamo.frontend.processors.model_files import ModelDirectories
from dynamo_gc.configuration.gc_options import (
    FRONTEND_MAINTENANCE_MODES,
    debug_gc_endpoint_option,
)
from dynamo_gc.configuration.typed import typed_config

from .sglang_options import SGLANG_OPTIONS
from .template_options import TEMPLATE_OPTIONS

PROG = "python -m dynamo.frontend"

HTTP_HOST = host_option(
    "http-host",
    "DYN_HTTP_HOST",
    "0.0.0.0",
    "Address the OpenAI-compatible HTTP service listens on",
)

HTTP_PORT = port_option(
    "http-port",
    "DYN_HTTP_PORT",
    8000,
    "Port of the HTTP service (0 picks a free port and logs it)",
)

READY_MIN_MODELS = count_option(
    "dyn-ready-min-models",
    "DYN_READY_MIN_MODELS",
    1,
    (
        "GET /health (readiness) answers 503 until at least N models are served (found "
        "through discovery, their chat processor built); 0: ready as soon as the HTTP "
        "listener opens. GET /live (liveness) answers 200 regardless"
    ),
    low=0,
    high=100_000,
)

CHAT_PROCESSOR = choice_option(
    "dyn-chat-processor",
    "DYN_CHAT_PROCESSOR",
    "hf",
    (
        "How the frontend applies each model's own tokenizer and chat template (from the "
        "model directory its worker registers): `hf` with the tokenizers and jinja2 "
        "libraries (small heap, no torch); `vllm` with vLLM's tokenizer and chat-template "
        "code, imported at start-up so the start-up freeze covers its ~0.5M-object heap "
        "(needs vLLM installed in the frontend's environment); `sglang` with SGLang's "
        "tokenizer, template and tool-call/reasoning parser code, imported the same way "
        "(~0.5M objects; needs SGLang: scripts/setup_sglang_env.sh)"
    ),
    kind=Choice(("hf", "vllm", "sglang")),
    metavar="NAME",
)

# The process's own: the GC options, the serving-time maintenance's (idle only: the frontend has
# no peer to withdraw to) and the drain deadline.
PROCESS_OPTIONS = process_options(
    flag_prefix="dyn-", env_prefix="DYN_", maintenance_modes=FRONTEND_MAINTENANCE_MODES
)
OPTIONS = [
    HTTP_HOST,
    HTTP_PORT,
    *DISCOVERY_OPTIONS,
    count_option(
        "dyn-preprocess-workers",
        "DYN_PREPROCESS_WORKERS",
        0,
        (
            "Tokenise in a pool of N processes (each freezes its own heap at the end of its "
            "initializer); 0 tokenises in the frontend process, on a few threads, never on its "
            "event loop (chat templates render in the template render processes with the hf "
            "processor, see --dyn-template-processes, else on those threads)"
        ),
        low=0,
        high=1024,
    ),
    CHAT_PROCESSOR,
    *SGLANG_OPTIONS,
    *TEMPLATE_OPTIONS,
    READY_MIN_MODELS,
    count_option(
        "dyn-max-models",
        "DYN_MAX_MODELS",
        64,
        (
            "Most distinct models the frontend serves at once (each holds its tokenizer and "
            "chat template in memory); a newly discovered model over the limit is refused with "
            "one WARNING and not served until one goes"
        ),
        low=1,
        high=100_000,
    ),
    Option(
        name="dyn-strict-request-fields",
        env_var="DYN_STRICT_REQUEST_FIELDS",
        default=False,
        help=(
            "Refuse a request field that neither this server nor vLLM's OpenAI server knows "
            "(400 naming it, code unknown_parameter) instead of accepting it with one WARNING "
            "per field name per minute, as vLLM does (docs/openai-fields.md)"
        ),
    ),
    Option(
        "dyn-model-dirs",
        "DYN_MODEL_DIRS",
        None,
        (
            "Directories the frontend may load models from (each must exist): a discovered "
            "model card whose tokenizer directory, tokenizer files or chat template resolve "
            "outside them is refused with one WARNING; the chat template must be a Jinja file "
            "either way. Unset (the default): any directory, each card's files still confined "
            "to its own model directory (see docs/operator-guide.md, security)"
        ),
        ModelDirectories(),
        metavar="DIR[:DIR...]",
    ),
    choice_option(
        "router-mode",
        "DYN_ROUTER_MODE",
        "round-robin",
        (
            "How requests are spread over a model's workers: round-robin (upstream Dynamo's "
            "default; its other modes, such as kv, are not available here)"
        ),
        kind=Choice(("round-robin",)),
    ),
    *PROCESS_OPTIONS,
    debug_gc_endpoint_option(
        name="dyn-debug-gc-endpoint",
        env_var="DYN_DEBUG_GC_ENDPOINT",
        where="the HTTP port",
        collect=True,
    ),
]

SURFACE = Surface(
    name="frontend",
    title="Frontend (`python -m dynamo.frontend`)",
    program=PROG,
    description=(
        "OpenAI-compatible HTTP frontend. It discovers workers, tokenises and routes requests, "
        "and freezes its GC heap once before it admits the first request."
    ),
    options=OPTIONS,
)


# Options that act only with another one (see dynamo.common.configuration.prerequisites); the
# sglang processor's options are refused outright with another processor (see sglang_checks).
REQUIREMENTS = [
    *DISCOVERY_REQUIREMENTS,
    budget_requirement(PROCESS_OPTIONS, FRONTEND_MAINTENANCE_MODES),
]


def listen_option_at_fault(exc: OSError) -> Option:
    """The option to change when the HTTP listener cannot bind: the host when it is no address
    of this machine (or does not resolve), else the port (taken, or privileged)."""
    if is_host_error(exc):
        return HTTP_HOST
    return HTTP_PORT


@dataclass(frozen=True)
class FrontendConfig(LauncherConfig):
    """``python -m dynamo.frontend``'s options, parsed: one field per option of :data:`OPTIONS`
    (held to them by :func:`~dynamo_gc.configuration.typed.typed_config`)."""

    http_host: str
    http_port: int
    dyn_preprocess_workers: int
    dyn_chat_processor: str
    tool_call_parser: str | None
    reasoning_parser: str | None
    chat_template: str | None
    dyn_max_models: int
    dyn_ready_min_models: int
    dyn_strict_request_fields: bool
    dyn_model_dirs: tuple[str, ...] | None
    dyn_template_processes: int
    dyn_template_timeout: float
    dyn_template_memory_mb: int
    router_mode: str

    @property
    def url(self) -> str:
        """Where the HTTP service listens, as a URL (for log lines)."""
        host = f"[{self.http_host}]" if ":" in self.http_host else self.http_host
        return f"http://{host}:{self.http_port}"


def readiness_problem(config: FrontendConfig) -> str | None:
    """Why the readiness threshold can never be met (more models than the frontend serves)."""
    if config.dyn_ready_min_models > config.dyn_max_models:
        return (
            f"{READY_MIN_MODELS.source_label()} is {config.dyn_ready_min_models}, more than the "
            f"{config.dyn_max_models} models --dyn-max-models / DYN_MAX_MODELS lets the frontend "
            "serve: /health would never be ready"
        )
    return None


def parse_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> FrontendConfig:
    """The frontend's configuration; bad input exits 2 (the parser says why), --help exits 0."""
    config = typed_config(FrontendConfig, parse_surface(SURFACE, argv, env))
    problem = maintenance_problem(config, OPTIONS)
    if problem is not None:
        build_parser(SURFACE).error(problem)
    given = sys.argv[1:] if argv is None else argv
    prerequisites.refuse_command_line_problem(SURFACE, REQUIREMENTS, config, given)
    return config
