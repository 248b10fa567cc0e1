"""Pages of docs/ generated from the code: written, or checked without writing.

Each generator (the configuration pages, the OpenAI fields page) renders its pages and hands
them here, so ``--check`` and a rewrite say the same thing in the same words for every page.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def is_stale(path: Path, text: str) -> bool:
    """Whether the page at ``path`` is missing or differs from ``text``."""
    return not path.exists() or path.read_text(encoding="utf-8") != text


def write_or_check(pages: Mapping[Path, str], *, check: bool, command: str) -> int:
    """Write every page (``wrote <path>``, exit 0); with ``check`` write nothing, name each
    stale page with the ``command`` that regenerates it, and exit 1 if there was one."""
    if check:
        stale = [path for path, text in pages.items() if is_stale(path, text)]
        for path in stale:
            print(f"stale: {path} (run {command})")
        return 1 if stale else 0
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0
