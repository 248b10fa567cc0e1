"""The mock engine's rank processes: R workers that step in lockstep, like vLLM's TP ranks.

Each rank is a ``spawn`` child with one duplex pipe to the parent. It builds a
:class:`MockRankWorker`, mixes in the worker extension the way vLLM does (qualified name resolved
with ``importlib``, appended to the worker class's ``__bases__`` after a conflict check), and then
answers ``(method, args)`` messages by calling ``worker.method(*args)``. The parent's
:meth:`RankGroup.collective_rpc` sends one message to every rank and returns when every rank has
answered, so one slow rank (a GC pause) stalls the whole step, as in real tensor parallelism.

Ranks ignore SIGINT: Ctrl-C reaches the whole process group, and the parent must still be able to
stop the GC policy in every rank before it shuts them down.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import logging
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dynamo.common.logging_setup import LogLevels, configure_logging, current_log_levels
from dynamo.vllm.process_watch import ProcessExit, describe_exit, first_exit

__all__ = ["RankError", "RankGroup", "describe_exit", "inject_worker_extension"]

logger = logging.getLogger(__name__)

# Simulated compute per step: a fixed launch cost plus a cost per token of the batch. The rank
# waits (as a CPU waits on a GPU) instead of spinning, so ranks do not fight over the few cores.
STEP_BASE_S = 0.0002
STEP_PER_TOKEN_S = 4e-9
# A scheduler step's shape: KV blocks of this many tokens, and one request in this many still
# decoding a few steps later (it survives young collections, then dies in an old generation).
BLOCK_TOKENS = 16
SURVIVOR_STRIDE = 4
SURVIVOR_STEPS = 4

_SHUTDOWN = "__shutdown__"
# A rank that took the shutdown message is on its way out: it gets at least this long to finish
# exiting (interpreter teardown is slow on a loaded machine) before it is killed.
EXITING_GRACE_S = 5.0


class RankError(RuntimeError):
    """A collective RPC failed on one or more ranks (the message names them)."""

    def __init__(
        self, message: str, *, ranks: Sequence[int] = (), died: Sequence[int] = ()
    ) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.died = tuple(died)  # the ranks whose process is gone (the group cannot step again)


def resolve_qualname(qualname: str) -> Any:
    """``package.module.Name`` -> the object (what vLLM's ``resolve_obj_by_qualname`` does)."""
    module_name, _, attr = qualname.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"not a qualified name (package.module.Name): {qualname!r}")
    return getattr(importlib.import_module(module_name), attr)


def inject_worker_extension(worker_class: type, qualname: str) -> list[str]:
    """Mix the extension named ``qualname`` into ``worker_class`` as vLLM does; return its calls.

    Like vLLM's ``WorkerWrapperBase.init_worker``: resolve the name, refuse an extension whose
    public attributes clash with the worker's, and append it to ``worker_class.__bases__`` (the
    class itself changes, so every worker of this process gets the methods).
    """
    extension = resolve_qualname(qualname)
    if not isinstance(extension, type):
        raise TypeError(f"worker extension {qualname!r} is not a class")
    extended_calls: list[str] = []
    if extension in worker_class.__bases__:
        return extended_calls
    for attr in dir(extension):
        if attr.startswith("__"):
            continue
        if hasattr(worker_class, attr):
            raise TypeError(
                f"worker class {worker_class.__name__} already has an attribute {attr!r}, which "
                f"conflicts with the worker extension class {qualname}"
            )
        if callable(getattr(extension, attr)):
            extended_calls.append(attr)
    worker_class.__bases__ = worker_class.__bases__ + (extension,)
    logger.info(
        "Injected %s into %s for extended collective_rpc calls %s",
        qualname,
        worker_class.__name__,
        extended_calls,
    )
    return extended_calls


def step_time_s(batch_size: int, seq_len: int) -> float:
    return STEP_BASE_S + batch_size * seq_len * STEP_PER_TOKEN_S


