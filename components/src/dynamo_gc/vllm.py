"""``python -m dynamo_gc.vllm``: upstream ai-dynamo's vLLM worker with its GC heap frozen.

Upstream's ``dynamo/vllm/main.py:worker()`` hands the module global ``register_vllm_model`` to its
``WorkerFactory`` at call time, and the decode, prefill, realtime, embedding and classify paths
await it after the engine, handlers, KV publishers, metrics and the self-benchmark are built
(the embedding and classify paths gather it with ``serve_endpoint``: their endpoint starts
beside the freeze, but no request is routed to it before the card is registered). The
multimodal encode worker registers its card with ``dynamo.llm.register_model`` directly, the
``worker_factory`` module's global: that one is wrapped too, with the same one freeze.
See :mod:`dynamo_gc.upstream.worker_cli`.

With ``--gc-maintenance idle`` every request the aggregated, decode and prefill workers serve
passes through their handlers' ``generate`` (``DecodeWorkerHandler``, ``PrefillWorkerHandler``
in ``dynamo.vllm.handlers``), which the adapter puts through the maintenance's admission gate
(:mod:`dynamo_gc.upstream.served_maintenance`). Upstream's other workers (realtime, embedding,
classify, the multimodal encode worker) serve through handlers the adapter does not count: with
the maintenance on, such a worker exits 2 at its freeze point, before it registers.
"""

from __future__ import annotations

from typing import Any

from dynamo_gc.upstream.hooks import ModuleGlobalHook
from dynamo_gc.upstream.request_gate import RequestPath
from dynamo_gc.upstream.worker_cli import WorkerAdapter
from dynamo_gc.upstream.worker_settings import VLLM_SURFACE

# The options this program declares (docs/configuration/ is generated from it).
SURFACE = VLLM_SURFACE

# Upstream's Config flags (dynamo/vllm/worker_factory.py's WorkerFactory.create) that select a
# worker whose requests go to a handler the adapter does not gate.
UNGATED_WORKERS = ("realtime", "embedding_worker", "classify_worker")


def ungated(call: Any) -> str | None:
    """Why the worker a hooked call registers serves requests the gate does not count, or None.

    ``register_vllm_model(model_input, model_type, generate_endpoint, config, ...)``: its
    ``config`` says which worker upstream built. The encode worker registers through
    ``register_model`` instead (the second hook), without a ``config``: not gated either.
    """
    args, kwargs = call if call is not None else ((), {})
    config = kwargs.get("config", args[3] if len(args) > 3 else None)
    if config is None or not all(hasattr(config, flag) for flag in UNGATED_WORKERS):
        return (
            "this worker registers without upstream's worker Config (the multimodal encode "
            "worker, or a changed register_vllm_model), so the adapter cannot tell that its "
            "requests pass through a handler it counts"
        )
    for flag in UNGATED_WORKERS:
        if getattr(config, flag):
            return (
                f"upstream's {flag.replace('_', ' ')} serves its requests through a handler the "
                "adapter does not count (only DecodeWorkerHandler and PrefillWorkerHandler)"
            )
    return None


ADAPTER = WorkerAdapter(
    surface=SURFACE,
    hooks=(
        ModuleGlobalHook(
            module="dynamo.vllm.main", name="register_vllm_model", caller="worker", coroutine=True
        ),
        ModuleGlobalHook(
            module="dynamo.vllm.worker_factory",
            name="register_model",
            caller="WorkerFactory._create_multimodal_encode_worker",
            coroutine=True,
            compiled=True,  # ai-dynamo's Rust binding, awaited by upstream
        ),
    ),
    entry_module="dynamo.vllm",
    freeze_context="upstream vLLM worker, after engine init, before register_vllm_model",
    admission="upstream vLLM worker registers its model",
    # Upstream's __main__ checks for checkpoint/restore standby before importing dynamo.vllm.main
    # ("restore standby mode must ... hold without importing vLLM"); so does the adapter. The
    # process that serves afterwards is the restored checkpoint, wrapped as it was started.
    before_engine_import=("dynamo.common.snapshot.restore_context:maybe_run_restore_standby_mode"),
    # --embedding-worker-processes N: upstream starts processes 2..N as `python -m dynamo.vllm`;
    # the adapter makes that `python -m dynamo_gc.vllm` with the same GC settings.
    embedding_children=True,
    # Upstream's worker() installs its graceful-shutdown handlers before it builds the engine
    # with blocking calls, so they would run only once the engine is up: the adapter's own stop
    # start-up until the freeze point, where upstream's are installed as upstream asked.
    signal_hook=ModuleGlobalHook(
        module="dynamo.vllm.main", name="install_signal_handlers", caller="worker", coroutine=False
    ),
    request_paths=(
        RequestPath("dynamo.vllm.handlers", "DecodeWorkerHandler", "generate"),
        RequestPath("dynamo.vllm.handlers", "PrefillWorkerHandler", "generate"),
    ),
    ungated=ungated,
)


parse_args = ADAPTER.parse_args
main = ADAPTER.main

if __name__ == "__main__":
    main()
