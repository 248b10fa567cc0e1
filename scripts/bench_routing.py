#!/usr/bin/env python3
"""Routing past dead records, idle and loaded (docs/security.md, "Request-plane answers").

One process runs the frontend's real service, registry and router on 127.0.0.1, the tiny
model's ``hf`` processor, in front of dead records and, in some scenarios, one live worker (a
small aiohttp server in the same process, listed last: the first request is routed past every
dead record). Dead records are refused (a port bound and not listening, as a dead process on a
live host) or hanging (a socket that accepts and never answers, as a dead pod's address often
does), each at its own address unless the scenario says one address.

* ``503``: ``--refused`` records and no live instance: how long the first request waits for its
  503 (the scout probes every record once), the records at one address and at as many
  addresses, side by side.
* ``live``: ``--refused`` + ``--hanging`` dead records and the live one, under each load
  (``idle``; ``starved``: the event loop blocked 0.1 s of every 0.15 s, as a frontend that
  shares its CPU), with the probes' deadlines in the frontend's own time (as built) and in wall
  time (its event-loop lag counted against the peer, as before issue 37): whether the first
  request got its 200, and when.

Arms alternate round by round. ``--cpu-hogs N`` runs N busy-loop processes meanwhile (the
machine's own load on top of the scenario's).

    python scripts/bench_routing.py [--rounds N] [--refused N] [--hanging N] [--cpu-hogs N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import statistics
import subprocess
import sys
import time

HOG = "while True: pass"


@contextlib.contextmanager
def refused_endpoints(count: int, distinct: bool):
    sockets = []
    try:
        for _ in range(count if distinct else 1):
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in sockets]
        yield urls if distinct else urls * count
    finally:
        for sock in sockets:
            sock.close()


@contextlib.asynccontextmanager
async def hanging_endpoints(count: int):
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass

    servers = [await asyncio.start_server(hold, "127.0.0.1", 0) for _ in range(count)]
    try:
        yield [f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
    finally:
        for writer in writers:
            writer.close()
        for server in servers:
            server.close()


@contextlib.asynccontextmanager
async def live_worker(token_ids: list[int]):
    from aiohttp import web

    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        finish = {"finish_reason": "length", "prompt_tokens": 1, "completion_tokens": 1}
        for item in ({"token_ids": token_ids}, finish):
            await response.write(json.dumps(item).encode() + b"\n")
        await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def starved_loop(on: bool):
    """The event loop blocked 0.1 s of every 0.15 s (``on``), as tests/support/loop_hog.py."""
    loop = asyncio.get_running_loop()
    timer = None

    def block() -> None:
        nonlocal timer
        time.sleep(0.1)  # the load itself
        timer = loop.call_later(0.05, block)

    if on:
        timer = loop.call_later(0.05, block)
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


@contextlib.contextmanager
def wall_clock_deadlines(on: bool):
    """Probe deadlines in wall time: the loop's lag counted against the peer (before issue 37)."""
    from dynamo.frontend.routing.loop_lag import LoopLag

    saved = LoopLag.lag
    if on:
        LoopLag.lag = lambda self: 0.0  # type: ignore[method-assign]
    try:
        yield
    finally:
        LoopLag.lag = saved  # type: ignore[method-assign]


