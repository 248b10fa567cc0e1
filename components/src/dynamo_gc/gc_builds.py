"""What this interpreter's build lets the layer do with the collector's thresholds and freeze.

Standard library only: the full-collection hold and the benchmark policy import it, and so can
a measurement child on a bare CPython (scripts/bench_gc_hold.py), without the configuration
package and its third-party parser.
"""

from __future__ import annotations

import sys
import sysconfig

# gc.set_threshold() parses C ints: the largest third threshold it accepts, which turns CPython's
# automatic full collections off (2**31 generation-1 collections first: never).
GEN2_NEVER = 2**31 - 1


def unsound_build_reason() -> str | None:
    """Why this interpreter cannot run the periodic freeze soundly, or ``None``."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return (
            "free-threaded build: gc.freeze() is a stop-the-world walk of the whole heap, not a "
            "list splice"
        )
    major, minor, micro = sys.version_info[:3]
    if (major, minor) == (3, 14) and micro <= 4:
        return (
            f"CPython {major}.{minor}.{micro} (incremental GC): the third GC threshold is "
            "ignored and gc.freeze() walks part of the heap"
        )
    return None


def threshold2_ignored_reason() -> str | None:
    """Why raising the third threshold does not stop automatic full collections here, or
    ``None`` where it does (standard builds of 3.10-3.13 and 3.14.5+)."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "free-threaded build: its collector is not generational, every collection is full"
    major, minor, micro = sys.version_info[:3]
    if (major, minor) == (3, 14) and micro <= 4:
        return f"CPython {major}.{minor}.{micro} (incremental GC) ignores the third threshold"
    return None
