"""The worker's self-benchmark: one timed forward pass per (batch size x sequence length) point.

It runs after engine init and before the serving freeze and ``register_model``. With
``--fpm-gc-policy freeze`` the GC policy (:mod:`dynamo.vllm.gc_policy`) runs around the sweep in
the main process, through the worker extension in every rank, and with ``--engine vllm``
through the scheduler (:mod:`dynamo.vllm.gc_scheduler`) in vLLM's EngineCore process: every
process a measured window runs in. Each process logs a ``Self-benchmark GC report`` (GC state,
heap size, collections, pause counters) before, at the start and end of the sweep, and after.
The policy is stopped on every exit
path (success, exception, KeyboardInterrupt, cancellation) before this function returns or
raises, so the serving freeze that follows sees stock thresholds, as if the benchmark never ran.

Before the engine is built, the worker resolves the hooks every process needs
(:mod:`dynamo.vllm.self_benchmark_hooks`).
"""

from __future__ import annotations

import json
import logging
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import IO, Any

from dynamo.vllm.backend_args import WorkerConfig
from dynamo.vllm.ranks import RankError
from dynamo.vllm.self_benchmark_hooks import policy_active
from dynamo_gc import bench_policy

logger = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
SEQ_LENS = (16, 32, 64, 128, 256, 512, 1024, 2048)
SWEEP_SEED = 0
# In long sweeps, an untimed gc_maintain window every this many points keeps the garbage the
# policy defers (cycles that reached a frozen generation) from piling up.
MAINTAIN_EVERY_POINTS = 1000
OUTLIER_FACTOR = 3.0


def sequence_lengths(max_seq_len: int | None = None) -> tuple[int, ...]:
    """:data:`SEQ_LENS`, capped at the engine's longest sequence when it has one.

    Lengths above the cap are replaced by the cap itself, once: the sweep still reaches the
    longest sequence the engine takes, and every point runs the length it records.
    """
    if max_seq_len is None or max_seq_len >= SEQ_LENS[-1]:
        return SEQ_LENS
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be at least 1, not {max_seq_len}")
    return tuple(seq for seq in SEQ_LENS if seq < max_seq_len) + (max_seq_len,)


def benchmark_points(
    count: int, *, seed: int = SWEEP_SEED, max_seq_len: int | None = None
) -> list[tuple[int, int]]:
    """``count`` (batch size, sequence length) points: the grid in a seeded order, repeated.

    ``max_seq_len`` caps the sequence lengths (see :func:`sequence_lengths`).
    """
    rng = random.Random(seed)
    grid = [(batch, seq) for batch in BATCH_SIZES for seq in sequence_lengths(max_seq_len)]
    points: list[tuple[int, int]] = []
    while len(points) < count:
        cycle = list(grid)
        rng.shuffle(cycle)
        points.extend(cycle)
    return points[:count]


@dataclass(frozen=True)
class PointResult:
    point: int
    batch: int
    seq: int
    wall_ms: float
    # Wall clock at the point's start (time.time()): lines a point up with the timestamped pause
    # lines of every process of the engine (their own clocks are this machine's).
    started_unix: float | None = None

    def json_line(self) -> str:
        fields = asdict(self)
        if fields["started_unix"] is None:
            del fields["started_unix"]
        return json.dumps(fields) + "\n"


@dataclass(frozen=True)
class BenchmarkSummary:
    points: int
    p50_ms: float
    max_ms: float
    outliers: int  # samples slower than OUTLIER_FACTOR x the median of their own point
    gc_policy: str

    def log_line(self) -> str:
        return (
            f"Self-benchmark done: points={self.points} p50_ms={self.p50_ms:.3f} "
            f"max_ms={self.max_ms:.3f} outliers={self.outliers} "
            f"(>{OUTLIER_FACTOR:g}x their point's median) gc_policy={self.gc_policy}"
        )


