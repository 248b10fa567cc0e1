"""The mock engine: its model card and vocabulary from a real tokenizer directory, the echo and
count with vLLM's stop rules, aborts, the start-up heap, and delegation to the rank group."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import types
from pathlib import Path

import pytest

from dynamo.common.utils.synthetic_heap import TRACKED_PER_UNIT
from dynamo.runtime.request_plane import BadGenerateRequest, GenerateRequest
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm import backend_args, engine_factory
from dynamo.vllm.engine import EngineUnavailable
from dynamo.vllm.mock_engine import MockEngine, mock_completion
from dynamo.vllm.mock_model import BadModelDirectory, MockModel, load_mock_model
from tests.support.tiny_model import mock_worker_env, tiny_tokenizer_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> MockModel:
    """The tiny model's tokenizer, loaded as the mock engine loads --model."""
    return load_mock_model(tiny_tokenizer_dir(), served_model_name="m")


def request(token_ids: list[int], max_tokens: int, request_id: str = "r", **sampling):
    return GenerateRequest(
        request_id=request_id,
        model="m",
        token_ids=token_ids,
        sampling=SamplingOptions(max_tokens=max_tokens, **sampling),
    )


async def collect(engine: MockEngine, plane_request: GenerateRequest) -> list[dict]:
    return [item async for item in engine.generate(plane_request)]


def streamed(items: list[dict]) -> list[int]:
    return [t for item in items[:-1] for t in item["token_ids"]]


def encode(model: MockModel, text: str) -> list[int]:
    return model.tokenizer.encode(text).ids


# --- the model card and the vocabulary, from the tokenizer directory ---------------------------


def test_the_card_comes_from_the_tiny_tokenizer_directory(tiny):
    card = tiny.card
    directory = str(Path(tiny_tokenizer_dir()).resolve())
    assert card.served_model_name == "m"
    assert card.model_path == card.tokenizer_path == directory
    assert card.context_length == 512  # tokenizer_config.json model_max_length
    eos = tiny.tokenizer.token_to_id("<|end_of_text|>")
    assert card.eos_token_ids == (eos,)
    assert card.chat_template_path is None
    assert card.max_token_id == tiny.vocab_size - 1  # the tiny vocabulary's ids are contiguous
    assert tiny.vocab_size == tiny.tokenizer.get_vocab_size() and tiny.vocab_size > 500
    assert tiny.special_ids == {0, 1, 2}  # BOS, EOS, pad
    assert tiny.ordinary_ids[0] == 3 and len(tiny.ordinary_ids) == tiny.vocab_size - 3


def test_the_served_name_defaults_to_the_model_directory(tmp_path):
    model = load_mock_model(tiny_tokenizer_dir())
    assert model.card.served_model_name == tiny_tokenizer_dir()


def test_context_length_from_config_json_or_the_option(tmp_path):
    directory = tmp_path / "model"
    shutil.copytree(tiny_tokenizer_dir(), directory)
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 96}))
    assert load_mock_model(str(directory)).card.context_length == 96
    assert load_mock_model(str(directory), max_model_len=40).card.context_length == 40


def test_generation_config_eos_ids_are_added_after_the_tokenizers(tmp_path):
    directory = tmp_path / "model"
    shutil.copytree(tiny_tokenizer_dir(), directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 1, 9]}))
    assert load_mock_model(str(directory)).card.eos_token_ids == (1, 7, 9)


def test_a_chat_template_override_is_published_as_an_absolute_path(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    model = load_mock_model(tiny_tokenizer_dir(), chat_template=str(template))
    assert model.card.chat_template_path == str(template)


@pytest.mark.parametrize(
    "setup, message",
    [
        ("missing", "is not a directory"),
        ("empty", "has no tokenizer.json"),
        ("garbage", "cannot be loaded"),
        ("no-context", "--mock-max-model-len / DYN_VLLM_MOCK_MAX_MODEL_LEN"),
    ],
)
def test_a_directory_the_mock_cannot_serve_says_why(tmp_path, setup, message):
    directory = tmp_path / "model"
    if setup != "missing":
        directory.mkdir()
    if setup == "garbage":
        (directory / "tokenizer.json").write_text("{not a tokenizer")
    if setup == "no-context":
        shutil.copy(Path(tiny_tokenizer_dir()) / "tokenizer.json", directory)
        (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 10**30}))
    with pytest.raises(BadModelDirectory, match=re.escape(message)):
        load_mock_model(str(directory))


