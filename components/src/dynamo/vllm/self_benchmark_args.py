"""Options of the worker's self-benchmark and its benchmark-scoped GC policy.

They are read by ``python -m dynamo.vllm`` together with the worker's own options, and have a
docs page of their own. The policy's two options are declared with the policy
(:mod:`dynamo_gc.bench_policy_config`), whose env vars rank processes read too: they never see the
command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamo.common.configuration import (
    Option,
    Surface,
    count_option,
    text_option,
)
from dynamo_gc.bench_policy_config import (
    FPM_GC_FREEZE_INTERVAL_S,
    FPM_GC_POLICY,
    POLICY_FREEZE,
    POLICY_OFF,
    PolicyWord,
)

__all__ = ["FPM_GC_FREEZE_INTERVAL_S", "FPM_GC_POLICY", "POLICY_FREEZE", "POLICY_OFF", "PolicyWord"]


@dataclass(frozen=True)
class QualifiedName:
    """A dotted ``package.module.Class`` name, the way vLLM names its worker extension."""

    def parse(self, text: str) -> str:
        name = text.strip()
        parts = name.split(".")
        if len(parts) < 2 or not all(part.isidentifier() for part in parts):
            raise ValueError("expected a qualified class name such as package.module.Class")
        return name

    def describe(self) -> str:
        return "qualified class name"


WORKER_EXTENSION_CLS = Option(
    name="worker-extension-cls",
    env_var="DYN_VLLM_WORKER_EXTENSION_CLS",
    default=None,
    kind=QualifiedName(),
    metavar="PACKAGE.MODULE.CLASS",
    help=(
        "Worker extension class mixed into every rank's worker (vLLM's worker_extension_cls). "
        "With the self-benchmark it defaults to "
        "dynamo.vllm.worker_extension.FpmGcWorkerExtension (the same class as upstream's "
        "dynamo.vllm.gc_policy.FpmGcWorkerExtension, which works too); with --fpm-gc-policy "
        "freeze another class must subclass it. vLLM's --scheduler-cls follows the same rule "
        "with dynamo.vllm.gc_scheduler.FpmGcScheduler (the policy in vLLM's EngineCore process)"
    ),
)

SELF_BENCHMARK_OUTPUT = text_option(
    "self-benchmark-output",
    "DYN_VLLM_SELF_BENCHMARK_OUTPUT",
    "Write one JSON line per self-benchmark point (with its wall time) to this file",
    what="file path",
    metavar="PATH",
)

OPTIONS = [
    SELF_BENCHMARK_POINTS := count_option(
        "self-benchmark-points",
        "DYN_VLLM_SELF_BENCHMARK_POINTS",
        0,
        (
            "Before serving, time N forward passes over a sweep of (batch size x sequence "
            "length) points; 0 turns the self-benchmark off"
        ),
        low=0,
        high=10_000_000,
    ),
    SELF_BENCHMARK_OUTPUT,
    FPM_GC_POLICY,
    FPM_GC_FREEZE_INTERVAL_S,
    WORKER_EXTENSION_CLS,
]

SURFACE = Surface(
    name="vllm-self-benchmark",
    title="vLLM worker self-benchmark and its GC policy",
    program="python -m dynamo.vllm",
    description=(
        "Options of the worker's self-benchmark, which runs after engine init and before the "
        "serving freeze and register_model, and of the GC policy that keeps gen2 pauses out of "
        "its measured windows."
    ),
    options=OPTIONS,
)
