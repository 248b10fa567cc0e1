"""The mock engine's heap growth (``--mock-heap-growth``, ``--mock-heap-evict-percent``).

A long-serving process's heap grows after its start-up freeze: per-model state, caches of
request state, whatever a dependency keeps. :class:`RequestStateCache` gives the mock engine
that shape, so tests and soaks of the serving-time maintenance have a heap that grows as fast
as they ask: every request served adds one entry of N tracked containers, one reference cycle
(each container refers back to the entry), as cached request state would be.

A share of the entries (``evict_percent``, spread evenly over the requests) goes to a bounded
cache that evicts its oldest entry once it holds :data:`EVICTING_OBJECTS` objects (a cache is
bounded by its size, so an entry lives longer in it when entries are smaller): an evicted entry
is cyclic garbage, which only the collector frees, and which it cannot free while a freeze pins
it (entries frozen by a maintenance while cached, evicted after it: what a reclaim is for). The
rest is kept for the life of the process.
"""

from __future__ import annotations

import collections

# The tracked objects the evicting cache holds before it evicts its oldest entry.
EVICTING_OBJECTS = 200_000


def request_entry(objects: int) -> list:
    """``objects`` tracked containers in one reference cycle: a list of small dicts and lists,
    each of which refers back to it (so each stays tracked, and the whole is garbage only to the
    collector once nothing else refers to it)."""
    entry: list = []
    for index in range(objects - 1):
        entry.append({"step": index, "entry": entry} if index % 2 else [entry, index])
    return entry


class RequestStateCache:
    """The entries the mock engine keeps per request (see the module docstring)."""

    def __init__(
        self, per_request: int, evict_percent: int = 0, evicting_objects: int = EVICTING_OBJECTS
    ) -> None:
        self.per_request = per_request
        self.evict_percent = evict_percent
        # Entries the evicting cache holds (at least one).
        self.capacity = max(1, evicting_objects // per_request) if per_request > 0 else 0
        self.kept: list[list] = []
        self.evicting: collections.deque[list] = collections.deque()
        self.requests = 0
        self.evicted = 0

    def add(self) -> None:
        """One request's entry: kept, or (its share) cached until evicted."""
        if self.per_request <= 0:
            return
        self.requests += 1
        entry = request_entry(self.per_request)
        # Request k is evictable when the running share k * P / 100 crosses an integer: P% of
        # the requests, evenly spread, whatever their number.
        share = self.evict_percent
        if (self.requests * share) // 100 > ((self.requests - 1) * share) // 100:
            self.evicting.append(entry)
            if len(self.evicting) > self.capacity:
                self.evicting.popleft()
                self.evicted += 1
        else:
            self.kept.append(entry)

    @property
    def tracked_objects(self) -> int:
        """Tracked objects the cache holds now (its own lists aside)."""
        return (len(self.kept) + len(self.evicting)) * self.per_request
