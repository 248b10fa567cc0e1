"""Logging for every process of the project: frontend, preprocess workers, vLLM worker, ranks.

One format everywhere, and every line carries the pid: a frontend and its spawned preprocess
workers, or a worker and its rank processes, share one stderr, and an operator (or a test) must
tell their freeze and pause lines apart.
"""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s pid=%(process)d %(name)s: %(message)s"

# Marks the handler we installed, so a second call (a test calling main twice, a pool
# initializer) does not stack handlers and print every line twice.
_HANDLER_MARK = "_dynamo_handler"


def log_format(label: str | None = None) -> str:
    """:data:`LOG_FORMAT`, with ``[label]`` after the pid when given (e.g. ``rank 0``)."""
    if not label:
        return LOG_FORMAT
    return LOG_FORMAT.replace("pid=%(process)d ", f"pid=%(process)d [{label}] ")


def configure_logging(level: int = logging.INFO, *, label: str | None = None) -> None:
    """Send ``level`` and above to stderr in the project's format; idempotent.

    ``label`` names a process that has no name of its own in the pid (a rank: ``rank 0``).
    Handlers others installed (pytest's capture, an embedding application) are left alone.
    """
    root = logging.getLogger()
    root.setLevel(level)
    if any(getattr(handler, _HANDLER_MARK, False) for handler in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(log_format(label)))
    setattr(handler, _HANDLER_MARK, True)
    root.addHandler(handler)


def remove_logging_handler() -> None:
    """Undo :func:`configure_logging`'s handler (tests that run ``main`` in-process)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(handler)
