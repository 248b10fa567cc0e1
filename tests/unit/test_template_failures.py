"""A chat template that fails is the model's fault, not the client's (issue 37): whatever it
fails with (the issue's lone surrogates, ``range(10**9)``, ``1 // 0``, ``truncate(-5)``,
``10.0 ** 400``; what the sandbox forbids; an attribute a message lacks), every request to its
model is a 502 ``chat_template_failed`` in the OpenAI shape, with render processes and
without, and a template's own ``raise_exception`` is still the client's 400. Never a 500, never
a traceback; the log has one line per cause a minute. The ``vllm`` and ``sglang`` processors run
the same checks in their environments (tests/vllm, tests/sglang)."""

from __future__ import annotations

import asyncio
import logging

import jinja2
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from dynamo.frontend.processors.hf_processor import (
    ChatTemplateError,
    ChatTemplateFailed,
    check_rendered,
    rendering_errors,
)
from dynamo.frontend.serving.http_surface import openai_errors
from tests.support.template_failures import check_template_answers, template_answers


@pytest.mark.parametrize("processes", [2, 0], ids=["render processes", "threads"])
def test_failing_templates_are_the_models_502_and_a_refusal_the_clients_400(
    tiny_tokenizer_dir, tmp_path, caplog, processes
):
    caplog.set_level(logging.INFO)
    answers = template_answers(tiny_tokenizer_dir, tmp_path, "hf", processes=processes, repeat=3)
    check_template_answers(answers, caplog.text)


def test_what_a_template_raises_is_sorted_by_whose_fault_it_is():
    def raising(exc: BaseException):
        with rendering_errors():
            raise exc

    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        raising(jinja2.exceptions.TemplateError("roles must alternate"))  # raise_exception
    # transformers' own checks of a request's arguments, outside the template: the client's.
    with pytest.raises(ChatTemplateError, match="continue_final_message"):
        raising(ValueError("continue_final_message is set but ..."))
    with pytest.raises(ChatTemplateFailed, match="UndefinedError: 'dict object'"):
        raising(jinja2.exceptions.UndefinedError("'dict object' has no attribute 'x'"))
    with pytest.raises(ChatTemplateFailed, match="ZeroDivisionError"):
        raising(ZeroDivisionError("division by zero"))
    with pytest.raises(MemoryError):  # a bound's: the render process answers it
        raising(MemoryError())
    # A ValueError raised while the template's code runs: the template's fault.
    template = jinja2.Environment().from_string("{{ '{:d}'.format('x') }}")
    with pytest.raises(ChatTemplateFailed, match="ValueError: Unknown format code"):
        with rendering_errors():
            template.render()


def test_a_prompt_with_a_lone_surrogate_is_no_prompt():
    assert check_rendered("héllo ❄") == "héllo ❄"
    with pytest.raises(ChatTemplateFailed, match=r"lone surrogate \(U\+DFFF\) at character 2"):
        check_rendered("ab\udfff")


def test_a_bug_of_the_frontends_is_a_500_whose_traceback_is_logged_once_a_minute(caplog):
    """The last resort of the error middleware: whatever a route raises that nothing answers
    (a bug) is a 500 in the OpenAI shape, and its traceback is logged once per exception type
    a minute, so that a peer or a client that finds a bug cannot flood the log with it."""

    async def broken(request: web.Request) -> web.Response:
        raise KeyError(request.query.get("key", "k"))

    async def other(request: web.Request) -> web.Response:
        raise RuntimeError("another bug")

    async def scenario() -> tuple[list[int], int, dict]:
        app = web.Application(middlewares=[openai_errors()])
        app.router.add_get("/broken", broken)
        app.router.add_get("/other", other)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            statuses = [(await client.get(f"/broken?key={i}")).status for i in range(5)]
            other_status = (await client.get("/other")).status
            body = await (await client.get("/broken")).json()
        return statuses, other_status, body

    statuses, other_status, body = asyncio.run(scenario())
    assert statuses == [500] * 5 and other_status == 500
    assert body["error"]["message"] == "internal error in the frontend"
    assert caplog.text.count("Traceback") == 2  # one KeyError, one RuntimeError
    assert caplog.text.count("GET /broken failed") == 1
