"""When the installed ai-dynamo freezes a process itself, the adapter stands down there.

Upstream's unmerged GC-freeze change (ai-dynamo/dynamo: ``dynamo/common/utils/gc_freeze.py``)
freezes the frontend after its route extensions are loaded (``--dyn-freeze-gc-heap`` /
``DYN_FREEZE_GC_HEAP``, default on) and the vLLM worker before ``register_model``
(``--freeze-gc-heap`` / ``DYN_VLLM_FREEZE_GC_HEAP``), each with a pause logger of its own
(``--dyn-gc-pause-log-ms`` / ``--gc-pause-log-ms``): the same names and meanings as the
adapter's options. Where that runs, a second freeze would add one more full collection and
nothing else, and a second pause logger would log every pause twice. So the adapter does nothing
of its own in that process: one line says so, and names the adapter's own settings (its metrics
port, its debug route) that are then not served. The launchers hand upstream the GC flags they
were given (upstream's parser reads the same names) and keep only the adapter's own.

Refusing instead (an exit 2) was weighed and rejected: an upgrade of ai-dynamo would stop every
pod that still names ``gc-freeze``, to save a collection that upstream's own freeze already
makes at nearly the same point.

Detected per process, from the launcher's own module: a global of it that comes from upstream's
freeze module (``maybe_freeze_gc_heap`` in upstream's change) means that launcher freezes.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence

from dynamo_gc.upstream.versions import describe_installed

logger = logging.getLogger(__name__)

UPSTREAM_FREEZE_MODULE = "dynamo.common.utils.gc_freeze"


def upstream_freeze_in(module: types.ModuleType) -> str | None:
    """What of upstream's freeze module ``module`` uses (``dynamo.common.utils.gc_freeze:
    install_gc_pause_logger, maybe_freeze_gc_heap``), or ``None`` when this launcher of
    upstream's does not freeze its process itself."""
    used = sorted(
        getattr(value, "__name__", name)
        for name, value in vars(module).items()
        if callable(value) and getattr(value, "__module__", None) == UPSTREAM_FREEZE_MODULE
    )
    return f"{UPSTREAM_FREEZE_MODULE}: {', '.join(used)}" if used else None


def stand_down(program: str, freeze: str, not_served: Sequence[str] = ()) -> None:
    """The one line: who stands down, why, and what of the adapter's is then not served.

    INFO when nothing the operator asked of the adapter is lost; WARNING when some setting of
    the adapter's own (a metrics port, the debug route) is not served.
    """
    lost = f"; not served: {', '.join(not_served)}" if not_served else ""
    logger.log(
        logging.WARNING if not_served else logging.INFO,
        "%s: %s freezes this process's GC heap itself (%s): the adapter stands down, no second "
        "freeze and no second pause logger; upstream's own options (same names) turn its freeze "
        "and pause log on and off%s",
        program,
        describe_installed(),
        freeze,
        lost,
    )
