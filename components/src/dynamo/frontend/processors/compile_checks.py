"""Registration's compile checks of peers' chat templates, bounded and scheduled so that hostile
templates cannot hold up an ordinary model's registration (docs/security.md, "Chat
templates").

Jinja's compiler is costly on a hostile source (a megabyte of ``{{ x }}`` took 90 s and over
1 GB), so a card's template is compiled once, when its model is registered, in a fresh render
process (:mod:`.render_process`) under the render bounds, and one that does not compile within
them refuses its model. Each check holds a process, so only a few run at once; what a peer
controls is how many templates it registers at once (up to ``--dyn-max-models`` pending) and
what they cost to compile. What it cannot hide is that cost: a real template (a few KB)
compiles in milliseconds, and a slow one is slow because it is large, or shows it within a
fraction of a second. So a check goes through two lanes, each of ``processes`` checks at once:

* the **first lane** takes every check, the smallest template first (then in arrival order),
  and gives it :data:`FIRST_LANE_S` (at most the timeout) and :data:`FIRST_LANE_MB` (at most the
  memory bound): nearly every real template is done there;
* a check that breaks the first lane's bounds is killed and goes to the **second lane**, in the
  same order, where it is compiled anew with the whole ``--dyn-template-timeout`` and
  ``--dyn-template-memory-mb``; one that breaks those refuses its model.

So an ordinary model's check waits only for first-lane checks (those running when it arrives,
and those of smaller templates: a second each at most), never for a hostile check's timeout;
hostile checks wait for each other in the second lane. Compiling holds at most ``processes``
processes of the memory bound, and ``processes`` more of the first lane's. A template that
compiled within the bounds is remembered (by its text and variables, :data:`REMEMBERED`):
another model with the same template, or the model back after a restart of its worker, is not
checked again. Closing (the frontend stopping) kills the checks running and refuses the ones
waiting, so the registry's build threads end at once.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .hf_processor import ModelFilesError
from .render_process import RenderProcess, template_key

# The first lane's bounds: far above what a real template needs to compile (milliseconds, a
# few MB), far below a hostile one's timeout.
FIRST_LANE_S = 1.0
FIRST_LANE_MB = 64
# Templates remembered as compiling within the bounds (least recently used forgotten).
REMEMBERED = 1024
STOPPING = "the frontend is stopping: its chat template was not checked"


class _Lane:
    """At most ``slots`` checks at once; waiting ones go in order of size, then of arrival."""

    def __init__(self, slots: int, closed: threading.Event) -> None:
        self.slots = slots
        self.busy = 0
        self._queue: list[tuple[int, int]] = []  # a heap of (size, arrival)
        self._arrivals = itertools.count()
        self._changed = threading.Condition()
        self._closed = closed

    @contextmanager
    def turn(self, size: int) -> Iterator[None]:
        ticket = (size, next(self._arrivals))
        with self._changed:
            heapq.heappush(self._queue, ticket)
            self._changed.wait_for(
                lambda: (
                    self._closed.is_set() or (self.busy < self.slots and self._queue[0] == ticket)
                )
            )
            if self._closed.is_set():
                self._queue.remove(ticket)
                heapq.heapify(self._queue)
                self._changed.notify_all()
                raise ModelFilesError(STOPPING)
            heapq.heappop(self._queue)
            self.busy += 1
            self._changed.notify_all()  # the next in line may fit too
        try:
            yield
        finally:
            with self._changed:
                self.busy -= 1
                self._changed.notify_all()

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()


class CompileChecks:
    """The registration's compile checks (see the module docstring)."""

    def __init__(self, processes: int, *, timeout_s: float, memory_bytes: int) -> None:
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.first_s = min(FIRST_LANE_S, timeout_s)
        self.first_bytes = min(FIRST_LANE_MB << 20, memory_bytes)
        self._closed = threading.Event()
        self._first = _Lane(processes, self._closed)
        self._second = _Lane(processes, self._closed)
        self._passed: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._running: set[RenderProcess] = set()
        self.second_lane = 0  # checks that went to the second lane (for tests and logs)

    def check(self, source: str, variables: Mapping[str, Any]) -> None:
        """Blocking (the registry's build thread): raises ModelFilesError when ``source`` does
        not compile or breaks a bound compiling (the model is refused)."""
        key = template_key(source, variables)
        with self._lock:
            if key in self._passed:
                self._passed.move_to_end(key)
                return
        payload = ("check", source, dict(variables), None, None)
        with self._first.turn(len(source)):
            kind, text = self._compile(payload, self.first_s, self.first_bytes)
        whole = (self.first_s, self.first_bytes) == (self.timeout_s, self.memory_bytes)
        if kind in ("timeout", "memory", "died") and not whole:
            with self._lock:
                self.second_lane += 1
            with self._second.turn(len(source)):
                kind, text = self._compile(payload, self.timeout_s, self.memory_bytes)
        if self._closed.is_set():
            raise ModelFilesError(STOPPING)
        if kind == "ok":
            with self._lock:
                self._passed[key] = None
                while len(self._passed) > REMEMBERED:
                    self._passed.popitem(last=False)
            return
        if kind == "template":
            raise ModelFilesError(text)
        if kind == "failed":
            raise ModelFilesError(f"the chat template does not compile: {text}")
        what = {
            "timeout": f"took over {self.timeout_s:g} s to compile",
            "memory": f"went over {self.memory_bytes >> 20} MiB compiling",
        }.get(kind, f"killed the process compiling it ({text})")
        raise ModelFilesError(
            f"the chat template {what} (--dyn-template-timeout / --dyn-template-memory-mb)"
        )

    def _compile(self, payload: tuple, timeout_s: float, memory_bytes: int) -> tuple[str, str]:
        """``payload`` compiled in a fresh render process under these bounds; its answer."""
        process = RenderProcess(memory_bytes)
        with self._lock:
            if self._closed.is_set():
                process.kill()
                raise ModelFilesError(STOPPING)
            self._running.add(process)
        try:
            return process.render(payload, timeout_s)
        finally:
            with self._lock:
                self._running.discard(process)
            process.kill()

    def close(self) -> None:
        """Kill the checks running, refuse those waiting and any asked for from now on."""
        self._closed.set()
        with self._lock:
            running = list(self._running)
        for process in running:
            process.process.kill()  # its check answers "died" at once; it joins it itself
        self._first.wake()
        self._second.wake()
