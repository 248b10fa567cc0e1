"""A few workers shared between models so that no model, and no group of costly work, can take
them all (docs/security.md, "Chat templates").

The frontend has a handful of workers for work that peers' models decide the cost of: the
template render processes (a peer's template is code) and the threads or processes that
tokenize prompts (a peer's template decides how long the prompt is). A :class:`FairShare` of
``slots`` workers admits a piece of work, for a key (the model), when:

* the key holds fewer than ``slots - 1`` of them (all of them when there is only one): a model
  whose work is slow, however much of it there is, leaves a worker to every other model;
* the work is not *heavy*, or heavy work (of every key together) holds fewer than
  ``slots - 1``: what the caller knows to be costly (a suspect model's render, a prompt too long
  to be cheap to tokenize) leaves a worker to the cheap work of everyone, however many models
  send it. Whether work is heavy may be a question asked when it is admitted (a model may turn
  suspect while its request waits);
* a worker is free.

Work that cannot be admitted waits in its key's queue (a key's work keeps its order), and the
keys take turns: when a worker frees, the first key in turn order whose next piece fits gets
it, and goes to the back. So a model with a thousand requests waiting does not go before a
model with one. Waiting is cancellable (a caller's deadline is ``asyncio.timeout``): a waiter
that is cancelled leaves the queue, or gives back the worker it was granted meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Hashable

Heaviness = bool | Callable[[], bool]
# Granted (with whether it was admitted as heavy) when done; whether it is heavy.
_Waiter = tuple[asyncio.Future[bool], Heaviness]


class FairShare:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a fair share needs at least one slot")
        self.slots = slots
        # What one key, and all heavy work together, may hold at once.
        self.per_key = max(1, slots - 1)
        self.heavy_slots = max(1, slots - 1)
        self.busy = 0
        self.heavy = 0
        self._held: dict[Hashable, int] = {}
        # Keys with work waiting, in turn order (the next to be served first).
        self._waiting: OrderedDict[Hashable, deque[_Waiter]] = OrderedDict()

    def held(self, key: Hashable) -> int:
        """Workers ``key`` holds now."""
        return self._held.get(key, 0)

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    @contextlib.asynccontextmanager
    async def slot(self, key: Hashable, *, heavy: Heaviness = False) -> AsyncIterator[bool]:
        """A worker for ``key`` while the block runs (see the module docstring); the block
        gets whether it was admitted as heavy."""
        admitted = await self.acquire(key, heavy=heavy)
        try:
            yield admitted
        finally:
            self.release(key, heavy=admitted)

    async def acquire(self, key: Hashable, *, heavy: Heaviness = False) -> bool:
        """Wait for a worker (cancellable); whether it was admitted as heavy, which
        :meth:`release` is told when it gives the worker back."""
        waiter: _Waiter = (asyncio.get_running_loop().create_future(), heavy)
        self._waiting.setdefault(key, deque()).append(waiter)
        self._admit()
        try:
            return await waiter[0]
        except asyncio.CancelledError:
            if waiter[0].done() and not waiter[0].cancelled():
                self.release(key, heavy=waiter[0].result())  # granted as the caller gave up
            else:
                self._forget(key, waiter)
            raise

    def release(self, key: Hashable, *, heavy: bool = False) -> None:
        held = self._held[key] - 1
        if held:
            self._held[key] = held
        else:
            del self._held[key]
        self.busy -= 1
        self.heavy -= heavy
        self._admit()

    def _fits(self, key: Hashable, heavy: bool) -> bool:
        if self.busy >= self.slots or self._held.get(key, 0) >= self.per_key:
            return False
        return not heavy or self.heavy < self.heavy_slots

    def _admit(self) -> None:
        """Grant workers to waiting keys, in turn order, while any key's next work fits."""
        granted = True
        while granted and self.busy < self.slots:
            granted = False
            for key in list(self._waiting):
                queue = self._waiting[key]
                while queue and queue[0][0].done():  # cancelled, its task not yet resumed
                    queue.popleft()
                if not queue:
                    del self._waiting[key]
                    continue
                future, heaviness = queue[0]
                heavy = heaviness() if callable(heaviness) else heaviness
                if not self._fits(key, heavy):
                    continue
                queue.popleft()
                self._held[key] = self._held.get(key, 0) + 1
                self.busy += 1
                self.heavy += heavy
                future.set_result(heavy)
                if queue:
                    self._waiting.move_to_end(key)  # its turn is over: to the back
                else:
                    del self._waiting[key]
                granted = True
                break  # the turn order changed: scan again from its front

    def _forget(self, key: Hashable, waiter: _Waiter) -> None:
        queue = self._waiting.get(key)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(waiter)
        if not queue:
            del self._waiting[key]
        self._admit()  # it may have been the head that held its key's queue back
