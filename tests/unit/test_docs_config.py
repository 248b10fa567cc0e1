"""docs/configuration/*.md stay in step with the option declarations."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from dynamo.common.configuration import docs
from dynamo_gc.configuration.options import Option, Surface
from tests.support.processes import run_python

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def test_the_default_docs_dir_is_this_repositorys():
    assert docs.default_docs_dir() == DOCS


def test_the_repository_pages_are_up_to_date():
    stale = docs.stale_pages(DOCS)
    assert stale == [], "run: python -m dynamo.common.configuration.docs"


def test_the_check_command_passes_on_the_repository():
    done = run_python("-m", "dynamo.common.configuration.docs", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", ["frontend", "vllm-worker"])
def test_each_launcher_has_a_configuration_page(name):
    assert (DOCS / "configuration" / f"{name}.md").is_file()


@pytest.mark.parametrize(
    "page,rows",
    [
        (
            "frontend",
            [
                "| `--dyn-freeze-gc-heap` / `--no-dyn-freeze-gc-heap` "
                "| `DYN_FREEZE_GC_HEAP` | on |",
                "| `--dyn-gc-pause-log-ms` | `DYN_GC_PAUSE_LOG_MS` | 0 |",
            ],
        ),
        (
            "vllm-worker",
            [
                "| `--freeze-gc-heap` / `--no-freeze-gc-heap` | `DYN_VLLM_FREEZE_GC_HEAP` | on |",
                "| `--gc-pause-log-ms` | `DYN_VLLM_GC_PAUSE_LOG_MS` | 0 |",
            ],
        ),
    ],
)
def test_the_gc_rows_are_the_issues_table(page, rows):
    text = (DOCS / "configuration" / f"{page}.md").read_text(encoding="utf-8")
    for row in rows:
        assert row in text


def test_every_env_var_on_a_configuration_page_is_declared():
    declared = {option.env_var for option in docs.all_options()}
    mentioned = set()
    for page in (DOCS / "configuration").glob("*.md"):
        mentioned |= set(re.findall(r"`(DYN_[A-Z0-9_]+)`", page.read_text(encoding="utf-8")))
    assert mentioned and mentioned <= declared, mentioned - declared


@pytest.mark.parametrize("surface", docs.surfaces(), ids=lambda s: s.name)
def test_every_declared_option_has_a_row(surface):
    text = docs.render(surface)
    for option in surface.options:
        flags = " / ".join(f"`{flag}`" for flag in option.flags())
        assert f"| {flags} | `{option.env_var}` | {option.render_default()} |" in text


def test_a_pipe_in_help_does_not_break_the_table():
    option = Option(name="x", env_var="DYN_X", default=True, help="a | b\nc")
    surface = Surface(name="t", title="T", program="p", description="d", options=[option])
    row = docs.render(surface).splitlines()[-1]
    assert row == "| `--x` / `--no-x` | `DYN_X` | on | on/off | a \\| b c |"


# --- the check on a docs dir of our own ----------------------------------------------------


@pytest.fixture
def docs_dir(tmp_path, capsys) -> Path:
    assert docs.main(["--docs-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    return tmp_path


def _module_of(surface_name: str):
    for module_name in docs.SURFACE_MODULES:
        module = importlib.import_module(module_name)
        if module.SURFACE.name == surface_name:
            return module
    raise KeyError(surface_name)


def _change_option(monkeypatch, surface_name: str, dest: str, **changes) -> Path:
    module = _module_of(surface_name)
    surface = module.SURFACE
    options = [dataclasses.replace(o, **changes) if o.dest == dest else o for o in surface.options]
    monkeypatch.setattr(module, "SURFACE", dataclasses.replace(surface, options=options))
    return docs.page_path(Path("."), surface)


def test_freshly_written_pages_are_not_stale(docs_dir):
    assert docs.stale_pages(docs_dir) == []
    assert docs.main(["--check", "--docs-dir", str(docs_dir)]) == 0


@pytest.mark.parametrize(
    "surface_name,dest,changes",
    [
        ("frontend", "freeze_gc_heap", {"default": False}),
        ("frontend", "gc_pause_log_ms", {"env_var": "DYN_GC_PAUSE_MS"}),
        ("vllm-worker", "gc_pause_log_ms", {"help": "Something else."}),
        ("vllm-worker", "freeze_gc_heap", {"name": "freeze-heap"}),
        ("vllm-self-benchmark", "fpm_gc_policy", {"default": "freeze"}),
    ],
)
def test_a_changed_declaration_makes_its_page_stale(
    docs_dir, monkeypatch, capsys, surface_name, dest, changes
):
    relative = _change_option(monkeypatch, surface_name, dest, **changes)
    stale_page = docs_dir / relative

    assert docs.stale_pages(docs_dir) == [stale_page]
    assert docs.main(["--check", "--docs-dir", str(docs_dir)]) == 1
    assert f"stale: {stale_page}" in capsys.readouterr().out
    assert docs.main(["--docs-dir", str(docs_dir)]) == 0  # regenerating fixes it
    assert docs.stale_pages(docs_dir) == []


def test_a_missing_page_is_stale(docs_dir):
    page = docs_dir / "configuration" / "frontend.md"
    page.unlink()
    assert docs.stale_pages(docs_dir) == [page]


def test_a_hand_edited_page_is_stale(docs_dir):
    page = docs_dir / "configuration" / "vllm-worker.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nhand-written note\n", encoding="utf-8")
    assert docs.stale_pages(docs_dir) == [page]
