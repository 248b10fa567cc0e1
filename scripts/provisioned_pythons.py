"""Where ``scripts/setup_pythons.sh`` puts the interpreters it provisions, for scripts and tests.

Standard library only (benchmark children and tests import it). The layout is the script's:
``$DYNAMO_PYTHONS_DIR/root/usr/bin/python3.X`` for the binary interpreters and
``$DYNAMO_PYTHONS_DIR/free-threaded/bin/python3.Xt`` for the free-threaded build; a test keeps
the two in step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

DIR_ENV = "DYNAMO_PYTHONS_DIR"
DEFAULT_DIR = "/opt/dynamo-pythons"
# An explicit free-threaded interpreter (any build with Py_GIL_DISABLED), instead of the
# script's own build.
FREE_THREADED_ENV = "DYNAMO_FREE_THREADED_PYTHON"
# The minor versions setup_pythons.sh provisions (its VERSIONS).
PROVISIONED_VERSIONS = ((3, 14), (3, 15))


def pythons_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(DIR_ENV) or DEFAULT_DIR)


def provisioned_interpreters(
    environ: Mapping[str, str] | None = None,
) -> dict[tuple[int, int], str]:
    """``{(3, 14): path, ...}`` for each provisioned interpreter that exists here."""
    usr_bin = pythons_dir(environ) / "root" / "usr" / "bin"
    found = {}
    for major, minor in PROVISIONED_VERSIONS:
        python = usr_bin / f"python{major}.{minor}"
        if python.is_file() and os.access(python, os.X_OK):
            found[(major, minor)] = str(python)
    return found


def free_threaded_interpreter(environ: Mapping[str, str] | None = None) -> str | None:
    """The free-threaded interpreter to use: ``$DYNAMO_FREE_THREADED_PYTHON``, else the one
    ``setup_pythons.sh --free-threaded`` built, else ``None``."""
    env = os.environ if environ is None else environ
    explicit = env.get(FREE_THREADED_ENV)
    if explicit:
        return explicit
    candidates = sorted((pythons_dir(env) / "free-threaded" / "bin").glob("python3.*t"))
    for python in reversed(candidates):  # the newest minor version, should there be two
        if os.access(python, os.X_OK):
            return str(python)
    return None
