"""Cyclic garbage for GC tests: an object only a collection can reclaim, watched by a weakref."""

from __future__ import annotations

import weakref


class Node:
    """A weakref-able object for building cycles."""

    self: Node | None = None


def dead_cycle() -> weakref.ref:
    """A weakref to an object in a reference cycle nothing else holds: alive until a collection
    of its generation reclaims it (or forever, once frozen)."""
    node = Node()
    node.self = node
    return weakref.ref(node)
