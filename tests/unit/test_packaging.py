"""The GC layer's distribution: its wheel holds dynamo_gc only, and the layer imports only what
that distribution depends on.

An ai-dynamo user installs this distribution beside ai-dynamo, whose top-level ``dynamo`` package
it must never touch: one file under ``dynamo/`` in the wheel would overwrite upstream's (or turn
its namespace package into a regular one).
"""

from __future__ import annotations

import ast
import email
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "components" / "src"
LAYER = SOURCES / "dynamo_gc"
BACKEND = REPO / "components" / "build_backend"
# What the layer may import beyond the standard library: its distribution's dependencies.
LAYER_DEPENDENCIES = {"configargparse", "prometheus_client"}
# What only our launchers use, and dynamo.* (ai-dynamo's namespace where an operator installs us).
FORBIDDEN = ("dynamo", "aiohttp", "pydantic", "jinja2", "tokenizers", "aetcd")
# The adapters into upstream's launchers (``dynamo_gc.upstream``, and the ``python -m`` entry
# points) import upstream's ``dynamo`` by design; the rule is the core's.
ADAPTERS = ("dynamo_gc.upstream", "dynamo_gc.frontend", "dynamo_gc.vllm", "dynamo_gc.mocker")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCES).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] in ("__init__", "__main__") else parts)


def _is_adapter(name: str) -> bool:
    return any(name == adapter or name.startswith(adapter + ".") for adapter in ADAPTERS)


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> Path:
    """What a checkout holds for the root distribution, copied (the checkout's own build/ and
    egg-info come from the editable installs of the development environments), the launchers'
    package included so the wheel's file selection is what keeps it out."""
    root = tmp_path_factory.mktemp("dynamo-gc-src")
    shutil.copy(REPO / "pyproject.toml", root)
    shutil.copy(REPO / "README.md", root)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for package in ("dynamo_gc", "dynamo"):
        shutil.copytree(SOURCES / package, root / "components" / "src" / package, ignore=ignore)
    shutil.copytree(BACKEND, root / "components" / "build_backend", ignore=ignore)
    return root


@pytest.fixture(scope="module")
def wheel(source_tree, tmp_path_factory) -> Path:
    """The dynamo-gc wheel, built as `pip wheel .` builds it from a checkout."""
    root = source_tree
    out = tmp_path_factory.mktemp("wheels")
    # No build isolation: the backend comes from the test extra, so no index is needed.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--wheel-dir", str(out), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("dynamo_gc-*.whl")
    return built


def test_the_wheel_holds_dynamo_gc_and_its_dist_info_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    outside = [
        name
        for name in names
        if not (name.startswith("dynamo_gc/") or name.split("/")[0].endswith(".dist-info"))
    ]
    assert outside == []
    assert not any(name.startswith("dynamo/") for name in names)
    assert "dynamo_gc/__init__.py" in names
    assert "dynamo_gc/freeze.py" in names and "dynamo_gc/configuration/__init__.py" in names


def test_building_leaves_no_build_dir_and_no_egg_info_in_the_sources(source_tree, wheel):
    # `pip install .` from a checkout used to leave both (and build/lib kept deleted modules for
    # the next wheel): the backend builds from a temporary copy
    left = sorted(
        str(path.relative_to(source_tree))
        for path in source_tree.rglob("*")
        if path.name == "build" or path.name.endswith(".egg-info")
    )
    assert left == []
    assert wheel.exists()


def test_the_wheel_depends_only_on_what_the_layer_imports(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(metadata_name))
    assert metadata["Name"] == "dynamo-gc"
    required = [
        requirement
        for requirement in metadata.get_all("Requires-Dist") or []
        if "extra ==" not in requirement  # the test, lint and bench tooling
    ]
    names = {
        requirement.split(";")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
        for requirement in required
    }
    assert names == LAYER_DEPENDENCIES


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_layer_source_imports_only_stdlib_and_its_dependencies():
    allowed = set(sys.stdlib_module_names) | LAYER_DEPENDENCIES | {"dynamo_gc"}
    offenders = {
        str(path.relative_to(REPO)): sorted(_imported_roots(path) - allowed)
        for path in sorted(LAYER.rglob("*.py"))
        if not _is_adapter(_module_name(path)) and _imported_roots(path) - allowed
    }
    assert offenders == {}


def test_importing_every_core_module_loads_nothing_of_the_launchers():
    # In a fresh interpreter (this one has imported the launchers already): what importing the
    # whole core really pulls in, the dependencies' own imports included.
    modules = sorted(
        {_module_name(path) for path in LAYER.rglob("*.py")} - {""},
    )
    core = [name for name in modules if not _is_adapter(name)]
    assert "dynamo_gc.freeze" in core and "dynamo_gc.configuration.gc_surfaces" in core
    code = (
        "import importlib, json, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = set(json.loads(done.stdout))
    assert "dynamo_gc" in loaded
    assert loaded.isdisjoint(FORBIDDEN), sorted(loaded & set(FORBIDDEN))
