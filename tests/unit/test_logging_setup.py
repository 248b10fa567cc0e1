"""The one logging set-up every process uses: pid on every line, one handler however often
called."""

from __future__ import annotations

import logging
import os
import pickle
import re

import pytest

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


# --- DYN_LOG ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "default", "targets"),
    [
        ("", logging.INFO, ()),
        ("  ", logging.INFO, ()),
        ("debug", logging.DEBUG, ()),
        ("DEBUG", logging.DEBUG, ()),
        ("warn", logging.WARNING, ()),
        ("warning", logging.WARNING, ()),
        ("error", logging.ERROR, ()),
        ("trace", logging.DEBUG, ()),  # Python has no TRACE; upstream maps it to DEBUG too
        ("off", logging_setup.OFF, ()),
        ("info,dynamo.vllm=debug", logging.INFO, (("dynamo.vllm", logging.DEBUG),)),
        ("info, dynamo::vllm::gc_policy = trace", logging.INFO,
         (("dynamo.vllm.gc_policy", logging.DEBUG),)),
        ("dynamo.frontend=warn,error", logging.ERROR, (("dynamo.frontend", logging.WARNING),)),
        ("info,,", logging.INFO, ()),
    ],
)  # fmt: skip
def test_dyn_log_values_upstream_accepts(text, default, targets):
    levels = logging_setup.parse_dyn_log(text)
    assert (levels.default, levels.targets) == (default, targets)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("loud", "'loud' is not a level"),
        ("info,dynamo=loud", "'loud' in 'dynamo=loud' is not a level"),
        ("info,=debug", "not a logger name"),
        ("info,dynamo vllm=debug", "not a logger name"),
        ("dynamo_runtime::system_status_server:trace", "not a level"),  # ':' is not '='
        ("info,dynamo[span]=debug", "span filters"),
    ],
)
def test_bad_dyn_log_values_say_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        logging_setup.parse_dyn_log(text)


def test_a_bad_dyn_log_exits_2_naming_it(capsys):
    with pytest.raises(SystemExit) as exc:
        logging_setup.log_levels_or_exit("prog", {"DYN_LOG": "loud"})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "prog: error: invalid value 'loud' for DYN_LOG" in err
    assert "error, warn, info, debug, trace or off" in err


def test_a_target_gets_its_level_under_an_info_default(capsys):
    logging_setup.configure_logging(
        logging_setup.parse_dyn_log("info,dynamo.quiet=error,dynamo.loud=debug")
    )
    logging.getLogger("dynamo.loud.child").debug("loud debug")
    logging.getLogger("dynamo.quiet").warning("quiet warning")
    logging.getLogger("dynamo.other").debug("other debug")
    logging.getLogger("dynamo.other").info("other info")
    err = capsys.readouterr().err
    assert "loud debug" in err and "other info" in err
    assert "quiet warning" not in err and "other debug" not in err


def test_reconfiguring_drops_the_previous_targets():
    logging_setup.configure_logging(logging_setup.parse_dyn_log("info,dynamo.x=debug"))
    logging_setup.configure_logging(logging_setup.parse_dyn_log("warn"))
    assert logging.getLogger("dynamo.x").level == logging.NOTSET
    assert logging_setup.current_log_levels().default == logging.WARNING


def test_the_levels_travel_to_a_child_process():
    levels = logging_setup.parse_dyn_log("warn,dynamo.vllm=debug")
    logging_setup.configure_logging(levels)
    assert pickle.loads(pickle.dumps(logging_setup.current_log_levels())) == levels


def test_debug_says_how_logging_was_configured(capsys):
    logging_setup.configure_logging(logging_setup.parse_dyn_log("debug"))
    assert "DEBUG" in capsys.readouterr().err.split("Logging configured from DYN_LOG='debug'")[0]


def test_targets_naming_no_python_package_are_reported(caplog):
    levels = logging_setup.parse_dyn_log("info,dynamo_runtime=debug,dynamo.vllm=debug")
    caplog.set_level(logging.WARNING, logger="dynamo.common.logging_setup")
    assert logging_setup.warn_unmatched_targets(levels) == ["dynamo_runtime"]
    assert "DYN_LOG target 'dynamo_runtime' names no Python package" in caplog.text


def test_ensure_logging_configures_a_bare_process_from_the_env(monkeypatch, capsys):
    monkeypatch.setenv("DYN_LOG", "debug")
    logging_setup.ensure_logging(label="vllm rank")
    logging.getLogger("dynamo.test").debug("from a rank")
    assert "[vllm rank] dynamo.test: from a rank" in capsys.readouterr().err
    monkeypatch.setenv("DYN_LOG", "error")
    logging_setup.ensure_logging(label="vllm rank")  # already configured: unchanged
    assert logging_setup.current_log_levels().default == logging.DEBUG
