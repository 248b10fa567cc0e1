"""What runs inside each preprocess worker process (``--dyn-preprocess-workers N``).

The pool starts these processes with the "spawn" context (see :mod:`.preprocess_pool` for why
not 3.14's default, forkserver): each is a fresh interpreter that imports only this module and
what it needs (no aiohttp, no HTTP app). Its initializer imports
the chat processor's libraries (``tokenizers``, or vLLM's with ``--dyn-chat-processor vllm``)
and ends with the process's one freeze, so that import heap is frozen before the process takes
its first task.

Each process tokenises for whichever model a task names: it loads that model's tokenizer from
the model card on first use and keeps the most recently used ones (at most
:data:`CACHED_TOKENIZERS`), so a frontend serving many models does not hold every tokenizer in
every process. Tokenizers loaded here are heap grown after this process's freeze; nothing here
freezes again.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import OrderedDict
from typing import Any

from dynamo.common.logging_setup import configure_logging
from dynamo.runtime.model_card import ModelCard
from dynamo_gc import lifecycle
from dynamo_gc.freeze import last_freeze, maybe_freeze_gc_heap
from dynamo_gc.pause_logger import install_gc_pause_logger

from .chat_processor import DEFAULT_CHAT_PROCESSOR, build_tokenizer, import_processor_libraries

logger = logging.getLogger(__name__)

FREEZE_CONTEXT = "preprocess worker"
# Tokenizers a process keeps loaded; the least recently used one goes first.
CACHED_TOKENIZERS = 8

_kind = DEFAULT_CHAT_PROCESSOR
_tokenizers: OrderedDict[ModelCard, Any] = OrderedDict()
_ready_barrier: Any = None  # a multiprocessing Barrier shared by the pool's processes
_initialized = False


def initialize_preprocess_worker(
    freeze_enabled: bool,
    gc_pause_log_ms: float,
    log_level: Any,
    ready_barrier: Any,
    chat_processor: str = DEFAULT_CHAT_PROCESSOR,
) -> None:
    """Pool initializer: logging, pause logger, the processor's libraries, then the freeze."""
    global _kind, _ready_barrier, _initialized
    # Ctrl-C reaches the whole process group; the frontend owns shutdown and stops the pool
    # itself, so a worker must not die mid-task with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(log_level)
    install_gc_pause_logger(gc_pause_log_ms)
    libraries = import_processor_libraries(chat_processor)
    _kind = chat_processor
    _ready_barrier = ready_barrier
    _initialized = True
    logger.info("Preprocess worker initialised: chat_processor=%s (%s)", chat_processor, libraries)
    maybe_freeze_gc_heap(freeze_enabled, context=FREEZE_CONTEXT)
    lifecycle.mark_serving("preprocess worker takes tasks")


def report_ready(timeout_s: float) -> tuple[int, int | None]:
    """Block until every pool process runs this task, then return this process's pid and the
    objects its own initializer froze (``None`` with the freeze off).

    The pool submits exactly one per process: since each blocks on the barrier until all have
    arrived, no process can take two, so N distinct pids prove N initializers finished. The
    count is the one the freeze stored for its log line (no heap walk here); it comes from this
    process's own freeze, since no start method the pool allows lets a child inherit its
    parent's module state.
    """
    _ready_barrier.wait(timeout_s)
    record = last_freeze()
    return os.getpid(), None if record is None else record.frozen


def _tokenizer(card: ModelCard) -> Any:
    tokenizer = _tokenizers.get(card)
    if tokenizer is not None:
        _tokenizers.move_to_end(card)
        return tokenizer
    tokenizer = build_tokenizer(card, _kind)
    _tokenizers[card] = tokenizer
    while len(_tokenizers) > CACHED_TOKENIZERS:
        _tokenizers.popitem(last=False)
    return tokenizer


def encode(card: ModelCard, text: str, add_special_tokens: bool) -> list[int]:
    if not _initialized:
        raise RuntimeError("preprocess worker used before its initializer ran")
    return _tokenizer(card).encode(text, add_special_tokens=add_special_tokens)


def cached_models() -> list[str]:
    """The models whose tokenizer this process holds (for tests)."""
    return [card.served_model_name for card in _tokenizers]
