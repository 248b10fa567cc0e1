"""``python -m dynamo_gc.mocker <upstream's arguments> [GC flags]``: upstream's real mock engine,
our flags taken out and checked first, the freeze after ``make_engine`` and before ``run_input``
serves the engine (so before the worker's endpoint and model are registered), and upstream's
real frontend answering the official ``openai`` client through it on loopback.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request

import pytest
from launcher_process import LauncherProcess
from upstream_pair import loopback_env, mocker_args, tiny_model_dir

from dynamo_gc.upstream.versions import SUPPORTED_VERSIONS
from tests.upstream.frontend_pair import Frontend

pytestmark = [pytest.mark.upstream, pytest.mark.integration]

ADAPTER = "dynamo_gc.mocker"
FROZEN = r"GC heap frozen \(upstream mocker, after make_engine, before run_input\)"
SERVING = r"Serving phase starting -> serving \(upstream mocker serves its engine\)"
# What the worker publishes once it serves: its endpoint on the request plane, its records
# (endpoint instance, model card, event channels) in discovery.
ENDPOINT_REGISTERED = r"Registered endpoint 'dynamo\.backend\.generate'"
DISCOVERY_REGISTER = r"KVStoreDiscovery::register"
# upstream's line once it has parsed its arguments and starts building
UPSTREAM_STARTED = r"Creating mocker worker 1/1"
START_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("upstream-mocker") / "model")


@pytest.fixture
def mockers(model_dir, tmp_path):
    started: list[LauncherProcess] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> LauncherProcess:
        kv_dir = tmp_path / f"kv-{len(started)}"
        kv_dir.mkdir()
        process = LauncherProcess(
            f"mocker-{len(started)}",
            ADAPTER,
            [*mocker_args(model_dir, speedup_ratio=1000), *args],
            log_dir=tmp_path,
            env={**loopback_env(kv_dir), **(env or {})},
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def first(pattern: str, log: str) -> int:
    match = re.search(pattern, log)
    assert match is not None, f"{pattern!r} not in the log:\n{log}"
    return match.start()


def test_freezes_before_the_engine_is_served_and_upstreams_frontend_answers(model_dir, tmp_path):
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    mocker = LauncherProcess(
        "mocker",
        ADAPTER,
        [
            *mocker_args(model_dir, speedup_ratio=1000),
            "--gc-pause-log-ms",
            "1",
            "--gc-metrics-port",
            "0",
            "--gc-metrics-host",
            "127.0.0.1",
        ],
        log_dir=tmp_path,
        env=loopback_env(kv_dir),
    )
    frontend = Frontend("dynamo.frontend", [], kv_dir=kv_dir, log_dir=tmp_path)
    try:
        frontend.serve_a_chat()
        log = mocker.log()
        frozen = first(FROZEN, log)
        assert re.search(r"GC heap frozen .*frozen=[1-9]\d*", log)
        assert first(SERVING, log) > frozen
        assert first(ENDPOINT_REGISTERED, log) > frozen
        assert first(DISCOVERY_REGISTER, log) > frozen
        assert mocker.count(FROZEN) == 1
        assert "GC pause logger installed" in log[:frozen]
        # the dynamo_gc_* metrics, scraped from the adapter's own port
        port = mocker.wait_for_log(r"GC metrics served on http://127\.0\.0\.1:(\d+)/metrics")
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=10) as r:
            scraped = r.read().decode()
        frozen_objects = re.search(r"^dynamo_gc_frozen_objects (\S+)$", scraped, re.M)
        assert frozen_objects is not None and float(frozen_objects.group(1)) > 0, scraped
        assert re.search(r'^dynamo_serving_phase\{phase="serving"\} 1\.0$', scraped, re.M)
        assert re.search(r"^dynamo_gc_freeze_enabled 1\.0$", scraped, re.M)
    finally:
        frontend.stop()
        mocker.stop()


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--no-freeze-gc-heap"], {}),
        ([], {"DYN_VLLM_FREEZE_GC_HEAP": "0"}),
        (["--no-freeze-gc-heap"], {"DYN_VLLM_FREEZE_GC_HEAP": "1"}),
    ],
    ids=["flag", "env-var", "flag-over-env"],
)
def test_off_restores_stock(mockers, args, env):
    mocker = mockers(args, env)
    mocker.wait_for_log(ENDPOINT_REGISTERED, deadline_s=START_DEADLINE_S)
    assert mocker.count(r"GC heap frozen") == 0
    # the process still turns `serving` (so nothing can freeze later), without a freeze
    assert mocker.count(SERVING) == 1


def test_the_flag_overrides_the_env_var(mockers):
    mocker = mockers(["--freeze-gc-heap"], {"DYN_VLLM_FREEZE_GC_HEAP": "0"})
    mocker.wait_for_log(ENDPOINT_REGISTERED, deadline_s=START_DEADLINE_S)
    assert mocker.count(FROZEN) == 1


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--gc-pause-log-ms", "-1"], {}, "DYN_VLLM_GC_PAUSE_LOG_MS"),
        (["--gc-pause-log-ms", "nan"], {}, "DYN_VLLM_GC_PAUSE_LOG_MS"),
        ([], {"DYN_VLLM_GC_PAUSE_LOG_MS": "soon"}, "--gc-pause-log-ms"),
        ([], {"DYN_VLLM_FREEZE_GC_HEAP": "maybe"}, "--freeze-gc-heap"),
        (["--freeze-gc-heap=yes"], {}, "--freeze-gc-heap"),
        (["--gc-metrics-port", "70000"], {}, "DYN_VLLM_GC_METRICS_PORT"),
        ([], {"DYN_VLLM_GC_METRICS_PORT": "http"}, "--gc-metrics-port"),
    ],
    ids=[
        "negative",
        "nan",
        "env-not-a-number",
        "env-not-a-bool",
        "valued-boolean",
        "port-out-of-range",
        "env-port-not-a-number",
    ],
)
def test_bad_values_exit_2_before_upstream_starts(mockers, args, env, named):
    mocker = mockers(args, env)
    assert mocker.exit_code(deadline_s=60) == 2
    log = mocker.log()
    assert named in log
    assert "error" in log
    # nothing of upstream ran: no runtime, no engine, no log line of upstream's
    assert re.search(UPSTREAM_STARTED, log) is None
    assert "dynamo_runtime" not in log


def run_adapter_after(prelude: str, tmp_path) -> subprocess.CompletedProcess:
    """The adapter's ``main()`` in a Python that first ran ``prelude`` on the real module."""
    script = (
        "import sys\n"
        "import dynamo.mocker.main as upstream\n"
        f"{prelude}\n"
        "from dynamo_gc.mocker import main\n"
        "sys.argv = ['python -m dynamo_gc.mocker', '--model-path', sys.argv[1]]\n"
        "main()\n"
    )
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "model")],
        env={**os.environ, **loopback_env(kv_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("prelude", "problem"),
    [
        ("del upstream.run_input", r"dynamo\.mocker\.main\.run_input is missing"),
        (
            "async def launch_workers(args, engine_args):\n    return None\n"
            "upstream.launch_workers = launch_workers",
            r"dynamo\.mocker\.main\.launch_workers no longer calls the module global run_input",
        ),
        ("del upstream.launch_workers", r"dynamo\.mocker\.main\.launch_workers is missing"),
        ("upstream.run_input = 'moved'", r"dynamo\.mocker\.main\.run_input is not callable"),
    ],
    ids=["symbol-missing", "caller-changed", "caller-missing", "not-callable"],
)
def test_a_changed_upstream_exits_2_naming_the_version_and_the_symbol(tmp_path, prelude, problem):
    from importlib.metadata import version

    result = run_adapter_after(prelude, tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"ai-dynamo {version('ai-dynamo')}:" in result.stderr
    assert re.search(problem, result.stderr), result.stderr
    assert f"this adapter supports ai-dynamo {', '.join(SUPPORTED_VERSIONS)}" in result.stderr
    assert "Creating mocker worker" not in result.stderr + result.stdout


def test_help_shows_the_gc_options_then_upstreams():
    result = subprocess.run(
        [sys.executable, "-m", ADAPTER, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    ours = result.stdout.index("--no-freeze-gc-heap")
    assert result.stdout.index("DYN_VLLM_GC_PAUSE_LOG_MS") > ours
    assert result.stdout.index("--speedup-ratio") > ours  # upstream's mocker option
    # Upstream's part is headed with this program's name, not runpy's "__main__.py".
    assert f"usage: python -m {ADAPTER} [-h]" in result.stdout
    assert "__main__.py" not in result.stdout


def test_a_bad_upstream_argument_is_upstreams_error_under_this_programs_name():
    result = subprocess.run(
        [sys.executable, "-m", ADAPTER, "--no-such-mocker-flag"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert (
        f"python -m {ADAPTER}: error: unrecognized arguments: --no-such-mocker-flag"
        in result.stderr
    )
