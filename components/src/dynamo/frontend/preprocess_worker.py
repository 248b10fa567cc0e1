"""What runs inside each preprocess worker process (``--dyn-preprocess-workers N``).

The pool starts these processes with the "spawn" context: each is a fresh interpreter that
imports only this module and what it needs (no aiohttp, no HTTP app). Its initializer builds the
tokenizer tables and ends with the process's one freeze, so the tables are frozen before the
process takes its first task. This module is kept light for the same reason.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from dynamo.common import lifecycle
from dynamo.common.utils.gc_freeze import install_gc_pause_logger, maybe_freeze_gc_heap

from dynamo.common.logging_setup import configure_logging
from .tokenizer import ByteTokenizer, build_tokenizer_tables

logger = logging.getLogger(__name__)

FREEZE_CONTEXT = "preprocess worker"

_tokenizer: ByteTokenizer | None = None
_ready_barrier: Any = None  # a multiprocessing Barrier shared by the pool's processes


def initialize_preprocess_worker(
    freeze_enabled: bool, gc_pause_log_ms: float, log_level: Any, ready_barrier: Any
) -> None:
    """Pool initializer: logging, pause logger, tokenizer tables, then the freeze (last)."""
    global _tokenizer, _ready_barrier
    # Ctrl-C reaches the whole process group; the frontend owns shutdown and stops the pool
    # itself, so a worker must not die mid-task with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(log_level)
    install_gc_pause_logger(gc_pause_log_ms)
    _tokenizer = ByteTokenizer(build_tokenizer_tables())
    _ready_barrier = ready_barrier
    logger.info("Preprocess worker initialised: vocab=%d", _tokenizer.vocab_size)
    maybe_freeze_gc_heap(freeze_enabled, context=FREEZE_CONTEXT)
    lifecycle.mark_serving("preprocess worker takes tasks")


def report_ready(timeout_s: float) -> int:
    """Block until every pool process runs this task, then return this process's pid.

    The pool submits exactly one per process: since each blocks on the barrier until all have
    arrived, no process can take two, so N distinct pids prove N initializers finished.
    """
    _ready_barrier.wait(timeout_s)
    return os.getpid()


def encode(text: str) -> list[int]:
    if _tokenizer is None:
        raise RuntimeError("preprocess worker used before its initializer ran")
    return _tokenizer.encode(text)
