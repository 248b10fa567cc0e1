"""Tests on upstream ai-dynamo's real wheels: skipped, with the reason, where they are missing.

ai-dynamo installs its own top-level ``dynamo`` package, which this repository's launchers also
use, so these tests run in an environment of their own (``scripts/setup_upstream_env.sh`` makes
``.venv-upstream``: ai-dynamo 1.6.1 and ai-dynamo-runtime 1.6.1 from PyPI with the ``dynamo-gc``
layer beside them). Everywhere else every test marked ``upstream`` here is skipped with that
command; ``DYNAMO_REQUIRE_UPSTREAM=1`` (CI, where it has just built the environment) turns the
skip into an error.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

REQUIRE_ENV = "DYNAMO_REQUIRE_UPSTREAM"
SUITE = Path(__file__).parent


def missing_upstream() -> str | None:
    """Why this Python cannot run the upstream tests, or ``None`` when it can."""
    try:
        found = version("ai-dynamo")
    except PackageNotFoundError:
        return "ai-dynamo is not installed"
    try:
        version("dynamo-gc")
    except PackageNotFoundError:
        return f"ai-dynamo {found} is installed but the dynamo-gc layer is not"
    return None


def pytest_collection_modifyitems(config, items) -> None:
    problem = missing_upstream()
    if problem is None:
        return
    reason = (
        f"{problem} in this Python environment ({sys.executable}); create it with "
        "scripts/setup_upstream_env.sh and run .venv-upstream/bin/python -m pytest -m upstream "
        "tests/upstream"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        raise pytest.UsageError(f"{REQUIRE_ENV}=1 but {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker("upstream") is not None and SUITE in Path(item.path).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """One upstream mocker serving the tiny model for the whole suite; its discovery directory.

    Every frontend test starts its own frontends against it (they only read the records).
    """
    from upstream_pair import tiny_model_dir

    from tests.upstream.frontend_pair import start_mocker

    root = tmp_path_factory.mktemp("upstream-mocker")
    kv_dir = root / "kv"
    kv_dir.mkdir()
    mocker = start_mocker(tiny_model_dir(root / "model"), kv_dir, root)
    try:
        yield kv_dir
    finally:
        mocker.stop()


@pytest.fixture
def frontends(served, tmp_path):
    """``frontends(module, args, env)`` starts upstream's frontend (``module``: upstream's
    ``dynamo.frontend`` or the adapter's launcher) against the suite's mocker; each one started
    is stopped after the test. ``launch``: a script that runs the module (a changed upstream)."""
    from tests.upstream.frontend_pair import Frontend

    started: list[Frontend] = []

    def start(
        module: str,
        args: list[str],
        env: dict[str, str] | None = None,
        launch: Path | None = None,
    ) -> Frontend:
        frontend = Frontend(
            module,
            args,
            kv_dir=served,
            log_dir=tmp_path,
            env=env,
            name=f"frontend-{len(started)}",
            launch=launch,
        )
        started.append(frontend)
        return frontend

    yield start
    for frontend in started:
        frontend.stop()
