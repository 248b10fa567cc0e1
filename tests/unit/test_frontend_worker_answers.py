"""What a hostile worker can make the frontend do (issue 19, items 4, 6, 8): the real HTTP
service, registry, router and tiny-model processor in front of hostile aiohttp servers on
127.0.0.1 (tests/support/hostile_worker.py).

* A bad stream item is a 502 ``bad_worker_response`` (not streaming, or before the first item) or
  an OpenAI error event then ``[DONE]`` (mid-stream); never a 500, never worker text.
* The request's own limits are the frontend's: ``max_tokens``, a stop token once ``min_tokens``
  are out, a stop string, whatever the worker keeps sending; the frontend hangs up on it.
* Routing: a failed instance is benched (1 s doubling to 30 s, forgiven at its first success,
  on a fake clock), and a request tries at most three instances (thousands of dead instances:
  test_frontend_dead_instances.py).
"""

from __future__ import annotations

import logging

import pytest
from aiohttp import web

from dynamo.runtime import request_plane
from dynamo.runtime.model_card import MAX_CONTEXT_LENGTH
from tests.support import wait_until_async
from tests.support.answers import assert_openai_error, streamed_text
from tests.support.clock import FakeClock
from tests.support.frontend_fakes import MODEL
from tests.support.hostile_worker import HostileWorker, endless, hostile_worker, raw
from tests.support.routed_frontend import (
    DEADLINE_S,
    LINE_LIMIT,
    answer_of,
    chat,
    frontend,
    frontend_lines,
    line,
    run,
)
from tests.support.tiny_model import tiny_card

# --- a bad stream item -------------------------------------------------------------------------

