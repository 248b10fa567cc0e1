"""Upstream Dynamo's ``dynamo.vllm.gc_policy``, on the GC layer's benchmark policy: the vLLM glue.

The policy itself (thresholds, the periodic freeze, maintenance, and upstream's public
functions :func:`start_gc_policy`, :func:`stop_gc_policy`, :func:`gc_maintain`) is
:mod:`dynamo_gc.bench_policy`; this module re-exports those names so a call site or a vLLM
``worker_extension_cls`` written for upstream (``dynamo.vllm.gc_policy.FpmGcWorkerExtension``)
works unchanged, and adds what only a vLLM process needs: :class:`FpmGcWorkerExtension`, the
worker extension vLLM mixes into every rank, and our log format in the processes vLLM starts.
"""

from __future__ import annotations

import gc
import logging
import os

from dynamo_gc.bench_policy import (
    INTERPRETER_RESIDUE_MAX,
    gc_maintain,
    gc_policy_state,
    gc_process_report,
    start_gc_policy,
    start_policy,
    stop_gc_policy,
    stop_policy,
)
from dynamo_gc.bench_policy_config import policy_config_from_env
from dynamo_gc.pause_logger import install_gc_pause_logger

__all__ = [
    "ENGINE_CORE_LABEL",
    "RANK_LABEL",
    "FpmGcWorkerExtension",
    "ensure_process_logging",
    "gc_maintain",
    "install_pause_logger_here",
    "start_gc_policy",
    "stop_gc_policy",
]

logger = logging.getLogger(__name__)

# How our log lines name the processes vLLM starts (beside their pid).
RANK_LABEL = "vllm rank"
ENGINE_CORE_LABEL = "vllm EngineCore"


def install_pause_logger_here(threshold_ms: float, *, label: str) -> bool:
    """Install the pause logger in a process the worker does not configure (a rank, EngineCore).

    Its lines go to that process's stderr, in the worker's log, with this process's pid and
    ``label``. Returns whether one is installed afterwards (``threshold_ms <= 0``: none).
    """
    ensure_process_logging(label)
    return install_gc_pause_logger(threshold_ms) is not None


class FpmGcWorkerExtension:
    """vLLM worker extension: ``fpm_gc_start``, ``fpm_gc_stop``, ``fpm_gc_maintain``,
    ``fpm_gc_state``.

    Pass ``dynamo.vllm.gc_policy.FpmGcWorkerExtension`` (upstream's path) or
    ``dynamo.vllm.worker_extension.FpmGcWorkerExtension`` (the same class) as vLLM's
    ``worker_extension_cls``; see :mod:`dynamo.vllm.worker_extension` for how ranks load it. It
    has no ``__init__`` and keeps no state on ``self`` (vLLM never calls an extension's
    initialiser): the state lives in :mod:`dynamo_gc.bench_policy`, one per process. The first
    three methods return what upstream's return.
    """

    def fpm_gc_start(self) -> bool:
        """Start the policy in this rank if its env turns it on; ``True`` when it runs after."""
        _ensure_rank_logging()
        config = policy_config_from_env()
        if not config.enabled:
            logger.warning(
                "GC policy not started in pid %d: its DYN_FPM_GC_POLICY is %r",
                os.getpid(),
                config.policy,
            )
            return False
        start_policy(interval_s=config.interval_s)
        return True

    def fpm_gc_stop(self) -> None:
        """Stop the policy in this rank (idempotent).

        The rank's heap is frozen again only if it was frozen before the policy started (vLLM
        freezes its engine-core processes after init): a rank has no serving freeze of its own.
        """
        stop_policy()

    def fpm_gc_maintain(self) -> int:
        """:func:`gc_maintain` in this rank: the permanent generation's size afterwards."""
        return gc_maintain()

    def fpm_gc_state(self) -> dict:
        """Thresholds, enabled flag, freeze count, whether the policy runs, pid.

        ``freeze_count`` walks the permanent generation: a diagnostic call, never per step.
        """
        state = gc_policy_state()
        state["freeze_count"] = gc.get_freeze_count()
        state["heap_frozen"] = state["freeze_count"] > INTERPRETER_RESIDUE_MAX
        return state

    def fpm_gc_report(self) -> dict:
        """:func:`gc_process_report` of this rank (heap walks: untimed windows only)."""
        return gc_process_report(RANK_LABEL)

    def fpm_gc_pause_log(self, threshold_ms: float) -> bool:
        """Install the pause logger in this rank (its lines in the rank's stderr)."""
        return install_pause_logger_here(float(threshold_ms), label=RANK_LABEL)


def ensure_process_logging(label: str) -> None:
    """Our log format in a process vLLM started (a rank, EngineCore), named ``label``."""
    from dynamo.common import logging_setup

    logging_setup.ensure_logging(label=label)


def _ensure_rank_logging() -> None:
    """In a rank nobody configured logging for (a vLLM worker process), log like our processes.

    vLLM sets up its own ``vllm`` logger only; without this, this module's INFO lines in a real
    vLLM rank would reach nobody. Our own processes (and mock ranks) already have the handler.
    """
    from dynamo.common import logging_setup

    logging_setup.ensure_logging(label=RANK_LABEL)
