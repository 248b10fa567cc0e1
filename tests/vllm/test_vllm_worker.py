"""The real worker (``python -m dynamo.vllm --engine vllm``) on the tiny model, with the real
frontend.

One module-scoped start serves every test here: two workers started side by side (engine init
dominates, so running them together roughly halves the wait) and one frontend.

* ``frozen``: default options (the serving freeze on) and ``--served-model-name``, paired with
  the frontend;
* ``unfrozen``: ``--no-freeze-gc-heap``, plus a short self-benchmark with the GC policy, so the
  sweep's forward passes are real vLLM steps and the policy runs in the real rank process. It
  has a discovery directory of its own, so the frontend never routes to it.
"""

from __future__ import annotations

import json
import re
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support import LauncherProcess
from tests.support.processes import start_frontend, start_worker
from tests.vllm.conftest import OFFLINE_ENV, VLLM_ARGS

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

START_DEADLINE_S = 360.0  # engine init is 10-40 s alone; two at once on 2 cores, plus imports
EXIT_DEADLINE_S = 60.0
SELF_BENCHMARK_POINTS = 12
FREEZE_LINE = re.compile(r"GC heap frozen \(vllm worker\): collected=\d+ frozen=(\d+) took_ms=")
REGISTERED_LINE = re.compile(r"Model registered: ")

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only


SERVED_NAME = "tiny-served"


@dataclass
class RealVllm:
    model: str
    model_dir: str
    frozen: LauncherProcess
    unfrozen: LauncherProcess
    frontend: LauncherProcess
    frontend_url: str
    frozen_discovery: Path
    unfrozen_output: Path


@pytest.fixture(scope="module")
def real_vllm(tiny_model, tmp_path_factory) -> Iterator[RealVllm]:
    directory = tmp_path_factory.mktemp("real-vllm")
    frozen_discovery = directory / "discovery-frozen"
    processes: list[LauncherProcess] = []
    try:
        # Every pause of 1 ms or more is logged: none may appear after "Worker stopped".
        frozen = start_worker(
            "worker-frozen",
            directory,
            frozen_discovery,
            SERVED_NAME,
            "--gc-pause-log-ms", "1",
            # Upstream's path for the extension, with the policy off (the default): an
            # upstream manifest that sets it by hand on a serving worker must work unchanged.
            "--worker-extension-cls", "dynamo.vllm.gc_policy.FpmGcWorkerExtension",
            vllm_model=tiny_model,
        )  # fmt: skip
        processes.append(frozen)
        unfrozen = start_worker(
            "worker-unfrozen",
            directory,
            directory / "discovery-unfrozen",
            None,  # registered under the model's path
            "--no-freeze-gc-heap",
            "--self-benchmark-points",
            str(SELF_BENCHMARK_POINTS),
            "--self-benchmark-output",
            str(directory / "self-benchmark.jsonl"),
            "--fpm-gc-policy",
            "freeze",
            # Upstream Dynamo's path for the policy's extension (the same class as ours).
            "--worker-extension-cls",
            "dynamo.vllm.gc_policy.FpmGcWorkerExtension",
            vllm_model=tiny_model,
        )
        processes.append(unfrozen)
        frontend = start_frontend("frontend", directory, frozen_discovery)
        processes.append(frontend)
        port = frontend.wait_for_log(
            r"HTTP service listening on http://127\.0\.0\.1:(\d+)", deadline_s=START_DEADLINE_S
        ).group(1)
        frozen.wait_for_log(REGISTERED_LINE.pattern, deadline_s=START_DEADLINE_S)
        frontend.wait_for_log(r"Model added: model=" + re.escape(SERVED_NAME), deadline_s=60)
        unfrozen.wait_for_log(REGISTERED_LINE.pattern, deadline_s=START_DEADLINE_S)
        yield RealVllm(
            model=SERVED_NAME,
            model_dir=tiny_model,
            frozen=frozen,
            unfrozen=unfrozen,
            frontend=frontend,
            frontend_url=f"http://127.0.0.1:{port}",
            frozen_discovery=frozen_discovery,
            unfrozen_output=directory / "self-benchmark.jsonl",
        )
    finally:
        for process in reversed(processes):
            process.stop(deadline_s=EXIT_DEADLINE_S)


def _post_json(url: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )


