"""VllmEngine embedded in this process, as the worker embeds it: one AsyncLLM on the tiny model
(its EngineCore and rank worker are real child processes) serves every test in this module.

The rank loads the self-benchmark's worker extension, so ``collective_rpc`` reaches the GC policy
in the real rank process and returns each rank's GC state; EngineCore runs the policy's
scheduler, so control requests reach the policy there and return EngineCore's GC report.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import re
from pathlib import Path

import pytest

from dynamo.runtime.request_plane import BadGenerateRequest, GenerateRequest
from dynamo.runtime.sampling import SamplingOptions, StructuredOutputs
from dynamo.vllm import backend_args
from dynamo.vllm.self_benchmark_args import POLICY_FREEZE
from tests.vllm.conftest import OFFLINE_ENV, VLLM_ARGS

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ENGINE_DEADLINE_S = 300.0
POLICY_SCHEDULER = "dynamo.vllm.gc_scheduler.FpmGcScheduler"
# What "GC as before" means in a process: its state, not its counters.
STATE_KEYS = ("thresholds", "isenabled", "heap_frozen", "policy_running", "freeze_thread_alive")
PROCESSES = ("main", "vllm rank", "vllm EngineCore")


def engine_args_scheduler(config) -> str | None:
    from dynamo.vllm import vllm_args

    return vllm_args.engine_args_from_config(config).scheduler_cls


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class EmbeddedEngine:
    """A VllmEngine and the one event loop it lives on (AsyncLLM binds to the first loop)."""

    def __init__(self, engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop

    def run(self, coroutine, timeout_s: float = 120.0):
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, timeout_s))

    def rpc(self, method: str) -> list:
        return self.run(self.engine.collective_rpc(method))


@pytest.fixture(scope="module")
def embedded(tiny_model):
    from dynamo.vllm import vllm_engine
    from dynamo.vllm.worker_extension import QUALNAME
    from dynamo_gc import bench_policy_config

    # Benchmark mode, so vLLM's EngineCore gets the policy's scheduler (serving through it is
    # what every other test here then checks).
    config = backend_args.parse_args(
        [
            "--engine", "vllm", "--model", tiny_model, "--served-model-name", "tiny",
            "--self-benchmark-points", "1", "--fpm-gc-policy", POLICY_FREEZE,
            *VLLM_ARGS,
        ],
        env={},
    )  # fmt: skip
    assert engine_args_scheduler(config) == POLICY_SCHEDULER
    engine = vllm_engine.build_vllm_engine(config, worker_extension_cls=QUALNAME)
    loop = asyncio.new_event_loop()
    # The rank reads the policy from the environment it is started with (as under the worker,
    # which exports it before engine init).
    policy_env = bench_policy_config.policy_env(
        bench_policy_config.PolicyConfig(POLICY_FREEZE, 60.0)
    )
    try:
        with _environ({**OFFLINE_ENV, **policy_env}):
            loop.run_until_complete(asyncio.wait_for(engine.start(), ENGINE_DEADLINE_S))
        yield EmbeddedEngine(engine, loop)
    finally:
        loop.run_until_complete(engine.shutdown())
        loop.close()


def plane_request(token_ids, max_tokens: int, request_id: str = "r", **sampling):
    return GenerateRequest(
        request_id=request_id,
        model="tiny",
        token_ids=list(token_ids),
        sampling=SamplingOptions(max_tokens=max_tokens, **sampling),
    )


def _collect(embedded: EmbeddedEngine, request: GenerateRequest) -> list[dict]:
    async def collect():
        return [item async for item in embedded.engine.generate(request)]

    return embedded.run(collect())


def _tokens(items: list[dict]) -> list[int]:
    return [t for item in items[:-1] for t in item["token_ids"]]


def test_the_policy_starts_and_stops_in_each_real_rank(embedded):
    before = embedded.rpc("fpm_gc_state")
    assert len(before) == 1  # tensor parallel size 1: one rank
    assert before[0]["pid"] != os.getpid()  # a real rank process, not this one
    assert before[0]["policy_running"] is False

    assert embedded.rpc("fpm_gc_start") == [True]
    running = embedded.rpc("fpm_gc_state")
    assert running[0]["policy_running"] is True
    assert running[0]["freeze_thread_alive"] is True
    assert running[0]["thresholds"] != before[0]["thresholds"]  # automatic gen2 turned off
    # A real step while the policy runs in the rank.
    embedded.run(embedded.engine.forward_pass(4, 32))

    assert embedded.rpc("fpm_gc_stop") == [None]  # upstream's extension returns nothing
    after = embedded.rpc("fpm_gc_state")
    assert after[0]["policy_running"] is False
    assert after[0]["freeze_thread_alive"] is False
    # The rank's GC state is as before the policy: stock thresholds, the enabled flag, and
    # frozen again exactly when it was frozen before (vLLM freezes its engine processes).
    assert after[0]["thresholds"] == before[0]["thresholds"]
    assert after[0]["isenabled"] == before[0]["isenabled"]
    assert after[0]["heap_frozen"] == before[0]["heap_frozen"], (before, after)
    assert after[0]["pid"] == before[0]["pid"]


def test_generate_streams_token_ids_then_a_final_item(embedded):
    items = _collect(embedded, plane_request([5, 6, 7, 8], 6, "stream"))
    final = items[-1]
    tokens = _tokens(items)
    assert final["finish_reason"] in ("length", "stop")
    assert final["prompt_tokens"] == 4
    assert final["completion_tokens"] == len(tokens)
    assert 1 <= len(tokens) <= 6
    assert all(0 <= t < embedded.engine.vocab_size for t in tokens)


def test_the_model_card_is_what_vllm_resolved(embedded, tiny_model):
    card = embedded.engine.model_card
    assert card.served_model_name == "tiny"  # --served-model-name, passed on to vLLM
    assert embedded.engine.engine_args.served_model_name == ["tiny"]
    assert card.model_path == card.tokenizer_path == str(Path(tiny_model).resolve())
    assert card.context_length == 256  # --max-model-len (VLLM_ARGS)
    assert card.eos_token_ids == (1,)  # <|end_of_text|>, tokenizer and generation config
    assert card.chat_template_path is None
    # vLLM's prompt-id bound: the larger of the tokenizer's largest id and the vocabulary - 1
    # (equal for the tiny model, whose embedding has a row per token).
    assert card.max_token_id == embedded.engine.vocab_size - 1


def test_vllm_receives_exactly_the_prompt_ids_sent(embedded, tiny_model):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(tiny_model) / "tokenizer.json"))
    prompt = tokenizer.encode("<|begin_of_text|><|user|>\nSay hello.<|end_of_text|>\n").ids
    seen: list[tuple[list[int], list[int]]] = []
    vllm_engine = embedded.engine.engine
    real_generate = vllm_engine.generate

    async def spying_generate(prompt_input, params, request_id, **kwargs):
        async for output in real_generate(prompt_input, params, request_id, **kwargs):
            # What we handed vLLM, and what vLLM reports it ran as the prompt.
            seen.append((list(prompt_input["prompt_token_ids"]), list(output.prompt_token_ids)))
            yield output

    vllm_engine.generate = spying_generate
    try:
        items = _collect(embedded, plane_request(prompt, 2, "exact-ids"))
    finally:
        del vllm_engine.generate  # the instance attribute goes; the class's method is back
    assert seen and all(given == reported == prompt for given, reported in seen), seen
    assert items[-1]["prompt_tokens"] == len(prompt)


def test_an_id_outside_the_vocabulary_is_refused_before_the_first_item(embedded):
    vocab_size = embedded.engine.vocab_size
    with pytest.raises(
        BadGenerateRequest, match=f"^Token id {vocab_size} is out of vocabulary"
    ) as excinfo:
        _collect(embedded, plane_request([5, vocab_size], 2, "big-ids"))
    assert excinfo.value.field == "token_ids.1"


def test_a_prompt_that_fills_max_model_len_is_refused(embedded):
    with pytest.raises(BadGenerateRequest, match="max_model_len 256"):
        _collect(embedded, plane_request([5] * 256, 2, "too-long"))


def test_seed_and_temperature_give_the_same_completion_twice(embedded):
    def sample(seed: int) -> list[int]:
        options = {"seed": seed, "temperature": 1.0, "ignore_eos": True}
        return _tokens(_collect(embedded, plane_request([5, 6, 7], 12, f"seed-{seed}", **options)))

    first, second = sample(1234), sample(1234)
    assert first == second and len(first) == 12


def test_a_stop_string_ends_the_completion(embedded, tiny_model):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(tiny_model) / "tokenizer.json"))
    options = {"seed": 99, "temperature": 1.0, "ignore_eos": True}
    free = _tokens(_collect(embedded, plane_request([5, 6, 7], 16, "free", **options)))
    # A stop string the seeded completion reaches at its 6th-or-later token, not before.
    for cut in range(6, len(free)):
        before = tokenizer.decode(free[: cut - 1])
        text = tokenizer.decode(free[:cut])
        stop = text[len(before) :].strip()
        if stop and stop not in before:
            break
    else:
        pytest.fail(f"no usable stop string in {tokenizer.decode(free)!r}")
    items = _collect(embedded, plane_request([5, 6, 7], 16, "stopped", stop=(stop,), **options))
    stopped = _tokens(items)
    assert items[-1]["finish_reason"] == "stop", (stop, items)
    assert len(stopped) < len(free) and stopped == free[: len(stopped)]
    assert stop in tokenizer.decode(stopped)


def test_sampling_vllm_refuses_is_a_bad_request(embedded):
    # Options the wire format accepts but vLLM's own checks refuse are a 400, never a crash:
    # min_tokens above max_tokens, built past our validation (as a peer of another version
    # could send it).
    options = SamplingOptions.model_construct(
        **{**SamplingOptions(max_tokens=4).model_dump(), "min_tokens": 5}
    )
    request = GenerateRequest.model_construct(
        request_id="min-gt-max", model="tiny", token_ids=[5], sampling=options
    )
    with pytest.raises(BadGenerateRequest, match="min_tokens") as excinfo:
        _collect(embedded, request)
    assert excinfo.value.field == "sampling"


def test_a_structured_output_constraint_reaches_vllm_and_shapes_the_completion(
    embedded, tiny_model
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    regex = StructuredOutputs(regex="[0-9]{3}")
    items = _collect(embedded, plane_request([5, 6], 16, "regex", structured_outputs=regex))
    assert items[-1]["finish_reason"] == "stop"
    assert re.fullmatch("[0-9]{3}", tokenizer.decode(_tokens(items), skip_special_tokens=True))
    choice = StructuredOutputs(choice=("yes", "no"))
    items = _collect(embedded, plane_request([5, 6], 16, "choice", structured_outputs=choice))
    assert tokenizer.decode(_tokens(items), skip_special_tokens=True) in ("yes", "no")


def test_a_schema_vllm_cannot_compile_is_refused_naming_the_constraint(embedded):
    bad = StructuredOutputs(json_schema='{"type": "no-such-type"}')
    with pytest.raises(BadGenerateRequest) as excinfo:
        _collect(embedded, plane_request([5], 4, "bad-schema", structured_outputs=bad))
    assert excinfo.value.field == "sampling.structured_outputs"
    assert "no-such-type" in str(excinfo.value)  # vLLM's words: the worker's log, not a client's


def test_every_constraint_field_maps_onto_vllms_structured_outputs_params():
    from vllm.sampling_params import StructuredOutputsParams

    from dynamo.vllm.vllm_sampling import sampling_params, structured_outputs_params

    assert structured_outputs_params(None) is None
    options = {"disable_any_whitespace": True, "disable_additional_properties": True,
               "whitespace_pattern": " ?"}  # fmt: skip
    wire = StructuredOutputs(json_schema='{"type": "object"}', **options)
    assert structured_outputs_params(wire) == StructuredOutputsParams(
        json='{"type": "object"}', **options
    )
    for constraint, expected in [
        ({"regex": "a+"}, {"regex": "a+"}), ({"choice": ("a", "b")}, {"choice": ["a", "b"]}),
        ({"grammar": 'root ::= "a"'}, {"grammar": 'root ::= "a"'}),
        ({"json_object": True}, {"json_object": True}),
    ]:  # fmt: skip
        mapped = structured_outputs_params(StructuredOutputs(**constraint))
        assert mapped == StructuredOutputsParams(**expected)
    options = SamplingOptions(max_tokens=3, structured_outputs=StructuredOutputs(regex="a"))
    assert sampling_params(options, {}).structured_outputs == StructuredOutputsParams(regex="a")
    assert sampling_params(SamplingOptions(max_tokens=3), {}).structured_outputs is None


def test_closing_the_stream_aborts_the_request_in_vllm(embedded, caplog):
    caplog.set_level(logging.INFO, logger="dynamo.vllm.vllm_engine")
    # The abort line is the engine protocol's (dynamo.vllm.engine.aborted, within its budget):
    # at INFO there whatever level an earlier test left its parents at.
    caplog.set_level(logging.INFO, logger="dynamo.vllm.engine")

    async def read_one_then_close():
        stream = embedded.engine.generate(plane_request([5, 6, 7], 200, "closed", ignore_eos=True))
        first = await stream.__anext__()
        await stream.aclose()
        return first, embedded.engine.engine.get_num_unfinished_requests()

    first, unfinished = embedded.run(read_one_then_close())
    assert first["token_ids"]
    assert "vLLM request closed-" in caplog.text and "aborted after 1 token(s)" in caplog.text
    assert unfinished == 0


def test_forward_pass_clamps_a_length_beyond_max_model_len(embedded, caplog):
    embedded.run(embedded.engine.forward_pass(2, 4 * embedded.engine.max_model_len))
    assert "does not fit max_model_len" in caplog.text
    assert embedded.engine.engine.get_num_unfinished_requests() == 0


def _engine_core_pid(embedded: EmbeddedEngine) -> int:
    """The pid vLLM itself started EngineCore with (its process manager's only process)."""
    manager = embedded.engine.engine.engine_core.resources.engine_manager
    (process,) = manager.processes
    return process.pid


def _state(report: dict) -> dict:
    return {key: (tuple(report[key]) if key == "thresholds" else report[key]) for key in STATE_KEYS}


def test_engine_core_is_its_own_process_and_runs_the_policy_through_its_scheduler(embedded):
    from dynamo_gc.bench_policy import GEN2_NEVER

    core = embedded.engine.engine_core_call
    before = embedded.run(core("report"))
    rank = embedded.rpc("fpm_gc_state")[0]
    # Three processes: this one, EngineCore (vLLM's own pid for it) and the rank.
    assert before["pid"] == _engine_core_pid(embedded)
    assert len({os.getpid(), before["pid"], rank["pid"]}) == 3
    assert before["label"] == "vllm EngineCore"
    assert before["policy_running"] is False
    assert before["heap_frozen"] is True  # vLLM froze EngineCore after init
    assert before["tracked_objects"] > 0

    started = embedded.run(core("start", interval_s=60.0))
    assert started["result"] is True
    assert started["policy_running"] is True and started["freeze_thread_alive"] is True
    assert started["thresholds"][2] == GEN2_NEVER
    assert started["thresholds"][:2] == before["thresholds"][:2]
    embedded.run(embedded.engine.forward_pass(4, 32))  # a real step under the policy
    assert embedded.run(core("start", interval_s=60.0))["result"] is False  # already running
    maintained = embedded.run(core("maintain", report=False))  # no heap walk: no report
    assert isinstance(maintained["result"], int) and "tracked_objects" not in maintained
    assert embedded.run(core("report"))["heap_frozen"] is True  # frozen again after collecting

    stopped = embedded.run(core("stop"))
    assert stopped["result"] is True
    assert _state(stopped) == _state(before)  # stock thresholds, frozen again as vLLM left it
    assert stopped["pid"] == before["pid"]
    assert embedded.run(core("stop"))["result"] is False  # idempotent


def test_an_unknown_control_command_is_refused_before_it_is_sent(embedded):
    with pytest.raises(ValueError, match="unknown GC control command 'explode'"):
        embedded.run(embedded.engine.engine_core_call("explode"))


def _benchmark_reports(embedded, caplog, policy: str) -> dict[tuple[str, str], dict]:
    """Run the real self-benchmark on the embedded engine; its per-process reports by
    (phase, process)."""
    from dynamo.vllm.self_benchmark import REPORT_LINE, run_self_benchmark
    from dynamo_gc import bench_policy

    config = backend_args.parse_args(
        [
            "--engine", "vllm", "--model", "unused",
            "--self-benchmark-points", "24", "--fpm-gc-policy", policy,
            "--no-freeze-gc-heap", "--gc-pause-log-ms", "50",
        ],
        env={},
    )  # fmt: skip
    caplog.set_level(logging.INFO, logger="dynamo.vllm.self_benchmark")
    saved = gc.get_threshold()
    try:
        summary = embedded.run(run_self_benchmark(embedded.engine, config), timeout_s=300.0)
    finally:
        bench_policy.stop_policy()  # a failed run must not leave this process policed
        gc.set_threshold(*saved)
    assert summary.points == 24 and summary.gc_policy == policy
    reports = {}
    for record in caplog.records:
        message = record.getMessage()
        if message.startswith(REPORT_LINE):
            report = json.loads(message[len(REPORT_LINE) :])
            reports[(report["phase"], report["label"])] = report
    phases = ("before", "sweep_start", "sweep_end", "after")
    assert set(reports) == {(phase, label) for phase in phases for label in PROCESSES}, reports
    return reports


def test_the_self_benchmark_polices_every_process_and_serving_starts_with_stock_gc(
    embedded, caplog
):
    from dynamo_gc.bench_policy import GEN2_NEVER

    reports = _benchmark_reports(embedded, caplog, POLICY_FREEZE)
    pids = {label: reports[("before", label)]["pid"] for label in PROCESSES}
    assert pids["main"] == os.getpid() and len(set(pids.values())) == 3
    assert pids["vllm EngineCore"] == _engine_core_pid(embedded)
    for label in PROCESSES:
        before, after = reports[("before", label)], reports[("after", label)]
        assert before["policy_running"] is False
        for phase in ("sweep_start", "sweep_end"):  # the whole sweep, in every process
            during = reports[(phase, label)]
            assert during["policy_running"] and during["freeze_thread_alive"], (label, during)
            assert during["thresholds"][2] == GEN2_NEVER and during["heap_frozen"]
        # Serving starts as if the benchmark never ran: stock thresholds, the enabled flag,
        # frozen exactly as before (EngineCore: vLLM's freeze; main and rank: not frozen here).
        assert _state(after) == _state(before), (label, before, after)
        assert after["pid"] == before["pid"]
        # The pause logger runs in every engine process, at the worker's threshold (this test
        # process is the worker's stand-in: its own logger is main.py's job).
        if label != "main":
            assert after["pause_logger"]["threshold_ms"] == 50.0, (label, after)
    # No automatic full collection in any process during the sweep.
    for label in PROCESSES:
        start, end = reports[("sweep_start", label)], reports[("sweep_end", label)]
        assert end["collections"][2] == start["collections"][2], (label, start, end)


def test_with_the_policy_off_the_self_benchmark_changes_no_process_gc(embedded, caplog):
    reports = _benchmark_reports(embedded, caplog, "off")
    for label in PROCESSES:
        states = [_state(reports[(phase, label)]) for phase in ("before", "sweep_start")]
        states += [_state(reports[(phase, label)]) for phase in ("sweep_end", "after")]
        assert all(state == states[0] for state in states), (label, states)
        assert states[0]["policy_running"] is False
