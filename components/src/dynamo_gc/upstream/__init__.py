"""Adapters that hook the GC layer into upstream ai-dynamo's real launchers, without editing them.

Upstream's code stays as installed (nothing here writes under its ``dynamo/`` tree); each adapter
resolves the upstream symbol it relies on, checks it is still what the adapter expects (else exit
2 naming the ai-dynamo version and the symbol, never a silent no-op), and wraps a module global
or names a route extension so the freeze runs at upstream's own quiescent point:

* :mod:`.versions`: which ai-dynamo is installed, which versions were checked;
* :mod:`.hooks`: resolve, check and wrap a hooked module global;
* :mod:`.worker_settings`, :mod:`.worker_freeze`, :mod:`.worker_cli`: the workers' adapters
  (``python -m dynamo_gc.vllm``, ``python -m dynamo_gc.mocker``); :mod:`.embedding_children`:
  upstream's ``--embedding-worker-processes`` children started through the vLLM adapter;
* the frontend's adapter (``python -m dynamo_gc.frontend`` and the ``gc-freeze`` route extension);
* :mod:`.stand_down`: where the installed ai-dynamo freezes a process itself, the adapters do not.
"""
