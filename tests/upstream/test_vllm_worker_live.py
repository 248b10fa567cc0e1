"""``python -m dynamo_gc.vllm`` end to end: upstream ai-dynamo's unchanged vLLM worker through the
adapter, on the real vLLM CPU engine serving the tiny model (scripts/make_tiny_model.py), and
upstream's unchanged frontend answering the official ``openai`` client on loopback.

The worker's parent (upstream's ``python -m dynamo.vllm`` process: vLLM's ``AsyncLLM``, upstream's
handlers and runtime) is frozen once, after the engine is built and before upstream's
``register_vllm_model`` publishes the model (so before the frontend lists it); the off switches
leave it unfrozen; the pause logger and the metrics port work on it; Ctrl-C and SIGTERM during
the engine's init stop it at once with one line. Each start here is a real engine: about a
minute of a loaded 2-core machine.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import bench_common
import psutil
import pytest
from launcher_process import LauncherProcess, wait_until
from upstream_pair import MODEL, loopback_env, vllm_worker_args

from tests.support.scrape import sample
from tests.upstream.frontend_pair import Frontend
from tests.upstream.needs_vllm import NEEDS_VLLM

pytestmark = [pytest.mark.upstream, pytest.mark.integration, NEEDS_VLLM]

ADAPTER = "dynamo_gc.vllm"
FROZEN = (
    r"GC heap frozen \(upstream vLLM worker, after engine init, before register_vllm_model\): "
    r"collected=\d+ frozen=(\d+)"
)
DISABLED = r"GC heap freeze disabled \(upstream vLLM worker"
SERVING = r"Serving phase starting -> serving \(upstream vLLM worker registers its model\)"
# upstream's and vLLM's own lines, in the order start-up reaches them
ENGINE_INIT = r"Initializing a V1 LLM engine"  # vLLM's EngineCore process is building the engine
ENGINE_BUILT = rf"worker for {MODEL} has been initialized"  # upstream's setup_vllm_engine is done
REGISTERED = rf"Registered base model '{MODEL}' MDC"  # upstream's register_model published it
START_DEADLINE_S = 600.0  # vLLM's imports and its engine, on a loaded 2-core machine
# A stop is prompt: far below the engine init it interrupts (vLLM gives its EngineCore a few
# seconds to end before it kills it).
STOP_DEADLINE_S = 20.0
TOKEN_VAR = "DYNAMO_TEST_STOP_TOKEN"


@pytest.fixture(scope="module")
def model_dir() -> str:
    """The tiny model with its weights, built once per machine by this environment's Python."""
    return bench_common.tiny_model_dir(sys.executable)


def start_worker(
    name: str,
    model_dir: str,
    root: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    *,
    new_session: bool = False,
) -> tuple[LauncherProcess, Path]:
    """The adapter on upstream's worker, with a discovery directory of its own (returned)."""
    kv_dir = root / f"kv-{name}"
    kv_dir.mkdir()
    worker = LauncherProcess(
        name,
        ADAPTER,
        [*vllm_worker_args(model_dir), *args],
        log_dir=root,
        env={**loopback_env(kv_dir), **(env or {})},
        new_session=new_session,
    )
    return worker, kv_dir


METRICS_ARGS = ["--gc-metrics-port", "0", "--gc-metrics-host", "127.0.0.1"]


def scrape(worker: LauncherProcess) -> str:
    port = worker.wait_for_log(r"GC metrics served on http://127\.0\.0\.1:(\d+)/metrics").group(1)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return answer.read().decode()


def lists_model(frontend: Frontend) -> bool:
    try:
        with urllib.request.urlopen(frontend.base_url + "/v1/models", timeout=5) as answer:
            return any(model["id"] == MODEL for model in json.load(answer)["data"])
    except OSError:
        return False


def position(pattern: str, log: str) -> int:
    match = re.search(pattern, log)
    assert match is not None, f"{pattern!r} not in the log:\n{log[-5000:]}"
    return match.start()


@dataclass
class Served:
    worker: LauncherProcess
    frontend: Frontend
    # The worker's log held its freeze line before the frontend listed the model.
    frozen_before_listed: bool


@pytest.fixture(scope="module")
def served(model_dir, tmp_path_factory) -> Iterator[Served]:
    """Upstream's frontend and the adapter on upstream's worker, freeze on, pause log at 1 ms,
    the metrics port on; until the frontend lists the model."""
    root = tmp_path_factory.mktemp("upstream-vllm-frozen")
    worker, kv_dir = start_worker(
        "worker", model_dir, root, ["--gc-pause-log-ms", "1", *METRICS_ARGS]
    )
    frontend = Frontend("dynamo.frontend", [], kv_dir=kv_dir, log_dir=root)
    try:
        frontend.wait_http()

        def listed() -> tuple[bool] | None:
            worker.check_alive()
            frontend.process.check_alive()
            frozen_already = re.search(FROZEN, worker.log()) is not None  # read first
            return (frozen_already,) if lists_model(frontend) else None

        (frozen_first,) = wait_until(
            listed, deadline_s=START_DEADLINE_S, what=f"upstream's frontend to list {MODEL}"
        )
        yield Served(worker, frontend, frozen_first)
    finally:
        frontend.stop()
        worker.stop()


