#!/usr/bin/env python3
"""Run a launcher (``python -m MODULE args...``) with what only the benchmarks need, unmodified.

    python scripts/bench_launch.py dynamo.frontend --http-port 0 ...

Read from the environment, before the launcher's own code runs:

- ``BENCH_START_UP_HEAP_OBJECTS=N``: build a synthetic long-lived heap of about N tracked objects
  (``dynamo.common.utils.synthetic_heap``) and keep it for the life of the process. It exists
  before the launcher's start-up freeze, exactly like the heap its imports build, so the freeze
  takes it in. The frontend has no option for a start-up heap (the worker has
  ``--mock-heap-objects``), and a real frontend's heap is mostly imports and tokenizer tables.
- ``BENCH_GC_DISABLE=1``: ``gc.disable()`` (the ``nogc`` arm of ab_serving: no automatic
  collection at all, the limit the frozen arms are compared with). The launchers' explicit
  start-up ``gc.collect()`` still runs; nothing in them re-enables automatic collection.

Then the launcher runs as ``__main__``, with the arguments after MODULE, in this process: it is
the real launcher, not a stand-in.
"""

from __future__ import annotations

import gc
import os
import runpy
import sys

# Kept referenced for the life of the process: that is what makes it long-lived.
START_UP_HEAP: list = []


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    module, args = sys.argv[1], sys.argv[2:]
    heap_objects = int(os.environ.get("BENCH_START_UP_HEAP_OBJECTS", "0") or 0)
    if heap_objects > 0:
        from dynamo.common.utils.synthetic_heap import build_synthetic_heap

        START_UP_HEAP.append(build_synthetic_heap(heap_objects))
    if os.environ.get("BENCH_GC_DISABLE", "").lower() in ("1", "true", "yes", "on"):
        gc.disable()
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
