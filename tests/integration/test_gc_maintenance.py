"""Serving-time GC maintenance in real processes on loopback: our frontend and mock workers whose
heap grows with every request (``--mock-heap-growth``), driven over HTTP until each process has
maintained at least once.

* ``withdraw``, two workers of one model, on the file store and on a real etcd: no request
  fails while they take turns out of routing, each worker counts its maintenances in
  ``dynamo_gc_maintenance_total{mode="withdraw"}``, and no serving GC pause reaches the budget
  (the pause logger's threshold is the budget: its WARNING lines are the serving pauses over it);
* ``idle``, one worker and the frontend: the same, each maintaining in place (the frontend's
  maintenance is made due by one full collection through its debug endpoint, with a budget any
  serving full collection reaches).

What is judged whatever the machine's pace is counted, not timed: each worker's maintenance
moved the request state it had grown into the permanent generation, out of every later serving
full collection (``/debug/gc/state``'s frozen count before and after, against the growth that
CPython's count rule requires before the full collection that made the maintenance due; see
:func:`check_growth_frozen`).

The budget here is 300 ms, not the default 50: this machine is shared, its full collections
slow and noisy, and the first serving full collection after a maintenance walks what CPython's
thresholds let grow before it (200k objects on 3.13+, docs/pythons.md). What 50 ms takes is
the soak's to measure (scripts/bench_gc_soak.py, docs/benchmarks.md), not a test's. Serving pauses
over the budget are wall-clock time and only reported, as a warning (check_serving_pauses);
everything else is judged whatever the load.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.request
import warnings

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dynamo_gc.gc_builds import GEN2_NEVER
from tests.support import LauncherProcess, wait_until
from tests.support.processes import listening_url, start_frontend, start_worker

pytestmark = pytest.mark.integration

MODEL = "maintained"
BUDGET_MS = "300"
GROWTH = ("--mock-heap-growth", "2000", "--mock-heap-evict-percent", "10")
SYSTEM_PORT = ("--system-host", "127.0.0.1", "--system-port", "0")
SYSTEM_PORT_LINE = r"System server listening on (http://127\.0\.0\.1:\d+)"
MAINTAINED_LINE = r"GC heap maintained \(([^)]*)\): mode=(\w+) reason=(\w+) "
SERVING_PAUSE_OVER_BUDGET_LINE = r"WARNING .*GC gen\d pause [0-9.]+ ms"
DRIVE_DEADLINE_S = 120.0
CONCURRENCY = 8

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def maintenance_args(mode: str, *extra: str) -> tuple[str, ...]:
    return ("--gc-maintenance", mode, "--gc-pause-budget-ms", BUDGET_MS,
            "--gc-pause-log-ms", BUDGET_MS, *GROWTH, *SYSTEM_PORT, "--debug-gc-endpoint",
            *extra)  # fmt: skip


def gc_state(url: str) -> dict:
    """A process's ``GET /debug/gc/state`` (its thresholds, frozen and unfrozen counts)."""
    with _opener.open(url + "/debug/gc/state", timeout=30) as response:
        return json.loads(response.read())


def check_growth_frozen(name: str, before: dict, after: dict) -> None:
    """The maintenance's effect, by count: the objects a worker grew before maintaining are in
    the permanent generation, where no serving full collection walks them.

    A maintenance is due only after a serving full collection, and CPython runs one only once
    its young collections have seen at least threshold0 x threshold1 x threshold2 more tracked
    objects allocated than freed since the last full one (70k on 3.10-3.12, 200k on 3.13+; the
    25% rule can only delay it). That net growth here is the request state the mock keeps
    (``--mock-heap-growth``, nothing evicted at this scale): a maintenance, collecting then
    freezing everything alive, moves at least that many objects into the permanent
    generation. Half of it is the floor judged (the young garbage and any frozen object freed
    since are the slack); without a maintenance the frozen count would not move at all.

    Where the maintainer holds CPython's automatic full collections off (the third threshold
    at GEN2_NEVER, as /debug/gc/state shows while serving), no serving full collection runs:
    the maintenance is due once the growth's walk, estimated from the generation-1 collections
    since the last full one, reaches the due level, so after one of them at least: threshold0 x
    threshold1 net allocations, half of which is the floor then.
    """
    t0, t1, t2 = before["thresholds"]
    floor = t0 * t1 // 2 if t2 == GEN2_NEVER else t0 * t1 * t2 // 2
    frozen = after["frozen_objects"] - before["frozen_objects"]
    assert frozen >= floor, (
        f"{name}: the maintenances froze {frozen} objects, fewer than the {floor} a serving full "
        f"collection needs grown first (thresholds {before['thresholds']}); before {before}, "
        f"after {after}"
    )


def maintenances(url: str, mode: str) -> float:
    """``dynamo_gc_maintenance_total{mode}`` on a process's /metrics, over both reasons."""
    with _opener.open(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "dynamo_gc_maintenance"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["mode"] == mode
    )


async def drive(url: str, done) -> tuple[int, list[str]]:
    """Chat requests, CONCURRENCY at a time, until ``done()``; (answered, failures)."""
    failures: list[str] = []
    answered = 0
    async with aiohttp.ClientSession() as session:

        async def one(index: int) -> None:
            nonlocal answered
            body = {"model": MODEL, "max_tokens": 4,
                    "messages": [{"role": "user", "content": f"request {index}"}]}  # fmt: skip
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                text = await response.text()
                if response.status != 200:
                    failures.append(f"{response.status}: {text[:300]}")
                else:
                    answered += 1

        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRIVE_DEADLINE_S
        index = 0
        while not await asyncio.to_thread(done):
            assert loop.time() < deadline, f"no maintenance after {answered} requests"
            await asyncio.gather(*(one(index + i) for i in range(CONCURRENCY)))
            index += CONCURRENCY
    return answered, failures


