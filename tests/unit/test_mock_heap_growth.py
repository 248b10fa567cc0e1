"""The mock engine's growth knob: N tracked objects kept per request, a share of them later
evicted as cyclic garbage (which a freeze pins until a reclaim)."""

from __future__ import annotations

import asyncio
import gc
import weakref

from dynamo.runtime.request_plane import GenerateRequest
from dynamo.runtime.sampling import SamplingOptions
from dynamo.vllm import backend_args
from dynamo.vllm.mock_engine import MockEngine
from dynamo.vllm.mock_growth import EVICTING_OBJECTS, RequestStateCache, request_entry
from tests.support.cycles import Node


def test_an_entry_is_n_tracked_containers_in_one_cycle():
    gc.collect()
    entry = request_entry(100)
    assert gc.is_tracked(entry) and all(gc.is_tracked(part) for part in entry)
    assert len(entry) + 1 == 100
    marker = Node()
    entry.append(marker)
    alive = weakref.ref(marker)
    del entry, marker
    assert alive() is not None  # refcounting cannot free a cycle
    assert gc.collect() >= 100
    assert alive() is None


def test_the_evicted_share_is_spread_evenly_and_the_cache_is_bounded():
    cache = RequestStateCache(10, evict_percent=25, evicting_objects=10_000)
    assert cache.capacity == 1000  # entries of 10 objects
    for _ in range(400):
        cache.add()
    assert (len(cache.kept), len(cache.evicting), cache.evicted) == (300, 100, 0)
    for _ in range(4 * cache.capacity):
        cache.add()
    assert len(cache.evicting) == cache.capacity and cache.evicted == 100
    assert cache.tracked_objects == (len(cache.kept) + cache.capacity) * 10
    # The default bound is in objects: larger entries, fewer of them.
    assert RequestStateCache(1000, 50).capacity == EVICTING_OBJECTS // 1000
    assert RequestStateCache(10 * EVICTING_OBJECTS, 50).capacity == 1
    nothing = RequestStateCache(0, 50)
    nothing.add()
    assert nothing.requests == 0 and nothing.tracked_objects == 0


def test_an_entry_frozen_then_evicted_stays_until_a_reclaim():
    cache = RequestStateCache(50, evict_percent=100)
    cache.add()
    marker = Node()
    cache.evicting[0].append(marker)
    first = weakref.ref(marker)
    del marker
    gc.collect()
    gc.freeze()  # a maintenance froze it while cached
    for _ in range(cache.capacity):
        cache.add()  # ... and the cache evicted it since
    gc.collect()
    assert cache.evicted == 1 and first() is not None  # pinned by the freeze
    gc.unfreeze()
    gc.collect()
    assert first() is None


def test_the_engine_keeps_the_growth_its_options_ask_for(tiny_tokenizer_dir):
    config = backend_args.parse_args(
        ["--mock-heap-growth", "20", "--mock-heap-evict-percent", "50"],
        {"DYN_VLLM_ENGINE": "mock", "DYN_VLLM_MODEL": str(tiny_tokenizer_dir)},
    )
    engine = MockEngine.from_config(config)
    request = GenerateRequest(
        request_id="r",
        model=engine.served_model_name,
        token_ids=[5, 6],
        sampling=SamplingOptions(max_tokens=1, ignore_eos=True),
    )

    async def serve_two() -> None:
        for _ in range(2):
            async for _item in engine.generate(request):
                pass

    asyncio.run(serve_two())
    state = engine.request_state
    assert (state.per_request, state.evict_percent, state.requests) == (20, 50, 2)
    assert (len(state.kept), len(state.evicting)) == (1, 1)
