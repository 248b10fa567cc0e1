"""``python -m dynamo.frontend`` exit codes as an operator sees them: bad input exits 2 with a
message naming the option, before anything runs (no log line, no listener); --help exits 0."""

from __future__ import annotations

import pytest

from tests.support.processes import start_frontend

pytestmark = pytest.mark.integration


def run(tmp_path, discovery_dir, *args: str):
    process = start_frontend("frontend", tmp_path, discovery_dir, *args)
    return process.exit_code(deadline_s=60), process.log()


def test_a_discovery_dir_that_is_a_file_exits_2_naming_flag_env_var_and_path(tmp_path):
    a_file = tmp_path / "records"
    a_file.write_text("not a directory")
    code, output = run(tmp_path, a_file)
    assert code == 2, output
    assert "--discovery-dir / DYN_DISCOVERY_DIR" in output and str(a_file) in output
    assert "Frontend starting" not in output  # nothing ran: not even logging


def test_bad_flags_exit_2_before_the_discovery_dir_is_made_and_help_exits_0(tmp_path):
    missing = tmp_path / "new" / "discovery"
    code, output = run(tmp_path, missing, "--http-port", "eighty")
    assert code == 2 and "--http-port" in output, output
    assert not missing.exists()  # flags are checked first; the directory is made only after

    code, output = run(tmp_path, missing, "--help")
    assert code == 0 and "--discovery-dir" in output
