"""A peer-triggered log line stays within its budget, and says what it held back."""

from __future__ import annotations

import logging

from dynamo.runtime.log_budget import LogBudget
from tests.support.clock import FakeClock


def test_at_most_the_budget_per_interval_then_the_count_of_what_was_held_back(caplog):
    clock = FakeClock()
    budget = LogBudget(logging.getLogger("t"), lines=2, interval_s=60, clock=clock)
    caplog.set_level(logging.WARNING, logger="t")
    logged = [budget.emit("bad record %d", n) for n in range(5)]
    assert logged == [True, True, False, False, False]
    clock.advance(60)
    assert budget.emit("bad record %d", 5)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:2] == ["bad record 0", "bad record 1"]
    assert messages[2].startswith("bad record 5 (3 more like it were not logged")
    assert len(messages) == 3