def test_a_bad_model_directory_exits_2_naming_the_option(tmp_path, capsys):
    from dynamo.vllm import main as worker_main

    argv = ["--engine", "mock", "--model", str(tmp_path), "--discovery-dir", str(tmp_path / "d")]
    assert worker_main.main(argv) == 2
    err = capsys.readouterr().err
    assert "--model / DYN_VLLM_MODEL" in err and "has no tokenizer.json" in err


# --- what the mock streams -------------------------------------------------------------------


def test_echoes_the_prompt_then_counts_through_the_ordinary_ids(tiny):
    engine = MockEngine(tiny, token_ms=0)
    items = asyncio.run(collect(engine, request([41, 42], 5)))
    ordinary = tiny.ordinary_ids
    assert streamed(items) == [41, 42, ordinary[2], ordinary[3], ordinary[4]]
    assert all(len(item["token_ids"]) == 1 for item in items[:-1])
    assert items[-1] == {"finish_reason": "length", "prompt_tokens": 2, "completion_tokens": 5}
    assert (engine.requests_started, engine.requests_finished, engine.requests_aborted) == (1, 1, 0)


def test_a_prompt_longer_than_max_tokens_is_cut_at_max_tokens(tiny):
    assert mock_completion(tiny, [9, 8, 7, 6], SamplingOptions(max_tokens=2)) == ([9, 8], "length")


def test_counting_wraps_around_the_vocabulary_and_never_emits_a_special_token():
    model = load_mock_model(tiny_tokenizer_dir(), max_model_len=2000)
    tokens, reason = mock_completion(model, [5], SamplingOptions(max_tokens=1500))
    assert reason == "length" and len(tokens) == 1500
    assert not set(tokens[1:]) & model.special_ids
    assert tokens[len(model.ordinary_ids)] == model.ordinary_ids[0]  # wrapped


def test_an_eos_token_stops_with_stop_and_is_streamed(tiny):
    eos = tiny.card.eos_token_ids[0]
    prompt = [41, eos, 42]
    assert mock_completion(tiny, prompt, SamplingOptions(max_tokens=10)) == ([41, eos], "stop")


def test_ignore_eos_runs_past_eos_to_max_tokens(tiny):
    eos = tiny.card.eos_token_ids[0]
    options = SamplingOptions(max_tokens=6, ignore_eos=True)
    tokens, reason = mock_completion(tiny, [41, eos, 42], options)
    assert reason == "length" and tokens[:3] == [41, eos, 42] and len(tokens) == 6


def test_stop_token_ids_stop_even_with_ignore_eos(tiny):
    options = SamplingOptions(max_tokens=10, stop_token_ids=(42,), ignore_eos=True)
    assert mock_completion(tiny, [41, 42, 43], options) == ([41, 42], "stop")


def test_min_tokens_holds_back_every_stop(tiny):
    eos = tiny.card.eos_token_ids[0]
    options = SamplingOptions(max_tokens=10, min_tokens=3)
    tokens, reason = mock_completion(tiny, [41, eos, 42, eos, 43], options)
    assert (tokens, reason) == ([41, eos, 42, eos], "stop")


def test_a_stop_string_in_its_own_decoded_text_stops_the_completion(tiny):
    prompt = encode(tiny, "Hello, frozen heap! Goodbye.")
    tokens, reason = mock_completion(tiny, prompt, SamplingOptions(max_tokens=50, stop=("heap",)))
    assert reason == "stop"
    text = tiny.tokenizer.decode(tokens)
    assert text.endswith("heap") or "heap" in text  # the token that completed it is streamed
    assert "heap" not in tiny.tokenizer.decode(tokens[:-1])  # nothing past that token


def test_a_stop_string_split_across_tokens_and_multibyte_text_is_matched(tiny):
    prompt = encode(tiny, "ab 🧊❄ cd")
    assert len(prompt) > 4  # the emoji is several byte-level tokens
    tokens, reason = mock_completion(tiny, prompt, SamplingOptions(max_tokens=50, stop=("🧊❄",)))
    assert reason == "stop" and tiny.tokenizer.decode(tokens).endswith("🧊❄")


