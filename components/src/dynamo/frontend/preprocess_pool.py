"""The frontend's handle on its preprocess worker processes.

All N processes are started and initialised (each has frozen its heap) during the frontend's
start-up, before the frontend's own freeze and before the listener opens: a process spawned
lazily on the first request would run its initializer, freeze included, while requests wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import multiprocessing

from . import preprocess_worker

logger = logging.getLogger(__name__)

# Spawning N fresh interpreters on a loaded 2-core box takes seconds, not minutes.
DEFAULT_START_TIMEOUT_S = 120.0


class PreprocessPoolError(RuntimeError):
    """The pool could not start, or broke while serving."""


class PreprocessPool:
    def __init__(
        self,
        workers: int,
        *,
        freeze_gc_heap: bool,
        gc_pause_log_ms: float,
        log_level: int = logging.INFO,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        if workers < 1:
            raise ValueError("a preprocess pool needs at least one worker")
        self.workers = workers
        self._freeze_gc_heap = freeze_gc_heap
        self._gc_pause_log_ms = gc_pause_log_ms
        self._log_level = log_level
        self._start_timeout_s = start_timeout_s
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self.pids: list[int] = []

    def start(self) -> list[int]:
        """Start every process and wait until each has finished its initializer (blocking)."""
        # "spawn": a forked child would inherit the parent's heap (and its frozen generation)
        # and the asyncio loop's state; a spawned one builds only what it needs.
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(self.workers)
        self._executor = concurrent.futures.ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=context,
            initializer=preprocess_worker.initialize_preprocess_worker,
            initargs=(self._freeze_gc_heap, self._gc_pause_log_ms, self._log_level, barrier),
        )
        # One blocking task per process (see report_ready): the executor spawns a new process
        # for each submit while none is idle, and the barrier keeps all of them busy.
        futures = [
            self._executor.submit(preprocess_worker.report_ready, self._start_timeout_s)
            for _ in range(self.workers)
        ]
        try:
            done, not_done = concurrent.futures.wait(futures, timeout=self._start_timeout_s)
            if not_done:
                raise PreprocessPoolError(
                    f"{len(not_done)} of {self.workers} preprocess workers did not start "
                    f"within {self._start_timeout_s:.0f}s"
                )
            pids = [future.result() for future in futures]
        except PreprocessPoolError:
            self.shutdown()
            raise
        except Exception as exc:  # BrokenProcessPool, BrokenBarrierError, an initializer error
            self.shutdown()
            raise PreprocessPoolError(f"preprocess workers failed to start: {exc!r}") from exc
        if len(set(pids)) != self.workers:
            self.shutdown()
            raise PreprocessPoolError(f"expected {self.workers} distinct workers, got {pids}")
        self.pids = pids
        logger.info("Preprocess pool ready: workers=%d pids=%s", self.workers, pids)
        return pids

    async def encode(self, text: str) -> list[int]:
        if self._executor is None:
            raise PreprocessPoolError("preprocess pool is not running")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, preprocess_worker.encode, text)
        except concurrent.futures.BrokenExecutor as exc:
            raise PreprocessPoolError(f"preprocess pool broke: {exc}") from exc

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
