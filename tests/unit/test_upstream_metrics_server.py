"""The adapters' GC metrics port: a port that cannot be bound stops start-up with exit 2."""

from __future__ import annotations

import socket

import pytest

from dynamo_gc.metrics import DynamoMetrics
from dynamo_gc.upstream import metrics_server


def test_a_taken_port_is_an_exit_2_naming_the_option(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = DynamoMetrics(freeze_enabled=True, process_collectors=False)
        with pytest.raises(SystemExit) as exited:
            metrics_server.serve(metrics, "127.0.0.1", port, option="--x-port / DYN_X_PORT")
    assert exited.value.code == 2
    assert f"127.0.0.1:{port} (--x-port / DYN_X_PORT)" in capsys.readouterr().err
