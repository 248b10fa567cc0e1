"""``python -m dynamo.vllm``: the worker, with its GC heap frozen at its quiescent point.

Start-up, each step logged, in this order (the shared steps are :mod:`dynamo.common.launcher`'s,
the worker's parts :mod:`dynamo.vllm.worker_process`'s):

1. parse the options, then check what can be checked before anything starts: the
   self-benchmark's worker extension, the discovery store (the etcd client is imported here,
   before the freeze covers it; a directory is created and a write probed), the self-benchmark
   output file, and with ``--engine vllm`` vLLM's own arguments (vLLM is imported here, before the
   event loop exists). Bad input exits 2;
2. logging, the GC pause logger and metrics;
3. the listeners bind, the discovery store is reached, the engine is initialised, the optional
   self-benchmark runs;
4. the serving freeze, then the phase ``serving`` and ``register_model``;
5. serve until SIGTERM/SIGINT (drain within ``--drain-timeout``, exit 0) or the engine's death
   (exit 1); every part is closed and the process's GC state put back.

A signal during start-up stops it within seconds, in every phase, with one line and exit 0,
registering nothing: before the event loop (vLLM's import) see :mod:`dynamo.common.startup_signals`;
on the loop it cancels start-up, and an engine still initialising has its processes stopped
(:meth:`dynamo.vllm.vllm_engine.VllmEngine.start`).
Exit codes: 0 after a signal (or --help), 2 for bad input (flags, env vars, paths, vLLM's
arguments, a --model that is neither a path nor a Hugging Face id, an engine that cannot run
here, a bad mock model directory), 1 when a start-up step
fails (a taken port, engine init) or the engine dies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from dynamo.common import launcher, logging_setup, startup_signals
from dynamo.runtime.discovery import Discovery, DiscoverySetupError, open_discovery
from dynamo.vllm import backend_args, engine_factory, startup_checks
from dynamo.vllm.backend_args import PROG, WorkerConfig
from dynamo.vllm.engine import EngineInitFailed, EngineUnavailable
from dynamo.vllm.engine_factory import EngineBuilder
from dynamo.vllm.ranks import RankError
from dynamo.vllm.worker_process import WorkerProcess
from dynamo_gc import startup_stop

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    return startup_signals.run_stoppable(run_main, argv, logger)


def run_main(argv: Sequence[str] | None) -> int:
    try:
        config = backend_args.parse_args(argv)
        log_levels = logging_setup.log_levels_or_exit(PROG)  # DYN_LOG, as upstream
        worker_extension_cls = self_benchmark_extension(config)  # a conflict exits 2
        # The etcd client is imported here, before the event loop and the freeze.
        discovery = open_discovery(config.discovery)
        # Names before paths: a refused name must leave nothing behind (check_paths creates).
        startup_checks.check_parser_names(config)
        startup_checks.check_record_fields(config)
        startup_checks.check_paths(config, discovery, config.discovery.directory)
    except SystemExit as exc:  # bad input (exit 2) or --help (exit 0): nothing else has run
        return launcher.exit_code(exc)
    except DiscoverySetupError as exc:  # etcd credentials that cannot work
        return launcher.usage_error(PROG, str(exc))
    launcher.configure_process_logging(PROG, log_levels, backend_args.ALL_OPTIONS)
    launcher.warn_unmet_prerequisites(backend_args.REQUIREMENTS, config, argv)
    log_options(config)
    try:
        # With --engine vllm: import vLLM and parse its arguments now, before the event loop
        # and before anything starts, so a bad vLLM flag exits 2 at once.
        engine_builder = engine_factory.prepare_engine(
            config, worker_extension_cls=worker_extension_cls
        )
        # vLLM's import is done: a signal meanwhile whose exception a finalizer swallowed
        # stops here (dynamo_gc.startup_stop).
        startup_stop.check()
        return asyncio.run(run_worker(config, discovery, engine_builder))
    except SystemExit as exc:  # vLLM's --help
        return launcher.exit_code(exc)
    except EngineUnavailable as exc:
        logger.error("Cannot start the worker: %s", exc)
        return 2
    except launcher.StartupFailed as exc:
        logger.error("Cannot start the worker: %s", exc)
        return exc.exit_status
    except EngineInitFailed as exc:
        logger.error("Cannot start the worker: %s", exc)
        return 1
    except RankError as exc:
        # A rank process died (or failed): the engine cannot run a step. Every other rank has
        # been reaped and the GC state put back by the time this is logged: one ERROR line.
        logger.error("Worker stopped: %s", " ".join(str(exc).split("\n")))
        return 1


async def run_worker(
    config: WorkerConfig, discovery: Discovery, engine_builder: EngineBuilder
) -> int:
    """Everything after the checks, on the event loop; the exit code (0 after a signal)."""
    process_gc = launcher.start_process_gc(config.gc, config.maintenance)
    try:
        worker = WorkerProcess(
            config, discovery, engine_builder, process_gc.metrics, process_gc.maintenance
        )
        code = await launcher.run_lifecycle(
            worker,
            gc=config.gc,
            process_gc=process_gc,
        )
    finally:
        process_gc.state.restore()  # last: the pause logger, the metrics, the frozen heap
    if code:
        logger.info("Worker stopped after its engine died (exit %d)", code)
    else:
        logger.info("Worker stopped")
    return code


def self_benchmark_extension(config: WorkerConfig) -> str | None:
    """The worker extension every rank loads: the GC policy's while the self-benchmark runs
    (a conflicting user extension exits 2 here), else the user's. The ranks read the policy from
    their environment, since they never see this command line: it is exported now."""
    if not config.self_benchmark.enabled:
        return config.worker_extension_cls
    from dynamo.vllm.self_benchmark_hooks import export_policy_env, resolve_worker_extension

    extension = resolve_worker_extension(config)
    export_policy_env(config)
    return extension


def log_options(config: WorkerConfig) -> None:
    logger.info(
        "Worker options: model=%s served_model_name=%s engine=%s discovery_backend=%s "
        "discovery_dir=%s discovery_ttl=%g request_plane=%s:%s freeze_gc_heap=%s "
        "gc_pause_log_ms=%g gc_maintenance=%s self_benchmark_points=%d",
        config.model,
        config.served_name,
        config.engine,
        config.discovery_backend,
        config.discovery.directory,
        config.discovery_ttl,
        config.request_plane_host,
        config.request_plane_port,
        config.freeze_gc_heap,
        config.gc_pause_log_ms,
        config.gc_maintenance,
        config.self_benchmark_points,
    )
