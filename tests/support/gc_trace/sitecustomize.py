"""Test-only: log every explicit ``gc.collect()`` of a process started with this directory first
on its ``PYTHONPATH`` (tests/support/processes.py: ``start_frontend(..., trace_gc_collect=True)``).

Integration tests must prove that discovering a model while serving triggers no explicit
collection in the frontend. A process cannot show the absence of a call from the outside, so
``site`` imports this module at interpreter start-up and it replaces ``gc.collect`` with a wrapper
that logs ``explicit gc.collect() called from FILE:LINE`` and then collects. The frontend's
start-up freeze calls it once, which shows the trace is installed; any later line is a
regression. Automatic collections (the collector's own thresholds) do not go through
``gc.collect`` and are not traced: the pause logger reports those.

The line is an INFO record of the ``gc_collect_trace`` logger, logged when the call happens:
by then the launcher has configured logging (``dynamo.common.logging_setup``: our handler on the
root logger, the root at ``DYN_LOG``'s default level, which this logger inherits), so the line
reaches the launcher's log in its format, with its pid. Processes the traced one spawns inherit
its ``PYTHONPATH`` and are traced too (their lines carry their own pid).

The package knows nothing of this: no variable of the package turns it on. Being first on the
path, this module hides any other ``sitecustomize`` (the project's environments have none).
"""

from __future__ import annotations

import gc
import logging
import sys

_logger = logging.getLogger("gc_collect_trace")
_original_collect = gc.collect


def _traced_collect(*args, **kwargs):
    caller = sys._getframe(1)
    _logger.info(
        "explicit gc.collect() called from %s:%d", caller.f_code.co_filename, caller.f_lineno
    )
    return _original_collect(*args, **kwargs)


gc.collect = _traced_collect
