"""The GC options for adapters: FRONTEND_GC / WORKER_GC, split_gc_args, gc_settings_from_env.

An adapter wraps another program (upstream ai-dynamo's launchers) whose arguments share the
command line: it takes only the GC flags out and must leave every other word alone, and it must
read the flags and env vars exactly as our own launchers do.
"""

from __future__ import annotations

import pytest

from dynamo.common.configuration import parse_surface
from dynamo.frontend import frontend_args
from dynamo.vllm import backend_args
from dynamo_gc.configuration.gc_options import GcSettings
from dynamo_gc.configuration.gc_surfaces import (
    FRONTEND_GC,
    WORKER_GC,
    gc_help,
    gc_settings_from_env,
    split_gc_args,
)

SURFACES = {"frontend": FRONTEND_GC, "worker": WORKER_GC}
# (freeze flag, no-freeze flag, freeze env, pause flag, pause env) as operators know them.
NAMES = {
    "frontend": (
        "--dyn-freeze-gc-heap",
        "--no-dyn-freeze-gc-heap",
        "DYN_FREEZE_GC_HEAP",
        "--dyn-gc-pause-log-ms",
        "DYN_GC_PAUSE_LOG_MS",
    ),
    "worker": (
        "--freeze-gc-heap",
        "--no-freeze-gc-heap",
        "DYN_VLLM_FREEZE_GC_HEAP",
        "--gc-pause-log-ms",
        "DYN_VLLM_GC_PAUSE_LOG_MS",
    ),
}
LAUNCHER_SURFACES = {"frontend": frontend_args.SURFACE, "worker": backend_args.SURFACE}
DEFAULT = GcSettings(freeze_gc_heap=True, gc_pause_log_ms=0.0)
PROG = "python -m dynamo_gc.test"

TRUE_WORDS = ["1", "true", "yes", "on", "TRUE", "Yes", "oN", " on\n"]
FALSE_WORDS = ["0", "false", "no", "off", "FALSE", "No", "oFf", " off\n"]


@pytest.fixture(params=sorted(SURFACES))
def named(request):
    """(surface, its operator-facing names) for the frontend and the worker."""
    return SURFACES[request.param], NAMES[request.param], request.param


def test_the_surfaces_name_the_options_as_our_launchers_do(named):
    surface, (flag, no_flag, env, pause_flag, pause_env), _ = named
    assert surface.freeze.flags() == (flag, no_flag)
    assert surface.freeze.env_var == env
    assert surface.pause_log_ms.flag == pause_flag
    assert surface.pause_log_ms.env_var == pause_env
    assert surface.freeze.default is True
    assert surface.pause_log_ms.default == 0.0


def test_one_declaration_our_launchers_read_the_same_options(named):
    surface, _, name = named
    assert set(surface.options) <= set(LAUNCHER_SURFACES[name].options)


def test_defaults_with_nothing_given(named):
    surface, _, _ = named
    assert split_gc_args([], surface, {}) == (DEFAULT, [])
    assert gc_settings_from_env(surface, {}) == DEFAULT


def test_every_other_word_is_left_in_order(named):
    surface, (flag, no_flag, _, pause_flag, _), _ = named
    argv = [
        "--http-port",
        "8000",
        flag,
        "--help",
        "--model-path",
        "/m",
        pause_flag,
        "25",
        "-h",
        "positional",
        f"{pause_flag}=5",
        "--some=value",
        no_flag,
    ]
    settings, rest = split_gc_args(argv, surface, {})
    assert settings == GcSettings(freeze_gc_heap=False, gc_pause_log_ms=5.0)  # last one wins
    assert rest == [
        "--http-port",
        "8000",
        "--help",
        "--model-path",
        "/m",
        "-h",
        "positional",
        "--some=value",
    ]


def test_never_an_abbreviation_nor_a_longer_flag_nor_after_a_double_dash(named):
    surface, (flag, no_flag, _, pause_flag, _), _ = named
    argv = [
        flag[:-3],  # an abbreviation of ours
        pause_flag[:-3],
        "7",
        flag + "-x",  # another program's flag that starts like ours
        pause_flag + "-max=3",
        "--no-" + flag[2:-1],
        "--",
        flag,
        pause_flag,
        "9",
    ]
    settings, rest = split_gc_args(argv, surface, {})
    assert settings == DEFAULT
    assert rest == argv


@pytest.mark.parametrize("word", FALSE_WORDS)
def test_env_false_words_turn_the_freeze_off(named, word):
    surface, (_, _, env, _, _), _ = named
    assert split_gc_args([], surface, {env: word})[0].freeze_gc_heap is False
    assert gc_settings_from_env(surface, {env: word}).freeze_gc_heap is False


@pytest.mark.parametrize("word", TRUE_WORDS)
def test_env_true_words_keep_it_on(named, word):
    surface, (_, _, env, _, _), _ = named
    assert gc_settings_from_env(surface, {env: word}).freeze_gc_heap is True