def test_one_freeze_after_the_engine_is_built_and_before_the_model_is_registered(served):
    log = served.worker.log()
    assert served.worker.count(FROZEN) == 1
    frozen = position(FROZEN, log)
    assert position(ENGINE_INIT, log) < position(ENGINE_BUILT, log) < frozen
    assert frozen < position(SERVING, log) < position(REGISTERED, log)
    assert served.frozen_before_listed  # the frontend did not list the model before the freeze
    # the worker parent's heap: vLLM's AsyncLLM, upstream's handlers and runtime (682,750 objects
    # measured here; docs/ai-dynamo.md)
    match = re.search(FROZEN, log)
    assert match is not None and int(match.group(1)) > 100_000, match


def test_upstreams_frontend_serves_a_chat_completion_from_the_frozen_worker(served):
    assert isinstance(served.frontend.chat("hello"), str)
    assert served.worker.count(FROZEN) == 1  # serving froze nothing more


def test_the_pause_logger_reports_the_parents_pauses(served):
    log = served.worker.log()
    assert position(r"GC pause logger installed: WARNING for pauses >= 1 ms", log) < position(
        FROZEN, log
    )
    pauses = [float(ms) for ms in re.findall(r"GC gen[012] pause (\d+\.\d+) ms", log)]
    assert pauses, log[-5000:]  # the freeze's own full collection is one
    assert min(pauses) >= 1.0


def test_the_metrics_port_serves_the_parents_freeze(served):
    scraped = scrape(served.worker)
    match = re.search(FROZEN, served.worker.log())
    assert match is not None
    assert sample(scraped, "dynamo_gc_frozen_objects") == int(match.group(1))
    assert sample(scraped, "dynamo_gc_freeze_enabled") == 1.0
    assert re.search(r'^dynamo_serving_phase\{phase="serving"\} 1\.0$', scraped, re.MULTILINE)
    assert re.search(
        r'^dynamo_gc_pause_seconds_count\{generation="2",phase="starting"\} [1-9]', scraped, re.M
    ), scraped


@pytest.fixture(scope="module")
def unfrozen(model_dir, tmp_path_factory) -> Iterator[dict[str, LauncherProcess]]:
    """The adapter with the freeze off by its flag and by its env var: both at once (two
    engines side by side), each until it serves."""
    root = tmp_path_factory.mktemp("upstream-vllm-unfrozen")
    workers = {
        "flag": start_worker("flag", model_dir, root, ["--no-freeze-gc-heap", *METRICS_ARGS])[0],
        "env-var": start_worker(
            "env-var", model_dir, root, METRICS_ARGS, {"DYN_VLLM_FREEZE_GC_HEAP": "0"}
        )[0],
    }
    try:
        for worker in workers.values():
            worker.wait_for_log(REGISTERED, deadline_s=START_DEADLINE_S)
        yield workers
    finally:
        for worker in workers.values():
            worker.stop()


@pytest.mark.parametrize("way", ["flag", "env-var"])
def test_off_leaves_the_worker_unfrozen(unfrozen, way):
    worker = unfrozen[way]
    log = worker.log()
    assert worker.count(r"GC heap frozen") == 0
    assert worker.count(DISABLED) == 1
    # still marked serving at the same point (so nothing can freeze later), without a freeze
    assert position(DISABLED, log) < position(SERVING, log) < position(REGISTERED, log)
    scraped = scrape(worker)
    assert sample(scraped, "dynamo_gc_frozen_objects") == 0.0
    assert sample(scraped, "dynamo_gc_freeze_enabled") == 0.0
    assert re.search(r'^dynamo_serving_phase\{phase="serving"\} 1\.0$', scraped, re.MULTILINE)


# Upstream's self-benchmark GC policy (dynamo/vllm/gc_policy.py), in the processes it runs in
POLICY_ACTIVE = r"FPM GC policy active: auto-gen2 disabled, .*\(pid=(\d+)\)"
POLICY_STOPPED = (
    r"FPM GC policy stopped: auto-gen2 restored, serving freeze re-established \(pid=(\d+)\)"
)
WORKERS_RESTORED = r"FPM GC policy stopped in all model workers"
# Two decode points (upstream's manifest format): the sweep takes seconds on the tiny model.
BENCHMARK_POINTS = {
    "schema_version": 1,
    "prefill": [],
    "decode": [
        {"batch_size": 1, "total_kv_read_tokens": 16},
        {"batch_size": 2, "total_kv_read_tokens": 32},
    ],
}