BAD = {
    "id beyond the vocabulary": line({"token_ids": [10**6]}),
    "finish_reason a number": line(
        {"finish_reason": 1, "prompt_tokens": 1, "completion_tokens": 1}
    ),
    "finish_reason unknown": line(
        {"finish_reason": "eos", "prompt_tokens": 1, "completion_tokens": 1}
    ),
    "negative count": line({"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": -5}),
    "float id": line({"token_ids": [3.0]}),
    "not json": b"<html>502 Bad Gateway</html>\n",
    "oversized line": b'{"token_ids": [' + b"1, " * 24_000 + b"1]}\n",  # 72 KB
    "deep nesting": b"[" * 50_000 + b"\n",
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_first_item_is_a_502_in_the_openai_shape(card, caplog, kind, stream):
    async def scenario():
        async with (
            hostile_worker(raw([BAD[kind]])) as worker,
            frontend(card, worker.endpoint) as (
                client,
                _,
            ),
        ):
            return await answer_of(client, chat(stream=stream))

    status, body = run(scenario)
    assert status == 502, body
    error = assert_openai_error(body)
    assert error["code"] == "bad_worker_response" and error["type"] == "server_error"
    assert "127.0.0.1" not in error["message"] and "token_ids" not in error["message"]
    lines = frontend_lines(caplog)
    assert all(len(text) < LINE_LIMIT and "\n" not in text for text in lines)
    assert not any(r.levelno >= logging.ERROR for r in caplog.records)


@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_item_mid_stream_is_an_error_event_then_done(card, processor, kind):
    good = line({"token_ids": processor.encode_chat("ok")})

    async def scenario():
        async with hostile_worker(raw([good, BAD[kind]])) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                # max_tokens 100: a stream budget (89 KiB) the oversized line fits in
                streamed = await answer_of(client, chat(stream=True, max_tokens=100))
                whole = await answer_of(client, chat(max_tokens=100))
                return streamed, whole

    (stream_status, events), (whole_status, whole) = run(scenario)
    assert stream_status == 200  # the headers went with the first item
    assert streamed_text(events) == "ok" and events[-1] == "[DONE]"
    error = assert_openai_error(events[-2])
    assert error["code"] == "bad_worker_response"
    assert whole_status == 502 and assert_openai_error(whole)["code"] == "bad_worker_response"


@pytest.mark.parametrize(
    "after",
    [
        [b"garbage \x00\n", b"\xff" * 10_000],
        [line({"token_ids": [5]})],
        [line({"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1})],
    ],
    ids=["garbage", "an item", "a second finish line"],
)
def test_a_line_after_the_finish_line_is_a_broken_worker(card, processor, after):
    """Issue 37: the finish line is the worker's last word (docs/security.md, "nothing after
    the finish line"). A worker that sends more is broken, and its answer is not served: a 502,
    or an error event in place of the stream's end."""
    ids = processor.encode_chat("ok")
    finish = line({"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": len(ids)})
    lines = [line({"token_ids": ids}), finish, *after]

    async def scenario():
        async with hostile_worker(raw(lines, hold=True)) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                answers = [await answer_of(client, chat(stream=s)) for s in (False, True)]
                await wait_until_async(lambda: worker.hung_up == 2, deadline_s=DEADLINE_S)
                return answers

    (whole_status, whole), (stream_status, events) = run(scenario)
    assert whole_status == 502 and assert_openai_error(whole)["code"] == "bad_worker_response"
    assert stream_status == 200 and events[-1] == "[DONE]"
    assert assert_openai_error(events[-2])["code"] == "bad_worker_response"
    assert not any(e["choices"][0].get("finish_reason") for e in events[:-2] if e.get("choices"))


@pytest.mark.parametrize("hold", [False, True], ids=["then the end", "then silence"])
def test_blank_lines_or_silence_after_the_finish_line_leave_the_answer_whole(card, processor, hold):
    """Blank lines are no line; a worker that goes silent after its finish line without ending
    its answer is hung up on after FINISH_END_S, the client's answer whole."""
    ids = processor.encode_chat("ok")
    finish = line({"finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": len(ids)})

    async def scenario():
        answer = raw([line({"token_ids": ids}), finish, b"\n \n"], hold=hold)
        async with hostile_worker(answer) as w:
            async with frontend(card, w.endpoint) as (client, _):
                answers = [await answer_of(client, chat(stream=s)) for s in (False, True)]
                if hold:
                    await wait_until_async(lambda: w.hung_up == 2, deadline_s=DEADLINE_S)
                return answers

    (whole_status, whole), (stream_status, events) = run(scenario)
    assert whole_status == 200 and whole["choices"][0]["message"]["content"] == "ok"
    assert stream_status == 200 and streamed_text(events) == "ok" and events[-1] == "[DONE]"


# --- the request's limits are the frontend's ---------------------------------------------------


@pytest.mark.parametrize("per_item", [1, 7, 100])
@pytest.mark.parametrize("max_tokens", [1, 5, 33])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_max_tokens_is_enforced_against_a_worker_that_never_stops(
    card, processor, per_item, max_tokens, stream
):
    word = processor.encode_chat(" word")[:1]
    item = line({"token_ids": word * per_item})

    async def scenario():
        async with hostile_worker(endless([], item)) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                body = chat(stream=stream, max_tokens=max_tokens, ignore_eos=True)
                if stream:
                    body["stream_options"] = {"include_usage": True}
                answer = await answer_of(client, body)
                await wait_until_async(lambda: worker.hung_up == 1, deadline_s=DEADLINE_S)
                return answer

    status, answer = run(scenario)
    assert status == 200
    if stream:
        text = streamed_text(answer)
        finish = [e["choices"][0]["finish_reason"] for e in answer if isinstance(e, dict)
                  and e.get("choices") and e["choices"][0].get("finish_reason")]  # fmt: skip
        usage = [e for e in answer if isinstance(e, dict) and e.get("usage")][-1]["usage"]
    else:
        text = answer["choices"][0]["message"]["content"]
        finish = [answer["choices"][0]["finish_reason"]]
        usage = answer["usage"]
    assert text == processor.tokenizer.decode(word * max_tokens)
    assert finish == ["length"]
    assert usage["completion_tokens"] == max_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_worker_that_never_stops_is_cut_at_the_stream_bound_without_max_tokens(
    tiny_tokenizer_dir, processor, monkeypatch, caplog, stream
):
    """Issue 37: a card may claim up to MAX_CONTEXT_LENGTH tokens, and a request without
    max_tokens gets the rest of that context: the stream's byte budget from it (4 GiB) is capped
    at MAX_STREAM_BYTES (made 2 MiB here, so the test reads that much, not 256 MiB). The
    frontend stops reading there and hangs up: a 502, or an error event mid-stream."""
    monkeypatch.setattr(request_plane, "MAX_STREAM_BYTES", 2 * 1024 * 1024)
    card = tiny_card(tiny_tokenizer_dir, MODEL, context_length=MAX_CONTEXT_LENGTH)
    word = processor.encode_chat(" word")[:1]
    item = line({"token_ids": word * 100})

    async def scenario():
        async with hostile_worker(endless([], item)) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                body = chat(stream=stream, ignore_eos=True)
                del body["max_tokens"]
                answer = await answer_of(client, body)
                await wait_until_async(lambda: worker.hung_up == 1, deadline_s=DEADLINE_S)
                return answer

    status, answer = run(scenario)
    if stream:
        assert status == 200 and answer[-1] == "[DONE]"
        assert assert_openai_error(answer[-2])["code"] == "bad_worker_response"
    else:
        assert status == 502 and assert_openai_error(answer)["code"] == "bad_worker_response"
    assert "more than the stream's budget of bytes" in caplog.text


def test_the_workers_counts_are_not_trusted(card, processor):
    ids = processor.encode_chat(" a b c")
    lie = line({"finish_reason": "length", "prompt_tokens": 2**31 - 1,
                "completion_tokens": 2**31 - 1})  # fmt: skip

    async def scenario():
        async with hostile_worker(raw([line({"token_ids": ids}), lie])) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                return await answer_of(client, chat(max_tokens=10))

    status, body = run(scenario)
    assert status == 200
    assert body["usage"]["completion_tokens"] == len(ids)
    assert body["usage"]["prompt_tokens"] < 100
    assert body["choices"][0]["finish_reason"] == "length"  # the worker's reason is kept


def test_a_stop_token_ends_the_completion_once_min_tokens_are_out(card, processor):
    eos = card.eos_token_ids[0]

    async def scenario():
        async with hostile_worker(endless([], line({"token_ids": [eos]}))) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                answer = await answer_of(client, chat(max_tokens=50, min_tokens=3))
                await wait_until_async(lambda: worker.hung_up == 1, deadline_s=DEADLINE_S)
                return answer

    status, body = run(scenario)
    assert status == 200
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 3


def test_a_stop_string_ends_the_completion_whatever_the_worker_sends(card, processor):
    ids = processor.encode_chat(" one two STOP three")

    async def scenario():
        async with hostile_worker(endless([], line({"token_ids": ids}))) as worker:
            async with frontend(card, worker.endpoint) as (client, _):
                answer = await answer_of(client, chat(max_tokens=200, stop=["STOP"]))
                await wait_until_async(lambda: worker.hung_up == 1, deadline_s=DEADLINE_S)
                return answer

    status, body = run(scenario)
    assert status == 200 and body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["message"]["content"] == " one two "


# --- routing: failure memory, bounded attempts, bounded log ------------------------------------


def toggled(worker_ids: list[int]):
    """An answer that streams a one-token completion while ``up[0]``, else answers 503."""
    up = [False]

    async def answer(request: web.Request, worker: HostileWorker) -> web.StreamResponse:
        await request.read()
        if not up[0]:
            return web.json_response({"error": "down"}, status=503)
        return await raw(
            [line({"token_ids": worker_ids}),
             line({"finish_reason": "length", "prompt_tokens": 1, "completion_tokens": 1})]
        )(request, worker)  # fmt: skip

    return answer, up


def test_a_failed_instance_is_benched_doubling_and_forgiven_at_its_first_success(
    card, processor, caplog
):
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    answer, up = toggled(processor.encode_chat(" x"))

    async def scenario():
        async with hostile_worker(answer) as worker:
            async with frontend(card, worker.endpoint, clock=clock) as (client, _):

                async def attempt(advance: float) -> tuple[int, int]:
                    clock.advance(advance)
                    before = worker.requests
                    status, _ = await answer_of(client, chat(max_tokens=1))
                    return status, worker.requests - before

                plan = [
                    (0, None),  # fails: benched for 1 s
                    (0.5, None),  # benched: 503 without trying
                    (0.6, None),  # tried, fails: 2 s
                    (1.9, None),  # benched
                    (0.2, None),  # tried, fails: 4 s
                    (3.9, None),  # benched
                    (0.2, None),  # tried, fails: 8 s
                    (8.1, None),  # tried, fails: 16 s
                    (16.1, None),  # tried, fails: 30 s (not 32)
                    (29.9, None),  # benched
                    (0.2, None),  # tried, fails: 30 s again, the most
                    (29.9, None),  # benched
                    (0.2, True),  # tried, succeeds: forgiven
                    (0, False),  # fails: benched for 1 s, not 30
                    (0.5, None),  # benched
                    (0.6, None),  # tried after 1 s
                ]
                steps = []
                for advance, state in plan:
                    if state is not None:
                        up[0] = state
                    steps.append(await attempt(advance))
                return steps

    tried = [1, 0, 1, 0, 1, 0, 1, 1, 1, 0, 1, 0, 1, 1, 0, 1]
    assert [n for _, n in run(scenario)] == tried
    lines = frontend_lines(caplog)
    assert sum("answers again" in text for text in lines) == 1
    assert sum("not routed to for 1 s" in text for text in lines) == 2


def test_a_known_model_with_every_instance_benched_is_503_at_once(card):
    async def scenario():
        answer = raw([b'{"error": "down"}'], status=500)
        async with hostile_worker(answer) as worker:
            async with frontend(card, *[worker.endpoint] * 3, clock=FakeClock()) as (client, _):
                first = await answer_of(client, chat())
                tried = worker.requests
                second = await answer_of(client, chat(stream=True))
                return first, tried, second, worker.requests

    (s1, b1), tried, (s2, b2), total = run(scenario)
    assert tried == 3 and total == 3  # three instances tried, then none
    for status, body in ((s1, b1), (s2, b2)):
        assert status == 503
        error = assert_openai_error(body)
        assert error["code"] == "worker_unavailable"
        for internal in ("127.0.0.1", "http://", "ssl:default", "down"):
            assert internal not in error["message"]
