"""``python -m dynamo.vllm`` as a real process on loopback: start-up, freeze, discovery, serving,
drain, and bad input.

One worker process (module fixture) serves the read-only tests; the drain and the option
variants get a process each because they end or change it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import signal
import socket
from pathlib import Path

import aiohttp
import pytest

from dynamo.runtime import request_plane
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.discovery.record import ModelRecord
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm.mock_engine import mock_completion
from dynamo.vllm.mock_model import load_mock_model
from tests.support import LauncherProcess, wait_until
from tests.support.processes import start_worker
from tests.support.tiny_model import tiny_tokenizer_dir

pytestmark = pytest.mark.integration

MODEL = "worker-test-model"
HEAP_OBJECTS = 200_000
FREEZE_LINE = r"GC heap frozen \(vllm worker\): collected=\d+ frozen=(\d+)"
REGISTERED_LINE = r"Model registered: model=(\S+) instance=(\w+) endpoint=(\S+)"


def records(directory: Path) -> dict[str, ModelRecord]:
    return DiscoveryStore(directory / "discovery").read_all()


def plane_request(request_id: str, token_ids: list[int], max_tokens: int, **sampling) -> dict:
    """A request-plane v2 body for MODEL."""
    return {
        "request_id": request_id,
        "model": MODEL,
        "token_ids": token_ids,
        "sampling": {"max_tokens": max_tokens, **sampling},
    }


def expected_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    model = load_mock_model(tiny_tokenizer_dir(), served_model_name=MODEL)
    return mock_completion(model, prompt, SamplingOptions(max_tokens=max_tokens))[0]


def as_dict(item: request_plane.StreamItem) -> dict:
    """A typed stream item as the wire's JSON object (a Finish without ids has none)."""
    return item.model_dump(exclude_defaults=True)


async def generate(endpoint: str, request: dict) -> list[dict]:
    async with aiohttp.ClientSession() as session:
        return [as_dict(item) async for item in request_plane.generate(session, endpoint, request)]


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    directory = tmp_path_factory.mktemp("worker")
    process = start_worker(
        "worker",
        directory,
        directory / "discovery",
        MODEL,
        "--mock-heap-objects",
        str(HEAP_OBJECTS),
        "--mock-token-ms",
        "2",
    )
    try:
        process.wait_for_log(REGISTERED_LINE)
        yield process, directory
    finally:
        process.stop()


def line_index(log: str, pattern: str) -> int:
    for number, line in enumerate(log.splitlines()):
        if re.search(pattern, line):
            return number
    raise AssertionError(f"no line matches {pattern!r} in:\n{log}")


def test_freezes_once_after_engine_init_and_before_registering(worker):
    process, _ = worker
    log = process.log()
    assert process.count(r"GC heap frozen \(") == 1, log
    frozen = int(re.search(FREEZE_LINE, log).group(1))
    assert frozen >= HEAP_OBJECTS  # the engine's start-up heap is in the permanent generation
    order = [
        line_index(log, r"Worker options: model=\S+ served_model_name=" + MODEL),
        # Bound before engine init (a taken port fails at once); it admits nothing yet.
        line_index(log, r"Request plane listening on http://127\.0\.0\.1:\d+"),
        line_index(log, r"Engine init: starting the mock engine"),
        line_index(log, r"Engine init done"),
        line_index(log, FREEZE_LINE),
        line_index(log, r"Serving phase starting -> serving \(register_model\)"),
        line_index(log, REGISTERED_LINE),
    ]
    assert order == sorted(order), log


def test_registers_a_reachable_endpoint(worker):
    process, directory = worker
    model, instance, endpoint = re.search(REGISTERED_LINE, process.log()).groups()
    (record,) = records(directory).values()
    assert (record.model, record.instance_id, record.endpoint) == (MODEL, instance, endpoint)
    assert model == MODEL  # the instance its log names is the one its record carries

    async def health():
        async with aiohttp.ClientSession() as session:
            async with session.get(endpoint + request_plane.HEALTH_PATH) as response:
                return response.status, await response.json()

    assert asyncio.run(health()) == (200, {"status": "ok"})


def test_generate_streams_the_echo_tokens(worker):
    _, directory = worker
    (record,) = records(directory).values()
    prompt = [101, 102, 103]
    items = asyncio.run(generate(record.endpoint, plane_request("echo", prompt, 6)))
    assert [item["token_ids"][0] for item in items[:-1]] == expected_tokens(prompt, 6)
    assert expected_tokens(prompt, 6)[:3] == prompt
    assert items[-1] == {"finish_reason": "length", "prompt_tokens": 3, "completion_tokens": 6}


def test_client_disconnect_aborts_the_request_in_the_engine(worker):
    process, directory = worker
    (record,) = records(directory).values()

    async def read_one_then_disconnect():
        async with aiohttp.ClientSession() as session:
            stream = request_plane.generate(
                session,
                record.endpoint,
                plane_request("walks-away", [5], 100_000),
            )
            first = await stream.__anext__()
            await stream.aclose()  # leaves the response early: the connection is closed
            return first

    assert as_dict(asyncio.run(read_one_then_disconnect())) == {"token_ids": (5,)}
    process.wait_for_log(r"request walks-away aborted after \d+ token")
    # The worker keeps serving after the abort.
    items = asyncio.run(generate(record.endpoint, plane_request("after", [5], 2)))
    assert items[-1]["finish_reason"] == "length"