def summarize(results: Sequence[PointResult], *, gc_policy_name: str) -> BenchmarkSummary:
    """p50 and max over every sample; outliers against the median of the same (batch, seq).

    A big point is legitimately slower than the sweep's median; a GC pause makes one sample of
    a point slower than the other samples of that same point.
    """
    if not results:
        return BenchmarkSummary(0, 0.0, 0.0, 0, gc_policy_name)
    by_point: dict[tuple[int, int], list[float]] = {}
    for result in results:
        by_point.setdefault((result.batch, result.seq), []).append(result.wall_ms)
    outliers = 0
    for samples in by_point.values():
        median = statistics.median(samples)
        outliers += sum(1 for value in samples if value > OUTLIER_FACTOR * median)
    wall_ms = [result.wall_ms for result in results]
    return BenchmarkSummary(
        points=len(results),
        p50_ms=statistics.median(wall_ms),
        max_ms=max(wall_ms),
        outliers=outliers,
        gc_policy=gc_policy_name,
    )


class PointWriter:
    """One JSON line per point, flushed as it goes (a crash keeps every point measured so far)."""

    def __init__(self, path: str | None) -> None:
        self._file: IO[str] | None = None if path is None else open(path, "w", encoding="utf-8")

    def write(self, result: PointResult) -> None:
        if self._file is not None:
            self._file.write(result.json_line())
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


async def run_sweep(
    engine: Any,
    points: Sequence[tuple[int, int]],
    writer: PointWriter,
    *,
    maintain_every: int | None,
) -> list[PointResult]:
    """Time one ``engine.forward_pass`` per point; ``gc_maintain`` windows between points."""
    results: list[PointResult] = []
    for index, (batch, seq) in enumerate(points):
        if maintain_every and index and index % maintain_every == 0:
            collected = bench_policy.maintain()  # untimed: between two measured points
            await engine.collective_rpc("fpm_gc_maintain")
            await _engine_core(engine, "maintain", report=False)
            logger.debug("GC maintain window before point %d: collected=%d", index, collected)
        started_unix = time.time()
        started = time.perf_counter()
        await engine.forward_pass(batch, seq)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        result = PointResult(
            point=index,
            batch=batch,
            seq=seq,
            wall_ms=round(elapsed_ms, 4),
            started_unix=round(started_unix, 6),
        )
        writer.write(result)
        results.append(result)
    return results


REPORT_LINE = "Self-benchmark GC report: "


async def _engine_core(engine: Any, command: str, **params: Any) -> dict | None:
    """``command`` in vLLM's EngineCore process; ``None`` for an engine without one (the mock)
    or an EngineCore whose scheduler is not ours (a user's, with the policy off)."""
    call = getattr(engine, "engine_core_call", None)
    if call is None:
        return None
    from dynamo.vllm.gc_scheduler import EngineCoreUnpoliced

    try:
        return await call(command, **params)
    except EngineCoreUnpoliced as exc:
        logger.warning("%s", exc)
        return None


async def _install_pause_loggers(engine: Any, config: WorkerConfig) -> None:
    """The worker's ``--gc-pause-log-ms`` in every process of the sweep, not only this one.

    Diagnostic: a process that cannot take it (a user's extension or scheduler, with the policy
    off) is logged and the sweep goes on.
    """
    threshold_ms = config.gc_pause_log_ms
    if threshold_ms <= 0:
        return
    try:
        await engine.collective_rpc("fpm_gc_pause_log", (threshold_ms,))
        await _engine_core(engine, "pause_log", threshold_ms=threshold_ms)
    except Exception as exc:  # noqa: BLE001 - see above
        logger.warning("GC pause logger not installed in every engine process: %s", exc)


async def _log_gc_reports(engine: Any, phase: str) -> None:
    """One line per process: its GC state, heap and pause counters (untimed; walks heaps)."""
    reports = [bench_policy.gc_process_report("main")]
    try:
        reports += list(await engine.collective_rpc("fpm_gc_report"))
        core = await _engine_core(engine, "report")
        if core is not None:
            reports.append(core)
    except Exception as exc:  # noqa: BLE001 - a diagnostic never stops the benchmark
        logger.warning("GC report (%s) incomplete: %s", phase, exc)
    for report in reports:
        report.pop("command", None)
        report.pop("result", None)
        logger.info("%s%s", REPORT_LINE, json.dumps({"phase": phase, **report}, sort_keys=True))


