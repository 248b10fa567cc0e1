"""Upstream Dynamo's (ai-dynamo 1.6.1) launcher names that these launchers do not take.

An operator's manifest written for upstream must work here unchanged or fail with a clear error.
Two lists, kept in step with docs/upstream.md by tests/unit/test_docs_upstream.py:

* :data:`REJECTED`: flags (and a few env vars whose silent loss would change what the process
  does, such as a benchmark that would not run) that stop the program with exit 2, naming the
  upstream name and what to use here. Checked before the parser runs, so the message is this
  one, not argparse's "unrecognized arguments" (or, with ``--engine vllm``, vLLM's).
* :data:`IGNORED_ENV`: env vars upstream reads (many are injected by the Dynamo operator into
  every pod) that mean nothing here. Refusing them would break every operator-managed pod, so
  each launcher logs one WARNING at start-up naming those that are set.

A name the surface declares is never rejected nor reported: when an option that upstream has
is added here, its entry stops applying by itself, and tests/unit/test_docs_upstream.py then
asks for the entry to go.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

logger = logging.getLogger(__name__)

FRONTEND = "python -m dynamo.frontend"
WORKER = "python -m dynamo.vllm"
BOTH = (FRONTEND, WORKER)

SELF_BENCHMARK = (
    "this worker's self-benchmark is --self-benchmark-points N / DYN_VLLM_SELF_BENCHMARK_POINTS "
    "(N forward passes over batch-size x sequence-length points, each a prefill plus one decode "
    "step; no prefill/decode/agg grids), with --fpm-gc-policy / DYN_FPM_GC_POLICY and "
    "--self-benchmark-output / DYN_VLLM_SELF_BENCHMARK_OUTPUT"
)
NO_BENCHMARK_KNOB = "the self-benchmark has no such setting; " + SELF_BENCHMARK


@dataclass(frozen=True)
class UpstreamName:
    """One upstream flag or env var, the programs it applies to, and what to do here instead."""

    name: str  # "--router-mode" or "DYN_ROUTER_MODE"
    programs: tuple[str, ...]
    instead: str
    # Env var values that mean what this program does anyway (no error, no warning).
    harmless: tuple[str, ...] = ()

    @property
    def is_flag(self) -> bool:
        return self.name.startswith("--")


def _names(names: Sequence[str], programs, instead: str, harmless=()) -> list[UpstreamName]:
    return [UpstreamName(n, tuple(programs), instead, tuple(harmless)) for n in names]


REJECTED: list[UpstreamName] = [
    # Upstream's self-benchmark: entered through --benchmark-mode.
    *_names(["--benchmark-mode", "DYN_BENCHMARK_MODE"], [WORKER], SELF_BENCHMARK),
    *_names(
        ["--benchmark-output-path", "DYN_BENCHMARK_OUTPUT_PATH"],
        [WORKER],
        "use --self-benchmark-output / DYN_VLLM_SELF_BENCHMARK_OUTPUT (one JSON line per "
        "point, not upstream's results document)",
    ),
    *_names(
        [
            "--benchmark-points-file",
            "DYN_BENCHMARK_POINTS_FILE",
            "--benchmark-timeout",
            "DYN_BENCHMARK_TIMEOUT",
            "--benchmark-warmup-iterations",
            "DYN_BENCHMARK_WARMUP_ITERATIONS",
            "--benchmark-max-batch-size",
            "DYN_BENCHMARK_MAX_BATCH_SIZE",
            "--benchmark-randomize-kda-state",
            "--benchmark-hybrid-live-state",
            "--benchmark-collect-imbalanced",
            "--prefill-max-new-token-samples",
            "--prefill-max-kv-read-token-samples",
            "--decode-max-kv-read-token-samples",
            "--decode-max-batch-size-samples",
            "--prefix-max-batch-size-samples",
        ],
        [WORKER],
        NO_BENCHMARK_KNOB,
    ),  # fmt: skip
    *_names(
        ["--disaggregation-mode", "DYN_VLLM_DISAGGREGATION_MODE"],
        [WORKER],
        "workers here are aggregated only (each prefills and decodes its own requests)",
        harmless=("agg",),
    ),
    *_names(["--enable-multimodal"], [WORKER], "this worker serves text models only"),
    *_names(
        ["--endpoint"],
        [WORKER],
        "a worker here is reached at its request plane, --request-plane-host / "
        "DYN_VLLM_REQUEST_PLANE_HOST and --request-plane-port / DYN_VLLM_REQUEST_PLANE_PORT, "
        "published in its discovery record",
    ),
    *_names(
        ["--request-plane", "--response-plane", "--event-plane"],
        BOTH,
        "the request plane here is always HTTP with NDJSON streaming (no NATS, TCP or ZMQ "
        "planes); there is no event plane",
    ),
    *_names(
        ["--router-mode"],
        [WORKER],
        "routing is the frontend's: --router-mode round-robin on python -m dynamo.frontend",
    ),
    *_names(
        [
            "--kv-cache-block-size",
            "--router-kv-events",
            "--router-temperature",
            "--kv-overlap-score-weight",
            "--router-replica-sync",
            "--router-reset-states",
            "--active-decode-blocks-threshold",
            "--active-prefill-tokens-threshold",
        ],
        [FRONTEND],
        "there is no KV-aware router here; the frontend routes round-robin",
    ),  # fmt: skip
    *_names(
        ["--migration-limit", "--migration-max-seq-len"],
        [FRONTEND],
        "requests are not migrated: the frontend retries on another worker only until the "
        "first output, then fails the request",
    ),
    *_names(
        ["--model-name", "--model-path"],
        [FRONTEND],
        "the frontend serves the models its workers register (each worker's --model / "
        "DYN_VLLM_MODEL); it takes none of its own",
    ),
    *_names(
        ["--tls-cert-path", "--tls-key-path", "--tls-client-ca-cert-path"],
        [FRONTEND],
        "the frontend serves plain HTTP; terminate TLS in front of it (an ingress, a sidecar)",
    ),
    *_names(
        ["--kserve-grpc-server", "--grpc-metrics-port", "--interactive"],
        [FRONTEND],
        "the frontend serves the OpenAI HTTP API only",
    ),
    *_names(
        ["--metrics-prefix"],
        [FRONTEND],
        "metric names are fixed (dynamo_gc_* and prometheus_client's process_*)",
    ),
    *_names(["--dump-config-to"], BOTH, "the options in effect are logged at start-up (INFO)"),
    *_names(
        ["--custom-jinja-template", "DYN_CUSTOM_JINJA_TEMPLATE"],
        [WORKER],
        "use --chat-template / DYN_VLLM_CHAT_TEMPLATE (vLLM serve's name): the file is "
        "published in the model card and the frontend renders it instead of the model's own",
    ),
    *_names(
        [
            "--dyn-tool-call-parser",
            "DYN_TOOL_CALL_PARSER",
            "--dyn-reasoning-parser",
            "DYN_REASONING_PARSER",
        ],
        [WORKER],
        "there is no tool-call or reasoning parsing here: the completion's text comes back as "
        "the model wrote it, without tool_calls or reasoning_content",
    ),  # fmt: skip
    *_names(
        ["--fpm-trace"],
        [WORKER],
        "there are no forward-pass metrics here; GC pauses are in dynamo_gc_pause_seconds",
    ),
    *_names(
        ["--connector"],
        [WORKER],
        "there are no KV connectors here (pass vLLM's own --kv-transfer-config if needed)",
    ),
]

IGNORED_ENV: list[UpstreamName] = [
    *_names(["NATS_SERVER"], BOTH, "there is no NATS here: the request plane is HTTP"),
    *_names(
        ["DYN_ENDPOINT", "DYN_REQUEST_PLANE", "DYN_RESPONSE_PLANE", "DYN_EVENT_PLANE"],
        BOTH,
        "the request plane is HTTP/NDJSON at the worker's --request-plane-host:port",
    ),
    *_names(
        ["DYN_ROUTER_MODE"],
        [WORKER],
        "routing is the frontend's (--router-mode / DYN_ROUTER_MODE there)",
    ),
    *_names(
        ["DYN_SYSTEM_PORT", "DYN_SYSTEM_HOST"],
        [FRONTEND],
        "the frontend has no system server (upstream's frontend ignores it too): its "
        "/health and /metrics are on --http-port / DYN_HTTP_PORT",
    ),
    *_names(
        ["DYN_SYSTEM_ENABLED"],
        [WORKER],
        "the worker's system server runs when --system-port / DYN_SYSTEM_PORT is set",
    ),
    *_names(
        [
            "DYN_SYSTEM_STARTING_HEALTH_STATUS",
            "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS",
            "DYN_HEALTH_CHECK_ENABLED",
        ],
        [WORKER],
        "/health is 503 until the model is registered, then 200 until the drain",
    ),  # fmt: skip
    *_names(
        ["DYN_LOGGING_JSONL", "DYN_LOG_USE_LOCAL_TZ", "DYN_LOGGING_CONFIG_PATH"],
        BOTH,
        "logs are text lines in one format, with the pid on each; levels come from DYN_LOG",
    ),
    *_names(
        ["DYN_FPM_TRACE", "DYN_FORWARDPASS_METRIC_PORT"],
        [WORKER],
        "there are no forward-pass metrics here",
    ),
    *_names(["DYN_KV_CACHE_BLOCK_SIZE"], [FRONTEND], "there is no KV-aware router here"),
    *_names(["DYN_MIGRATION_LIMIT"], [FRONTEND], "requests are not migrated"),
    *_names(
        ["DYN_MODEL_NAME", "DYN_MODEL_PATH"],
        [FRONTEND],
        "the frontend serves the models its workers register",
    ),
]

IGNORED_ENV += _names(
    ["DYN_FILE_KV"],
    BOTH,
    "upstream's file-backend root; the directory here is --discovery-dir / DYN_DISCOVERY_DIR",
)

# Upstream names that options here also declare, with the same spelling (ai-dynamo 1.6.1 and
# the vLLM flags upstream's worker passes on). docs/upstream.md must have a row for each one
# that is declared here; tests/unit/test_docs_upstream.py checks it.
SHARED = frozenset(
    {
        "--http-host", "DYN_HTTP_HOST", "--http-port", "DYN_HTTP_PORT",
        "--router-mode", "DYN_ROUTER_MODE",
        "--namespace", "DYN_NAMESPACE", "--discovery-backend", "DYN_DISCOVERY_BACKEND",
        "ETCD_ENDPOINTS", "--dyn-chat-processor", "DYN_CHAT_PROCESSOR",
        "DYN_SYSTEM_PORT", "DYN_SYSTEM_HOST",
        "DYN_FPM_GC_POLICY", "DYN_FPM_GC_FREEZE_INTERVAL_S",
        "--model", "--served-model-name", "--tensor-parallel-size", "--worker-extension-cls",
        "--dyn-tool-call-parser", "DYN_TOOL_CALL_PARSER",
        "--dyn-reasoning-parser", "DYN_REASONING_PARSER",
        "--custom-jinja-template", "DYN_CUSTOM_JINJA_TEMPLATE",
        "--kv-cache-block-size", "DYN_KV_CACHE_BLOCK_SIZE",
    }
)  # fmt: skip

# Every upstream name this module deals with.
ALL = REJECTED + IGNORED_ENV
KNOWN = SHARED | {entry.name for entry in ALL}


def declared_names(options) -> set[str]:
    """The flags (``--x`` and ``--no-x``) and env vars of these option declarations."""
    names: set[str] = set()
    for option in options:
        names.update(option.flags())
        names.add(option.env_var)
    return names


def _applies(entry: UpstreamName, program: str, declared: AbstractSet[str]) -> bool:
    return program in entry.programs and entry.name not in declared


def _flag_given(flag: str, argv: Sequence[str]) -> bool:
    for token in argv:
        if token == "--":
            return False
        if token == flag or token.startswith(flag + "="):
            return True
    return False


def rejected_problem(
    program: str, argv: Sequence[str], env: Mapping[str, str], declared: set[str]
) -> str | None:
    """The error for the first upstream-only name given to ``program``, or ``None``.

    ``declared`` holds the flags and env vars the program's surface declares.
    """
    for entry in REJECTED:
        if not _applies(entry, program, declared):
            continue
        if entry.is_flag:
            if _flag_given(entry.name, argv):
                return f"{entry.name} is upstream Dynamo's and not supported here: {entry.instead}"
        elif entry.name in env:
            value = env[entry.name]
            if value.strip().lower() in entry.harmless:
                continue
            return (
                f"{entry.name}={value!r} is upstream Dynamo's and not supported here: "
                f"{entry.instead}"
            )
    return None


def ignored_env(
    program: str, env: Mapping[str, str] | None = None, declared: AbstractSet[str] = frozenset()
) -> list[UpstreamName]:
    """The upstream env vars set in ``env`` that ``program`` does not read."""
    env = os.environ if env is None else env
    found = []
    for entry in IGNORED_ENV:
        if not _applies(entry, program, declared) or entry.name not in env:
            continue
        if env[entry.name].strip().lower() in entry.harmless:
            continue
        found.append(entry)
    return found


def warn_ignored_env(
    program: str, declared: set[str], env: Mapping[str, str] | None = None
) -> list[str]:
    """One WARNING naming the upstream env vars set here that this program does not read."""
    found = ignored_env(program, env, declared)
    if found:
        logger.warning(
            "Ignoring upstream Dynamo env vars that %s does not read: %s",
            program,
            "; ".join(f"{entry.name} ({entry.instead})" for entry in found),
        )
    return [entry.name for entry in found]
