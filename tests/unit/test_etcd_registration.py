"""The etcd registration's drain step, without an etcd: what it does when etcd cannot answer."""

from __future__ import annotations

import asyncio
import logging

from dynamo.runtime.discovery import etcd_registration
from dynamo.runtime.discovery.etcd_client import EtcdConnection, EtcdCredentials
from dynamo.runtime.discovery.etcd_endpoints import parse_endpoints
from dynamo.runtime.discovery.etcd_registration import EtcdRegistration


def test_unregister_is_bounded_even_when_the_client_must_be_rebuilt_first(mocker, caplog):
    """After an outage the keep-alive dropped its client; at the drain, unregister() builds a
    new one, which (with a user set) authenticates before anything else. A black-holed etcd
    made that wait its own 5 s RPC timeout outside the revoke's 2 s bound, eating the drain."""
    mocker.patch.object(etcd_registration, "REVOKE_TIMEOUT_S", 0.05)
    connection = EtcdConnection(parse_endpoints("http://10.255.255.1:2379"), EtcdCredentials())
    never = asyncio.Event()

    async def authenticating_for_ever():
        await never.wait()  # an Authenticate RPC that nobody answers

    mocker.patch.object(connection, "client", side_effect=authenticating_for_ever)
    registration = EtcdRegistration(connection, "dynamo-gc/t/models/", 10.0)
    registration.lease_id = 0x1234

    async def scenario():
        await asyncio.wait_for(registration.unregister(), 5)

    caplog.set_level(logging.WARNING)
    asyncio.run(scenario())
    assert registration.lease_id is None
    (line,) = [r.getMessage() for r in caplog.records if "cannot revoke lease" in r.getMessage()]
    assert "the record expires within 10 s" in line
