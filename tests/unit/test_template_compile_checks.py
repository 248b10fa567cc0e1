"""Registration's compile checks (issues 29 and 37): bounded in processes, and scheduled so that
slow-compiling (hostile) templates cannot hold up an ordinary model's registration. The issue's
shape: six records whose templates take longer than the bound to compile, and an ordinary model
registered after them, through the real registry and real compile processes. What is asserted
is counted in timeouts, not in seconds: the ordinary model is served before any hostile check
has spent its timeout (it used to wait for four of them: its check was the seventh in a queue
two wide)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading

import pytest

from dynamo.frontend.processors import compile_checks
from dynamo.frontend.processors.chat_processor import build_chat_processor
from dynamo.frontend.processors.template_sandbox import TemplateSandbox
from dynamo.frontend.routing.model_registry import REFUSAL_LINES, ModelRegistry
from tests.support import wait_until
from tests.support.frontend_fakes import record
from tests.support.tiny_model import tiny_card

ORDINARY = "[{{ messages[0].content }}]"
# ~1 MB that takes Jinja's compiler far longer than any bound here (and little memory at first).
SLOW = "{{ x }}" * 140_000
DEADLINE_S = 300.0


@pytest.fixture
def counted(mocker):
    """Compile processes alive at once, by the memory bound they got (which lane)."""
    alive: dict[int, int] = {}
    most: dict[int, int] = {}
    started = [0]
    counting = threading.Lock()

    class CountedProcess(compile_checks.RenderProcess):
        def __init__(self, memory_bytes: int, **kwargs) -> None:
            with counting:
                alive[memory_bytes] = alive.get(memory_bytes, 0) + 1
                most[memory_bytes] = max(most.get(memory_bytes, 0), alive[memory_bytes])
                started[0] += 1
            self.memory_bytes = memory_bytes
            super().__init__(memory_bytes, **kwargs)

        def kill(self) -> None:
            super().kill()
            with counting:
                alive[self.memory_bytes] -= 1

    mocker.patch.object(compile_checks, "RenderProcess", CountedProcess)
    return alive, most, started


def test_each_lane_runs_at_most_as_many_checks_at_once_as_render_processes(counted):
    """The registry builds models on many threads at once, and each compile check is a fresh
    process: 8 hostile records once started 6 at once (2.87 GB). However many checks are asked
    for together, each lane runs at most as many as the sandbox has processes."""
    alive, most, _ = counted
    checks = compile_checks.CompileChecks(2, timeout_s=1.5, memory_bytes=256 << 20)
    sources = [f"{ORDINARY}{{# {i} #}}" for i in range(6)] + [SLOW + f"{{# {i} #}}" for i in "ab"]
    with concurrent.futures.ThreadPoolExecutor(len(sources)) as threads:
        results = [threads.submit(checks.check, source, {}) for source in sources]
        refused = [r.exception(timeout=DEADLINE_S) is not None for r in results]
    assert refused == [False] * 6 + [True] * 2
    first, second = checks.first_bytes, checks.memory_bytes
    assert most[first] <= 2 and most[second] <= 2, most
    assert checks.second_lane == 2  # only the slow ones
    assert alive == {first: 0, second: 0}


def test_a_template_that_compiled_is_not_checked_again(counted):
    _, _, started = counted
    checks = compile_checks.CompileChecks(1, timeout_s=5.0, memory_bytes=256 << 20)
    checks.check(ORDINARY, {"bos_token": "<s>"})
    checks.check(ORDINARY, {"bos_token": "<s>"})  # another model with the same template
    assert started[0] == 1
    checks.check(ORDINARY, {"bos_token": "<|begin|>"})  # other variables: checked
    assert started[0] == 2


def test_an_ordinary_model_registers_before_any_hostile_compile_check_spends_its_timeout(
    tiny_tokenizer_dir, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    sandbox = TemplateSandbox(2, timeout_s=3.0, memory_mb=2048)  # hostile ones: time, not memory
    cards = []
    for name, source in [*((f"hostile{i}", SLOW + f"{{# {i} #}}") for i in range(6))]:
        path = tmp_path / f"{name}.jinja"
        path.write_text(source, encoding="utf-8")
        cards.append(tiny_card(tiny_tokenizer_dir, name, chat_template_path=str(path)))
    ordinary = tmp_path / "ordinary.jinja"
    ordinary.write_text(ORDINARY, encoding="utf-8")
    cards.append(tiny_card(tiny_tokenizer_dir, "ordinary", chat_template_path=str(ordinary)))

    async def scenario() -> list[str]:
        factory = functools.partial(build_chat_processor, template_check=sandbox.check_compiles)
        registry = ModelRegistry(factory)
        for card in cards:  # the hostile records first, as the issue's
            registry.add_instance(record(card, "http://127.0.0.1:9", card.served_model_name))
        await registry.wait_idle()
        return [entry.name for entry in registry.entries()]

    served = asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))
    assert served == ["ordinary"]
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("model_registry")]
    added = next(
        i for i, line in enumerate(lines) if line.startswith("Model added: model=ordinary")
    )
    refusals = [
        i for i, line in enumerate(lines) if line.startswith("Model refused: model=hostile")
    ]
    # Every hostile model refused (only the ordinary one is served), the lines within the
    # registry's refusal budget.
    assert len(refusals) == min(6, REFUSAL_LINES)
    assert all("took over 3 s to compile" in lines[i] for i in refusals), lines
    # Counted in timeouts: not one hostile check had spent its bound when the ordinary model
    # was served.
    assert added < min(refusals), lines


def test_closing_stops_the_checks_running_and_refuses_those_waiting():
    """The frontend stopping must not wait for hostile checks: the one running is killed, the
    one waiting is refused, long before their timeout."""
    checks = compile_checks.CompileChecks(1, timeout_s=120.0, memory_bytes=2048 << 20)
    errors: dict[str, BaseException | None] = {}

    def check(name: str, source: str) -> None:
        try:
            checks.check(source, {})
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 - what the test looks at
            errors[name] = exc

    running = threading.Thread(target=check, args=("running", SLOW))
    running.start()
    waiting = threading.Thread(target=check, args=("waiting", SLOW + "{# 2 #}"))
    waiting.start()
    wait_until(lambda: checks._running, deadline_s=60.0, what="the first check compiling")
    checks.close()
    for thread in (running, waiting):
        thread.join(timeout=30.0)  # a quarter of the timeout either would otherwise take
        assert not thread.is_alive()
    assert all(
        isinstance(e, compile_checks.ModelFilesError) and "stopping" in str(e)
        for e in errors.values()
    ), errors
    with pytest.raises(compile_checks.ModelFilesError, match="stopping"):
        checks.check(ORDINARY, {})