def test_a_stop_string_that_never_appears_runs_to_max_tokens(tiny):
    prompt = encode(tiny, "Hello")
    options = SamplingOptions(max_tokens=8, stop=("zebra",))
    assert mock_completion(tiny, prompt, options)[1] == "length"


def test_the_context_length_ends_a_completion_with_length(tmp_path):
    model = load_mock_model(tiny_tokenizer_dir(), max_model_len=6)
    tokens, reason = mock_completion(model, [41, 42], SamplingOptions(max_tokens=100))
    assert (len(tokens), reason) == (4, "length")


def test_a_prompt_that_fills_the_context_is_refused_before_the_first_item():
    model = load_mock_model(tiny_tokenizer_dir(), max_model_len=3)
    engine = MockEngine(model, token_ms=0)
    with pytest.raises(BadGenerateRequest, match="no room") as excinfo:
        asyncio.run(collect(engine, request([41, 42, 43], 2)))
    assert excinfo.value.field == "token_ids"
    assert engine.requests_started == 0


def test_an_id_outside_the_vocabulary_is_refused_before_the_first_item_as_vllm_does(tiny):
    engine = MockEngine(tiny, token_ms=0)
    largest = tiny.card.max_token_id
    with pytest.raises(BadGenerateRequest, match=f"^Token id {largest + 1} is out of vocabulary"):
        try:
            asyncio.run(collect(engine, request([41, largest, largest + 1], 2)))
        except BadGenerateRequest as exc:
            assert exc.field == "token_ids.2"
            raise
    assert engine.requests_started == 0
    assert streamed(asyncio.run(collect(engine, request([largest], 1)))) == [largest]


def test_closing_the_stream_aborts_the_request(tiny):
    engine = MockEngine(tiny, token_ms=0)

    async def read_one_then_close():
        stream = engine.generate(request([41, 42, 43], 10, request_id="gone"))
        first = await stream.__anext__()
        await stream.aclose()
        return first

    assert asyncio.run(read_one_then_close()) == {"token_ids": [41]}
    assert (engine.requests_finished, engine.requests_aborted) == (0, 1)


def test_cancelling_the_consumer_aborts_the_request(tiny):
    engine = MockEngine(tiny, token_ms=60_000)  # the first step never ends by itself

    async def cancel_mid_step():
        task = asyncio.ensure_future(collect(engine, request([41], 2)))
        while engine.requests_started == 0:  # the task reaches the engine's first step
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(cancel_mid_step(), 30))
    assert engine.requests_aborted == 1


def test_start_builds_and_keeps_the_synthetic_heap(tiny, caplog):
    caplog.set_level("INFO")
    engine = MockEngine(tiny, heap_objects=50_000)
    asyncio.run(engine.start())
    assert len(engine.heap) * TRACKED_PER_UNIT == 50_000
    assert "synthetic start-up heap of ~50000 tracked objects" in caplog.text
    asyncio.run(engine.shutdown())
    assert len(engine.heap) * TRACKED_PER_UNIT == 50_000  # long-lived: kept for the process


def test_no_heap_by_default(tiny):
    engine = MockEngine(tiny)
    asyncio.run(engine.start())
    assert engine.heap == []


def test_forward_pass_without_ranks_is_a_clear_error(tiny):
    engine = MockEngine(tiny)
    asyncio.run(engine.start())
    with pytest.raises(RuntimeError, match="no rank processes: the self-benchmark is off"):
        asyncio.run(engine.forward_pass(4, 128))
    with pytest.raises(RuntimeError, match="no rank processes"):
        asyncio.run(engine.collective_rpc("anything"))


class FakeRankGroup:
    """Records what the engine asks of its rank group (the real one is tested on its own)."""

    instances: list[FakeRankGroup] = []

    def __init__(self, size, *, worker_extension_cls):
        self.size = size
        self.worker_extension_cls = worker_extension_cls
        self.calls: list = []
        FakeRankGroup.instances.append(self)

    async def start(self):
        self.calls.append("start")

    async def collective_rpc(self, method, args=()):
        self.calls.append((method, tuple(args)))
        return [None] * self.size

    async def shutdown(self):
        self.calls.append("shutdown")


