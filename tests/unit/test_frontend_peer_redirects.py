"""A worker's redirects and cookies (issue 37, items 1 and 2): the real service, registry and
router in front of real aiohttp servers on 127.0.0.1 (tests/support/hostile_worker.py).

* A redirect is never followed, on any path the frontend talks to a peer on: a request's
  ``POST /generate``, the router's ``GET /health`` of a silent instance, the scout's probes. It
  is a bad answer from that instance: the request fails over (or is a 502 / 503), the instance
  is benched, and the place the redirect named is never asked anything.
* No cookie jar: one worker's ``Set-Cookie`` never reaches another (nor itself).
"""

from __future__ import annotations

import contextlib
import logging

import pytest
from aiohttp import web

from dynamo.frontend.processors.chat_processor import build_chat_processor
from tests.support import wait_until_async
from tests.support.answers import assert_openai_error
from tests.support.hostile_worker import HostileWorker, hostile_worker, raw, silent
from tests.support.routed_frontend import (
    DEADLINE_S,
    answer_of,
    chat,
    dead_endpoint,
    frontend,
    frontend_lines,
    line,
    run,
)
from tests.support.tiny_model import tiny_card

REDIRECTS = [301, 302, 303, 307, 308]


def _served(processor) -> bytes:
    ids = processor.encode_chat(" y")
    finish = {"finish_reason": "length", "prompt_tokens": 1, "completion_tokens": len(ids)}
    return line({"token_ids": ids}) + line(finish)


def _redirect(status: int, to: str):
    """An answer (for /generate or /health) that is a redirect to ``to``."""

    async def answer(request: web.Request, worker: HostileWorker) -> web.StreamResponse:
        await request.read()
        response = web.Response(status=status, headers={"Location": to}, text="moved")
        await response.prepare(request)
        await response.write_eof()
        return response

    return answer


def _untouched(target: HostileWorker) -> None:
    assert (target.requests, target.health_probes) == (0, 0), "a redirect was followed"


@pytest.mark.parametrize("status", REDIRECTS)
def test_a_redirected_generate_is_a_bad_answer_never_followed(card, processor, caplog, status):
    """Alone, the instance's redirect is the client's 502; beside a live instance, the request
    fails over to it. The prompt is never re-sent to where the redirect points."""
    caplog.set_level(logging.INFO)

    async def scenario():
        async with contextlib.AsyncExitStack() as stack:
            target = await stack.enter_async_context(hostile_worker(raw([_served(processor)])))
            where = f"{target.endpoint}/generate?stolen=1"
            moved = await stack.enter_async_context(hostile_worker(_redirect(status, where)))
            live = await stack.enter_async_context(hostile_worker(raw([_served(processor)])))
            async with frontend(card, moved.endpoint) as (client, _):
                alone = await answer_of(client, chat(max_tokens=1))
            # The redirecting instance first (its turn), the live one beside it.
            async with frontend(card, moved.endpoint, live.endpoint) as (client, router):
                beside = await answer_of(client, chat(max_tokens=1))
                benched = [endpoint for _, endpoint in router._benched]
            return alone, beside, benched, target, moved, live

    (alone_status, alone), (beside_status, _), benched, target, moved, live = run(scenario)
    assert_openai_error(alone, alone_status, 502)
    assert beside_status == 200 and live.requests == 1 and moved.requests == 2
    assert benched == [moved.endpoint]
    _untouched(target)
    lines = frontend_lines(caplog)
    assert any(f"answered {status}, a redirect (not followed) to " in text for text in lines)


@pytest.mark.parametrize("status", REDIRECTS)
def test_a_redirected_health_probe_of_a_silent_instance_means_gone(card, processor, status):
    """An instance silent for its first second is asked /health; a redirect there is not an
    answer from it: the request goes on to the live instance, and nothing is asked of the
    place the redirect named."""

    async def scenario():
        async with contextlib.AsyncExitStack() as stack:
            target = await stack.enter_async_context(hostile_worker(raw([_served(processor)])))
            stuck = await stack.enter_async_context(hostile_worker(silent()))
            stuck.health_answer = _redirect(status, f"{target.endpoint}/health")
            live = await stack.enter_async_context(hostile_worker(raw([_served(processor)])))
            async with frontend(card, stuck.endpoint, live.endpoint) as (client, _):
                answer = await answer_of(client, chat(max_tokens=1))
            return answer, target, stuck, live

    (status_code, _), target, stuck, live = run(scenario)
    assert status_code == 200 and live.requests == 1
    assert stuck.requests == 1 and stuck.health_probes >= 1
    _untouched(target)


@pytest.mark.parametrize("status", REDIRECTS)
def test_an_instance_whose_health_redirects_is_never_found_by_the_scout(card, processor, status):
    """After a first attempt fails, the scout probes the other instances: one whose /health
    redirects is benched, never routed to, and the live one takes the request."""

    async def scenario():
        async with contextlib.AsyncExitStack() as stack:
            target = await stack.enter_async_context(hostile_worker(raw([_served(processor)])))
            moved = await stack.enter_async_context(hostile_worker(raw([_served(processor)])))
            moved.health_answer = _redirect(status, f"{target.endpoint}/health")
            live = await stack.enter_async_context(hostile_worker(raw([_served(processor)])))
            # A dead instance first (its turn): its refusal sends the request to the scout.
            dead = dead_endpoint()
            async with frontend(card, dead, moved.endpoint) as (client, _):
                alone = await answer_of(client, chat(max_tokens=1))
            async with frontend(card, dead, moved.endpoint, live.endpoint) as (client, _):
                beside = await answer_of(client, chat(max_tokens=1))
                # The sweep goes on after the live one is found: the redirecting one is probed.
                await wait_until_async(lambda: moved.health_probes >= 2, deadline_s=DEADLINE_S)
            return alone, beside, target, moved, live

    (alone_status, alone), (beside_status, _), target, moved, live = run(scenario)
    assert_openai_error(alone, alone_status, 503)
    assert beside_status == 200 and live.requests == 1
    assert moved.requests == 0
    _untouched(target)


def test_one_workers_cookie_never_reaches_another(tiny_tokenizer_dir):
    """Two models' workers on one host (``localhost``, as a record may name it): the first
    sets a cookie; neither the other nor itself is ever sent it."""
    card_a = tiny_card(tiny_tokenizer_dir, "model-a")
    card_b = tiny_card(tiny_tokenizer_dir, "model-b")
    processor = build_chat_processor(card_a)

    async def setting_cookie(request: web.Request, worker: HostileWorker) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/x-ndjson",
                "Set-Cookie": "session=worker-a-secret; Path=/",
            }
        )
        await response.prepare(request)
        await response.write(_served(processor))
        await response.write_eof()
        return response

    async def scenario():
        async with (
            hostile_worker(setting_cookie, host="localhost") as worker_a,
            hostile_worker(raw([_served(processor)]), host="localhost") as worker_b,
        ):
            async with frontend(
                card_a, worker_a.endpoint, others=[(card_b, worker_b.endpoint)]
            ) as (
                client,
                _,
            ):
                statuses = []
                for model in ("model-a", "model-b", "model-a", "model-b"):
                    statuses.append((await answer_of(client, chat(model=model, max_tokens=1)))[0])
            return statuses, worker_a, worker_b

    statuses, worker_a, worker_b = run(scenario)
    assert statuses == [200] * 4
    assert worker_a.requests == worker_b.requests == 2
    assert worker_a.cookies == [] and worker_b.cookies == []
