"""Test scaffolding for real processes: SIGUSR1 makes the process run one full collection.

Loaded as ``sitecustomize`` by a process whose ``PYTHONPATH`` starts with this directory
(tests/upstream/test_maintenance_live.py puts it there for upstream's frontend and worker). The
handler runs in the main thread, between two bytecodes of whatever it is doing, as an automatic
full collection would: a serving full collection, which a test with a tiny pause budget uses to
make a maintenance due at a moment of its choosing. Nothing of the project imports it.
"""

from __future__ import annotations

import gc
import signal


def _collect(signum, frame) -> None:
    gc.collect()


signal.signal(signal.SIGUSR1, _collect)
