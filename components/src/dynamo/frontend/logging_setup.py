"""Logging for the frontend process and its preprocess worker processes.

Every line carries the pid: the frontend and its spawned preprocess workers share one stderr,
and an operator (or a test) must tell their freeze lines apart.
"""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)s pid=%(process)d %(name)s: %(message)s"

# Marks the handler we installed, so a second call (a test calling main twice, a pool
# initializer) does not stack handlers and print every line twice.
_HANDLER_MARK = "_dynamo_frontend_handler"


def configure_logging(level: int = logging.INFO) -> None:
    """Send INFO and above to stderr in the project's format; idempotent.

    Handlers others installed (pytest's capture, an embedding application) are left alone.
    """
    root = logging.getLogger()
    root.setLevel(level)
    if any(getattr(handler, _HANDLER_MARK, False) for handler in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    setattr(handler, _HANDLER_MARK, True)
    root.addHandler(handler)


def remove_logging_handler() -> None:
    """Undo :func:`configure_logging`'s handler (tests that run ``main`` in-process)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(handler)
