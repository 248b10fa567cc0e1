"""Peers' chat templates in the render processes, shared by the ``hf`` tests and the ``vllm`` and
``sglang`` processors' tests in their own environments: the issue-29 template bombs and the
issue-37 failing templates through a real frontend process (whichever chat processor), beside a
healthy model served by a real mock worker; and a processor's requests rendered in real render
processes, compared with a reference's renders."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai

from dynamo.frontend.processors.template_sandbox import TemplateSandbox
from dynamo.runtime.discovery import ModelRecord
from dynamo.runtime.discovery.file_store import DiscoveryStore
from tests.support.processes import listening_url, start_frontend, start_worker
from tests.support.tiny_model import tiny_card, tiny_tokenizer_dir

HEALTHY = "healthy-mock"
TWO: list[Any] = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]
BOMBS = {
    "folding": "{{ ('a' * 250000000) | length }}",
    "conversation": "{% set x = 'a' * (messages|length * 300000000) %}{{ x|length }}",
    "loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
}
# Templates that fail (issue 37): the model's 502, never a 500 with a traceback.
FAILING = {"division": "{{ 1 // 0 }}", "surrogate": "{{ 'x\\ud800y' }}"}


def check_template_bombs(tmp_path: Path, *frontend_args: str) -> None:
    """Six requests to the nested-loops bomb while the healthy model answers, then one to each
    other bomb: every bomb a 503 ``chat_template_limit`` naming its model, never its template,
    one WARNING for the loops' cause; two requests to each failing template, each a 502
    ``chat_template_failed``, one WARNING in all; no traceback; both processes exiting 0."""
    discovery = tmp_path / "discovery"
    worker = start_worker("worker", tmp_path, discovery, HEALTHY, mock_token_ms=1)
    store = DiscoveryStore(discovery)
    for name, source in {**BOMBS, **FAILING}.items():
        path = tmp_path / f"{name}.jinja"
        path.write_text(source, encoding="utf-8")
        card = tiny_card(tiny_tokenizer_dir(), name, chat_template_path=str(path))
        store.register(ModelRecord(model=name, endpoint="http://127.0.0.1:9", card=card))
    frontend = start_frontend(
        "frontend", tmp_path, discovery, "--dyn-template-timeout", "3", *frontend_args
    )
    try:
        url = listening_url(frontend)
        for name in (HEALTHY, *BOMBS, *FAILING):
            frontend.wait_for_log(rf"Model added: model={name} ")
        http = openai.DefaultHttpx2Client(trust_env=False, timeout=60.0)
        with openai.OpenAI(
            base_url=url + "/v1", api_key="unused", http_client=http, max_retries=0
        ) as api:

            def ask(model: str):
                try:
                    return api.chat.completions.create(model=model, messages=TWO, max_tokens=4)
                except openai.APIStatusError as exc:
                    return exc

            with concurrent.futures.ThreadPoolExecutor(8) as threads:
                loops = [threads.submit(ask, "loops") for _ in range(6)]
                healthy = ask(HEALTHY)
                loops_running = not all(bomb.done() for bomb in loops)
                answers = {"loops": [bomb.result() for bomb in loops]}
            answers.update({name: [ask(name)] for name in ("folding", "conversation")})
            failures = [ask(name) for name in FAILING for _ in range(2)]
            after = ask(HEALTHY)
    finally:
        codes = {"frontend": frontend.stop(), "worker": worker.stop()}
    assert codes == {"frontend": 0, "worker": 0}, (codes, frontend.log())
    assert not isinstance(healthy, Exception) and healthy.choices[0].message.content
    assert loops_running  # the healthy model did not wait for the bombs
    assert not isinstance(after, Exception)
    for name, errors in answers.items():
        for error in errors:
            assert isinstance(error, openai.APIStatusError) and error.status_code == 503, error
            body = error.body
            assert isinstance(body, dict), body
            assert body["code"] == "chat_template_limit" and f"`{name}`" in body["message"]
            assert "range" not in body["message"]
    for error in failures:
        assert isinstance(error, openai.APIStatusError) and error.status_code == 502, error
        assert isinstance(error.body, dict) and error.body["code"] == "chat_template_failed"
    log = frontend.log()
    assert log.count("-> 502 chat_template_failed") == 1
    assert "Template render processes ready: processes=2" in log
    assert log.count("Chat template of model loops took over 3 s") == 1
    assert "Traceback" not in log


def bounded_renders(processor: Any, sandbox: Any, requests: list[Any]) -> list[str | Exception]:
    """Each chat request of ``processor`` (built with ``sandbox``'s compile check) rendered in
    ``sandbox``'s processes, in order: the prompt, or what the render raised."""

    async def render_all() -> list[str | Exception]:
        rendered: list[str | Exception] = []
        for request in requests:
            bounded = processor.bounded_render_inputs(request)
            assert bounded is not None  # built with the check: it renders there
            try:
                rendered.append(await sandbox.render(processor.model, *bounded))
            except Exception as exc:  # noqa: BLE001 - the caller compares it with a reference
                rendered.append(exc)
        return rendered

    return asyncio.run(render_all())


def assert_renders_match(
    requests: list[Any], got: list[str | Exception], reference: Callable[[Any], str]
) -> None:
    """Each of ``got`` (:func:`bounded_renders`' results for ``requests``) is the prompt
    ``reference`` renders for its request, or an exception where the reference refuses too."""
    for request, text in zip(requests, got, strict=True):
        try:
            want = reference(request)
        except Exception:  # noqa: BLE001 - a refusal of the reference's must be ours too
            assert isinstance(text, Exception), (request, text)
            continue
        assert text == want, request


@contextlib.contextmanager
def started_sandbox(
    processes: int = 2, *, timeout_s: float, memory_mb: int = 256
) -> Iterator[TemplateSandbox]:
    """Real render processes for the block, stopped after it."""
    sandbox = TemplateSandbox(processes, timeout_s=timeout_s, memory_mb=memory_mb)
    sandbox.start()
    try:
        yield sandbox
    finally:
        sandbox.close()
