"""The mock engine's options (``--engine mock``): its pace, context, start-up and heap shape.

Each acts only with ``--engine mock`` (backend_args' prerequisites); ``--mock-heap-evict-percent``
only with ``--mock-heap-growth`` above 0 as well.
"""

from __future__ import annotations

from dynamo.common.configuration import count_option, milliseconds_option
from dynamo.vllm.mock_growth import EVICTING_OBJECTS

MOCK_TOKEN_MS = milliseconds_option(
    "mock-token-ms",
    "DYN_VLLM_MOCK_TOKEN_MS",
    5.0,
    "Mock engine: time per generated token, in milliseconds",
)

MOCK_MAX_MODEL_LEN = count_option(
    "mock-max-model-len",
    "DYN_VLLM_MOCK_MAX_MODEL_LEN",
    None,
    (
        "Mock engine: the context length (prompt + completion) it serves and publishes in the "
        "model card (unset: the model directory's config.json max_position_embeddings, else "
        "tokenizer_config.json model_max_length)"
    ),
    low=1,
    high=10_000_000,
    metavar="TOKENS",
)

MOCK_INIT_MS = milliseconds_option(
    "mock-init-ms",
    "DYN_VLLM_MOCK_INIT_MS",
    0.0,
    (
        "Mock engine: how long engine init takes, in milliseconds, like a real engine "
        "loading its weights (to rehearse start-up probes: /live answers, /health is 503)"
    ),
)

MOCK_HEAP_OBJECTS = count_option(
    "mock-heap-objects",
    "DYN_VLLM_MOCK_HEAP_OBJECTS",
    0,
    (
        "Mock engine: build a synthetic long-lived heap of about N tracked objects at engine "
        "init, shaped like engine imports and tokenizer tables (for demos and benchmarks)"
    ),
    low=0,
    high=50_000_000,
)

MOCK_HEAP_GROWTH = count_option(
    "mock-heap-growth",
    "DYN_VLLM_MOCK_HEAP_GROWTH",
    0,
    (
        "Mock engine: keep N tracked container objects alive per request served, as a cache "
        "of request state would (each request's entry is one reference cycle), so the heap "
        "grows after the start-up freeze as a long-serving process's does (tests and soaks "
        "of --gc-maintenance); 0: none"
    ),
    low=0,
    high=1_000_000,
)

MOCK_HEAP_EVICT_PERCENT = count_option(
    "mock-heap-evict-percent",
    "DYN_VLLM_MOCK_HEAP_EVICT_PERCENT",
    0,
    (
        "Mock engine, with --mock-heap-growth: this share of the requests' entries goes to a "
        f"bounded cache that evicts its oldest entry once it holds {EVICTING_OBJECTS:,} "
        "objects; an "
        "evicted entry is cyclic garbage, which a collection frees unless a freeze pinned it "
        "meanwhile (what --gc-maintenance reclaims); the rest is kept for good"
    ),
    low=0,
    high=100,
    metavar="PERCENT",
)

MOCK_OPTIONS = [
    MOCK_TOKEN_MS,
    MOCK_MAX_MODEL_LEN,
    MOCK_INIT_MS,
    MOCK_HEAP_OBJECTS,
    MOCK_HEAP_GROWTH,
    MOCK_HEAP_EVICT_PERCENT,
]
