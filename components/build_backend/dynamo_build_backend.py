"""The build backend of both distributions: setuptools', with two things added.

1. **Nothing left in the checkout.** setuptools builds in the source tree: ``pip install .``
   left ``build/`` (whose ``lib/`` also keeps modules deleted since, and puts them in the next
   wheel) and ``*.egg-info`` beside the sources. Wheels, sdists and the metadata pip asks for
   first are built here from a copy of what the distribution ships (``pyproject.toml``, its
   readme, the packages its ``[tool.setuptools.packages.find]`` selects) in a temporary
   directory, which goes when the build ends. Editable installs stay in place: they point at
   the sources by design.

2. **The launchers refuse an ai-dynamo environment.** ``dynamo-gc-launchers`` (components/)
   installs a top-level ``dynamo`` package, which is ai-dynamo's: pip has no conflict
   metadata, so ``pip install ./components`` into an ai-dynamo environment succeeded silently
   and overwrote 13 of ai-dynamo's files, added 115, and uninstalling it deleted 26 of
   upstream's. Before anything is built, a distribution that ships ``dynamo`` looks at the
   environment pip installs into (the interpreter running this backend: pip runs it in that
   environment even when it isolates the build's own requirements) and refuses when ai-dynamo
   is installed there, naming the GC layer to install instead and the repair command. What this
   cannot see: a wheel built elsewhere and installed with ``pip install x.whl`` (no build runs),
   or ``pip install --target`` / ``--prefix`` into another place.
   ``DYNAMO_BUILD_BESIDE_AI_DYNAMO=1`` builds anyway (a wheel meant for another environment).

Named in both pyproject.toml files (``backend-path``): the root's reaches it as
``components/build_backend``, components/' as ``build_backend``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import tomllib
from setuptools import build_meta as _setuptools

OVERRIDE_ENV = "DYNAMO_BUILD_BESIDE_AI_DYNAMO"
# How to put an ai-dynamo environment the launchers were installed into back as it was.
REPAIR = (
    "pip uninstall dynamo-gc-launchers, then pip install --force-reinstall --no-deps "
    "ai-dynamo==X ai-dynamo-runtime==X (X: the version that was installed)"
)


def _project() -> dict:
    with open("pyproject.toml", "rb") as file:
        return tomllib.load(file)


def _ships_dynamo(project: dict) -> bool:
    find = project.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    return "dynamo" in find.get("include", [])


def _ai_dynamo_in_target() -> str | None:
    """``ai-dynamo X in DIR`` when the environment this interpreter installs into has it."""
    places = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    for place in sorted(places):
        for dist_info in sorted(Path(place).glob("ai_dynamo-*.dist-info")):
            version = dist_info.name[len("ai_dynamo-") : -len(".dist-info")]
            return f"ai-dynamo {version} in {place}"
    return None


def _refuse_beside_ai_dynamo() -> None:
    project = _project()
    if not _ships_dynamo(project) or os.environ.get(OVERRIDE_ENV) == "1":
        return
    found = _ai_dynamo_in_target()
    if found is None:
        return
    name = project.get("project", {}).get("name", "this distribution")
    message = (
        f"{name}: refusing to build for {sys.prefix}, which has {found}: this distribution "
        "installs a top-level `dynamo` package, which is ai-dynamo's (it would overwrite "
        "ai-dynamo's files, and uninstalling it would delete some). For ai-dynamo, install the "
        "GC layer instead: pip install <checkout> (the repository root, dynamo-gc; see "
        f"docs/ai-dynamo.md). Already installed? Repair: {REPAIR}. To build a wheel for another "
        f"environment anyway: {OVERRIDE_ENV}=1."
    )
    raise SystemExit(message)


def _shipped(project: dict) -> list[Path]:
    """What the distribution is built from: pyproject.toml, its readme, its packages' sources."""
    paths = [Path("pyproject.toml")]
    readme = project.get("project", {}).get("readme")
    if isinstance(readme, str):
        paths.append(Path(readme))
    find = project.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    for where in find.get("where", ["."]):
        for pattern in find.get("include", ["*"]):
            top = pattern.split(".")[0].rstrip("*")
            paths.extend(
                package
                for package in Path(where).glob(f"{top}*")
                if package.is_dir() and (package / "__init__.py").exists()
            )
    return sorted(set(paths))


@contextlib.contextmanager
def _in_a_copy() -> Iterator[None]:
    """Run the build in a temporary copy of what the distribution ships."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    source = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="dynamo-build-") as tree:
        for path in _shipped(_project()):
            target = Path(tree) / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                shutil.copytree(source / path, target, ignore=ignore)
            else:
                shutil.copy2(source / path, target)
        os.chdir(tree)
        try:
            yield
        finally:
            os.chdir(source)


def _absolute(directory: str) -> str:
    return os.path.abspath(directory)


def get_requires_for_build_wheel(config_settings=None):
    _refuse_beside_ai_dynamo()
    with _in_a_copy():
        return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    with _in_a_copy():
        return _setuptools.get_requires_for_build_sdist(config_settings)


def get_requires_for_build_editable(config_settings=None):
    _refuse_beside_ai_dynamo()
    return _setuptools.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _refuse_beside_ai_dynamo()
    metadata_directory = _absolute(metadata_directory)
    with _in_a_copy():
        return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _refuse_beside_ai_dynamo()
    wheel_directory = _absolute(wheel_directory)
    if metadata_directory is not None:
        metadata_directory = _absolute(metadata_directory)
    with _in_a_copy():
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    sdist_directory = _absolute(sdist_directory)
    with _in_a_copy():
        return _setuptools.build_sdist(sdist_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _refuse_beside_ai_dynamo()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _refuse_beside_ai_dynamo()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
