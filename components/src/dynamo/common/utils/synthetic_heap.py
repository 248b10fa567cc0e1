"""A synthetic long-lived heap shaped like what a serving process holds after start-up.

Real frontends and workers hold ~0.6-1M tracked objects after start-up: module dicts and
function objects from imports, tokenizer vocabularies (str -> int dicts and their reverse
lists), parser and chat-template registries (small dicts and tuples), config objects. The mix
matters because the GC's pause depends on the number of tracked containers and their edges, not
on bytes. Each "unit" below adds about 10 tracked objects.
"""

from __future__ import annotations

import gc


class _ConfigObject:
    __slots__ = ("name", "options", "children")

    def __init__(self, name: str, options: dict, children: list) -> None:
        self.name = name
        self.options = options
        self.children = children


def _unit(i: int) -> list:
    # Every container here holds another container, so CPython keeps all of them tracked (a
    # dict or tuple of only atomic values would be untracked and cost the collector nothing).
    token = f"tok{i}"
    merges = [token, f"{token}#"]
    vocab_entry = {token: [i], "merges": (token, merges)}  # tokenizer table
    registry_entry = {"id": i, "children": merges}  # parser / template registry
    config = _ConfigObject(token, {"rank": [i % 8]}, [vocab_entry])  # engine config
    return [vocab_entry, registry_entry, config]


# Tracked objects one unit adds: 3 dicts, 5 lists, 1 tuple, 1 object (a test checks this).
TRACKED_PER_UNIT = 10


def build_synthetic_heap(target_objects: int) -> list:
    """Allocate about ``target_objects`` tracked objects and return the root that keeps them.

    The GC is paused while building so that the build itself does not run dozens of full
    collections (a real import does trigger them, but that is start-up cost, not what we model).
    """
    if target_objects <= 0:
        return []
    units = max(1, target_objects // TRACKED_PER_UNIT)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return [_unit(i) for i in range(units)]
    finally:
        if was_enabled:
            gc.enable()
