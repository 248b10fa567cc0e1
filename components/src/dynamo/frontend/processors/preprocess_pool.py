"""The frontend's handle on its preprocess worker processes.

All N processes are started and initialised (each has frozen its heap) during the frontend's
start-up, before the frontend's own freeze and before the listener opens: a process spawned
lazily on the first request would run its initializer, freeze included, while requests wait.

A process that dies while serving (OOM-killed, say) breaks the whole executor: every later task
fails with BrokenProcessPool. The pool then rebuilds itself once, in a thread so the event loop
keeps serving, with one WARNING; requests meanwhile get a prompt 503. The new processes are new
interpreters in phase ``starting``, so each freezes its own heap in its initializer as at
start-up. If the rebuild fails, the pool stays down, :attr:`PreprocessPool.healthy` turns false
(the frontend's /health answers 503, so Kubernetes stops routing to the pod) and one ERROR says
so. A pool that breaks again later is rebuilt again: each break gets one attempt, never a loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing
import threading
import time

from dynamo.common.logging_setup import LogLevels
from dynamo.runtime.model_card import ModelCard

from . import preprocess_worker
from .chat_processor import DEFAULT_CHAT_PROCESSOR

logger = logging.getLogger(__name__)

# Spawning N fresh interpreters on a loaded 2-core box takes seconds, not minutes.
DEFAULT_START_TIMEOUT_S = 120.0
# The start method the frontend uses on every CPython; see PreprocessPool.
SPAWN = "spawn"
# "fork" would hand each child a copy of the parent's heap (frozen generation included), its
# freeze record and its event loop; the pool refuses it, whether asked for or the default.
_ALLOWED_START_METHODS = ("spawn", "forkserver")
# How often a start-up wait looks whether the pool is being closed meanwhile.
_CLOSE_CHECK_S = 0.25


class PreprocessPoolError(RuntimeError):
    """The pool could not start, or is not available to take a task right now."""


class PreprocessPool:
    """N preprocess worker processes, started and initialised (each has frozen its own heap)
    before :meth:`start` returns.

    ``start_method`` is ``"spawn"`` by default, on every CPython. ``None`` takes the platform's
    default (``forkserver`` on Linux from 3.14, ``fork`` before it, which is refused). The
    frontend keeps ``spawn`` although 3.14 made ``forkserver`` the default, because the two
    give a child the same heap here and only ``spawn`` behaves the same on every supported
    version: a forkserver started by ``python -m dynamo.frontend`` preloads nothing of ours
    (it preloads ``__main__`` only when that is a file), so every child still imports its
    chat processor's libraries and freezes them itself, exactly as a spawned child does, and
    saves only the interpreter's own start; and a forkserver is one more long-lived process,
    shared by everything in this process that uses multiprocessing. docs/design.md has the
    measurement.
    """

    def __init__(
        self,
        workers: int,
        *,
        freeze_gc_heap: bool,
        gc_pause_log_ms: float,
        log_level: int | LogLevels = logging.INFO,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        chat_processor: str = DEFAULT_CHAT_PROCESSOR,
        start_method: str | None = SPAWN,
    ) -> None:
        if workers < 1:
            raise ValueError("a preprocess pool needs at least one worker")
        # get_all_start_methods()[0] is the platform's default, read without fixing
        # multiprocessing's global context as get_start_method() would.
        method = start_method or multiprocessing.get_all_start_methods()[0]
        if method not in _ALLOWED_START_METHODS:
            raise ValueError(
                f"preprocess pool start method {method!r} is not one of {_ALLOWED_START_METHODS}"
            )
        self.start_method = method
        self.workers = workers
        self._freeze_gc_heap = freeze_gc_heap
        self._gc_pause_log_ms = gc_pause_log_ms
        self._log_level = log_level
        self._start_timeout_s = start_timeout_s
        self._chat_processor = chat_processor
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._rebuild: asyncio.Task | None = None
        self._closing = threading.Event()  # read by a rebuild's thread
        self.pids: list[int] = []
        # Objects each process's own initializer froze, by position in pids (None: freeze off).
        self.frozen: list[int | None] = []
        self.rebuilds = 0  # successful ones
        self.failure: str | None = None  # why the last rebuild failed: the pool is down

    @property
    def healthy(self) -> bool:
        """False once a rebuild has failed: the pool will not take work again."""
        return self.failure is None

    @property
    def state(self) -> str:
        if self.failure is not None:
            return "failed"
        if self._rebuild is not None and not self._rebuild.done():
            return "rebuilding"
        return "ready" if self._executor is not None else "stopped"

    def start(self) -> list[int]:
        """Start every process and wait until each has finished its initializer (blocking)."""
        self._executor, self.pids, self.frozen = self._spawn()
        logger.info(
            "Preprocess pool ready: workers=%d pids=%s frozen=%s start_method=%s",
            self.workers,
            self.pids,
            self.frozen,
            self.start_method,
        )
        return self.pids

    def _spawn(
        self,
    ) -> tuple[concurrent.futures.ProcessPoolExecutor, list[int], list[int | None]]:
        """A new executor whose N processes have all run their initializer (blocking)."""
        context = multiprocessing.get_context(self.start_method)
        barrier = context.Barrier(self.workers)
        executor = concurrent.futures.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=context,
            initializer=preprocess_worker.initialize_preprocess_worker,
            initargs=(
                self._freeze_gc_heap,
                self._gc_pause_log_ms,
                self._log_level,
                barrier,
                self._chat_processor,
            ),
        )
        try:
            # One blocking task per process (see report_ready): the executor spawns a new
            # process for each submit while none is idle, and the barrier keeps all of them busy.
            futures = [
                executor.submit(preprocess_worker.report_ready, self._start_timeout_s)
                for _ in range(self.workers)
            ]
            deadline = time.monotonic() + self._start_timeout_s
            not_done = set(futures)
            while not_done and not self._closing.is_set() and time.monotonic() < deadline:
                _, not_done = concurrent.futures.wait(not_done, timeout=_CLOSE_CHECK_S)
            if self._closing.is_set():
                raise PreprocessPoolError("preprocess pool closed while starting")
            if not_done:
                raise PreprocessPoolError(
                    f"{len(not_done)} of {self.workers} preprocess workers did not start "
                    f"within {self._start_timeout_s:.0f}s"
                )
            ready = [future.result() for future in futures]
            pids = [pid for pid, _ in ready]
            if len(set(pids)) != self.workers:
                raise PreprocessPoolError(f"expected {self.workers} distinct workers, got {pids}")
        except PreprocessPoolError:
            executor.shutdown(wait=True, cancel_futures=True)
            raise
        except Exception as exc:  # BrokenProcessPool, BrokenBarrierError, an initializer error
            executor.shutdown(wait=True, cancel_futures=True)
            raise PreprocessPoolError(f"preprocess workers failed to start: {exc!r}") from exc
        return executor, pids, [frozen for _, frozen in ready]

    async def encode(self, card: ModelCard, text: str, *, add_special_tokens: bool) -> list[int]:
        """``text`` in the tokens of ``card``'s model (each process loads it once, then
        keeps it in a bounded cache). A tokenizer that fails to load raises ModelFilesError."""
        executor = self._executor
        if executor is None:
            raise PreprocessPoolError(self._unavailable())
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                executor, preprocess_worker.encode, card, text, add_special_tokens
            )
        except concurrent.futures.BrokenExecutor as exc:
            self._broke(executor, exc)
            raise PreprocessPoolError(f"preprocess pool broke ({exc}); rebuilding it") from exc

    def _unavailable(self) -> str:
        state = self.state
        if state == "failed":
            return f"the preprocess pool is down: {self.failure}"
        if state == "rebuilding":
            return "the preprocess pool is being rebuilt after a worker process died"
        return "the preprocess pool is not running"

    def _broke(self, executor: concurrent.futures.Executor, exc: BaseException) -> None:
        if executor is not self._executor:
            return  # every task in flight fails alike: the first one starts the rebuild
        self._executor = None
        if self._closing.is_set():
            return
        logger.warning(
            "Preprocess pool broke (%s; pids were %s): rebuilding it in the background, "
            "requests get 503 until it is back",
            exc,
            self.pids,
        )
        self._rebuild = asyncio.get_running_loop().create_task(
            self._rebuild_pool(executor), name="preprocess-pool-rebuild"
        )

    async def _rebuild_pool(self, broken: concurrent.futures.Executor) -> None:
        def replace() -> tuple[concurrent.futures.ProcessPoolExecutor, list[int], list[int | None]]:
            broken.shutdown(wait=True, cancel_futures=True)
            return self._spawn()

        started = time.monotonic()
        # Blocking for seconds (N interpreters start and freeze): in a thread, not on the loop.
        call = asyncio.ensure_future(asyncio.to_thread(replace))
        try:
            executor, pids, frozen = await asyncio.shield(call)
        except asyncio.CancelledError:
            # The loop is going away: make the thread give up, and stop what it started.
            self._closing.set()
            await asyncio.wait([call])
            if not call.cancelled() and call.exception() is None:
                call.result()[0].shutdown(wait=True, cancel_futures=True)
            raise
        except Exception as exc:  # noqa: BLE001 - reported through /health and one ERROR
            if self._closing.is_set():
                return
            self.failure = str(exc)
            logger.error(
                "Preprocess pool rebuild failed: %s; /health answers 503 from now on and "
                "tokenising requests get 503: restart the frontend",
                exc,
            )
            return
        if self._closing.is_set():
            await asyncio.to_thread(executor.shutdown, True, cancel_futures=True)
            return
        self._executor, self.pids, self.frozen = executor, pids, frozen
        self.rebuilds += 1
        logger.info(
            "Preprocess pool rebuilt in %.1f s: workers=%d pids=%s frozen=%s",
            time.monotonic() - started,
            self.workers,
            pids,
            frozen,
        )

    async def aclose(self) -> None:
        """Stop the processes, waiting for a rebuild in progress to give up first."""
        self._closing.set()
        if self._rebuild is not None:
            await asyncio.wait([self._rebuild])
        self.shutdown()

    def shutdown(self) -> None:
        self._closing.set()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
