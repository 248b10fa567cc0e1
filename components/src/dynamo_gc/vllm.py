"""``python -m dynamo_gc.vllm``: upstream ai-dynamo's vLLM worker with its GC heap frozen.

Upstream's ``dynamo/vllm/main.py:worker()`` hands the module global ``register_vllm_model`` to its
``WorkerFactory`` at call time, and the decode, prefill, realtime, embedding and classify paths
await it after the engine, handlers, KV publishers, metrics and the self-benchmark are built
(the embedding and classify paths gather it with ``serve_endpoint``: their endpoint starts
beside the freeze, but no request is routed to it before the card is registered). The
multimodal encode worker registers its card with ``dynamo.llm.register_model`` directly, the
``worker_factory`` module's global: that one is wrapped too, with the same one freeze.
See :mod:`dynamo_gc.upstream.worker_cli`.
"""

from __future__ import annotations

from dynamo_gc.upstream.hooks import ModuleGlobalHook
from dynamo_gc.upstream.worker_cli import WorkerAdapter
from dynamo_gc.upstream.worker_settings import VLLM_SURFACE

# The options this program declares (docs/configuration/ is generated from it).
SURFACE = VLLM_SURFACE

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
)


parse_args = ADAPTER.parse_args
main = ADAPTER.main

if __name__ == "__main__":
    main()
