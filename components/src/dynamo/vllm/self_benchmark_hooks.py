"""What the self-benchmark needs from vLLM's hooks before the engine exists.

Every process a measured window runs in must run the GC policy: the ranks load our worker
extension (vLLM's ``worker_extension_cls``) and EngineCore our scheduler (vLLM's
``--scheduler-cls``), and both read the policy from the environment, since they never see the
worker's command line. A user's own class with the policy on must subclass ours, else the
worker exits 2 before anything starts.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from dynamo.vllm.backend_args import PROG, WorkerConfig
from dynamo.vllm.ranks import resolve_qualname
from dynamo.vllm.self_benchmark_args import FPM_GC_POLICY, POLICY_FREEZE, WORKER_EXTENSION_CLS
from dynamo.vllm.worker_extension import QUALNAME as POLICY_EXTENSION
from dynamo.vllm.worker_extension import FpmGcWorkerExtension
from dynamo_gc.bench_policy_config import PolicyConfig, policy_env


class WorkerExtensionConflict(ValueError):
    """The user's worker extension would leave the ranks without the GC policy."""


def policy_active(config: WorkerConfig) -> bool:
    """The policy runs when the self-benchmark does and ``--fpm-gc-policy`` is ``freeze``."""
    return config.self_benchmark_points > 0 and config.fpm_gc_policy == POLICY_FREEZE


def _policy_hook(
    config: WorkerConfig,
    user_value: Any,
    *,
    ours: str,
    base: Any,
    what: str,
    needs: str,
    conflict: type[ValueError],
) -> Any:
    """The class a vLLM hook (``what``) must name while the self-benchmark runs.

    Ours (``ours``, the qualified name of ``base``) is injected when the user set none, with the
    policy off too (it then only installs the pause logger and reports the heap, so the two arms
    of an A/B differ in the policy alone). With the policy active a user's class must subclass
    ``base`` (else ``conflict``); with it off, or outside the self-benchmark, the user's value
    is returned untouched.
    """
    if config.self_benchmark_points <= 0:
        return user_value
    if user_value is None or user_value == ours:
        return ours
    if not policy_active(config):
        return user_value
    try:
        found = user_value if isinstance(user_value, type) else resolve_qualname(user_value)
    except Exception as exc:  # noqa: BLE001 - any import failure is the same operator error
        raise conflict(f"{what} {user_value!r} cannot be loaded ({exc})") from None
    if isinstance(found, type) and issubclass(found, base):
        return user_value
    raise conflict(
        f"{what} is {user_value!r}, but {FPM_GC_POLICY.source_label()} 'freeze' with the "
        f"self-benchmark needs {needs} {ours}: make yours subclass it, or set "
        f"{FPM_GC_POLICY.flag} off"
    )


def check_worker_extension(config: WorkerConfig) -> str | None:
    """The ``worker_extension_cls`` the engine must get (raises on a conflict): every rank
    loads :class:`FpmGcWorkerExtension` while the self-benchmark runs (:func:`_policy_hook`)."""
    return _policy_hook(
        config,
        config.worker_extension_cls,
        ours=POLICY_EXTENSION,
        base=FpmGcWorkerExtension,
        what=WORKER_EXTENSION_CLS.source_label(),
        needs="every rank to load",
        conflict=WorkerExtensionConflict,
    )


def resolve_worker_extension(config: WorkerConfig) -> str | None:
    """:func:`check_worker_extension`, with a conflict ending the program like a bad flag (2)."""
    try:
        return check_worker_extension(config)
    except WorkerExtensionConflict as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


class SchedulerConflict(ValueError):
    """The user's vLLM ``--scheduler-cls`` would leave EngineCore without the GC policy."""


def check_scheduler_cls(config: WorkerConfig, user_value: Any) -> Any:
    """The vLLM ``scheduler_cls`` EngineCore must get (raises on a conflict); vLLM only.

    The rule of :func:`check_worker_extension`, for vLLM's own ``--scheduler-cls``:
    :class:`dynamo.vllm.gc_scheduler.FpmGcScheduler` while the self-benchmark runs.
    """
    from dynamo.vllm.gc_scheduler import QUALNAME as POLICY_SCHEDULER
    from dynamo.vllm.gc_scheduler import FpmGcScheduler

    return _policy_hook(
        config,
        user_value,
        ours=POLICY_SCHEDULER,
        base=FpmGcScheduler,
        what="vLLM's --scheduler-cls",
        needs="vLLM's EngineCore process to run",
        conflict=SchedulerConflict,
    )


def resolve_scheduler_cls(config: WorkerConfig, user_value: Any) -> Any:
    """:func:`check_scheduler_cls`, with a conflict ending the program like a bad flag (2)."""
    try:
        return check_scheduler_cls(config, user_value)
    except SchedulerConflict as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def policy_env_for(config: WorkerConfig) -> dict[str, str]:
    """The policy env vars the engine's rank processes need (none outside benchmark mode)."""
    if config.self_benchmark_points <= 0:
        return {}
    return policy_env(PolicyConfig(config.fpm_gc_policy, config.fpm_gc_freeze_interval_s))


def export_policy_env(config: WorkerConfig) -> None:
    """Give the engine's rank processes (started later, never seeing argv) this policy config.

    The values were validated by the parser, so a rank reads back exactly what was given on the
    command line or in the environment.
    """
    os.environ.update(policy_env_for(config))