async def _start_policy(engine: Any, config: WorkerConfig) -> None:
    bench_policy.start_policy(interval_s=config.fpm_gc_freeze_interval_s)
    started = await engine.collective_rpc("fpm_gc_start")
    unpoliced = [rank for rank, running in enumerate(started) if not running]
    if unpoliced:
        logger.warning(
            "GC policy did not start in rank(s) %s: their environment turns it off, so their "
            "gen2 pauses can land in measured windows",
            unpoliced,
        )
    await _engine_core(engine, "start", interval_s=float(config.fpm_gc_freeze_interval_s))


async def _stop_policy(
    engine: Any, *, serving_freeze: bool, raise_errors: bool, ranks_alive: bool = True
) -> None:
    # The main process first: if the engine runs the extension in this very process, its
    # fpm_gc_stop is then a no-op instead of stopping without the serving-freeze hint.
    errors: list[Exception] = []
    try:
        bench_policy.stop_policy(serving_freeze=serving_freeze)
    except Exception as exc:  # noqa: BLE001 - the ranks must still be stopped
        errors.append(exc)
    if ranks_alive:  # a rank group that lost a rank is shut down, the policy with its ranks
        try:
            await engine.collective_rpc("fpm_gc_stop")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        try:
            # EngineCore's scheduler also stops it when EngineCore shuts down.
            await _engine_core(engine, "stop")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    if errors and raise_errors:
        raise errors[0]
    for error in errors:
        logger.error("Stopping the GC policy failed: %s", error)


async def run_self_benchmark(engine: Any, config: WorkerConfig) -> BenchmarkSummary:
    """Run the sweep (after engine init, before the serving freeze); log and return its summary.

    The benchmark's own error propagates after the policy has been stopped everywhere.
    """
    # An engine with a length limit (vLLM: its max_model_len) says so; the mock has none.
    max_seq_len = getattr(engine, "max_seq_len", None)
    points = benchmark_points(config.self_benchmark_points, max_seq_len=max_seq_len)
    if max_seq_len is not None and max_seq_len < SEQ_LENS[-1]:
        logger.info(
            "Self-benchmark: sequence lengths capped at %d, the engine's longest", max_seq_len
        )
    use_policy = policy_active(config)
    policy_name = config.fpm_gc_policy if use_policy else "off"
    serving_freeze = config.freeze_gc_heap
    logger.info(
        "Self-benchmark: %d points, GC policy %s, output %s",
        len(points),
        policy_name,
        config.self_benchmark_output or "none",
    )
    writer = PointWriter(config.self_benchmark_output)  # fails before any GC state changes
    policy_started = False
    try:
        await _install_pause_loggers(engine, config)
        await _log_gc_reports(engine, "before")
        if use_policy:
            policy_started = True  # set first: a start that fails half-way is still stopped
            await _start_policy(engine, config)
        await _log_gc_reports(engine, "sweep_start")
        results = await run_sweep(
            engine,
            points,
            writer,
            maintain_every=MAINTAIN_EVERY_POINTS if use_policy else None,
        )
        await _log_gc_reports(engine, "sweep_end")
    except BaseException as exc:
        if policy_started:
            # Start-up is abandoned: no serving freeze follows, so the heap is not frozen again
            # (unless it was frozen before the policy), and dead ranks are not asked to stop.
            await _stop_policy(
                engine,
                serving_freeze=False,
                raise_errors=False,
                ranks_alive=not (isinstance(exc, RankError) and exc.died),
            )
        raise
    finally:
        writer.close()
    if policy_started:
        await _stop_policy(engine, serving_freeze=serving_freeze, raise_errors=True)
    await _log_gc_reports(engine, "after")
    summary = summarize(results, gc_policy_name=policy_name)
    logger.info(summary.log_line())
    return summary
