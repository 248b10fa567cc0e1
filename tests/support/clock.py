"""The one fake clock: a callable that returns a time a test sets, for code that takes a clock.

Inject it where the code under test takes one (``DiscoveryWatcher(clock=...)``), or patch it
over a module's clock function (``time.perf_counter_ns`` for the pause logger, with ``now`` in
nanoseconds). It moves only when told to: no assertion depends on real timing.
"""

from __future__ import annotations


class FakeClock:
    """Returns :attr:`now`; :meth:`advance` moves it (seconds, or the unit ``now`` is in)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, amount: float) -> None:
        self.now += amount