def test_upstreams_self_benchmark_policy_restores_before_the_one_serving_freeze(
    model_dir, tmp_path
):
    """PR #12177's contract, on upstream 1.6.1's own policy: the benchmark's GC policy runs and
    restores the GC state it found (upstream keeps it out of the worker's parent, in vLLM's
    EngineCore and model worker processes), then the adapter's serving freeze runs once, in the
    parent, after upstream has awaited every process's restore and before it registers."""
    points = tmp_path / "points.json"
    points.write_text(json.dumps(BENCHMARK_POINTS))
    benchmark = [
        "--max-model-len",  # upstream's warm-up prefills 256 tokens, then decodes
        "512",
        "--benchmark-mode",
        "decode",
        "--benchmark-points-file",
        str(points),
        "--benchmark-output-path",
        str(tmp_path / "benchmark.json"),
    ]
    worker, _ = start_worker(
        "benchmarked",
        model_dir,
        tmp_path,
        [*benchmark, *METRICS_ARGS],
        {"DYN_FPM_GC_POLICY": "freeze"},
    )
    try:
        worker.wait_for_log(REGISTERED, deadline_s=START_DEADLINE_S)
        log = worker.log()
        frozen = position(FROZEN, log)
        assert worker.count(FROZEN) == 1  # in the whole log: the children's output is in it too
        active = {int(pid) for pid in re.findall(POLICY_ACTIVE, log)}
        stopped = {int(pid) for pid in re.findall(POLICY_STOPPED, log)}
        assert active, log[-5000:]  # the policy ran (EngineCore logs it)
        assert worker.pid not in active  # never in the parent: its GC state is as it found it
        assert stopped == active  # every process that started it restored it ...
        for match in re.finditer(POLICY_STOPPED, log):
            assert match.start() < frozen  # ... before the serving freeze
        assert position(WORKERS_RESTORED, log) < frozen < position(REGISTERED, log)
        assert position(r"Benchmark complete", log) < frozen
        scraped = scrape(worker)
        match = re.search(FROZEN, log)
        assert match is not None
        assert sample(scraped, "dynamo_gc_frozen_objects") == int(match.group(1))  # one freeze
    finally:
        worker.stop()


def processes_with(token: str) -> list[psutil.Process]:
    """The live processes (zombies aside) whose environment carries ``token``: the worker and
    every process it started (vLLM's EngineCore and its model worker inherit it)."""
    found = []
    for process in psutil.process_iter():
        try:
            if (
                process.status() != psutil.STATUS_ZOMBIE
                and process.environ().get(TOKEN_VAR) == token
            ):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def ctrl_c(worker: LauncherProcess) -> str:
    worker.signal_group(signal.SIGINT)  # as a terminal sends it: vLLM's processes get it too
    return "SIGINT"


def sigterm(worker: LauncherProcess) -> str:
    worker.signal(signal.SIGTERM)  # to the worker alone, as Kubernetes sends it
    return "SIGTERM"


@pytest.mark.parametrize("send", [ctrl_c, sigterm], ids=["ctrl-c", "sigterm"])
def test_a_signal_during_engine_init_stops_the_worker_at_once(
    send: Callable[[LauncherProcess], str], model_dir, tmp_path
):
    token = uuid.uuid4().hex
    worker, _ = start_worker(
        "worker", model_dir, tmp_path, [], {TOKEN_VAR: token}, new_session=True
    )
    try:
        worker.wait_for_log(ENGINE_INIT, deadline_s=START_DEADLINE_S)
        signame = send(worker)
        assert worker.wait_exit(STOP_DEADLINE_S) == 0, worker.log()[-5000:]
        log = worker.log()
        lines = re.findall(rf"^.*Received {signame} during start-up.*$", log, re.MULTILINE)
        assert len(lines) == 1, log[-5000:]
        assert "python -m dynamo_gc.vllm" in lines[0]
        # No traceback from the worker's own process: none passes through the adapter or
        # upstream's worker. (With Ctrl-C, vLLM's EngineCore and model worker get the signal too,
        # as from a terminal, and print their own: vLLM's processes, not the adapter's.)
        assert re.search(r'File ".*/(dynamo_gc|dynamo/vllm)/', log) is None, log[-5000:]
        # stopped mid-init: the engine never finished, nothing was frozen or registered
        assert re.search(ENGINE_BUILT, log) is None
        assert re.search(r"GC heap frozen", log) is None
        assert re.search(REGISTERED, log) is None
        wait_until(
            lambda: not processes_with(token),
            deadline_s=STOP_DEADLINE_S,
            what="the worker's processes (vLLM's EngineCore and model worker) to end",
        )
    finally:
        worker.stop()
        for process in processes_with(token):  # a failed test leaves nothing running either
            process.kill()
