"""The engine protocol behind ``python -m dynamo.vllm``.

The worker's lifecycle (init, self-benchmark, freeze, register, serve, drain) talks to an engine
only through this protocol, so the built-in mock engine and a real vLLM ``AsyncLLM`` adapter are
interchangeable.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Protocol, Sequence


class EngineUnavailable(Exception):
    """The selected engine cannot be used here (e.g. vLLM is not installed)."""


class Engine(Protocol):
    """What the worker needs from an engine.

    An engine may also have a ``max_seq_len`` attribute: the longest sequence (in tokens) one
    :meth:`forward_pass` can run, for engines with such a limit (vLLM: its ``max_model_len``
    less the one generated token). The self-benchmark caps its sweep at it; an engine without
    the attribute (the mock) has no limit.
    """

    model_name: str

    async def start(self) -> None:
        """Engine init: load the model, start rank processes. Runs before any freeze."""

    def generate(self, request: dict) -> AsyncIterator[dict]:
        """Stream request-plane items for one request (see dynamo.runtime.request_plane).

        Closing the iterator (client disconnect) aborts the request in the engine.
        """

    async def forward_pass(self, batch_size: int, seq_len: int) -> None:
        """One scheduler step at this point, on every rank (for the self-benchmark)."""

    async def collective_rpc(self, method: str, args: Sequence[Any] = ()) -> list:
        """Call ``method`` on every rank's worker (worker extension methods included)."""

    async def shutdown(self) -> None:
        """Stop rank processes and release resources; idempotent."""
