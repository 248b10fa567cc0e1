"""``GET /health`` of a worker instance: how the router and the scout ask a peer whether it is
there (:mod:`.worker_router`, :mod:`.instance_scout`).

The answer is a peer's: a redirect is never followed (a record's endpoint that answered 302
would otherwise have another host, any host, answer for it, and take the probe's time with
it); it is returned as the status it is, which both callers take as a bad answer. The deadline
is the frontend's own time (:class:`~.loop_lag.LoopLag`): the frontend's event-loop lag does not
count against the peer.
"""

from __future__ import annotations

import asyncio

import aiohttp

from dynamo.runtime.request_plane import HEALTH_PATH

from .loop_lag import LoopLag

# How far a probe's deadline may stretch in wall time while the frontend's loop runs behind.
# A live instance's answer needs the loop's turns (a frontend starved to a tenth of a CPU by
# the machine's load took seconds to read it), and a dead one costs its deadline at most this
# many times over: what a request waits for the scout bounds what a client waits (instance_scout).
PROBE_CAP_FACTOR = 10.0
# The probe's deadline is LoopLag.within's.
_NO_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=None, sock_read=None)


def is_redirect(status: int) -> bool:
    return 300 <= status < 400


def describe(status: int | None, timeout_s: float) -> str:
    """What a probe's answer says against its instance, for a log line."""
    if status is None:
        return f"its health probe unanswered within {timeout_s:g} s"
    if is_redirect(status):
        return f"its health probe answered {status}, a redirect (not followed)"
    return f"its health probe answered {status}"


async def probe_health(
    session: aiohttp.ClientSession, endpoint: str, timeout_s: float, lag: LoopLag
) -> int | None:
    """The status ``endpoint``'s ``/health`` answered within ``timeout_s`` of the frontend's
    own time, or None: no answer (refused, reset, silent, not HTTP) in time."""
    url = endpoint.rstrip("/") + HEALTH_PATH

    async def ask() -> int:
        # No timer of aiohttp's besides ours (the session's would be more per probe: probes are
        # thousands at a time, each must stay cheap).
        async with session.get(url, allow_redirects=False, timeout=_NO_TIMEOUT) as response:
            return response.status

    try:
        return await lag.within(ask(), timeout_s, cap_factor=PROBE_CAP_FACTOR)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        return None
