"""``n`` > 1 in the frontend: n request-plane requests (seed + index, as vLLM's parallel
sampling), choices indexed 0..n-1, whole and streamed interleaved, usage counting the prompt
once, each choice's own stop and finish reason and logprobs, one child's failure failing the
request, every child closed when the client goes, and the bounds of n and best_of.

The worker is a request-plane server whose answer depends on the seed (a choice's seed picks
its ids), so the choices differ and a test can tell them apart; the real engine's choices are
checked in tests/vllm/test_logprobs_vllm.py."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from dynamo.frontend.routing.worker_router import WorkerRouter
from dynamo.runtime.sampling import SamplingOptions
from tests.support import wait_until_async
from tests.support.answers import assert_openai_error, sse_events
from tests.support.frontend_fakes import MODEL, echo_logprobs, frontend, request_plane_server
from tests.support.tiny_model import tiny_card

HELLO = [{"role": "user", "content": "hello"}]
TOKENS = 4
ANSWER_DEADLINE_S = 30  # far below WORKER_READ_TIMEOUT_S, what a choice still opening waits


@pytest.fixture
def card(tiny_tokenizer_dir):
    return tiny_card(tiny_tokenizer_dir, MODEL)


class SeededEngine:
    """Answers ``TOKENS`` ids starting at 10 + seed (seed 0 when none); ``fail_seed`` fails
    in-band after its first id; ``hold`` keeps every stream open after its first id;
    ``fail_first`` fails that seed before its first id, ``hold_first`` holds those seeds
    before theirs (still opening). ``first_sent``: the seeds whose first id went out."""

    def __init__(
        self,
        fail_seed: int | None = None,
        hold: bool = False,
        *,
        fail_first: int | None = None,
        hold_first: frozenset[int] = frozenset(),
    ) -> None:
        self.fail_seed = fail_seed
        self.hold = hold
        self.fail_first = fail_first
        self.hold_first = hold_first
        self.bodies: list[dict] = []
        self.aborted = 0
        self.aborted_seeds: list[int] = []
        self.first_sent: list[int] = []

    async def generate(self, body: dict):
        sampling = SamplingOptions.model_validate(body["sampling"])
        self.bodies.append(body)
        seed = sampling.seed or 0
        produced = 0
        try:
            if seed == self.fail_first:
                raise RuntimeError("engine failed before its first token")
            if seed in self.hold_first:
                await asyncio.Event().wait()
            for i in range(min(TOKENS, sampling.max_tokens)):
                token = 10 + seed + i
                item: dict = {"token_ids": [token]}
                if sampling.logprobs is not None:
                    item["logprobs"] = [echo_logprobs(token, sampling.logprobs)]
                yield item
                if produced == 0:
                    self.first_sent.append(seed)
                produced += 1
                if token in sampling.stop_token_ids and not sampling.ignore_eos:
                    break
                if seed == self.fail_seed:
                    raise RuntimeError("engine failed")
                if self.hold:
                    await asyncio.Event().wait()
        except (GeneratorExit, asyncio.CancelledError):
            self.aborted += 1
            self.aborted_seeds.append(seed)
            raise
        yield {"finish_reason": "stop" if produced < TOKENS else "length",
               "prompt_tokens": 3, "completion_tokens": produced}  # fmt: skip


def post(card, path, body, *, stream=False, engine=None):
    engine = engine or SeededEngine()

    async def scenario():
        async with (
            request_plane_server(engine.generate) as endpoint,
            frontend(card, endpoint) as client,
        ):
            response = await client.post(path, json={"model": MODEL, **body, "stream": stream})
            answer = await sse_events(response) if stream else await response.json()
            return response.status, answer

    status, answer = asyncio.run(scenario())
    return status, answer, engine


def chat(card, stream=False, engine=None, **fields):
    body = {"messages": HELLO, "max_tokens": TOKENS, "ignore_eos": True, **fields}
    return post(card, "/v1/chat/completions", body, stream=stream, engine=engine)


def completion(card, stream=False, engine=None, **fields):
    body = {"prompt": "hello", "max_tokens": TOKENS, "ignore_eos": True, **fields}
    return post(card, "/v1/completions", body, stream=stream, engine=engine)


def test_n_choices_are_n_requests_with_seed_plus_index(card):
    status, body, engine = chat(card, n=3, seed=20)
    assert status == 200, body
    assert sorted(b["sampling"]["seed"] for b in engine.bodies) == [20, 21, 22]
    assert len({b["request_id"] for b in engine.bodies}) == 3
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    texts = [c["message"]["content"] for c in body["choices"]]
    assert len(set(texts)) == 3  # each choice its own child's answer
    # vLLM's usage: the prompt once, the completion tokens of every choice.
    assert body["usage"]["completion_tokens"] == 3 * TOKENS
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 3 * TOKENS


def test_without_a_seed_every_child_samples_unseeded(card):
    _, _, engine = completion(card, n=2)
    assert [b["sampling"].get("seed") for b in engine.bodies] == [None, None]


def test_the_choices_of_a_completion_are_indexed_and_whole(card):
    _, one, _ = completion(card, seed=1)
    _, two, _ = completion(card, n=2, seed=0)
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["choices"][1]["text"] == one["choices"][0]["text"]  # choice 1: seed 0 + 1


def test_streamed_choices_interleave_by_index_each_with_its_finish(card):
    _, whole, _ = chat(card, n=2, seed=5)
    _, events, _ = chat(card, stream=True, n=2, seed=5, stream_options={"include_usage": True})
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        text = "".join(c["delta"].get("content") or "" for c in mine)
        assert text == whole["choices"][index]["message"]["content"]
        # The finish rides the last token's chunk (vLLM's shape), and nothing of the choice
        # follows it (the reader runs ahead of the writer: "last" is read with each piece).
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["length"]
        assert mine[-1]["finish_reason"] == "length" and mine[-1]["delta"].get("content")
    usage = [e for e in events if isinstance(e, dict) and e.get("usage")]
    assert usage[-1]["usage"]["completion_tokens"] == 2 * TOKENS and events[-1] == "[DONE]"


def test_each_choice_has_its_own_stop_and_finish_reason(card):
    # Choice i generates 10 + i, 11 + i, ...: stop id 11 ends choice 0 at its second token and
    # choice 1 at its first; choice 2 (12, 13, ...) never meets it.
    status, body, _ = completion(card, n=3, seed=0, stop_token_ids=[11], ignore_eos=False)
    assert status == 200, body
    reasons = [c["finish_reason"] for c in body["choices"]]
    assert reasons == ["stop", "stop", "length"]
    # vLLM's stop_reason: the stop token id that ended the choice, null for length.
    assert [c["stop_reason"] for c in body["choices"]] == [11, 11, None]
    assert body["usage"]["completion_tokens"] == 2 + 1 + TOKENS  # stop tokens counted (vLLM)
    stop_at_11 = {"n": 3, "seed": 0, "stop_token_ids": [11], "ignore_eos": False}
    _, events, _ = completion(card, stream=True, **stop_at_11)
    ends = {
        e["choices"][0]["index"]: e["choices"][0]
        for e in events
        if isinstance(e, dict) and e["choices"] and e["choices"][0]["finish_reason"]
    }
    ended = [(ends[i]["finish_reason"], ends[i]["stop_reason"]) for i in range(3)]
    assert ended == [("stop", 11), ("stop", 11), ("length", None)]


def test_the_models_eos_ends_a_choice_without_a_stop_reason(card):
    """vLLM checks the model's EOS id before the stop ids: ending on it is ``stop`` with no
    ``stop_reason``, even when the client listed it among its stop ids."""
    eos_card = card.model_copy(update={"eos_token_ids": (11, 12)})
    status, body, _ = completion(eos_card, n=3, seed=0, ignore_eos=False, stop_token_ids=[11])
    assert status == 200, body
    ended = [(c["finish_reason"], c["stop_reason"]) for c in body["choices"]]
    # Choice 2 (12, 13, ...) ends on the card's second EOS id: vLLM's stop ids hold it.
    assert ended == [("stop", None), ("stop", None), ("stop", 12)]


def test_each_choice_has_its_own_logprobs(card):
    status, body, _ = completion(card, n=2, seed=0, logprobs=0, return_tokens_as_token_ids=True)
    assert status == 200, body
    tokens = [c["logprobs"]["tokens"] for c in body["choices"]]
    assert tokens == [[f"token_id:{10 + s + i}" for i in range(TOKENS)] for s in (0, 1)]


def test_one_childs_failure_fails_the_request_and_closes_the_others(card):
    engine = SeededEngine(fail_seed=1)
    status, body, _ = chat(card, n=3, seed=0, engine=engine)
    assert_openai_error(body, status, 503)
    _, events, _ = chat(card, stream=True, n=3, seed=0, engine=SeededEngine(fail_seed=1))
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and events[-1] == "[DONE]"


def test_every_child_is_closed_when_the_client_goes(card):
    engine = SeededEngine(hold=True)

    async def scenario():
        async with (
            request_plane_server(engine.generate) as endpoint,
            frontend(card, endpoint) as client,
        ):
            body = {"model": MODEL, "messages": HELLO, "n": 3, "seed": 0, "stream": True}
            response = await client.post("/v1/chat/completions", json=body)
            await response.content.readline()  # the stream started
            response.close()
            with contextlib.suppress(Exception):
                await response.release()
            await wait_until_async(lambda: engine.aborted == 3, deadline_s=10, what="3 aborts")

    asyncio.run(scenario())
    assert len(engine.bodies) == 3


@pytest.fixture
def held(monkeypatch):
    """Every stream the router opens, held here as any other holder might (a log record's
    traceback, a debugger): dropping the last reference cannot close it, only an explicit
    close does, so a test sees whether the frontend closed it."""
    streams: list = []
    open_stream = WorkerRouter.open_stream

    async def holding(self, *args, **kwargs):
        first, stream = await open_stream(self, *args, **kwargs)
        streams.append(stream)
        return first, stream

    monkeypatch.setattr(WorkerRouter, "open_stream", holding)
    return streams


def test_a_childs_failure_while_others_open_closes_them_at_once(card, held):
    # Choice 0 (seed 0) opens and holds; choice 1 fails before its first token; choice 2 is
    # still opening (it would for WORKER_READ_TIMEOUT_S). The request fails at once, and
    # choice 0's and 2's streams are aborted.
    engine = SeededEngine(hold=True, fail_first=1, hold_first=frozenset({2}))

    async def scenario():
        async with (
            request_plane_server(engine.generate) as endpoint,
            frontend(card, endpoint) as client,
        ):
            body = {"model": MODEL, "messages": HELLO, "n": 3, "seed": 0}
            response = await asyncio.wait_for(
                client.post("/v1/chat/completions", json=body), timeout=ANSWER_DEADLINE_S
            )
            assert_openai_error(await response.json(), response.status, 503)
            await wait_until_async(
                lambda: engine.aborted == 2, deadline_s=10, what="choices 0 and 2 aborted"
            )

    asyncio.run(scenario())
    assert sorted(engine.aborted_seeds) == [0, 2] and len(held) == 1


def test_every_child_is_closed_when_the_client_goes_while_they_open(card, held):
    # Choice 0 has opened (its first token read), choice 1 is still opening when the client
    # hangs up: both are aborted by the frontend, not left to whoever drops them last.
    engine = SeededEngine(hold=True, hold_first=frozenset({1}))

    async def scenario():
        async with (
            request_plane_server(engine.generate) as endpoint,
            frontend(card, endpoint) as client,
        ):
            body = {"model": MODEL, "messages": HELLO, "n": 2, "seed": 0, "stream": True}
            request = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
            await wait_until_async(
                lambda: engine.first_sent == [0] and len(engine.bodies) == 2 and held,
                deadline_s=10,
                what="choice 0 open, choice 1 opening",
            )
            request.cancel()  # the client's connection is closed
            with contextlib.suppress(asyncio.CancelledError):
                await request
            await wait_until_async(lambda: engine.aborted == 2, deadline_s=10, what="2 aborts")

    asyncio.run(scenario())
    assert sorted(engine.aborted_seeds) == [0, 1]


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"n": 17}, "n"),
        ({"n": 0}, "n"),
        ({"n": 2, "best_of": 3}, "best_of"),
        ({"best_of": 2}, "best_of"),
        ({"n": 2, "seed": 2**63 - 1}, "seed"),
        ({"n": 2, "temperature": 0}, "n"),  # vLLM: n must be 1 when using greedy sampling
        ({"n": 3, "temperature": 1e-6}, "n"),
    ],
)
def test_the_bounds_of_n_and_best_of_are_400s_naming_the_field(card, fields, param):
    status, body, engine = completion(card, **fields)
    error = assert_openai_error(body, status, 400, param=param)
    assert param in error["message"] and engine.bodies == []


def test_greedy_sampling_with_one_choice_or_an_unset_temperature_is_taken(card):
    assert completion(card, temperature=0)[0] == 200
    assert completion(card, n=2)[0] == 200  # the model's default temperature: not greedy here


def test_best_of_equal_to_n_asks_for_nothing(card):
    status, body, _ = completion(card, n=2, best_of=2)
    assert status == 200 and len(body["choices"]) == 2


def test_an_echo_only_stream_finishes_on_the_echoed_prompts_chunk(card):
    """vLLM (echo, max_tokens 0) streams one chunk: the prompt, with finish_reason length."""
    status, events, _ = completion(card, stream=True, echo=True, max_tokens=0)
    assert status == 200
    chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
    assert len(chunks) == 1, chunks
    assert chunks[0]["choices"][0]["text"] == "hello"
    assert chunks[0]["choices"][0]["finish_reason"] == "length"


def test_every_streamed_completion_chunk_has_a_stop_reason(card):
    """vLLM's completion chunks set stop_reason on each (null until the end), as logprobs."""
    status, events, _ = completion(card, stream=True)
    chunks = [e["choices"][0] for e in events if isinstance(e, dict) and e["choices"]]
    assert all("stop_reason" in c for c in chunks), chunks
