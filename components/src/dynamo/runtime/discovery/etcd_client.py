"""Talking to etcd: the client on the endpoints in turn, credentials, bounds and back-off.

Every await on aetcd or gRPC is bounded on the asyncio side too (:data:`CALL_BOUND_S`), so a
completion that never arrives fails like any other RPC. A user and password come from
``ETCD_AUTH_USERNAME`` / ``ETCD_AUTH_PASSWORD`` (upstream Dynamo's names) and are never logged;
aetcd opens plain-text channels only, so upstream's TLS variables are refused, not ignored.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import aetcd
import aetcd.exceptions
import aetcd.rpc
import grpc

from dynamo.runtime.discovery.etcd_endpoints import EtcdEndpoint
from dynamo.runtime.discovery.interface import (
    DiscoverySetupError,
)
from dynamo.runtime.discovery.record import MAX_RECORD_BYTES

logger = logging.getLogger(__name__)

KEY_ROOT = "dynamo-gc"
USERNAME_ENV = "ETCD_AUTH_USERNAME"
PASSWORD_ENV = "ETCD_AUTH_PASSWORD"
TLS_ENVS = ("ETCD_AUTH_CA", "ETCD_AUTH_CLIENT_CERT", "ETCD_AUTH_CLIENT_KEY")
# One etcd call (not a watch stream) that takes longer than this counts as a failure.
RPC_TIMEOUT_S = 5.0
# How long the drain waits for the lease revocation before leaving the key to its TTL.
REVOKE_TIMEOUT_S = 2.0
# Every await on aetcd or gRPC is bounded on the asyncio side too, a little past gRPC's own
# deadline: a completion that never arrives (a call queued behind aetcd's watch lock or its
# bounded request queue, a gRPC event that reaches no loop) must fail like any other RPC, never
# hang the keep-alive, the watcher, a stop or a drain. Closing a client gets a shorter bound.
CALL_BOUND_S = RPC_TIMEOUT_S + 1.0
CLOSE_BOUND_S = 2.0
BACKOFF_INITIAL_S = 0.25
BACKOFF_MAX_S = 5.0
# Keys per range request when listing: a page of records at the size limit still fits in one
# gRPC message (below); ordinary records are ~1 KiB, so 1,000 of them take 20 round trips.
LIST_PAGE = 50
CHANNEL_OPTIONS = {
    # gRPC's own reconnect back-off grows to 120 s: a restarted etcd would stay unused for
    # minutes. Ours (above) is the one that paces retries.
    "grpc.initial_reconnect_backoff_ms": 250,
    "grpc.min_reconnect_backoff_ms": 250,
    "grpc.max_reconnect_backoff_ms": int(BACKOFF_MAX_S * 1000),
    # A watch on a half-open connection (a partition, a frozen peer) would wait forever without
    # pings; etcd accepts them down to 5 s apart.
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.max_receive_message_length": LIST_PAGE * MAX_RECORD_BYTES + (1 << 20),
}


# Log lines quoted by docs/operator-guide.md (kept whole so the guide's check finds them).
DEGRADED_LINE = "Discovery degraded: lost etcd at %s (%s); still routing to the %d instance(s) known, retrying with back-off"  # noqa: E501
WORKER_LOST_LINE = "Discovery: lost etcd at %s (%s); still serving, retrying with back-off (the record expires after %d s if this lasts, and is put back when etcd is reachable again)"  # noqa: E501
REREGISTERED_LINE = (
    "Discovery: lease expired; registered again in etcd at %s with lease %x (instance %s)"
)
QUIET_END_LINE = "Discovery: etcd watch stream ended before any event; listing again in %.2f s"


class EtcdSettingsError(DiscoverySetupError):
    """etcd settings in the environment that cannot work (exit 2 at start-up, naming them)."""


@dataclass(frozen=True)
class EtcdCredentials:
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a repr, never logged

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EtcdCredentials:
        env = os.environ if env is None else env
        tls = [name for name in TLS_ENVS if env.get(name)]
        if tls:
            raise EtcdSettingsError(
                f"{', '.join(tls)} set, but this project's etcd client (aetcd) does not speak "
                "TLS; unset them and reach etcd over a trusted network (or a TLS-terminating "
                "proxy next to each process)"
            )
        username, password = env.get(USERNAME_ENV) or None, env.get(PASSWORD_ENV) or None
        if (username is None) != (password is None):
            missing = PASSWORD_ENV if password is None else USERNAME_ENV
            raise EtcdSettingsError(
                f"{USERNAME_ENV} and {PASSWORD_ENV} go together: {missing} is not set"
            )
        return cls(username, password)


def lease_ttl_for(ttl_s: float) -> int:
    """etcd leases are whole seconds: the TTL rounded up (never shorter than asked)."""
    return max(1, math.ceil(ttl_s))


class Backoff:
    def __init__(self, initial_s: float = BACKOFF_INITIAL_S, max_s: float = BACKOFF_MAX_S):
        self.initial_s = initial_s
        self.max_s = max_s
        self._next = initial_s

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = self.initial_s


def describe_error(exc: BaseException) -> str:
    """One line, no traceback: what went wrong talking to etcd."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    cause = exc.__cause__
    if isinstance(cause, grpc.aio.AioRpcError):
        return f"{cause.code().name}: {cause.details()}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class EtcdConnection:
    """One aetcd client at a time, on the endpoints in turn: a failure moves to the next."""

    def __init__(self, endpoints: tuple[EtcdEndpoint, ...], credentials: EtcdCredentials):
        self.endpoints = endpoints
        self.credentials = credentials
        self._index = 0
        self._client: aetcd.Client | None = None

    @property
    def url(self) -> str:
        return self.endpoints[self._index].url

    async def client(self) -> aetcd.Client:
        if self._client is None:
            endpoint = self.endpoints[self._index]
            host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
            client = aetcd.Client(
                host=host,
                port=endpoint.port,
                username=self.credentials.username,
                password=self.credentials.password,
                timeout=RPC_TIMEOUT_S,
                options=CHANNEL_OPTIONS,
            )
            # Opens the channel; authenticates when a user is set.
            await asyncio.wait_for(client.connect(), CALL_BOUND_S)
            self._client = client
        return self._client

    async def reset(self) -> None:
        """Drop the client after a failure; the next one talks to the next endpoint."""
        client, self._client = self._client, None
        self._index = (self._index + 1) % len(self.endpoints)
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), CLOSE_BOUND_S)
            except Exception:  # noqa: BLE001 - a broken channel may fail to close; it is gone
                pass

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), CLOSE_BOUND_S)
            except Exception:  # noqa: BLE001
                pass
