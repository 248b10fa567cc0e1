"""The launchers refuse a default discovery directory another user could write in: exit 2
before anything runs, naming the directory and the flag that chooses another."""

from __future__ import annotations

import pytest

from tests.support import LauncherProcess
from tests.support.tiny_model import tiny_tokenizer_dir

pytestmark = pytest.mark.integration

ARGS = {
    "dynamo.frontend": ["--http-host", "127.0.0.1", "--http-port", "0"],
    "dynamo.vllm": ["--engine", "mock", "--model", "<tiny>"],
}


@pytest.mark.parametrize("module", sorted(ARGS))
def test_a_default_directory_writable_by_others_exits_2_naming_it_and_the_flag(tmp_path, module):
    shared = tmp_path / "dynamo"  # the default's first component under $XDG_RUNTIME_DIR
    shared.mkdir()
    shared.chmod(0o777)
    args = [tiny_tokenizer_dir() if a == "<tiny>" else a for a in ARGS[module]]
    process = LauncherProcess(
        "launcher", module, args, log_dir=tmp_path, env={"XDG_RUNTIME_DIR": str(tmp_path)}
    )
    assert process.exit_code(60) == 2
    log = process.log()
    assert "--discovery-dir / DYN_DISCOVERY_DIR" in log
    assert f"{shared} is writable by other users" in log
    assert "Traceback" not in log and "GC heap frozen" not in log
    assert not (shared / "discovery").exists()  # nothing created inside what is not ours
