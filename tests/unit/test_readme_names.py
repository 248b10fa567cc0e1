"""The README's first screen says which command takes which GC names; the table is checked
against the option declarations (each program's Surface), so a renamed or added option cannot
leave it wrong: every row names exactly its program's freeze, pause-log and maintenance options
(flags, the --no-* form, the maintenance modes, the env vars), and the row of upstream's own
frontend (the gc-freeze route extension) names env vars only."""

from __future__ import annotations

import importlib
import re

import pytest

from tests.support.doc_blocks import REPO

README = REPO / "README.md"
COLUMNS = ("freeze_gc_heap", "gc_pause_log_ms", "gc_maintenance")
# each row's program, as the table names it -> the module declaring its SURFACE
ROWS = {
    "`python -m dynamo.frontend`, this project's": "dynamo.frontend.frontend_args",
    "`python -m dynamo.vllm`, this project's": "dynamo.vllm.backend_args",
    "`python -m dynamo.frontend`, ai-dynamo's, with `DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze`": (
        "dynamo_gc.upstream.frontend_settings"
    ),
    "`python -m dynamo_gc.frontend` (ai-dynamo's frontend through the adapter)": (
        "dynamo_gc.upstream.frontend_settings"
    ),
    "`python -m dynamo_gc.vllm` (ai-dynamo's vLLM worker through the adapter)": "dynamo_gc.vllm",
    "`python -m dynamo_gc.mocker` (ai-dynamo's mock engine through the adapter)": (
        "dynamo_gc.mocker"
    ),
}
ENV_ONLY = (
    "`python -m dynamo.frontend`, ai-dynamo's, with `DYN_FRONTEND_ROUTE_EXTENSIONS=gc-freeze`"
)


def table() -> dict[str, list[str]]:
    text = README.read_text(encoding="utf-8")
    marker = text.index("<!-- names-table:")
    rows = {}
    for line in text[marker:].splitlines()[3:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_table_has_a_row_per_program_and_sits_on_the_first_screen():
    assert list(table()) == list(ROWS)
    # the first screen: before the README's first heading below the title
    text = README.read_text(encoding="utf-8")
    assert text.index("<!-- names-table:") < text.index("\n## ")


@pytest.mark.parametrize("program", ROWS)
def test_each_row_names_its_programs_declared_options(program):
    cells = table()[program]
    options = {
        option.dest: option for option in importlib.import_module(ROWS[program]).SURFACE.options
    }
    for column, cell in zip(COLUMNS, cells, strict=True):
        option = options.get(column)
        if option is None:
            assert cell.startswith("none"), (program, column)
            continue
        names = set(re.findall(r"`([^`]*)`", cell))
        names = {name.split(" ")[0] for name in names}  # "--gc-maintenance {off,idle}"
        assert option.env_var in names, (program, column)
        if program == ENV_ONLY:
            # upstream's parser refuses our flags: the row may name one only as refused
            assert cell.startswith("env var only"), (program, column)
            continue
        for flag in option.flags():
            assert flag in names, (program, flag)
        if option.metavar and option.metavar.startswith("{"):
            assert f"`{option.flag} {option.metavar}`" in cell, (program, option.metavar)
