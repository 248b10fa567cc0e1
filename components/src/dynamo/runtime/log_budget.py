"""A log line that peers can trigger, kept to a budget: at most a few lines per interval.

A flood of malformed records, dead instances or bad clients must not become a flood of log lines
(and the disk, the log pipeline and the operator's attention behind them). A :class:`LogBudget`
is one cause: it logs its first ``lines`` occurrences in each ``interval_s``, counts the rest, and
says in its next line how many it held back.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any

DEFAULT_LINES = 10
DEFAULT_INTERVAL_S = 60.0

# Every budget made, to put them all back to a clean slate at once (forget_all).
_ALL: weakref.WeakSet[LogBudget | CauseBudgets] = weakref.WeakSet()


def forget_all() -> None:
    """Every budget back to where a new process starts: what it counted is forgotten. For tests,
    so that each starts as if alone, whatever ran before it in the process."""
    for budget in list(_ALL):
        budget.forget()


class LogBudget:
    def __init__(
        self,
        log: logging.Logger,
        level: int = logging.WARNING,
        *,
        lines: int = DEFAULT_LINES,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._level = level
        self.lines = lines
        self.interval_s = interval_s
        self._clock = clock
        self.forget()
        _ALL.add(self)

    def forget(self) -> None:
        self._window_start = float("-inf")
        self._spent = 0
        self.held_back = 0  # occurrences not logged since the last line that was

    def emit(self, message: str, *args: Any, exc_info: BaseException | None = None) -> bool:
        """Log ``message % args`` (with ``exc_info``'s traceback, if given) if the budget
        allows; True when it was logged."""
        now = self._clock()
        if now - self._window_start >= self.interval_s:
            self._window_start, self._spent = now, 0
        if self._spent >= self.lines:
            self.held_back += 1
            return False
        self._spent += 1
        if self.held_back:
            message += " (%d more like it were not logged: at most %d such lines per %g s)"
            args = (*args, self.held_back, self.lines, self.interval_s)
            self.held_back = 0
        self._log.log(self._level, message, *args, exc_info=exc_info)
        return True


class CauseBudgets:
    """One :class:`LogBudget` per cause (any hashable key: an error code, a status and a
    model), so a flood of one cause cannot hide another; at most ``causes`` of them are kept,
    the least recently used forgotten first."""

    def __init__(
        self,
        log: logging.Logger,
        level: int = logging.WARNING,
        *,
        lines: int = 1,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        causes: int = 256,
    ) -> None:
        self._make = lambda: LogBudget(log, level, lines=lines, interval_s=interval_s, clock=clock)
        self._budgets: dict[Hashable, LogBudget] = {}
        self._causes = causes
        _ALL.add(self)

    def forget(self) -> None:
        self._budgets.clear()

    def emit(
        self, cause: Hashable, message: str, *args: Any, exc_info: BaseException | None = None
    ) -> bool:
        """Log ``message % args`` (and ``exc_info``) if ``cause``'s budget allows; True when
        it was logged. ``cause`` is a kind of event, from a bounded set: a key of a peer's
        text (a model name) would give every new name a budget of its own."""
        budget = self._budgets.pop(cause, None) or self._make()
        self._budgets[cause] = budget  # most recently used last
        while len(self._budgets) > self._causes:
            del self._budgets[next(iter(self._budgets))]
        return budget.emit(message, *args, exc_info=exc_info)