def test_sigterm_removes_the_record_finishes_in_flight_requests_and_exits_0(tmp_path):
    # 200 tokens at 10 ms: the request is still streaming when SIGTERM lands (it is sent after
    # the first token), so the drain has a request in flight to wait for.
    process = start_worker(
        "drain", tmp_path, tmp_path / "discovery", MODEL, "--mock-token-ms", "10"
    )
    try:
        process.wait_for_log(REGISTERED_LINE)
        (record,) = records(tmp_path).values()

        async def stream_across_sigterm():
            async with aiohttp.ClientSession() as session:
                items = []
                request = plane_request("in-flight", [7, 8], 200)
                async for item in request_plane.generate(session, record.endpoint, request):
                    items.append(as_dict(item))
                    if len(items) == 1:
                        process.signal(signal.SIGTERM)
                        # The record goes first, while the request is still being served.
                        await asyncio.to_thread(
                            wait_until,
                            lambda: not records(tmp_path),
                            deadline_s=30,
                            what="the discovery record to be removed",
                        )
                return items

        items = asyncio.run(stream_across_sigterm())
        assert process.wait_exit() == 0
    finally:
        process.stop()
    assert items[-1] == {"finish_reason": "length", "prompt_tokens": 2, "completion_tokens": 200}
    assert [item["token_ids"][0] for item in items[:-1]] == expected_tokens([7, 8], 200)
    log = process.log()
    assert re.search(r"Draining: 1 request\(s\) in flight", log), log
    assert re.search(r"requests finished=1 aborted=0", log), log
    order = [
        line_index(log, r"Received SIGTERM: draining"),
        line_index(log, r"Serving phase serving -> draining"),
        line_index(log, r"Model unregistered: model=" + MODEL),
        line_index(log, r"Draining: 1 request"),
        line_index(log, r"Engine shut down"),
        line_index(log, r"Worker stopped"),
    ]
    assert order == sorted(order), log


def test_no_freeze_gc_heap_logs_no_freeze_and_serves(tmp_path):
    process = start_worker(
        "no-freeze",
        tmp_path,
        tmp_path / "discovery",
        MODEL,
        "--no-freeze-gc-heap",
        "--mock-token-ms",
        "0",
    )
    try:
        process.wait_for_log(REGISTERED_LINE)
        (record,) = records(tmp_path).values()
        items = asyncio.run(generate(record.endpoint, plane_request("no-freeze", [3], 2)))
    finally:
        assert process.stop() == 0
    assert items[-1]["completion_tokens"] == 2
    assert process.count(r"GC heap frozen") == 0
    assert process.count(r"GC heap freeze refused") == 0
    assert process.count(r"GC heap freeze disabled \(vllm worker\)") == 1


def test_bad_env_value_exits_2_with_the_message_and_registers_nothing(tmp_path):
    process = start_worker(
        "bad-env", tmp_path, tmp_path / "discovery", MODEL, env={"DYN_VLLM_GC_PAUSE_LOG_MS": "nan"}
    )
    assert process.exit_code() == 2
    log = process.log()
    assert "DYN_VLLM_GC_PAUSE_LOG_MS" in log and "--gc-pause-log-ms" in log and "'nan'" in log
    assert not (tmp_path / "discovery").exists() or records(tmp_path) == {}
    assert "Engine init" not in log


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this environment"
)
def test_engine_vllm_without_vllm_exits_2_naming_the_mock_engine(tmp_path):
    process = start_worker("no-vllm", tmp_path, tmp_path / "discovery", MODEL, "--engine", "vllm")
    assert process.exit_code() == 2
    log = process.log()
    assert "vLLM is not installed" in log and "--engine mock" in log, log
    assert records(tmp_path) == {}


def test_a_taken_request_plane_port_exits_2_before_engine_init_with_one_error_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start_worker(
            "taken-port", tmp_path, tmp_path / "discovery", MODEL, "--request-plane-port", str(port)
        )
        assert process.exit_code() == 2
    log = process.log()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1, log
    assert "--request-plane-port / DYN_VLLM_REQUEST_PLANE_PORT" in errors[0], log
    assert f"127.0.0.1:{port}" in errors[0], log
    assert "Traceback" not in log and "Engine init" not in log, log
    assert records(tmp_path) == {}


def test_a_discovery_dir_that_is_a_file_exits_2_naming_flag_env_and_path(tmp_path):
    not_a_dir = tmp_path / "not-a-dir"
    not_a_dir.write_text("")
    process = LauncherProcess(
        "file-discovery",
        "dynamo.vllm",
        ["--engine", "mock", "--model", MODEL],
        log_dir=tmp_path,
        env={"DYN_DISCOVERY_DIR": str(not_a_dir)},
    )
    assert process.exit_code() == 2
    log = process.log()
    assert "--discovery-dir / DYN_DISCOVERY_DIR" in log and str(not_a_dir) in log, log
    assert "Traceback" not in log and "Engine init" not in log, log
