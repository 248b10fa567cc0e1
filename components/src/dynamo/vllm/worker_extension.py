"""The GC policy as a worker extension, so every rank of the engine runs it.

vLLM loads ``parallel_config.worker_extension_cls`` in each rank
(``WorkerWrapperBase.init_worker``): it resolves the qualified name with ``importlib``, checks
that none of the extension's public attributes clash with the worker class, appends the
extension to the worker class's ``__bases__``, and ``collective_rpc("name", args=...)`` then
calls ``worker.name(*args)`` in every rank. The mock engine's ranks (:mod:`dynamo.vllm.ranks`)
load it the same way, so this class works under both. It has no ``__init__`` and keeps no state
on ``self`` (vLLM never calls an extension's initialiser): the state lives in
:mod:`dynamo.vllm.gc_policy`, one per process.

Each rank reads the policy from its environment (``DYN_FPM_GC_POLICY``,
``DYN_FPM_GC_FREEZE_INTERVAL_S``); a bad value logs a WARNING and the default is used. The worker
exports both before the engine starts its ranks
(:func:`dynamo.vllm.self_benchmark.export_policy_env`).
"""

from __future__ import annotations

import gc
import logging
import os

from dynamo.vllm import gc_policy

logger = logging.getLogger(__name__)

QUALNAME = "dynamo.vllm.worker_extension.FpmGcWorkerExtension"


class FpmGcWorkerExtension:
    """Worker methods ``fpm_gc_start``, ``fpm_gc_stop``, ``fpm_gc_maintain``, ``fpm_gc_state``."""

    def fpm_gc_start(self) -> bool:
        """Start the policy in this rank if its env turns it on; ``True`` when it runs after."""
        config = gc_policy.policy_config_from_env()
        if not config.enabled:
            logger.warning(
                "GC policy not started in pid %d: its DYN_FPM_GC_POLICY is %r",
                os.getpid(),
                config.policy,
            )
            return False
        gc_policy.start_gc_policy(interval_s=config.interval_s)
        return True

    def fpm_gc_stop(self) -> bool:
        """Stop the policy in this rank (idempotent); ``True`` if it was running.

        The rank's heap is frozen again only if it was frozen before the policy started (vLLM
        freezes its engine-core processes after init): a rank has no serving freeze of its own.
        """
        return gc_policy.stop_gc_policy()

    def fpm_gc_maintain(self) -> int:
        return gc_policy.gc_maintain()

    def fpm_gc_state(self) -> dict:
        """Thresholds, enabled flag, freeze count, whether the policy runs, pid.

        ``freeze_count`` walks the permanent generation: a diagnostic call, never per step.
        """
        state = gc_policy.gc_policy_state()
        state["freeze_count"] = gc.get_freeze_count()
        state["heap_frozen"] = state["freeze_count"] > gc_policy.INTERPRETER_RESIDUE_MAX
        return state

