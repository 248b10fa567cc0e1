"""Test-only tracing of explicit ``gc.collect()`` calls.

Integration tests must prove that discovering a model while serving triggers no explicit
collection in the frontend. A process cannot show the absence of a call from the outside, so
when ``DYN_TEST_TRACE_GC_COLLECT`` is set to a true word (1/true/yes/on), ``main`` replaces
``gc.collect`` with a wrapper that logs ``explicit gc.collect() called`` and then collects.
The start-up freeze calls it once, which shows the trace works; any later line is a regression.

Off by default; only tests set the variable. It is not an operator option, so it has no flag and
no docs row. Automatic collections (the collector's own thresholds) do not go through
``gc.collect`` and are not traced: the pause logger reports those.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Mapping

from dynamo.common.configuration import parse_bool_word

logger = logging.getLogger(__name__)

ENV_VAR = "DYN_TEST_TRACE_GC_COLLECT"

_original_collect = None


def requested(environ: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    try:
        return bool(value) and parse_bool_word(value)
    except ValueError:
        return False


def install() -> None:
    global _original_collect
    if _original_collect is not None:
        return
    original = gc.collect

    def traced_collect(*args, **kwargs):
        caller = sys._getframe(1)
        logger.info(
            "explicit gc.collect() called from %s:%d",
            caller.f_code.co_filename,
            caller.f_lineno,
        )
        return original(*args, **kwargs)

    _original_collect = original
    gc.collect = traced_collect


def uninstall() -> None:
    global _original_collect
    if _original_collect is not None:
        gc.collect = _original_collect
        _original_collect = None


def install_if_requested(environ: Mapping[str, str] | None = None) -> bool:
    if not requested(environ):
        return False
    install()
    logger.info("Tracing explicit gc.collect() calls (%s is set; tests only)", ENV_VAR)
    return True