@pytest.fixture
def fake_ranks(mocker):
    FakeRankGroup.instances = []
    module = types.ModuleType("dynamo.vllm.ranks")
    module.RankGroup = FakeRankGroup
    mocker.patch.dict(sys.modules, {"dynamo.vllm.ranks": module})
    return FakeRankGroup.instances


def config_for(*argv: str):
    return backend_args.parse_args(
        ["--discovery-dir", "/nonexistent", *argv], env=mock_worker_env()
    )


@pytest.mark.parametrize(
    "argv, size",
    [(["--self-benchmark-points", "3"], 1), (["--tensor-parallel-size", "2"], 2)],
)
def test_rank_group_started_for_the_benchmark_or_tensor_parallel(fake_ranks, argv, size):
    engine = engine_factory.build_engine(config_for(*argv), worker_extension_cls="pkg.Ext")

    async def scenario():
        await engine.start()
        await engine.forward_pass(8, 256)
        result = await engine.collective_rpc("fpm_gc_start")
        await engine.shutdown()
        return result

    assert asyncio.run(scenario()) == [None] * size
    (group,) = fake_ranks
    assert (group.size, group.worker_extension_cls) == (size, "pkg.Ext")
    assert group.calls == [
        "start",
        ("execute_forward", (8, 256)),
        ("fpm_gc_start", ()),
        "shutdown",
    ]


def test_no_rank_group_when_neither_is_configured(fake_ranks):
    engine = engine_factory.build_engine(config_for())
    asyncio.run(engine.start())
    assert fake_ranks == []


def test_factory_builds_the_mock_engine_from_the_options():
    engine = engine_factory.build_engine(
        config_for("--served-model-name", "m1", "--mock-token-ms", "7", "--mock-heap-objects", "30")
    )
    assert isinstance(engine, MockEngine)
    assert (engine.served_model_name, engine.token_s, engine.heap_objects) == ("m1", 0.007, 30)


def test_factory_without_vllm_names_the_way_out(mocker):
    mocker.patch.dict(sys.modules, {"vllm": None})  # `import vllm` raises ImportError
    with pytest.raises(EngineUnavailable) as excinfo:
        engine_factory.build_engine(config_for("--engine", "vllm"))
    message = str(excinfo.value)
    assert "vLLM is not installed" in message
    assert "scripts/setup_vllm_env.sh" in message
    assert "--engine mock" in message


def test_without_ranks_nothing_can_die_and_the_wait_is_cancellable():
    import asyncio

    from dynamo.vllm.mock_engine import MockEngine
    from dynamo.vllm.mock_model import load_mock_model

    async def scenario():
        engine = MockEngine(load_mock_model(tiny_tokenizer_dir()), token_ms=0)
        await engine.start()
        wait = asyncio.ensure_future(engine.wait_until_dead())
        done, _ = await asyncio.wait([wait], timeout=0.2)
        assert not done
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
        await engine.shutdown()
        return wait.cancelled()

    assert asyncio.run(scenario())


@pytest.mark.parametrize(
    "name, value",
    [("logit_bias", ((5, 1.0),)), ("allowed_token_ids", (5,)), ("bad_words", ("snow",)),
     ("structured_outputs", {"regex": "[0-9]+"}),
     ("logprobs", 0),  # no distribution to report: even the sampled token's is refused
     ("prompt_logprobs", 0)],
)  # fmt: skip
def test_the_mock_refuses_what_it_cannot_apply_naming_the_field(name, value):
    from dynamo.runtime.request_plane import BadGenerateRequest
    from dynamo.vllm.mock_engine import MockCompletion
    from dynamo.vllm.mock_model import load_mock_model
    from tests.support.tiny_model import tiny_tokenizer_dir

    model = load_mock_model(tiny_tokenizer_dir(), served_model_name="m")
    sampling = SamplingOptions(max_tokens=4, **{name: value})
    with pytest.raises(BadGenerateRequest) as raised:
        MockCompletion(model, [5, 6], sampling).check_prompt()
    assert raised.value.field == f"sampling.{name}"
