"""A script written against upstream Dynamo's ``dynamo.vllm.gc_policy`` API (ai-dynamo 1.6.1).

It uses only upstream's public names and checks only what upstream promises, so it runs against
either implementation; tests/unit/test_upstream_gc_policy.py runs it here. It changes
``os.environ`` and GC state: the caller restores both.
"""

from __future__ import annotations

import gc
import os

from dynamo.vllm.gc_policy import (
    FpmGcWorkerExtension,
    gc_maintain,
    start_gc_policy,
    stop_gc_policy,
)
from tests.support.cycles import dead_cycle


def run() -> None:
    stock = gc.get_threshold()

    # Env unset: the policy is off, and starting it does nothing.
    os.environ.pop("DYN_FPM_GC_POLICY", None)
    assert start_gc_policy() is False
    assert gc.get_threshold() == stock

    # Upstream strips and lowercases the policy word.
    os.environ["DYN_FPM_GC_POLICY"] = " FREEZE "
    os.environ["DYN_FPM_GC_FREEZE_INTERVAL_S"] = "60"
    assert start_gc_policy() is True
    assert start_gc_policy() is True  # idempotent: still running
    assert gc.get_threshold()[:2] == stock[:2]
    assert gc.get_threshold()[2] > stock[2]  # automatic gen2 collections pushed out of reach

    # A cycle that dies in the frozen heap survives collections until a maintenance window.
    ref = dead_cycle()
    gc.freeze()  # what the policy's periodic tick does
    gc.collect()
    assert ref() is not None
    frozen = gc_maintain()
    assert isinstance(frozen, int) and frozen >= 0
    assert ref() is None

    # The worker extension's RPC methods, called as vLLM's collective_rpc would.
    extension = FpmGcWorkerExtension()
    assert extension.fpm_gc_start() is True
    assert isinstance(extension.fpm_gc_maintain(), int)

    # Stop restores the thresholds; a second stop is a no-op.
    stop_gc_policy()
    assert gc.get_threshold() == stock
    stop_gc_policy()
    extension.fpm_gc_stop()
    assert gc.get_threshold() == stock


if __name__ == "__main__":
    run()
    print("upstream gc_policy script: ok")
