"""Send a tokenised request to one of a model's worker instances, over the request plane.

Round-robin over the model's instances, failing over to the next one while no output has been
produced (a dead instance costs a retry, not the request). Connection errors must fail fast:
a SIGKILLed worker's port refuses at once, and a hung one hits the connect or read timeout.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

import aiohttp

from dynamo.runtime import request_plane
from dynamo.runtime.request_plane import WorkerUnavailable

from .model_registry import ModelEntry

logger = logging.getLogger(__name__)

# A worker on loopback accepts within milliseconds; longer means it is stopped or gone.
WORKER_CONNECT_TIMEOUT_S = 5.0
# Longest silence between two items of a worker's stream (a real engine's slowest prefill and
# step fit well inside); past it the request is failed with 503 instead of hanging.
WORKER_READ_TIMEOUT_S = 120.0


def create_worker_session() -> aiohttp.ClientSession:
    """The frontend's one client session to its workers (call inside the running loop)."""
    return aiohttp.ClientSession(
        # limit=0: no client-side cap on concurrent streams; the workers apply backpressure.
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=WORKER_CONNECT_TIMEOUT_S, sock_read=WORKER_READ_TIMEOUT_S
        ),
    )


class NoWorkerAvailable(Exception):
    """Every instance of the model failed before producing output, or none is left.

    ``str()`` is for the client; ``detail`` lists every instance tried, for the log line.
    """

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


class WorkerRouter:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def open_stream(
        self, entry: ModelEntry, plane_request: dict
    ) -> tuple[dict, AsyncGenerator[dict, None]]:
        """The first item of a worker's stream and the stream itself (the caller closes it).

        Waiting for the first item before answering the client lets a dead worker become a
        proper 503 (or a retry on another instance) instead of a stream that breaks at once.
        """
        failures: list[str] = []  # "instance at endpoint: error", in the order tried
        for record in entry.route_order():
            stream = request_plane.generate(self.session, record.endpoint, plane_request)
            try:
                first = await stream.__anext__()
            except (WorkerUnavailable, StopAsyncIteration) as exc:
                await stream.aclose()
                failures.append(
                    f"{record.instance_id} at {record.endpoint}: {exc or 'empty stream'}"
                )
                continue
            except BaseException:
                await stream.aclose()
                raise
            if failures:
                # Served after all, so no other line mentions the dead instance(s): one here.
                logger.warning(
                    "Request %s for model %s failed over after %d unavailable instance(s): %s",
                    plane_request.get("request_id"),
                    entry.name,
                    len(failures),
                    "; ".join(failures),
                )
            return first, stream
        if not failures:
            raise NoWorkerAvailable(f"no worker instance left for model `{entry.name}`")
        # Not logged here: the HTTP service logs the failed request once, with the detail.
        raise NoWorkerAvailable(
            f"no worker for model `{entry.name}` is reachable "
            f"({len(failures)} tried; last: {failures[-1].split(': ', 1)[1]})",
            detail=f"model {entry.name}: {len(failures)} instance(s) unavailable: "
            + "; ".join(failures),
        )
