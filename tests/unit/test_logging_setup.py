"""The one logging set-up every process uses: pid on every line, one handler however often called."""

from __future__ import annotations

import logging
import os

from dynamo.common import logging_setup


def ours(root: logging.Logger) -> list[logging.Handler]:
    return [h for h in root.handlers if getattr(h, logging_setup._HANDLER_MARK, False)]


def test_every_line_names_its_pid_and_a_second_call_adds_no_handler(capsys):
    logging_setup.configure_logging()
    logging_setup.configure_logging()  # a test calling main twice, a pool initializer
    root = logging.getLogger()
    assert len(ours(root)) == 1
    logging.getLogger("dynamo.test").info("hello")
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "hello" in line]
    assert f" INFO pid={os.getpid()} dynamo.test: hello" in line


def test_a_label_follows_the_pid(capsys):
    logging_setup.configure_logging(label="rank 3")
    logging.getLogger("dynamo.test").warning("labelled")
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "labelled" in line]
    assert f" WARNING pid={os.getpid()} [rank 3] dynamo.test: labelled" in line


def test_remove_logging_handler_leaves_other_handlers():
    root = logging.getLogger()
    others = [h for h in root.handlers if h not in ours(root)]
    logging_setup.configure_logging()
    logging_setup.remove_logging_handler()
    assert ours(root) == []
    assert [h for h in root.handlers] == others
