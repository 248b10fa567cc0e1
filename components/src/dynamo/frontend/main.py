"""``python -m dynamo.frontend``: the OpenAI-compatible frontend, freezing at its quiescent point.

Start-up, each step logged, in this order (the shared steps are :mod:`dynamo.common.launcher`'s,
the frontend's parts :mod:`dynamo.frontend.process`'s):

1. parse the options and open the discovery store (a directory is checked, and created if
   missing; the etcd client is imported here, before the freeze covers it): bad input exits 2
   before anything runs; then logging, and the GC pause logger and metrics;
2. import the chat processor's libraries (``vllm``, ``sglang``: the heap the freeze is for);
3. build everything that does not depend on discovery, the preprocess pool (each process
   freezes its own heap) and the listener's sockets (bound, not listening) included;
4. freeze the GC heap, then mark the process ``serving``: from here on any freeze is refused;
5. open the listener and start the discovery watcher;
6. on SIGTERM/SIGINT, drain within ``--dyn-drain-timeout`` and close every part; the
   process's GC state is put back last.

Exit codes: 0 after a signal (or --help), 2 for bad input before anything runs, 1 when start-up
or shutdown fails.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence

from dynamo.common import launcher, logging_setup, startup_signals
from dynamo.common.configuration.runtime_options import DISCOVERY_DIR
from dynamo.frontend.processors.chat_processor import import_processor_libraries
from dynamo.frontend.processors.sglang_processor import SETUP_COMMAND as SGLANG_SETUP_COMMAND
from dynamo.runtime.discovery import (
    Discovery,
    DiscoveryDirError,
    DiscoverySetupError,
    open_discovery,
)
from dynamo_gc import startup_stop

from . import frontend_args, sglang_checks
from .frontend_args import PROG
from .process import FrontendProcess

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    return startup_signals.run_stoppable(run_main, argv, logger)


def run_main(argv: Sequence[str] | None) -> int:
    try:
        config = frontend_args.parse_args(argv)
        log_levels = logging_setup.log_levels_or_exit(PROG)  # DYN_LOG, as upstream
    except SystemExit as exc:  # bad input (2, the parser printed why) or --help (0)
        return launcher.exit_code(exc)
    problem = frontend_args.readiness_problem(config)
    if problem is not None:  # before the discovery directory is made: nothing half-applied
        return launcher.usage_error(PROG, problem)
    try:
        # The etcd client is imported here, before the start-up freeze covers it.
        discovery = open_discovery(config.discovery)
        problem = check_discovery(discovery, config.discovery.directory)
    except DiscoverySetupError as exc:  # etcd credentials that cannot work
        problem = str(exc)
    problem = problem or sglang_checks.problem_before_import(config, frontend_args.CHAT_PROCESSOR)
    if problem is not None:
        # Before anything runs: a watcher on a file or an unreadable directory would see no
        # worker, ever, while /health said ready.
        return launcher.usage_error(PROG, problem)
    launcher.configure_process_logging(PROG, log_levels, frontend_args.SURFACE.options)
    launcher.warn_unmet_prerequisites(frontend_args.REQUIREMENTS, config, argv)
    problem = import_chat_processor(config.dyn_chat_processor)
    sglang = None
    if problem is None and config.dyn_chat_processor in ("sglang", "vllm"):
        # SGLang's (vLLM's) registries are the source of the parser names: checked now.
        sglang, problem = sglang_checks.settings_or_problem(config)
    if problem is not None:
        return launcher.usage_error(PROG, problem)
    # The imports are done: a signal meanwhile whose exception a finalizer swallowed stops here.
    startup_stop.check()
    process_gc = launcher.start_process_gc(config.gc, config.maintenance)
    logger.info(
        "Frontend starting: http=%s discovery=%s chat_processor=%s max_models=%d "
        "ready_min_models=%d preprocess_workers=%d freeze_gc_heap=%s",
        config.url,
        discovery.describe(),
        config.dyn_chat_processor,
        config.dyn_max_models,
        config.dyn_ready_min_models,
        config.dyn_preprocess_workers,
        "on" if config.freeze_gc_heap else "off",
    )
    frontend = FrontendProcess(
        config, discovery, process_gc.metrics, sglang, process_gc.maintenance
    )
    try:
        code = asyncio.run(
            launcher.run_lifecycle(
                frontend,
                gc=config.gc,
                process_gc=process_gc,
            )
        )
    except launcher.StartupFailed as exc:
        logger.error("%s", exc)
        code = exc.exit_status
    finally:
        process_gc.state.restore()
    logger.info("Frontend exiting with code %d", code)
    return code


def check_discovery(discovery: Discovery, directory: str) -> str | None:
    """Why the discovery store cannot be watched (a directory is created when missing), or None."""
    try:
        discovery.check(writer=False)
    except DiscoveryDirError as exc:
        return (
            f"{DISCOVERY_DIR.source_label()} is {directory!r}: the frontend cannot watch it ({exc})"
        )
    return None


def import_chat_processor(kind: str) -> str | None:
    """Import the chat processor's libraries now, before the freeze; why not, or None.

    With ``vllm`` that is vLLM's ~0.5M-object import heap: imported on the first discovered
    model instead, it would land after the freeze, where every full collection walks it.
    """
    started = time.perf_counter()
    if kind != "hf":  # seconds of imports: say what the process is doing meanwhile
        logger.info("Chat processor %s: importing its libraries", kind)
    try:
        libraries = import_processor_libraries(kind)
    except ImportError as exc:
        option = frontend_args.CHAT_PROCESSOR
        if kind == "sglang":
            return (
                f"{option.source_label()} is 'sglang' but SGLang cannot be imported in this "
                f"Python environment ({sys.executable}): {exc}. Create its environment with "
                f"{SGLANG_SETUP_COMMAND} and start the frontend with its python "
                "(.venv-sglang/bin/python -m dynamo.frontend), or use the default `hf`"
            )
        return (
            f"{option.source_label()} is {kind!r} but vLLM cannot be imported in this Python "
            f"environment ({sys.executable}): {exc}. Install vLLM next to the frontend (pip "
            "install vllm, or run it from the vLLM environment), or use the default `hf`"
        )
    logger.info(
        "Chat processor %s: imported %s in %.1f s",
        kind,
        libraries,
        time.perf_counter() - started,
    )
    return None