def test_the_command_line_beats_the_env_both_ways(named):
    surface, (flag, no_flag, env, pause_flag, pause_env), _ = named
    settings, _ = split_gc_args([no_flag, pause_flag, "3"], surface, {env: "1", pause_env: "8"})
    assert settings == GcSettings(freeze_gc_heap=False, gc_pause_log_ms=3.0)
    settings, _ = split_gc_args([flag], surface, {env: "0", pause_env: "8"})
    assert settings == GcSettings(freeze_gc_heap=True, gc_pause_log_ms=8.0)


def test_environ_none_reads_the_process_env(named, monkeypatch):
    surface, (_, _, env, _, pause_env), _ = named
    monkeypatch.setenv(env, "off")
    monkeypatch.setenv(pause_env, "12.5")
    expected = GcSettings(freeze_gc_heap=False, gc_pause_log_ms=12.5)
    assert gc_settings_from_env(surface) == expected
    assert split_gc_args(["--x"], surface) == (expected, ["--x"])


@pytest.mark.parametrize(
    "value", ["-1", "nan", "inf", "-inf", "abc", "", "1e400", "５", "1_0", "3\udcff"]
)
def test_a_bad_pause_value_exits_2_naming_flag_env_and_value(named, value, capsys):
    surface, (_, _, _, pause_flag, pause_env), _ = named
    for argv in ([pause_flag, value], [f"{pause_flag}={value}"]):
        with pytest.raises(SystemExit) as raised:
            split_gc_args(["--other", *argv], surface, {}, prog=PROG)
        assert raised.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"{PROG}: error: invalid value ")
        assert f"{pause_flag} / {pause_env}" in err
    with pytest.raises(SystemExit) as raised:
        gc_settings_from_env(surface, {pause_env: value}, prog=PROG)
    assert raised.value.code == 2
    assert f"{pause_flag} / {pause_env}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["maybe", "2", "", "enabled", "of\udcff"])
def test_a_bad_freeze_env_exits_2_naming_flag_and_env(named, value, capsys):
    surface, (flag, _, env, _, _), _ = named
    for call in (
        lambda: split_gc_args(["--other"], surface, {env: value}, prog=PROG),
        lambda: gc_settings_from_env(surface, {env: value}, prog=PROG),
    ):
        with pytest.raises(SystemExit) as raised:
            call()
        assert raised.value.code == 2
        err = capsys.readouterr().err
        assert f"{flag} / {env}" in err
        reason = "not valid UTF-8" if "\udcff" in value else "1/0, true/false, yes/no, on/off"
        assert reason in err


@pytest.mark.parametrize("which", [0, 1])
def test_a_value_given_to_the_boolean_exits_2(named, which, capsys):
    surface, names, _ = named
    with pytest.raises(SystemExit) as raised:
        split_gc_args([f"{names[which]}=0"], surface, {}, prog=PROG)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert f"{names[0]} / {names[2]}" in err and "takes no value" in err


@pytest.mark.parametrize("tail", [[], ["--", "x"]])
def test_a_missing_pause_value_exits_2(named, tail, capsys):
    surface, (_, _, _, pause_flag, pause_env), _ = named
    with pytest.raises(SystemExit) as raised:
        split_gc_args(["--a", pause_flag, *tail], surface, {}, prog=PROG)
    assert raised.value.code == 2
    assert f"{pause_flag} / {pause_env}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, env",
    [
        ([], {}),
        (["NO"], {}),
        (["PAUSE", "4.5"], {"FREEZE_ENV": "no"}),
        (["YES", "PAUSE=0.25"], {"FREEZE_ENV": "off", "PAUSE_ENV": "9"}),
        (["NO", "YES"], {"PAUSE_ENV": " 3 "}),
        # Given on the command line, an option does not read its env var, not even a bad one.
        (["NO", "PAUSE", "2"], {"FREEZE_ENV": "maybe", "PAUSE_ENV": "abc"}),
    ],
)
def test_same_settings_as_our_launchers_parser(named, argv, env):
    surface, (flag, no_flag, freeze_env, pause_flag, pause_env), name = named
    words = {"YES": flag, "NO": no_flag, "PAUSE": pause_flag, "PAUSE=0.25": pause_flag + "=0.25"}
    keys = {"FREEZE_ENV": freeze_env, "PAUSE_ENV": pause_env}
    argv = [words.get(word, word) for word in argv]
    env = {keys[key]: value for key, value in env.items()}
    ours = parse_surface(LAUNCHER_SURFACES[name], argv, env, allow_unknown=True)[0]
    assert split_gc_args(argv, surface, env)[0] == GcSettings(
        ours.freeze_gc_heap, ours.gc_pause_log_ms
    )


def test_help_lists_flags_env_vars_and_defaults(named):
    surface, (flag, no_flag, env, pause_flag, pause_env), _ = named
    text = gc_help(surface)
    for name in (flag, no_flag, env, pause_flag, pause_env):
        assert name in text
    assert "(default: on)" in text and "(default: 0)" in text
    assert "usage:" not in text