async def first_requests(card, endpoints: list[str], load_on: bool) -> list[tuple[int, float]]:
    """(status, seconds) of the first two requests through a fresh frontend."""
    import aiohttp
    from aiohttp import web

    from dynamo.frontend.processors.chat_processor import build_chat_processor
    from dynamo.frontend.routing.model_registry import ModelRegistry
    from dynamo.frontend.routing.worker_router import WorkerRouter, create_worker_session
    from dynamo.frontend.serving.http_service import FrontendService
    from dynamo.frontend.serving.http_surface import http_runner
    from dynamo.runtime.discovery import ModelRecord

    registry = ModelRegistry(build_chat_processor)
    for endpoint in endpoints:
        registry.add_instance(
            ModelRecord(model=card.served_model_name, endpoint=endpoint, card=card)
        )
    await registry.wait_idle()
    session = create_worker_session()
    router = WorkerRouter(session)
    runner = http_runner(FrontendService(registry, router).build_app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
    body = {"model": card.served_model_name, "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    results = []
    try:
        async with aiohttp.ClientSession() as client, starved_loop(load_on):
            for _ in range(2):
                started = time.monotonic()
                async with client.post(url, json=body) as response:
                    await response.read()
                    results.append((response.status, time.monotonic() - started))
    finally:
        await router.aclose()
        await session.close()
        await runner.cleanup()
        await registry.aclose()
    return results


async def scenario_503(card, refused: int, distinct: bool) -> list[tuple[int, float]]:
    with refused_endpoints(refused, distinct) as dead:
        return await first_requests(card, dead, load_on=False)


async def scenario_live(
    card, token_ids: list[int], refused: int, hanging: int, starved: bool, wall: bool
) -> list[tuple[int, float]]:
    async with live_worker(token_ids) as live, hanging_endpoints(hanging) as hung:
        with refused_endpoints(refused, True) as dead, wall_clock_deadlines(wall):
            return await first_requests(card, dead + hung + [live], load_on=starved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--refused", type=int, default=3000)
    parser.add_argument("--hanging", type=int, default=300)
    parser.add_argument("--cpu-hogs", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the frontend's lines are not the result

    import resource

    import bench_common

    from dynamo.frontend.processors.chat_processor import build_chat_processor
    from dynamo.runtime.model_card import ModelCard

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 16384)), hard))
    tokenizer = bench_common.tiny_tokenizer_dir()
    card = ModelCard(served_model_name="tiny", model_path=tokenizer, tokenizer_path=tokenizer,
                     context_length=1024)  # fmt: skip
    token_ids = build_chat_processor(card).encode_chat(" y")
    arms_503 = {f"{args.refused} refused, one address": False,
                f"{args.refused} refused, {args.refused} addresses": True}  # fmt: skip
    arms_live = {
        (load, deadlines): (load == "starved", deadlines == "wall time")
        for load in ("idle", "starved")
        for deadlines in ("own time (as built)", "wall time")
    }
    got_503: dict[str, list[list[tuple[int, float]]]] = {arm: [] for arm in arms_503}
    got_live: dict[tuple[str, str], list[list[tuple[int, float]]]] = {a: [] for a in arms_live}
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.cpu_hogs)]
    try:
        for _ in range(args.rounds):
            for arm, distinct in arms_503.items():
                got_503[arm].append(asyncio.run(scenario_503(card, args.refused, distinct)))
            for live_arm, (starved, wall) in arms_live.items():
                got_live[live_arm].append(
                    asyncio.run(
                        scenario_live(card, token_ids, args.refused, args.hanging, starved, wall)
                    )
                )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

    print(f"{args.rounds} rounds per arm, {args.cpu_hogs} busy-loop processes beside\n")
    print("| no live instance | first request | its time (median) | the next one (median) |")
    print("|---|---|---|---|")
    for arm, runs in got_503.items():
        statuses = sorted({first[0] for first, _ in runs})
        print(f"| {arm} | {statuses} | {statistics.median(f[1] for f, _ in runs):.2f} s | "
              f"{statistics.median(n[1] for _, n in runs):.2f} s |")  # fmt: skip
    first = list(got_503.values())
    ratio = statistics.median(f[1] for f, _ in first[1]) / statistics.median(
        f[1] for f, _ in first[0]
    )
    print(f"\n{args.refused} addresses / one address, first 503: {ratio:.1f}x\n")
    print(f"| {args.refused} refused + {args.hanging} hanging + 1 live (last) | deadlines "
          "| first request 200 | its time (median) |")  # fmt: skip
    print("|---|---|---|---|")
    for (load, deadlines), runs in got_live.items():
        served = sum(1 for f, _ in runs if f[0] == 200)
        print(f"| {load} | {deadlines} | {served} of {len(runs)} | "
              f"{statistics.median(f[1] for f, _ in runs):.2f} s |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