def check_logs(process: LauncherProcess, mode: str) -> list[tuple[str, str, str]]:
    """The process's maintenance lines (context, mode, reason); its serving pauses over the
    budget reported (see :func:`check_serving_pauses`)."""
    log = process.log()
    check_serving_pauses(process.name, re.findall(SERVING_PAUSE_OVER_BUDGET_LINE, log))
    found = re.findall(MAINTAINED_LINE, log)
    assert found and {m for _, m, _ in found} == {mode}, found
    return found


def check_serving_pauses(name: str, over_budget: list[str]) -> None:
    """Serving GC pauses that reached the budget (the pause logger's WARNING lines, its
    threshold the budget) are reported as a warning, never a failure: a pause is wall-clock
    time, which measures the machine as much as the heap (on CI's two cores, with the other
    xdist worker's processes beside it, a walk that takes 100 ms alone took 850 ms). The
    maintenance's effect is judged by counts (check_growth_frozen); pause lengths are the
    soak's to measure (scripts/bench_gc_soak.py, docs/benchmarks.md section 9)."""
    if over_budget:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
        warnings.warn(
            f"{name}: serving pauses over the {BUDGET_MS} ms budget (load {load:.1f} per core, "
            f"not judged: wall-clock): {over_budget}",
            stacklevel=2,
        )


def run_withdraw_pair(log_dir, worker_args, frontend_args, *, discovery_dir=None):
    workers = [
        start_worker(
            f"worker-{i}",
            log_dir,
            discovery_dir,
            MODEL,
            *maintenance_args("withdraw"),
            *worker_args,
            mock_token_ms=1,
        )  # fmt: skip
        for i in range(2)
    ]
    frontend = start_frontend("frontend", log_dir, discovery_dir, *frontend_args)
    try:
        url = listening_url(frontend)
        metrics = [listening_url(w, SYSTEM_PORT_LINE) for w in workers]
        frontend.wait_for_log(rf"added: model={MODEL} .*\(2 instances\)")
        before = [gc_state(m) for m in metrics]

        def each_maintained() -> bool:
            return all(maintenances(m, "withdraw") >= 1 for m in metrics)

        answered, failures = asyncio.run(drive(url, each_maintained))
        assert failures == [] and answered > 0
        for worker, url_of, was in zip(workers, metrics, before, strict=True):
            check_growth_frozen(worker.name, was, gc_state(url_of))
            check_logs(worker, "withdraw")
        # The frontend saw them leave routing and come back.
        assert "Model instance withdrawn" in frontend.log()
    finally:
        codes = [p.stop() for p in (frontend, *workers)]
    assert codes == [0, 0, 0], [p.log()[-3000:] for p in (frontend, *workers)]


def test_withdraw_on_the_file_store(tmp_path):
    run_withdraw_pair(tmp_path, (), (), discovery_dir=tmp_path / "discovery")


def test_withdraw_on_etcd(tmp_path, etcd_server):
    on_etcd = ("--discovery-backend", "etcd", "--etcd-endpoints", etcd_server.url,
               "--namespace", "maintenance")  # fmt: skip
    run_withdraw_pair(tmp_path, on_etcd, on_etcd)


def test_idle_on_one_worker_and_the_frontend(tmp_path):
    discovery = tmp_path / "discovery"
    worker = start_worker("worker", tmp_path, discovery, MODEL, *maintenance_args("idle"),
                          mock_token_ms=1)  # fmt: skip
    frontend = start_frontend(
        "frontend", tmp_path, discovery, "--dyn-gc-maintenance", "idle",
        "--dyn-gc-pause-budget-ms", "0.001", "--dyn-debug-gc-endpoint",
    )  # fmt: skip
    try:
        url = listening_url(frontend)
        worker_metrics = listening_url(worker, SYSTEM_PORT_LINE)
        frontend.wait_for_log(rf"Model added: model={MODEL} ")
        # One serving full collection: with a budget of 1 us, it makes the frontend's due (if
        # the growth's estimated walk has not already: reason ahead), and with no request in
        # flight the frontend maintains at once.
        request = urllib.request.Request(url + "/debug/gc/collect", method="POST")
        with _opener.open(request, timeout=30) as response:
            assert response.status == 200
        wait_until(lambda: maintenances(url, "idle") >= 1, deadline_s=DRIVE_DEADLINE_S)
        lines = re.findall(MAINTAINED_LINE, frontend.log())
        assert {("frontend", "idle")} == {(context, mode) for context, mode, _ in lines}, lines

        before = gc_state(worker_metrics)
        answered, failures = asyncio.run(
            drive(url, lambda: maintenances(worker_metrics, "idle") >= 1)
        )
        assert failures == [] and answered > 0
        check_growth_frozen(worker.name, before, gc_state(worker_metrics))
        check_logs(worker, "idle")
    finally:
        codes = [p.stop() for p in (frontend, worker)]
    assert codes == [0, 0], [p.log()[-3000:] for p in (frontend, worker)]
