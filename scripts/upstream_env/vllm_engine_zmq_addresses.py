"""Compatibility name for the upstream test environment: `vllm.v1.engine.utils.
get_engine_zmq_addresses`, which vLLM 0.32 renamed `get_engine_zmq_bind_addresses`.

ai-dynamo 1.6.1's `dynamo/vllm/embedding_worker_processes.py` (line 32, `from vllm.v1.engine.utils
import get_engine_zmq_addresses, launch_core_engines`) is imported by `dynamo/vllm/main.py`, so
without the name upstream's vLLM worker does not start at all. Upstream calls it in one place
(line 466, `get_engine_zmq_addresses(vllm_config, process_count)`), on the
`--embedding-worker-processes N` path, for the frontend ZMQ addresses it hands
`launch_core_engines` and its child processes.

vLLM 0.31.0 (upstream's pin) defined it as: one input and one output address per API server, an
IPC path when the client only talks to co-located engines, else a `tcp://host:0` placeholder
that the binding socket resolves (`defer_api_server_ports=True`, the default upstream uses).
vLLM 0.32.0's `get_engine_zmq_bind_addresses(vllm_config, num_api_servers)` computes exactly
those addresses, returned as `EngineZmqBindAddresses` (inputs, outputs) where 0.31 returned the
`EngineZmqAddresses` that `launch_core_engines` takes. So the name added here calls vLLM's own
function and hands its addresses over in the type the caller passes on: no address logic of its
own. (0.31's keyword `defer_api_server_ports=False`, which upstream never passes, has no 0.32
equivalent and is refused by the signature.)

scripts/setup_upstream_env.sh copies this file into the environment's site-packages and a .pth
file calls `install()` at start-up. The finder only watches for that one module's import; vLLM
is imported when something imports it, never by the .pth. After vLLM's own module has run, the
name is added only when vLLM lacks it (a vLLM that has it is never shadowed). It writes nothing
anywhere.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

MODULE = "vllm.v1.engine.utils"
OLD_NAME = "get_engine_zmq_addresses"
NEW_NAME = "get_engine_zmq_bind_addresses"


def _add_old_name(module: types.ModuleType) -> None:
    if hasattr(module, OLD_NAME) or not hasattr(module, NEW_NAME):
        return
    bind_addresses = getattr(module, NEW_NAME)
    addresses_type = module.EngineZmqAddresses

    def get_engine_zmq_addresses(vllm_config: Any, num_api_servers: int = 1) -> Any:
        found = bind_addresses(vllm_config, num_api_servers)
        return addresses_type(inputs=list(found.inputs), outputs=list(found.outputs))

    get_engine_zmq_addresses.__module__ = module.__name__
    get_engine_zmq_addresses.__doc__ = (
        f"vLLM 0.31's name for {NEW_NAME} (added by the upstream test environment's shim, "
        f"{__name__})."
    )
    setattr(module, OLD_NAME, get_engine_zmq_addresses)


class _AfterExecLoader(importlib.abc.Loader):
    """vLLM's own loader for the module, then the old name added."""

    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.real.exec_module(module)
        _add_old_name(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for inspect, linecache
        return getattr(self.real, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _AfterExecLoader(spec.loader)
        return spec


def install() -> None:
    """Put the finder first, once (a .pth may be processed twice, e.g. by site.addsitedir)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    already = sys.modules.get(MODULE)
    if already is not None:
        _add_old_name(already)