class RankWorkerBase:
    """What vLLM's ``WorkerBase`` is to its workers: the class an extension is mixed in next to."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size


class MockRankWorker(RankWorkerBase):
    """One rank's worker: ``execute_forward`` allocates like a scheduler step, then computes."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.steps = 0
        # Requests still decoding: they outlive a few steps, so young collections promote them
        # and they die in an old generation, which only a full collection (or a freeze) handles.
        self._in_flight: collections.deque = collections.deque(maxlen=SURVIVOR_STEPS)

    def execute_forward(self, batch_size: int, seq_len: int) -> int:
        step = self.steps
        self.steps += 1
        blocks = max(1, seq_len // BLOCK_TOKENS)
        requests = []
        for index in range(batch_size):
            request = {
                "request_id": f"step{step}-req{index}",
                "block_table": [[step, index, block] for block in range(blocks)],
                "sampling_params": {"temperature": 0.7, "stop": ["</s>"]},
                "output_token_ids": [step + index],
            }
            # Request and scheduler state point at each other, so a finished request is cyclic
            # garbage that needs the collector, as in a real engine.
            request["state"] = {"request": request, "num_computed_tokens": [seq_len]}
            requests.append(request)
        self._in_flight.append(requests[::SURVIVOR_STRIDE])
        time.sleep(step_time_s(batch_size, seq_len))  # simulated compute, not synchronisation
        return len(requests)

    def ping(self) -> int:
        return os.getpid()


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()


def _rank_main(
    rank: int,
    world_size: int,
    conn,
    worker_extension_cls: str | None,
    log_level: int | LogLevels,
    exiting,
):
    """Entry point of a rank process (spawned: a fresh interpreter, this module imported).

    ``exiting`` (a multiprocessing Event) is set when the rank takes the shutdown message, so
    the parent can tell a rank on its way out from one stuck in a step.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(log_level, label=f"rank {rank}")
    try:
        worker_class = MockRankWorker
        if worker_extension_cls:
            inject_worker_extension(worker_class, worker_extension_cls)
        worker = worker_class(rank, world_size)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises RankError
        conn.send(("error", _describe(exc)))
        return
    conn.send(("ok", os.getpid()))
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return  # the parent is gone
        if method == _SHUTDOWN:
            exiting.set()
            return
        try:
            conn.send(("ok", getattr(worker, method)(*args)))
        except Exception as exc:  # noqa: BLE001 - the parent raises it as RankError
            conn.send(("error", _describe(exc)))


class RankGroup:
    """R rank processes answering collective RPCs in lockstep."""

    def __init__(
        self,
        size: int,
        *,
        worker_extension_cls: str | None = None,
        shutdown_deadline_s: float = 10.0,
    ) -> None:
        if size < 1:
            raise ValueError(f"a rank group needs at least one rank, not {size}")
        self.size = size
        self.worker_extension_cls = worker_extension_cls
        self.shutdown_deadline_s = shutdown_deadline_s
        self._procs: list = []
        self._conns: list = []
        self._exiting: list = []  # one multiprocessing Event per rank, see _rank_main
        self._executor: ThreadPoolExecutor | None = None
        self._lock = asyncio.Lock()
        # Replies still owed by an RPC that was cancelled: drained before the next one, so a
        # late reply is never taken for the answer to a later call.
        self._pending: list[asyncio.Future] = []
        self._closed = False

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    async def start(self) -> None:
        if self._procs or self._closed:
            raise RuntimeError("a RankGroup starts once")
        loop = asyncio.get_running_loop()
        context = multiprocessing.get_context("spawn")
        # One thread per rank: every rank's reply is awaited at once (lockstep).
        self._executor = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="rank-pipe")
        log_level = current_log_levels()  # the parent's DYN_LOG levels, targets included
        try:
            for rank in range(self.size):
                parent_conn, child_conn = context.Pipe(duplex=True)
                exiting = context.Event()
                proc = context.Process(
                    target=_rank_main,
                    args=(
                        rank,
                        self.size,
                        child_conn,
                        self.worker_extension_cls,
                        log_level,
                        exiting,
                    ),
                    name=f"dynamo-rank-{rank}",
                    daemon=True,
                )
                self._procs.append(proc)
                self._conns.append(parent_conn)
                self._exiting.append(exiting)
                await loop.run_in_executor(self._executor, proc.start)
                child_conn.close()
            replies = await self._gather_replies(range(self.size))
            self._raise_for_errors("start", replies)
        except BaseException:
            await self.shutdown()
            raise
        logger.info(
            "Started %d rank process(es) %s (worker extension: %s)",
            self.size,
            self.pids,
            self.worker_extension_cls or "none",
        )

    async def watch(self) -> ProcessExit:
        """Return as soon as any rank process ends, however it ends (see
        :mod:`dynamo.vllm.process_watch`): while serving, nothing else would notice before the
        next collective call. Cancel the watch before :meth:`shutdown`, whose ranks end too."""
        if not self._procs:
            raise RuntimeError("the rank group is not running")
        return await first_exit([(f"rank {rank}", proc) for rank, proc in enumerate(self._procs)])

    async def collective_rpc(self, method: str, args: Sequence[Any] = ()) -> list:
        """Call ``method(*args)`` on every rank's worker; the list of results, by rank.

        Returns when every rank has answered. A rank's exception (or death) raises
        :class:`RankError` naming the rank, after every other rank has answered.
        """
        if self._closed or not self._procs:
            raise RuntimeError("the rank group is not running")
        async with self._lock:
            if self._pending:
                await asyncio.gather(*self._pending)
                self._pending = []
            message = (method, tuple(args))
            sent, replies = [], {}
            for rank, conn in enumerate(self._conns):
                try:
                    conn.send(message)
                    sent.append(rank)
                except OSError:
                    replies[rank] = ("died", self._death_note(rank))
            replies.update(await self._gather_replies(sent))
            self._raise_for_errors(method, replies)
            return [replies[rank][1] for rank in range(self.size)]

    async def _gather_replies(self, ranks) -> dict[int, tuple[str, Any]]:
        loop = asyncio.get_running_loop()
        ranks = list(ranks)
        futures = [loop.run_in_executor(self._executor, self._recv, rank) for rank in ranks]
        self._pending = futures
        # Shielded: a cancelled caller leaves the receives running; the next call drains them.
        results = await asyncio.shield(asyncio.gather(*futures))
        self._pending = []
        return dict(zip(ranks, results, strict=True))  # gather keeps one result per rank

    def _recv(self, rank: int) -> tuple[str, Any]:
        try:
            return self._conns[rank].recv()
        except (EOFError, OSError):
            return ("died", self._death_note(rank))

    def _death_note(self, rank: int) -> str:
        proc = self._procs[rank]
        proc.join(timeout=1.0)  # it closed its pipe: it is exiting, collect its exit code
        return f"rank process {proc.pid} {describe_exit(proc.exitcode)}"

    def _raise_for_errors(self, method: str, replies: dict[int, tuple[str, Any]]) -> None:
        failed = sorted(rank for rank, (status, _) in replies.items() if status != "ok")
        if not failed:
            return
        details = "\n".join(f"rank {rank}: {replies[rank][1]}" for rank in failed)
        raise RankError(
            f"collective_rpc {method!r} failed on rank(s) {', '.join(map(str, failed))}:\n"
            f"{details}",
            ranks=failed,
            died=[rank for rank in failed if replies[rank][0] == "died"],
        )

    async def shutdown(self) -> None:
        """Ask every rank to exit, kill those stuck past the deadline; idempotent.

        A rank has ``shutdown_deadline_s`` to take the shutdown message (one stuck in a step, or
        stopped, does not); a rank that took it then has a deadline of its own to finish
        exiting, so one stuck rank cannot use up the time of the others.
        """
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            try:
                conn.send((_SHUTDOWN, ()))
            except OSError:
                pass  # already gone
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._reap, time.monotonic() + self.shutdown_deadline_s)
        if self._pending:
            # The ranks are dead, so these receives have returned or are returning EOF.
            await asyncio.gather(*self._pending)
            self._pending = []
        for conn in self._conns:
            conn.close()
        if self._executor is not None:
            await loop.run_in_executor(None, self._executor.shutdown)
        # DEBUG: the engine that owns the group logs its shutdown (one line per event).
        logger.debug("Rank processes %s stopped", self.pids)

    def _reap(self, deadline: float) -> None:
        exit_grace_s = max(self.shutdown_deadline_s, EXITING_GRACE_S)
        for rank, proc in enumerate(self._procs):
            if proc.pid is None:
                continue  # never started
            if self._took_shutdown(rank, deadline):
                proc.join(timeout=exit_grace_s)
                if not proc.is_alive():
                    continue
                logger.warning(
                    "Rank process %d took the shutdown but did not exit within %g s: killing it",
                    proc.pid,
                    exit_grace_s,
                )
            else:
                logger.warning("Rank process %d did not exit in time: killing it", proc.pid)
            proc.kill()
            proc.join(timeout=5.0)

    def _took_shutdown(self, rank: int, deadline: float) -> bool:
        """Whether ``rank`` took the shutdown message (or is gone) by ``deadline``."""
        proc, exiting = self._procs[rank], self._exiting[rank]
        while not exiting.is_set() and proc.is_alive():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # Short waits: a rank that dies without taking the message is noticed promptly.
            exiting.wait(min(remaining, 0.05))
        return True
