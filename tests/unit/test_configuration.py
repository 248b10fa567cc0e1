"""Option declarations and both arg surfaces (frontend, vLLM worker).

Bad-value cases are generated from the declarations themselves (every surface listed in
``dynamo.common.configuration.docs``), so an option declared later is covered without editing
this file; a new value kind fails :func:`bad_values` until someone says what is bad for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dynamo.common.configuration import (
    Choice,
    FiniteFloat,
    Host,
    IntRange,
    Option,
    Text,
    build_parser,
    docs,
    parse_bool_word,
)
from dynamo.frontend import frontend_args
from dynamo.vllm import backend_args, self_benchmark_args
from dynamo_gc import mocker as upstream_mocker
from dynamo_gc import vllm as upstream_vllm
from dynamo_gc.configuration.gc_options import FREEZE_GC_HEAP, GC_PAUSE_LOG_MS
from dynamo_gc.configuration.typed import option_fields, typed_config
from dynamo_gc.upstream import frontend_settings
from tests.support.processes import run_python

REPO = Path(__file__).resolve().parents[2]


def parse_worker(argv=None, env=None) -> backend_args.WorkerConfig:
    """The worker's parse_args with its one required option (--model) given through its env
    var, so each test can leave it out."""
    env = dict(os.environ if env is None else env)
    env.setdefault(backend_args.MODEL.env_var, "/models/some-model")
    return backend_args.parse_args(argv, env)


# Each program and the parse_args that reads its command line and env.
PARSERS: dict[str, Callable[..., Any]] = {
    "python -m dynamo.frontend": frontend_args.parse_args,
    "python -m dynamo.vllm": parse_worker,
    # upstream ai-dynamo's frontend through the adapter: its own options only
    "python -m dynamo_gc.frontend": frontend_settings.parse_args,
    # upstream ai-dynamo's workers through the adapters: their GC options only
    "python -m dynamo_gc.vllm": upstream_vllm.parse_args,
    "python -m dynamo_gc.mocker": upstream_mocker.parse_args,
}
MAIN_MODULES = {
    "python -m dynamo.frontend": "dynamo.frontend",
    "python -m dynamo.vllm": "dynamo.vllm",
}


def options_by_program() -> dict[str, list[Option]]:
    grouped: dict[str, list[Option]] = {}
    for surface in docs.surfaces():
        grouped.setdefault(surface.program, []).extend(surface.options)
    return grouped


OPTIONS = options_by_program()


# The table: the two GC options, declared once, under two naming schemes.
@dataclasses.dataclass(frozen=True)
class GcSurface:
    program: str
    freeze_flag: str
    freeze_env: str
    pause_flag: str
    pause_env: str

    @property
    def parse(self) -> Callable[..., Any]:
        return PARSERS[self.program]

    @property
    def no_freeze_flag(self) -> str:
        return "--no-" + self.freeze_flag[2:]


GC_SURFACES = [
    GcSurface(
        "python -m dynamo.frontend",
        "--dyn-freeze-gc-heap",
        "DYN_FREEZE_GC_HEAP",
        "--dyn-gc-pause-log-ms",
        "DYN_GC_PAUSE_LOG_MS",
    ),
    GcSurface(
        "python -m dynamo.vllm",
        "--freeze-gc-heap",
        "DYN_VLLM_FREEZE_GC_HEAP",
        "--gc-pause-log-ms",
        "DYN_VLLM_GC_PAUSE_LOG_MS",
    ),
    *(
        GcSurface(
            program,
            "--freeze-gc-heap",
            "DYN_VLLM_FREEZE_GC_HEAP",
            "--gc-pause-log-ms",
            "DYN_VLLM_GC_PAUSE_LOG_MS",
        )
        for program in ("python -m dynamo_gc.vllm", "python -m dynamo_gc.mocker")
    ),
]
GC_IDS = ["frontend", "vllm", "upstream-vllm", "upstream-mocker"]


def expect_exit_2(capsys, parse, argv, env) -> str:
    """Run a parse that must stop with exit code 2; return what it printed to stderr."""
    with pytest.raises(SystemExit) as exc:
        parse(argv, env)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def assert_names_flag_env_and_value(err: str, flag: str, env_var: str, value: str) -> None:
    assert flag in err, err
    assert env_var in err, err
    assert repr(value) in err, err


# --- the declarations themselves ------------------------------------------------------------


def test_every_documented_program_has_a_parser_here():
    # A new program (surface) must be added to PARSERS so that its options are tested below.
    assert set(OPTIONS) == set(PARSERS)


@pytest.mark.parametrize("program", sorted(OPTIONS))
def test_flags_env_vars_and_destinations_are_unique_per_program(program):
    options = OPTIONS[program]
    flags = [flag for option in options for flag in option.flags()]
    env_vars = [option.env_var for option in options]
    dests = [option.dest for option in options]
    assert len(flags) == len(set(flags))
    assert len(env_vars) == len(set(env_vars))
    assert len(dests) == len(set(dests))


# Env vars upstream Dynamo reads without the DYN_ prefix: ours keep upstream's names.
UPSTREAM_ENV_VARS = {"ETCD_ENDPOINTS"}


@pytest.mark.parametrize("program", sorted(OPTIONS))
def test_every_option_has_a_long_flag_and_an_explicit_env_var(program):
    for option in OPTIONS[program]:
        assert all(flag.startswith("--") for flag in option.flags()), option
        assert option.env_var and (
            option.env_var.startswith("DYN_") or option.env_var in UPSTREAM_ENV_VARS
        ), option
        assert option.help.strip(), option


@pytest.mark.parametrize("surface", docs.surfaces(), ids=lambda s: s.name)
def test_every_parser_argument_reads_exactly_its_declared_env_var(surface):
    parser = build_parser(surface)
    declared = {o.dest: o.env_var for o in surface.options}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert getattr(action, "env_var", None) == declared[action.dest], action


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
def test_the_gc_options_are_one_declaration_under_two_names(gc_surface):
    by_flag = {o.flag: o for o in OPTIONS[gc_surface.program]}
    freeze = by_flag[gc_surface.freeze_flag]
    pause = by_flag[gc_surface.pause_flag]
    assert freeze.env_var == gc_surface.freeze_env
    assert pause.env_var == gc_surface.pause_env
    assert freeze.flags() == (gc_surface.freeze_flag, gc_surface.no_freeze_flag)
    assert freeze == dataclasses.replace(FREEZE_GC_HEAP, name=freeze.name, env_var=freeze.env_var)
    assert pause == dataclasses.replace(GC_PAUSE_LOG_MS, name=pause.name, env_var=pause.env_var)
    assert (freeze.dest, pause.dest) == ("freeze_gc_heap", "gc_pause_log_ms")


def test_configargparse_is_imported_only_by_the_configuration_package():
    # Importing it patches argparse process-wide: one package owns that.
    sources = REPO / "components" / "src"
    allowed = sources / "dynamo_gc" / "configuration"
    offenders = [
        str(path.relative_to(REPO))
        for path in sources.rglob("*.py")
        if allowed not in path.parents and "configargparse" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


# --- value kinds --------------------------------------------------------------------------------

TRUE_SPELLINGS = ["1", "true", "yes", "on", "TRUE", "True", "tRuE", "YES", "Yes", "ON", "oN"]
FALSE_SPELLINGS = ["0", "false", "no", "off", "FALSE", "False", "fAlSe", "NO", "No", "OFF", "Off"]


@pytest.mark.parametrize("word", TRUE_SPELLINGS)
def test_parse_bool_word_true(word):
    assert parse_bool_word(word) is True


@pytest.mark.parametrize("word", FALSE_SPELLINGS)
def test_parse_bool_word_false(word):
    assert parse_bool_word(word) is False


@pytest.mark.parametrize("word", ["maybe", "", "2", "-1", "tru", "y", "n", "enable", "none"])
def test_parse_bool_word_rejects_anything_else(word):
    with pytest.raises(ValueError):
        parse_bool_word(word)


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e309", "-1e309"])
def test_finite_float_rejects_non_finite(text):
    with pytest.raises(ValueError, match="finite"):
        FiniteFloat(0.0).parse(text)


@pytest.mark.parametrize("text", ["", " ", "abc", "1,5", "0x10", "1.2.3"])
def test_finite_float_rejects_non_numbers(text):
    with pytest.raises(ValueError, match="not a number"):
        FiniteFloat(0.0).parse(text)


def test_finite_float_bounds():
    assert FiniteFloat(0.0).parse("0") == 0.0
    assert FiniteFloat(0.0).parse("1e308") == 1e308
    assert FiniteFloat(1.0).parse("1") == 1.0
    with pytest.raises(ValueError, match=">= 1"):
        FiniteFloat(1.0).parse("0.999")
    with pytest.raises(ValueError, match=">= 0"):
        FiniteFloat(0.0).parse("-0.001")
    bounded = FiniteFloat(1.0, maximum=3600.0)
    assert bounded.parse("3600") == 3600.0
    with pytest.raises(ValueError, match="between 1 and 3600"):
        bounded.parse("3600.5")


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
def test_the_pause_log_threshold_stops_at_an_hour_and_says_why(gc_surface, capsys):
    # 9223372036000 ms (threading's longest wait) was the limit once: no operator could tell
    # what it was, and a GC pause log threshold is not a wait
    assert gc_surface.parse([gc_surface.pause_flag, "3600000"], {}).gc_pause_log_ms == 3_600_000
    err = expect_exit_2(capsys, gc_surface.parse, [], {gc_surface.pause_env: "3600001"})
    assert_names_flag_env_and_value(err, gc_surface.pause_flag, gc_surface.pause_env, "3600001")
    assert "must be between 0 and 3600000 (one hour: no GC pause comes near it" in err


def test_a_wait_past_threadings_limit_says_what_the_limit_is(capsys):
    err = expect_exit_2(capsys, PARSERS["python -m dynamo.vllm"], ["--drain-timeout", "1e10"], {})
    assert "between 0 and 9223372036 (about 292 years: the longest wait Python's threading" in err


def test_a_discovery_ttl_no_lease_store_can_hold_exits_2(capsys):
    """etcd refuses a lease over 9e9 s and aetcd cannot encode one over 2**63: such a TTL left
    the worker retrying its registration for ever (not ready, a WARNING naming etcd, not the
    option). Refused at parse time instead, naming flag and env var."""
    err = expect_exit_2(capsys, PARSERS["python -m dynamo.vllm"], [], {"DYN_DISCOVERY_TTL": "1e10"})
    assert_names_flag_env_and_value(err, "--discovery-ttl", "DYN_DISCOVERY_TTL", "1e10")


def test_int_range_bounds():
    kind = IntRange(0, 10)
    assert kind.parse("0") == 0 and kind.parse("10") == 10
    for bad in ["-1", "11", "1.0", "1e1", "", "x"]:
        with pytest.raises(ValueError):
            kind.parse(bad)
    assert IntRange(5).parse("123456789") == 123456789


def test_choice_is_exact():
    kind = Choice(("off", "freeze"))
    assert kind.parse("freeze") == "freeze"
    for bad in ["", "bogus", "Freeze", "fr"]:
        with pytest.raises(ValueError, match="off, freeze"):
            kind.parse(bad)


# --- both GC surfaces: defaults, env spellings, precedence ------------------------------------


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
def test_gc_defaults(gc_surface):
    config = gc_surface.parse([], {})
    assert config.freeze_gc_heap is True
    assert config.gc_pause_log_ms == 0.0
    assert isinstance(config.gc_pause_log_ms, float)


@pytest.mark.parametrize("program", sorted(OPTIONS))
def test_every_option_has_its_declared_default(program):
    config = PARSERS[program]([], {})
    for option in OPTIONS[program]:
        assert hasattr(config, option.dest), option
        if option.default is not None:  # None means "resolved later" (discovery dir)
            expected = option.default
            if isinstance(expected, str) and option.kind is not None:
                expected = option.kind.parse(expected)  # argparse parses a text default too
            assert getattr(config, option.dest) == expected, option


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
@pytest.mark.parametrize(
    "word,expected",
    [(w, True) for w in TRUE_SPELLINGS] + [(w, False) for w in FALSE_SPELLINGS],
)
def test_freeze_env_spellings(gc_surface, word, expected):
    config = gc_surface.parse([], {gc_surface.freeze_env: word})
    assert config.freeze_gc_heap is expected


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
def test_freeze_flags_without_env(gc_surface):
    assert gc_surface.parse([gc_surface.freeze_flag], {}).freeze_gc_heap is True
    assert gc_surface.parse([gc_surface.no_freeze_flag], {}).freeze_gc_heap is False


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
@pytest.mark.parametrize("word", ["1", "true", "YES", "on"])
def test_no_flag_beats_a_true_env_var(gc_surface, word):
    config = gc_surface.parse([gc_surface.no_freeze_flag], {gc_surface.freeze_env: word})
    assert config.freeze_gc_heap is False


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
@pytest.mark.parametrize("word", ["0", "false", "NO", "off"])
def test_flag_beats_a_false_env_var(gc_surface, word):
    config = gc_surface.parse([gc_surface.freeze_flag], {gc_surface.freeze_env: word})
    assert config.freeze_gc_heap is True


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
def test_pause_threshold_from_env_and_cli(gc_surface):
    assert gc_surface.parse([], {gc_surface.pause_env: "2.5"}).gc_pause_log_ms == 2.5
    assert gc_surface.parse([gc_surface.pause_flag, "7"], {}).gc_pause_log_ms == 7.0
    config = gc_surface.parse([f"{gc_surface.pause_flag}=7"], {gc_surface.pause_env: "2.5"})
    assert config.gc_pause_log_ms == 7.0
    config = gc_surface.parse([gc_surface.pause_flag, "0"], {gc_surface.pause_env: "2.5"})
    assert config.gc_pause_log_ms == 0.0


def test_the_surfaces_read_only_their_own_env_vars():
    frontend = frontend_args.parse_args([], {"DYN_VLLM_FREEZE_GC_HEAP": "0"})
    worker = parse_worker([], {"DYN_FREEZE_GC_HEAP": "0"})
    assert frontend.freeze_gc_heap is True
    assert worker.freeze_gc_heap is True


def test_parse_args_reads_os_environ_when_no_env_is_given(monkeypatch):
    monkeypatch.setenv("DYN_VLLM_GC_PAUSE_LOG_MS", "12")
    monkeypatch.setenv("DYN_FREEZE_GC_HEAP", "off")
    assert parse_worker([]).gc_pause_log_ms == 12.0
    assert frontend_args.parse_args([]).freeze_gc_heap is False


# --- bad boolean env values -------------------------------------------------------------------


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
@pytest.mark.parametrize("word", ["maybe", "", " ", "2", "truee", "disabled"])
def test_bad_freeze_env_value_exits_2_naming_flag_env_and_value(gc_surface, word, capsys):
    err = expect_exit_2(capsys, gc_surface.parse, [], {gc_surface.freeze_env: word})
    assert_names_flag_env_and_value(err, gc_surface.freeze_flag, gc_surface.freeze_env, word)


@pytest.mark.parametrize("program", sorted(OPTIONS))
def test_every_boolean_rejects_a_bad_env_value(program, capsys):
    booleans = [o for o in OPTIONS[program] if o.is_bool]
    assert booleans, "each program has at least the freeze option"
    for option in booleans:
        err = expect_exit_2(capsys, PARSERS[program], [], {option.env_var: "maybe"})
        assert_names_flag_env_and_value(err, option.flag, option.env_var, "maybe")


# --- bad values for every non-boolean option, generated from the declarations ------------------


# Tried on every option whose kind this file does not know: the ones its own parse rejects must
# make the surface exit 2 too, so a new kind is tested without editing this file.
GENERIC_JUNK = ["", "  ", "abc", "nan", "-1", "1.5", "bogus value", "a..b", "\x00"]
# "/" last: an existing directory, for --dyn-model-dirs (every other kind takes an earlier word)
GENERIC_GOOD = ["some-value", "package.module.Class", "1", "2", "on", "localhost", "127.0.0.1", "/"]


def _rejects(option: Option, text: str) -> bool:
    assert option.kind is not None, option.flag
    try:
        option.kind.parse(text)
    except ValueError:
        return True
    return False


# Unicode digits that int()/float() read as numbers (fullwidth, Arabic-Indic, Devanagari, ...)
# and characters that look like digits: none of them is a number to our parsers.
UNICODE_DIGITS = [
    "\uff15",
    "\uff11\uff12",
    "\u0663",
    "\u06f4",
    "\u096a\u0968",
    "\u00b2",
    "\u2460",
    "\u516b",
]
CONTROL_JUNK = ["\t", "\n", "a\nb", "a\x00b", "\x1b[31mred", "a\x7fb", "a\u0085b"]


# Bytes that are not UTF-8, as Python hands them over from argv and the environment (lone
# surrogates): every kind refuses them, naming the option, instead of a traceback later.
NOT_UTF8 = ["\udcff", "a\udcffb", "\udcc3\udca9"]


def bad_values(option: Option) -> list[str]:
    """About twenty values each kind must refuse (exit 2 naming flag, env var and value)."""
    return _bad_values(option) + NOT_UTF8


def _bad_values(option: Option) -> list[str]:
    kind = option.kind
    if isinstance(kind, FiniteFloat):
        below = [f"{kind.minimum - 1:g}"] + ([f"{kind.minimum / 2:g}"] if kind.minimum > 0 else [])
        if kind.maximum is not None:
            below += [f"{kind.maximum + 0.5:.17g}", f"{kind.maximum * 1e6:g}", "1e300"]
        return [
            "nan", "NaN", "inf", "-inf", "+Infinity", "1e309", "-1e309", "", "  ", "abc",
            "1,5", "1_0", "0x10", "1.5.2", "1e", "e5", "..5", "\uff11.\uff15",
            *UNICODE_DIGITS[:4], "1\x00", *below,
        ]  # fmt: skip
    if isinstance(kind, IntRange):
        values = [
            "", "  ", "abc", "1.5", "1e3", "0x10", "0o7", "0b1", "1_000", "1 000", "--1",
            "+-1", "1\x00", "9" * 400, *UNICODE_DIGITS, str(kind.minimum - 1),
        ]  # fmt: skip
        if kind.maximum is not None:
            values.append(str(kind.maximum + 1))
        return values
    if isinstance(kind, Choice):
        word = kind.words[-1]
        fullwidth = "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in word)
        values = [
            "", "  ", "bogus", word.upper(), word.capitalize(), word + "x", "x" + word,
            word[:-1], fullwidth, word + "\x00", ",".join(kind.words), " ".join(kind.words),
            "*", "-", "1", "0", "none", "\uff11", f"'{word}'", f'"{word}"',
        ]  # fmt: skip
        # A one-word choice joined with itself is that word, and some choices take any case
        # (DYN_FPM_GC_POLICY, as upstream): only the values the kind refuses are bad ones.
        return [value for value in values if _rejects(option, value)]
    if isinstance(kind, Host):
        return [
            "", "  ", "a..b", ".", "..", "a" * 64, "a" * 64 + ".example.com",
            "a." * 127 + "com", "[::1]", "http://localhost", "localhost:80", "host/path",
            "no-such-host.invalid", "\u00fcn\u00efc\u00f6d\u00e9.invalid",
            "\uff11\uff12\uff17.\uff10.\uff10.\uff11", "1.2.3", "0x7f.1", "999.1.1.1",
            "a b", "local\x00host", "local\nhost", "::1%", "-",
        ]  # fmt: skip
    if isinstance(kind, Text):
        return ["", "  ", *CONTROL_JUNK]
    return [text for text in GENERIC_JUNK + CONTROL_JUNK if _rejects(option, text)]


def good_value(option: Option) -> tuple[str, object]:
    """A valid value other than the default, and what it parses to."""
    kind = option.kind
    assert kind is not None, option.flag
    if isinstance(kind, FiniteFloat):
        return f"{kind.minimum + 1.5:g}", kind.minimum + 1.5
    if isinstance(kind, IntRange):
        value = kind.minimum + 1 if option.default == kind.minimum else kind.minimum
        return str(value), value
    if isinstance(kind, Choice):
        # A one-word choice (--router-mode round-robin) has only its default to give.
        word = next((w for w in kind.words if w != option.default), kind.words[0])
        return word, word
    for text in GENERIC_GOOD:
        if not _rejects(option, text) and kind.parse(text) != option.default:
            return text, kind.parse(text)
    raise AssertionError(f"{option.flag}: add a valid value of {kind!r} to GENERIC_GOOD")


VALUED = [
    (program, option)
    for program, options in sorted(OPTIONS.items())
    for option in options
    if not option.is_bool
]
BAD_CASES = [
    pytest.param(program, option, value, id=f"{program.split('.')[-1]}:{option.flag}={value!r}")
    for program, option in VALUED
    for value in bad_values(option)
]


@pytest.mark.parametrize("program,option", [pytest.param(p, o, id=o.flag) for p, o in VALUED])
def test_every_valued_option_has_bad_values_to_test(program, option):
    assert bad_values(option), f"{option.flag}: no rejected value found; extend GENERIC_JUNK"


@pytest.mark.parametrize("program,option,value", BAD_CASES)
def test_bad_env_value_exits_2_naming_flag_env_and_value(program, option, value, capsys):
    err = expect_exit_2(capsys, PARSERS[program], [], {option.env_var: value})
    assert_names_flag_env_and_value(err, option.flag, option.env_var, value)


@pytest.mark.parametrize("program,option,value", BAD_CASES)
def test_bad_cli_value_exits_2_naming_flag_env_and_value(program, option, value, capsys):
    err = expect_exit_2(capsys, PARSERS[program], [f"{option.flag}={value}"], {})
    assert_names_flag_env_and_value(err, option.flag, option.env_var, value)


@pytest.mark.parametrize("program,option,value", BAD_CASES)
def test_bad_cli_value_as_separate_word_exits_2_naming_flag_env_and_value(
    program, option, value, capsys
):
    # `--x -inf` as two words: argparse alone would take "-inf" for an unknown option and say
    # only "expected one argument".
    err = expect_exit_2(capsys, PARSERS[program], [option.flag, value], {})
    assert_names_flag_env_and_value(err, option.flag, option.env_var, value)


# What each option that acts only with another one needs, as env vars (see
# dynamo.common.configuration.prerequisites; the test below holds this table to its REQUIREMENTS).
_ETCD = {"DYN_DISCOVERY_BACKEND": "etcd"}
_MOCK = {"DYN_VLLM_ENGINE": "mock"}
_SYSTEM_PORT = {"DYN_SYSTEM_PORT": "0"}
_BENCH = {"DYN_VLLM_SELF_BENCHMARK_POINTS": "1"}
ENABLERS: dict[str, dict[str, str]] = {
    "etcd_endpoints": _ETCD,
    "namespace": _ETCD,
    "discovery_dir": {},  # the default backend (file)
    "mock_token_ms": _MOCK,
    "mock_max_model_len": _MOCK,
    "mock_init_ms": _MOCK,
    "mock_heap_objects": _MOCK,
    "mock_heap_growth": _MOCK,
    "mock_heap_evict_percent": {**_MOCK, "DYN_VLLM_MOCK_HEAP_GROWTH": "10"},
    # each launcher's maintenance mode (the other one's env var means nothing to it)
    "gc_pause_budget_ms": {"DYN_VLLM_GC_MAINTENANCE": "idle", "DYN_GC_MAINTENANCE": "idle"},
    "system_host": _SYSTEM_PORT,
    "debug_gc_endpoint": _SYSTEM_PORT,
    "self_benchmark_output": _BENCH,
    "fpm_gc_policy": _BENCH,
    "fpm_gc_freeze_interval_s": {**_BENCH, "DYN_FPM_GC_POLICY": "freeze"},
    # the default processor (hf)
    "dyn_template_processes": {},
    "dyn_template_timeout": {},
    "dyn_template_memory_mb": {},
}


def test_every_option_with_a_prerequisite_has_its_enabler_here():
    for requirements in (backend_args.REQUIREMENTS, frontend_args.REQUIREMENTS):
        for requirement in requirements:
            assert requirement.option.dest in ENABLERS, requirement.option.flag


@pytest.mark.parametrize("program,option", [pytest.param(p, o, id=o.flag) for p, o in VALUED])
def test_every_option_takes_a_good_value_and_cli_beats_env(program, option):
    parse = PARSERS[program]
    text, value = good_value(option)
    enabler = ENABLERS.get(option.dest, {}) if option.env_var not in _ETCD else {}
    assert getattr(parse([], {**enabler, option.env_var: text}), option.dest) == value
    assert getattr(parse([option.flag, text], enabler), option.dest) == value
    # the command line wins over a different, even invalid, env value
    other = bad_values(option)[-1]
    env = {**enabler, option.env_var: other}
    assert getattr(parse([f"{option.flag}={text}"], env), option.dest) == value


def test_a_dash_word_after_a_text_option_is_not_taken_for_its_value(capsys):
    err = expect_exit_2(capsys, parse_worker, ["--model", "-x"], {})
    assert "argument --model: expected one argument" in err
    # Said explicitly, it is a value.
    assert parse_worker(["--model=-weird-name"], {}).model == "-weird-name"


def test_a_vllm_flag_after_a_text_option_is_not_swallowed_as_its_value(capsys):
    argv = ["--engine", "vllm", "--model", "--max-model-len", "256"]
    err = expect_exit_2(capsys, parse_worker, argv, {})
    assert "argument --model: expected one argument" in err


@pytest.mark.parametrize("value", ["-5", "-inf", "-1e3", "-x"])
def test_a_dash_word_after_a_numeric_option_reaches_its_check(value, capsys):
    option = next(o for o in backend_args.OPTIONS if o.flag == "--mock-token-ms")
    err = expect_exit_2(capsys, parse_worker, [option.flag, value], {})
    assert_names_flag_env_and_value(err, option.flag, option.env_var, value)


@pytest.mark.parametrize(
    "parse, argv",
    [
        (frontend_args.parse_args, ["--dyn-gc-pause-log", "5"]),
        (parse_worker, ["--gc-pause-log", "5", "--engine", "mock"]),
        (parse_worker, ["--mock-token", "1", "--engine", "mock"]),
    ],
)
def test_abbreviated_flags_are_refused(parse, argv, capsys):
    err = expect_exit_2(capsys, parse, argv, {})
    assert f"unrecognized arguments: {argv[0]}" in err


def test_an_abbreviation_meant_for_vllm_goes_to_vllm():
    config = parse_worker(["--engine", "vllm", "--tensor-parallel", "2"], {})
    assert config.tensor_parallel_size == 1
    assert config.vllm_args == ("--tensor-parallel", "2")


def test_a_following_flag_is_not_taken_for_a_value(capsys):
    err = expect_exit_2(capsys, parse_worker, ["--model", "--engine", "mock"], {})
    assert "--model" in err


# --- self-benchmark options -------------------------------------------------------------------

INTERVAL = self_benchmark_args.FPM_GC_FREEZE_INTERVAL_S
POLICY = self_benchmark_args.FPM_GC_POLICY


@pytest.mark.parametrize("value", ["0.5", "inf", "nan", "-1", "abc"])
@pytest.mark.parametrize("source", ["env", "cli"])
def test_self_benchmark_freeze_interval_rejects(value, source, capsys):
    argv, env = (
        ([f"{INTERVAL.flag}={value}"], {}) if source == "cli" else ([], {INTERVAL.env_var: value})
    )
    err = expect_exit_2(capsys, parse_worker, argv, env)
    assert_names_flag_env_and_value(err, INTERVAL.flag, INTERVAL.env_var, value)


@pytest.mark.parametrize("source", ["env", "cli"])
def test_self_benchmark_policy_rejects_bogus(source, capsys):
    argv, env = ([POLICY.flag, "bogus"], {}) if source == "cli" else ([], {POLICY.env_var: "bogus"})
    err = expect_exit_2(capsys, parse_worker, argv, env)
    assert_names_flag_env_and_value(err, POLICY.flag, POLICY.env_var, "bogus")


def test_self_benchmark_defaults_and_values():
    config = parse_worker([], {})
    assert config.fpm_gc_policy == "off"
    assert config.fpm_gc_freeze_interval_s == 60.0
    config = parse_worker([], {POLICY.env_var: "freeze", INTERVAL.env_var: "1"})
    assert config.fpm_gc_policy == "freeze"
    assert config.fpm_gc_freeze_interval_s == 1.0


def test_the_frontend_does_not_accept_worker_options(capsys):
    err = expect_exit_2(capsys, frontend_args.parse_args, ["--fpm-gc-policy", "freeze"], {})
    assert "unrecognized arguments" in err


# --- help ---------------------------------------------------------------------------------------


def _normalised(text: str) -> str:
    return " ".join(text.split())


def parse_args_help(program: str, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        PARSERS[program](["--help"], {})
    assert exc.value.code == 0
    return capsys.readouterr().out


def launcher_help(program: str, capsys) -> str:
    """``python -m <module> --help`` once the launcher exists, else parse_args' own help."""
    module = MAIN_MODULES.get(program)  # the upstream adapters' --help needs ai-dynamo
    if module is None or importlib.util.find_spec(module + ".__main__") is None:
        return parse_args_help(program, capsys)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    done = run_python("-m", module, "--help", env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("gc_surface", GC_SURFACES, ids=GC_IDS)
def test_help_lists_both_gc_flags_with_env_vars_and_defaults(gc_surface, capsys):
    text = _normalised(launcher_help(gc_surface.program, capsys))
    assert f"{gc_surface.freeze_flag}, {gc_surface.no_freeze_flag}" in text
    assert f"(default: on) [env var: {gc_surface.freeze_env}]" in text
    assert f"{gc_surface.pause_flag} MS" in text
    assert f"(default: 0) [env var: {gc_surface.pause_env}]" in text
    assert "(default: True)" not in text  # argparse's own wording, not the operator's


@pytest.mark.parametrize("program", sorted(OPTIONS))
def test_help_of_parse_args_lists_every_option_with_env_var_and_default(program, capsys):
    text = _normalised(parse_args_help(program, capsys))
    for option in OPTIONS[program]:
        for flag in option.flags():
            assert flag in text, flag
        assert f"(default: {option.render_default()}) [env var: {option.env_var}]" in text, option


# --- negatable booleans given a value on the command line -----------------------------------

BOOLEANS = [
    (program, option) for program, options in sorted(OPTIONS.items()) for option in options
    if option.is_bool
]  # fmt: skip
BOOL_FLAG_VALUES = ["0", "1", "true", "false", "no", "on", "", "maybe", "\uff11"]


@pytest.mark.parametrize(
    "program,option,flag,value",
    [
        pytest.param(p, o, flag, v, id=f"{p.split('.')[-1]}:{flag}={v!r}")
        for p, o in BOOLEANS
        for flag in o.flags()
        for v in BOOL_FLAG_VALUES
    ],
)
def test_a_boolean_flag_given_a_value_exits_2_naming_flag_env_and_value(
    program, option, flag, value, capsys
):
    err = expect_exit_2(capsys, PARSERS[program], [f"{flag}={value}"], {})
    assert_names_flag_env_and_value(err, option.flag, option.env_var, value)
    assert "takes no value" in err


def test_a_value_after_double_dash_is_not_checked_as_a_boolean_flag():
    # After `--` every word is positional: with the vLLM engine it goes to vLLM untouched.
    config = backend_args.parse_args(
        ["--engine", "vllm", "--model", "/m", "--", "--freeze-gc-heap=0"], {}
    )
    assert "--freeze-gc-heap=0" in config.vllm_args


# --- the value kinds themselves ---------------------------------------------------------------


@pytest.mark.parametrize("text", UNICODE_DIGITS + ["1_000", "0x10", " \u00a05"])
def test_numbers_are_ascii_only(text):
    for kind in (IntRange(0), FiniteFloat(0.0)):
        with pytest.raises(ValueError, match="ASCII"):
            kind.parse(text)


@pytest.mark.parametrize("text,expected", [(" 7\n", 7), ("+5", 5), ("0", 0), ("65535", 65535)])
def test_ascii_whole_numbers_with_blanks_around_are_read(text, expected):
    assert IntRange(0, 65535).parse(text) == expected


@pytest.mark.parametrize("text", ["localhost", "127.0.0.1", "::1", "0.0.0.0", "::", " localhost\n"])
def test_hosts_that_resolve_or_are_addresses_are_accepted(text):
    assert Host().parse(text) == text.strip()


def test_a_host_the_resolver_does_not_answer_for_is_refused_within_the_bound(mocker):
    import threading

    from dynamo_gc.configuration import values

    release = threading.Event()
    mocker.patch.object(values, "_resolve", lambda host: release.wait(10))
    mocker.patch.object(values, "RESOLVE_TIMEOUT_S", 0.2)
    try:
        with pytest.raises(ValueError, match="did not answer within 0.2 s"):
            Host().parse("slow.example")
    finally:
        release.set()


@pytest.mark.parametrize("program", sorted(MAIN_MODULES))
def test_a_bad_host_stops_the_program_with_exit_2_and_no_traceback(program):
    """Through the real program: the resolver's errors (IDNA, unknown name) never escape."""
    options = [o for o in OPTIONS[program] if isinstance(o.kind, Host)]
    assert options, f"{program} has host options"
    for option in options:
        for value in ("a" * 64 + ".example", "no-such-host.invalid"):
            result = subprocess.run(
                [sys.executable, "-m", MAIN_MODULES[program], f"{option.flag}={value}"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "PYTHONPATH": str(REPO / "components" / "src")},
            )
            assert result.returncode == 2, result.stderr
            assert "Traceback" not in result.stderr, result.stderr
            assert_names_flag_env_and_value(result.stderr, option.flag, option.env_var, value)


def test_the_worker_needs_a_model_naming_flag_and_env_var(capsys):
    err = expect_exit_2(capsys, backend_args.parse_args, [], {})
    assert "--model / DYN_VLLM_MODEL is required" in err
    assert backend_args.parse_args([], {"DYN_VLLM_MODEL": "/m"}).model == "/m"


def test_the_engine_is_vllm_unless_the_mock_is_chosen():
    assert parse_worker([], {}).engine == "vllm"
    assert parse_worker(["--engine", "mock"], {}).engine == "mock"
    assert parse_worker([], {"DYN_VLLM_ENGINE": "mock"}).engine == "mock"


def test_the_served_model_name_defaults_to_unset():
    assert parse_worker([], {}).served_model_name is None
    assert parse_worker(["--served-model-name", "tiny"], {}).served_model_name == "tiny"


# --- the typed configurations ----------------------------------------------------------------


def test_each_configuration_has_one_field_per_option_and_nothing_else():
    """An option parsed but not carried into the configuration would be silently ignored; a
    field no option fills would be a value nobody can set."""
    frontend_dests = {option.dest for option in frontend_args.SURFACE.options}
    worker_dests = {option.dest for option in backend_args.ALL_OPTIONS}
    assert option_fields(frontend_args.FrontendConfig) == frontend_dests
    assert option_fields(backend_args.WorkerConfig) == worker_dests | {"vllm_args"}


def test_a_parse_and_a_configuration_that_disagree_are_refused():
    parsed = argparse.Namespace(**dataclasses.asdict(frontend_args.parse_args([], {})))
    extra = argparse.Namespace(**{**vars(parsed), "not_an_option": 1})
    with pytest.raises(TypeError, match="not_an_option"):
        typed_config(frontend_args.FrontendConfig, extra)
    missing = argparse.Namespace(**{k: v for k, v in vars(parsed).items() if k != "http_port"})
    with pytest.raises(TypeError, match="http_port"):
        typed_config(frontend_args.FrontendConfig, missing)


@pytest.mark.parametrize("parse", [frontend_args.parse_args, parse_worker])
def test_a_parsed_configuration_is_a_value_nobody_can_change(parse):
    config = parse([], {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.freeze_gc_heap = False  # type: ignore[misc]
