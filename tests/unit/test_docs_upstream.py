"""docs/upstream.md stays in step with the option declarations and with what the launchers do
with upstream Dynamo's names (``dynamo.common.configuration.upstream``)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynamo.common import logging_setup
from dynamo.common.configuration import upstream
from dynamo.common.configuration.docs import all_options
from dynamo.frontend import frontend_args
from dynamo.vllm import backend_args

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "upstream.md"

# Which launchers each section of the page is about.
SECTION_PROGRAMS = {
    "The GC policy": (upstream.WORKER,),
    "The self-benchmark": (upstream.WORKER,),
    "The worker": (upstream.WORKER,),
    "The frontend": (upstream.FRONTEND,),
    "Both launchers": upstream.BOTH,
    "Logging": upstream.BOTH,
}
STATUSES = ("same", "differs", "not supported")
NAME = re.compile(r"`(--[a-z][a-z0-9-]*|[A-Z][A-Z0-9_]*[A-Z0-9])`")
# Named in the "here" column without being an option declaration.
NOT_OPTIONS = {logging_setup.DYN_LOG}

PARSERS = {upstream.FRONTEND: frontend_args.parse_args, upstream.WORKER: backend_args.parse_args}
DECLARED = {
    upstream.FRONTEND: upstream.declared_names(frontend_args.SURFACE.options),
    upstream.WORKER: upstream.declared_names(backend_args.ALL_OPTIONS),
}


@dataclass
class Row:
    section: str
    programs: tuple[str, ...]
    upstream: list[str]
    here: list[str]
    status: str
    notes: str
    line: str

    @property
    def pending(self) -> bool:
        return "pending H" in self.status


def rows() -> list[Row]:
    found: list[Row] = []
    section = ""
    programs: tuple[str, ...] = ()
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = line[3:]
            programs = next(p for key, p in SECTION_PROGRAMS.items() if section.startswith(key))
            continue
        if not line.startswith("| ") or line.startswith("| upstream |"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"a row needs 4 cells: {line}"
        found.append(
            Row(section, programs, NAME.findall(cells[0]), NAME.findall(cells[1]), cells[2],
                cells[3], line)
        )  # fmt: skip
    return found


ROWS = rows()


def rows_naming(name: str, program: str) -> list[Row]:
    return [row for row in ROWS if name in row.upstream and program in row.programs]


def test_the_page_has_a_row_per_section_and_every_status_is_one_of_three():
    assert {row.section.split(":")[0] for row in ROWS} >= {"The worker", "The frontend"}
    for row in ROWS:
        assert row.status.startswith(STATUSES), row.line


def test_every_declared_option_that_upstream_also_has_has_a_row():
    on_page = {name for row in ROWS for name in row.upstream}
    missing = set()
    for option in all_options():
        for name in (*option.flags(), option.env_var):
            if name in upstream.KNOWN and name not in on_page:
                missing.add(name)
    assert not missing, f"declared here and upstream, but not on docs/upstream.md: {missing}"


def test_every_flag_or_env_var_of_ours_named_on_the_page_exists():
    declared = {name for names in DECLARED.values() for name in names} | NOT_OPTIONS
    for row in ROWS:
        if row.pending:
            continue  # another change adds it; the lead drops the marker at merge
        unknown = set(row.here) - declared
        assert not unknown, f"{row.line}: not declared here: {unknown}"


def test_every_upstream_name_we_list_is_declared_refused_or_ignored():
    # A name upstream's launchers take (upstream.SHARED) that no option here declares would
    # otherwise be a flag argparse calls "unrecognized" without saying what to use, or an env
    # var dropped silently: a custom chat template or a tool-call parser that never applies.
    declared = {name for option in all_options() for name in (*option.flags(), option.env_var)}
    handled = {entry.name for entry in upstream.ALL}
    assert not sorted(upstream.SHARED - declared - handled)


def test_a_row_marked_pending_names_an_option_that_does_not_exist_yet():
    # The marker (and its "Today: ..." text) is for an option another change adds; once the
    # option is declared, the row must say what the launchers do now.
    declared = {name for names in DECLARED.values() for name in names}
    for row in ROWS:
        if row.pending:
            assert not set(row.here) & declared, f"declared now, drop the marker: {row.line}"


def test_the_page_names_only_env_vars_that_are_declared_upstream_or_pending():
    declared = {option.env_var for option in all_options()} | NOT_OPTIONS
    text = PAGE.read_text(encoding="utf-8")
    pending = {name for row in ROWS if row.pending for name in row.upstream + row.here}
    for name in set(re.findall(r"\bDYN_[A-Z0-9_]*[A-Z0-9]\b", text)):
        assert name in declared or name in upstream.KNOWN or name in pending, name


def _applicable(entries):
    for entry in entries:
        for program in entry.programs:
            if entry.name not in DECLARED[program]:
                yield pytest.param(entry, program, id=f"{program.split('.')[-1]}:{entry.name}")


def assert_rows_say(entry, program, status: str, today: str) -> None:
    """Every row naming the entry has ``status``, or is pending and says what happens today."""
    found = rows_naming(entry.name, program)
    assert found, f"{entry.name} ({program}) has no row"
    for row in found:
        assert row.status == status or (
            row.pending and "Today:" in row.notes and today in row.notes
        ), row.line


@pytest.mark.parametrize("entry,program", list(_applicable(upstream.REJECTED)))
def test_every_refused_name_has_a_row_saying_exit_2(entry, program):
    assert_rows_say(entry, program, "not supported (exit 2)", "exit")


@pytest.mark.parametrize("entry,program", list(_applicable(upstream.IGNORED_ENV)))
def test_every_ignored_env_var_has_a_row_saying_ignored(entry, program):
    assert_rows_say(entry, program, "not supported (ignored, WARNING)", "ignored")


def test_every_row_saying_not_supported_is_one_the_launchers_act_on():
    refused = {(e.name, p) for e in upstream.REJECTED for p in e.programs}
    ignored = {(e.name, p) for e in upstream.IGNORED_ENV for p in e.programs}
    for row in ROWS:
        if not row.status.startswith("not supported"):
            continue
        table = refused if "exit 2" in row.status else ignored
        for name in row.upstream:
            for program in row.programs:
                if name in DECLARED[program]:
                    continue  # a section for both launchers; this one declares it
                assert (name, program) in table, f"{row.line}: {name} on {program}"


# --- and the launchers do what the page says -------------------------------------------------


@pytest.mark.parametrize("entry,program", list(_applicable(upstream.REJECTED)))
def test_a_refused_name_exits_2_naming_it_and_what_to_use(entry, program, capsys):
    if entry.is_flag:
        argv, env = [entry.name, "x"], {}
        if program == upstream.WORKER:
            argv = ["--engine", "vllm", *argv]  # not even vLLM's parser gets to see it
    else:
        argv, env = [], {entry.name: "x"}
    with pytest.raises(SystemExit) as exc:
        PARSERS[program](argv, env)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{entry.name}" in err and "is upstream Dynamo's and not supported here" in err, err
    assert entry.instead in err


def test_an_upstream_value_that_means_what_we_do_is_accepted():
    env = {"DYN_VLLM_DISAGGREGATION_MODE": " AGG ", "DYN_VLLM_MODEL": "/m"}
    PARSERS[upstream.WORKER]([], env)


def test_a_refused_flag_after_double_dash_is_not_ours_to_judge():
    config = backend_args.parse_args(
        ["--engine", "vllm", "--model", "/m", "--", "--benchmark-mode", "agg"], {}
    )
    assert "--benchmark-mode" in config.vllm_args


def test_the_upstream_benchmark_flag_names_ours(capsys):
    with pytest.raises(SystemExit):
        backend_args.parse_args(["--benchmark-mode=agg"], {})
    assert "--self-benchmark-points N / DYN_VLLM_SELF_BENCHMARK_POINTS" in capsys.readouterr().err


@pytest.mark.parametrize("entry,program", list(_applicable(upstream.IGNORED_ENV)))
def test_an_ignored_env_var_is_named_in_one_warning(entry, program, caplog):
    caplog.set_level(logging.WARNING, logger="dynamo.common.configuration.upstream")
    names = upstream.warn_ignored_env(program, DECLARED[program], {entry.name: "x"})
    assert names == [entry.name]
    (record,) = caplog.records
    assert entry.name in record.getMessage() and entry.instead in record.getMessage()


def test_nothing_is_said_when_no_upstream_env_var_is_set(caplog):
    caplog.set_level(logging.WARNING, logger="dynamo.common.configuration.upstream")
    assert upstream.warn_ignored_env(upstream.WORKER, DECLARED[upstream.WORKER], {}) == []
    assert caplog.records == []


def test_a_declared_name_is_never_refused_nor_reported():
    # When a change declares an upstream name, it stops being refused or reported by itself.
    argv, env = ["--router-mode", "kv"], {"NATS_SERVER": "nats://n:4222"}
    assert upstream.rejected_problem(upstream.WORKER, argv, {}, set()) is not None
    assert upstream.ignored_env(upstream.WORKER, env, set()) != []
    declared = {"--router-mode", "NATS_SERVER"}
    assert upstream.rejected_problem(upstream.WORKER, argv, {}, declared) is None
    assert upstream.ignored_env(upstream.WORKER, env, declared) == []


@pytest.mark.parametrize("entry", [*upstream.REJECTED, *upstream.IGNORED_ENV], ids=str)
def test_no_entry_is_dead_weight(entry):
    """An entry every launcher it names now declares never applies: its message (what to use
    instead) is stale, so it goes."""
    assert any(entry.name not in DECLARED[program] for program in entry.programs), entry.name
