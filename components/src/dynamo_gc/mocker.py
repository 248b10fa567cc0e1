"""``python -m dynamo_gc.mocker``: upstream ai-dynamo's mock engine with its GC heap frozen.

Upstream's ``dynamo/mocker/main.py:launch_workers`` builds each worker's engine (``make_engine``)
and then serves it with the module global ``run_input``; wrapping that global before upstream's
``main()`` runs puts the freeze after the first engine is built, before it is served. With
``--num-workers`` above 1, the later workers' engines are built after that point (the process
is ``serving`` by then) and stay unfrozen. See :mod:`dynamo_gc.upstream.worker_cli`.
"""

from __future__ import annotations

from dynamo_gc.upstream.hooks import ModuleGlobalHook
from dynamo_gc.upstream.worker_cli import WorkerAdapter
from dynamo_gc.upstream.worker_settings import MOCKER_SURFACE

# The options this program declares (docs/configuration/ is generated from it).
SURFACE = MOCKER_SURFACE

ADAPTER = WorkerAdapter(
    surface=SURFACE,
    hooks=(
        ModuleGlobalHook(
            module="dynamo.mocker.main", name="run_input", caller="launch_workers", coroutine=False
        ),
    ),
    entry_module="dynamo.mocker",
    freeze_context="upstream mocker, after make_engine, before run_input",
    admission="upstream mocker serves its engine",
)


parse_args = ADAPTER.parse_args
main = ADAPTER.main

if __name__ == "__main__":
    main()
