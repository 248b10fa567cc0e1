"""Import every module of components/, scripts/ and tests/ in this process and report which ones
changed the process environment (``os.environ``, and the Hugging Face hub settings read from it
at import time). Run it as a script in a fresh interpreter; importing it does nothing.

    python tests/support/import_environment.py   # prints one JSON object

The third-party libraries the project's modules import are imported first, so what they do at
their own import (vLLM sets a few ``TORCHINDUCTOR_*`` and similar variables) is the baseline,
not blamed on the module that imports them. A module that cannot be imported because an
optional library is absent from this environment (vLLM or SGLang in the default one), or that
skips itself (``pytest.importorskip``), is reported under ``skipped``; any other import failure
under ``failed``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "components" / "src"
SCRIPTS = REPO / "scripts"
TESTS = REPO / "tests"
# Run as sitecustomize in a child only (it logs every explicit gc.collect()); this checker.
NOT_IMPORTED = {"tests.support.gc_trace.sitecustomize", "tests.support.import_environment"}
THIRD_PARTY_FIRST = (
    "huggingface_hub",
    "tokenizers",
    "torch",
    "transformers",
    "vllm",
    "vllm.v1.engine.async_llm",
    "vllm.entrypoints.openai.api_server",
    "sglang",
)
OUR_TOP_LEVELS = {"dynamo", "dynamo_gc", "tests"} | {p.stem for p in SCRIPTS.glob("*.py")}


def module_names() -> list[str]:
    """Every module: the packages under components/src (the launchers and the GC layer), tests/
    (a package), scripts/ (top level)."""
    names = []
    roots = ((SOURCE, SOURCE / "dynamo"), (SOURCE, SOURCE / "dynamo_gc"), (REPO, TESTS))
    for root, top in (*roots, (SCRIPTS, SCRIPTS)):
        for path in sorted(top.rglob("*.py") if top != SCRIPTS else top.glob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    # A package's __main__ is the program itself (python -m runs it): importing it runs it.
    return [n for n in names if n not in NOT_IMPORTED and not n.endswith(".__main__")]


def hub_settings() -> dict[str, str]:
    """huggingface_hub's constants (HF_HUB_OFFLINE and the rest), read from the environment once
    when it is imported: a module that sets HF_* before that import changes them for good."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is None:
        return {}
    return {k: repr(getattr(constants, k)) for k in dir(constants) if k.isupper()}


def snapshot() -> dict[str, str]:
    return {
        **dict(os.environ),
        **{f"huggingface_hub.constants.{k}": v for k, v in hub_settings().items()},
    }


def diff(before: dict[str, str], after: dict[str, str]) -> dict[str, list[str | None]]:
    return {
        key: [before.get(key), after.get(key)]
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    }


def is_optional_absence(exc: BaseException) -> bool:
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return exc.name.split(".")[0] not in OUR_TOP_LEVELS
    return type(exc).__name__ == "Skipped"  # pytest.importorskip / pytest.skip at module level


def main() -> int:
    sys.path[:0] = [str(SOURCE), str(SCRIPTS), str(REPO)]
    baseline_failures = {}
    for name in THIRD_PARTY_FIRST:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - absent or broken here: our imports will say
            baseline_failures[name] = f"{type(exc).__name__}: {exc}"[:200]
    report: dict = {"imported": [], "changed": {}, "skipped": {}, "failed": {}}
    for name in module_names():
        before = snapshot()
        try:
            importlib.import_module(name)
        except BaseException as exc:  # pytest's Skipped is a BaseException, not an Exception
            if isinstance(exc, KeyboardInterrupt):
                raise
            where = "skipped" if is_optional_absence(exc) else "failed"
            report[where][name] = f"{type(exc).__name__}: {exc}"[:300]
        else:
            report["imported"].append(name)
        changed = diff(before, snapshot())
        if changed:
            report["changed"][name] = changed
    report["third_party_not_imported"] = baseline_failures
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
