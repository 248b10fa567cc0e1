"""The engine protocol behind ``python -m dynamo.vllm``.

The worker's lifecycle (init, self-benchmark, freeze, register, serve, drain) talks to an engine
only through this protocol, so the built-in mock engine and a real vLLM ``AsyncLLM`` adapter are
interchangeable.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.model_card import ModelCard
from dynamo.runtime.request_plane import GenerateRequest, StreamFailed

# An engine's line for each request aborted mid-stream, within a budget: whoever reaches the
# request plane sends requests (a stop string the frontend matched aborts one, too), and a line
# per request would be theirs to multiply.
_aborts = CauseBudgets(logging.getLogger(__name__), logging.INFO, lines=10, interval_s=10.0)


def aborted(engine: str, request_id: str, produced: int) -> None:
    """``<engine> request <id> aborted after <n> token(s)``, within the budget."""
    _aborts.emit("aborted", "%s request %s aborted after %d token(s)", engine, request_id, produced)


class EngineUnavailable(Exception):
    """The selected engine cannot be used here (vLLM is not installed, a bad model directory or
    engine argument): the worker exits 2 with this message."""


class EngineInitFailed(Exception):
    """Engine init failed (e.g. vLLM's "Engine core initialization failed" after its CPU memory
    check): the worker logs this message as one ERROR line and exits 1."""


class EngineDied(StreamFailed):
    """The engine died while serving (a rank or EngineCore process ended): the streams it was
    running end with this message in-band; the worker logs the death once and exits 1."""


class Engine(Protocol):
    """What the worker needs from an engine.

    An engine may also have a ``max_seq_len`` attribute: the longest sequence (in tokens) one
    :meth:`forward_pass` can run, for engines with such a limit (vLLM: its ``max_model_len``
    less the one generated token). The self-benchmark caps its sweep at it; an engine without
    the attribute (the mock) has no limit.
    """

    @property
    def served_model_name(self) -> str:
        """The name clients use (known before :meth:`start`)."""

    @property
    def model_card(self) -> ModelCard:
        """What the frontend needs to serve the model, as the engine resolved it (valid after
        :meth:`start`); published in the worker's discovery record."""

    async def start(self) -> None:
        """Engine init: load the model, start rank processes. Runs before any freeze.

        Raises :class:`EngineInitFailed` when the engine cannot start.
        """

    def generate(self, request: GenerateRequest) -> AsyncGenerator[dict, None]:
        """Stream request-plane items for one request (see dynamo.runtime.request_plane).

        Raises :class:`dynamo.runtime.request_plane.BadGenerateRequest` before the first item
        for a prompt the engine refuses. Closing the iterator (client disconnect) aborts the
        request in the engine.
        """

    async def forward_pass(self, batch_size: int, seq_len: int) -> None:
        """One scheduler step at this point, on every rank (for the self-benchmark)."""

    async def collective_rpc(self, method: str, args: Sequence[Any] = ()) -> list:
        """Call ``method`` on every rank's worker (worker extension methods included)."""

    async def wait_until_dead(self) -> str:
        """Return, saying what died and how, when the engine can no longer serve (a rank or
        EngineCore process ended, or the engine reports itself dead); never while it is healthy.
        The worker awaits it while serving and cancels it before :meth:`shutdown`."""

    async def shutdown(self) -> None:
        """Stop rank processes and release resources; idempotent."""
