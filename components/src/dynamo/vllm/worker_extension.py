"""The GC policy as a worker extension, so every rank of the engine runs it.

vLLM loads ``parallel_config.worker_extension_cls`` in each rank
(``WorkerWrapperBase.init_worker``): it resolves the qualified name with ``importlib``, checks
that none of the extension's public attributes clash with the worker class, appends the
extension to the worker class's ``__bases__``, and ``collective_rpc("name", args=...)`` then
calls ``worker.name(*args)`` in every rank. The mock engine's ranks (:mod:`dynamo.vllm.ranks`)
load it the same way, so the class works under both.

The class is defined in :mod:`dynamo.vllm.gc_policy`, where upstream Dynamo has it
(``dynamo.vllm.gc_policy.FpmGcWorkerExtension``, the path operators may have set by hand); this
module's name for it is the same class object, kept for the path this project has always
documented. Defining it there, not here, is what keeps the two modules free of an import cycle.

Each rank reads the policy from its environment (``DYN_FPM_GC_POLICY``,
``DYN_FPM_GC_FREEZE_INTERVAL_S``); a bad value logs a WARNING and the default is used. The worker
exports both before the engine starts its ranks
(:func:`dynamo.vllm.self_benchmark.export_policy_env`).
"""

from __future__ import annotations

from dynamo.vllm.gc_policy import FpmGcWorkerExtension

QUALNAME = "dynamo.vllm.worker_extension.FpmGcWorkerExtension"
# Upstream Dynamo's path for the same class.
UPSTREAM_QUALNAME = "dynamo.vllm.gc_policy.FpmGcWorkerExtension"

__all__ = ["FpmGcWorkerExtension", "QUALNAME", "UPSTREAM_QUALNAME"]