def test_streamed_chat_completion_through_the_real_frontend(real_vllm):
    request = _post_json(
        real_vllm.frontend_url + "/v1/chat/completions",
        {
            "model": real_vllm.model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    with _opener.open(request, timeout=120) as response:
        assert response.status == 200
        events = [
            line[len(b"data: ") :].decode()
            for line in response.read().splitlines()
            if line.startswith(b"data: ")
        ]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all("error" not in chunk for chunk in chunks), chunks
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert finishes[-1] in ("length", "stop")
    usage = chunks[-1]["usage"]
    # The random model may sample its end-of-text token early; it never runs past max_tokens.
    assert 1 <= usage["completion_tokens"] <= 8
    assert usage["prompt_tokens"] > 0


def test_parent_freezes_its_real_heap_after_engine_init_and_before_register_model(real_vllm):
    log = real_vllm.frozen.log()
    freezes = list(FREEZE_LINE.finditer(log))
    assert len(freezes) == 1, log
    frozen_objects = int(freezes[0].group(1))
    # torch, transformers, vLLM and the AsyncLLM client: ~600k tracked objects here.
    assert frozen_objects >= 200_000, freezes[0].group(0)
    engine_done = log.index("Engine init done")
    registered = REGISTERED_LINE.search(log).start()
    assert engine_done < freezes[0].start() < registered


def test_upstreams_extension_path_with_the_policy_off_loads_and_serves(real_vllm):
    log = real_vllm.frozen.log()
    assert "Injected <class 'dynamo.vllm.gc_policy.FpmGcWorkerExtension'>" in log, log
    assert "GC policy started" not in log  # off: the extension is loaded and does nothing
    assert REGISTERED_LINE.search(log) is not None and "Traceback" not in log


def test_no_freeze_gc_heap_leaves_the_real_parent_unfrozen(real_vllm):
    log = real_vllm.unfrozen.log()
    assert REGISTERED_LINE.search(log) is not None
    assert "GC heap frozen (" not in log
    disabled = log.index("GC heap freeze disabled (vllm worker)")
    assert log.index("Engine init done") < disabled < REGISTERED_LINE.search(log).start()


def test_self_benchmark_runs_real_forward_passes_with_the_policy_in_the_ranks(real_vllm):
    log = real_vllm.unfrozen.log()
    summary = re.search(r"Self-benchmark done: points=(\d+) .* gc_policy=(\w+)", log)
    assert summary is not None, log
    assert summary.group(1) == str(SELF_BENCHMARK_POINTS)
    assert summary.group(2) == "freeze"
    # Every rank started the policy (a rank that did not is logged as unpoliced).
    assert "GC policy did not start in rank" not in log
    # vLLM's rank loaded the extension by upstream's path, and our module logged in that rank.
    assert "Injected <class 'dynamo.vllm.gc_policy.FpmGcWorkerExtension'>" in log, log
    assert "[vllm rank] dynamo_gc.bench_policy: GC policy started" in log, log
    # vLLM's EngineCore ran the policy's scheduler: its own start and stop lines, its pid, in the
    # worker's log, before the sweep's summary (the policy stopped before serving).
    for process in ("vllm rank", "vllm EngineCore"):
        for event in ("started", "stopped"):
            line = re.search(
                rf"INFO pid=(\d+) \[{process}\] dynamo_gc\.bench_policy: GC policy {event}", log
            )
            assert line is not None and line.start() < summary.start(), (process, event, log)
    assert "Using custom scheduler class dynamo.vllm.gc_scheduler.FpmGcScheduler" in log, log
    assert summary.start() < REGISTERED_LINE.search(log).start()


def test_the_record_carries_the_card_vllm_resolved_under_the_served_name(real_vllm):
    (record,) = DiscoveryStore(real_vllm.frozen_discovery).read_all().values()
    assert record.model == SERVED_NAME
    card = record.card
    assert card is not None and card.served_model_name == SERVED_NAME
    assert card.model_path == card.tokenizer_path == str(Path(real_vllm.model_dir).resolve())
    assert card.context_length == 256  # --max-model-len
    assert card.eos_token_ids == (1,)
    with _opener.open(real_vllm.frontend_url + "/v1/models", timeout=30) as response:
        assert [m["id"] for m in json.load(response)["data"]] == [SERVED_NAME]


def test_a_request_for_another_name_is_a_400_from_the_worker(real_vllm):
    (record,) = DiscoveryStore(real_vllm.frozen_discovery).read_all().values()
    body = {
        "request_id": "wrong-name",
        "model": real_vllm.model_dir,  # --model, not the served name
        "token_ids": [5, 6],
        "sampling": {"max_tokens": 2},
    }
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        _opener.open(_post_json(record.endpoint + "/generate", body), timeout=30)
    with excinfo.value as error:
        assert error.code == 400
        assert json.load(error)["field"] == "model"


def test_client_disconnect_aborts_the_request_in_vllm(real_vllm):
    (record,) = DiscoveryStore(real_vllm.frozen_discovery).read_all().values()
    request = _post_json(
        record.endpoint + "/generate",
        {
            "request_id": "disconnect-test",
            "model": SERVED_NAME,
            "token_ids": [72, 105, 33],
            "sampling": {"max_tokens": 200, "ignore_eos": True},
        },
    )
    response = _opener.open(request, timeout=60)
    try:
        first = json.loads(response.readline())
        assert first.get("token_ids"), first
    finally:
        response.close()  # the client goes away mid-stream
    real_vllm.frozen.wait_for_log(
        r"vLLM request disconnect-test-\S+ aborted after \d+ token\(s\)", deadline_s=60
    )


def test_sigterm_stops_the_real_worker_and_its_engine(real_vllm):
    worker = real_vllm.unfrozen
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(EXIT_DEADLINE_S) == 0, worker.log()
    log = worker.log()
    assert len(re.findall(r"Engine shut down in \d+ ms", log)) == 1, log
    assert "Worker stopped" in log
    assert_a_clean_stop(log)


def assert_a_clean_stop(log: str) -> None:
    """No WARNING from the signal on: vLLM's process manager used to SIGKILL EngineCore and its
    worker ("force killing") on every clean stop, 5 s after SIGTERM (the signal goes to the
    worker's pid alone, as Kubernetes sends it)."""
    stopping = log[log.index("Received SIGTERM") :]
    assert "force killing" not in stopping, stopping
    assert "WARNING" not in stopping, stopping


def test_self_benchmark_lengths_stop_at_what_the_model_takes(real_vllm):
    # max_model_len 256 (VLLM_ARGS): a prompt of at most 255 tokens plus the one generated.
    rows = [json.loads(line) for line in real_vllm.unfrozen_output.read_text().splitlines()]
    assert len(rows) == SELF_BENCHMARK_POINTS
    assert max(row["seq"] for row in rows) <= 255, rows
    assert "does not fit max_model_len" not in real_vllm.unfrozen.log()  # nothing clamped


def test_the_frozen_worker_exits_without_leak_reports(real_vllm):
    """With the heap frozen, triton's nanobind objects were never finalized at exit and each
    was reported as leaked; the worker unfreezes once its engine has shut down."""
    worker = real_vllm.frozen
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(EXIT_DEADLINE_S) == 0, worker.log()
    log = worker.log()
    assert "nanobind: leaked" not in log, log
    assert_a_clean_stop(log)
    stopped = log.index("Worker stopped")
    assert re.search(r"GC gen\d pause", log[stopped:]) is None, log[stopped:]


def test_an_engine_that_fails_to_initialise_ends_the_worker_with_one_error_line(
    tiny_model, tmp_path
):
    """vLLM's "Engine core initialization failed" is one ERROR line naming the cause and exit 1,
    not a traceback of ours; nothing registers. The cause here is vLLM's CPU memory check: with
    no --kv-cache-memory-bytes it reserves --gpu-memory-utilization of the node's total memory,
    and 1.0 is always more than is available."""
    args = [a for a in VLLM_ARGS if a not in ("--kv-cache-memory-bytes", "64M")]
    worker = LauncherProcess(
        "worker-init-fails",
        "dynamo.vllm",
        [
            "--model", tiny_model,
            "--discovery-dir", str(tmp_path / "discovery"),
            "--request-plane-host", "127.0.0.1",
            *args,
            "--gpu-memory-utilization", "1.0",
        ],
        log_dir=tmp_path,
        env=OFFLINE_ENV,
    )  # fmt: skip
    assert worker.exit_code(START_DEADLINE_S) == 1, worker.log()
    log = worker.log()
    ours = [line for line in log.splitlines() if " dynamo." in line]
    errors = [line for line in ours if " ERROR " in line]
    assert len(errors) == 1, log
    assert "Cannot start the worker: vLLM engine init failed: " in errors[0], errors
    assert "Engine core initialization failed" in errors[0], errors
    # vLLM's engine core logs its own traceback; the worker adds none.
    assert 'File "' + str(Path(__file__).parents[2] / "components") not in log, log
    assert "Model registered" not in log
    assert DiscoveryStore(tmp_path / "discovery").read_all() == {}


@pytest.mark.parametrize("model", ["/no/such/model/dir", "./no-such-dir", "a/b/c"])
def test_a_model_that_is_neither_a_directory_nor_a_hub_id_exits_2_naming_model(tmp_path, model):
    """vLLM took it for a Hugging Face id and failed with "Repo id must be in the form ...",
    exit 1, after seconds of imports; now as with the mock engine: exit 2 naming --model."""
    worker = LauncherProcess(
        "worker-no-model",
        "dynamo.vllm",
        ["--model", model, "--discovery-dir", str(tmp_path / "discovery")],
        log_dir=tmp_path,
        env=OFFLINE_ENV,
    )
    assert worker.exit_code(EXIT_DEADLINE_S) == 2, worker.log()
    log = worker.log()
    assert f"--model / DYN_VLLM_MODEL is {model!r}: no such file or directory" in log, log
    assert "Repo id" not in log and "Traceback" not in log, log
