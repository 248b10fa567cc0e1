"""The test etcd server itself (tests/support/etcd_server.py): a port taken between being picked and
being bound must not fail the test that wanted an etcd (the CI runs other suites alongside)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from tests.support import etcd_server as helper
from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def binary() -> str:
    found = helper.find_etcd()
    if found is None:
        if os.environ.get(helper.REQUIRE_ETCD_ENV) == "1":
            pytest.fail(f"{helper.REQUIRE_ETCD_ENV}=1 but {helper.ETCD_MISSING_REASON}")
        pytest.skip(helper.ETCD_MISSING_REASON)
    return found


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_client_port_taken_before_the_first_start_is_replaced(binary, tmp_path, mocker):
    with _listening() as squatter:
        taken = squatter.getsockname()[1]
        real = helper._two_free_ports
        picks = iter([(taken, real()[1])])
        mocker.patch.object(helper, "_two_free_ports", lambda: next(picks, None) or real())
        server = helper.EtcdServer(binary, tmp_path)
        assert server.client_port == taken
        try:
            server.start()
            assert server.healthy() and server.proc.poll() is None
            assert server.client_port != taken
        finally:
            server.stop()
    assert "address already in use" in server.log()  # the first attempt did meet the squatter


def test_a_restart_whose_port_is_briefly_taken_waits_and_keeps_its_ports(binary, tmp_path):
    server = helper.EtcdServer(binary, tmp_path)
    server.start()
    ports = (server.client_port, server.peer_port)
    server.stop()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past etcd's TIME_WAITs
    squatter.bind(("127.0.0.1", server.client_port))
    squatter.listen()

    def release_once_etcd_has_met_it() -> None:
        wait_until(
            lambda: "address already in use" in server.log(), deadline_s=30, what="the clash"
        )
        squatter.close()

    releaser = threading.Thread(target=release_once_etcd_has_met_it, daemon=True)
    releaser.start()
    try:
        server.start()
        assert server.healthy() and (server.client_port, server.peer_port) == ports
    finally:
        releaser.join(30)
        squatter.close()
        server.stop()
