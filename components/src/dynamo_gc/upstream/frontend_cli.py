"""``python -m dynamo_gc.frontend``: upstream ai-dynamo's frontend, with its GC heap frozen.

Our options are taken out of the command line and checked (a bad value exits 2 before upstream
is imported); everything else goes to upstream's ``dynamo.frontend.main.main`` unchanged, with
the ``gc-freeze`` route extension added to its list. The freeze itself is the extension's
(:mod:`dynamo_gc.upstream.frontend_freeze`): one freeze path for both activation ways, at the
point upstream calls its route providers (after ``make_engine``, before HTTP starts).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from dynamo_gc.upstream import (
    frontend_freeze,
    frontend_hooks,
    frontend_settings,
    interrupts,
    stand_down,
)

logger = logging.getLogger(__name__)

UPSTREAM_PROGRAM = "python -m dynamo_gc.frontend"
ROUTE_EXTENSION_FLAG = "--frontend-route-extension"


def upstream_argv(rest: Sequence[str], non_http_mode: str | None) -> list[str]:
    """Upstream's arguments with the ``gc-freeze`` extension added, in the HTTP mode only.

    Upstream refuses route extensions in its modes that serve no HTTP (given as a flag or by its
    env var): there is no freeze point there.
    """
    args = list(rest)
    if non_http_mode is not None:
        return args
    return [*args, ROUTE_EXTENSION_FLAG, frontend_freeze.EXTENSION_NAME]


@interrupts.stoppable(UPSTREAM_PROGRAM)
def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--help" in args or "-h" in args:
        print(frontend_settings.format_help())
        print("Upstream ai-dynamo frontend's own options follow.\n", flush=True)
        parse_upstream_args = frontend_hooks.upstream_frontend_parse_args()
        sys.argv = [UPSTREAM_PROGRAM, "--help"]
        parse_upstream_args()  # prints upstream's help and exits 0
        return
    config, rest = frontend_settings.split_args(args)
    upstream = frontend_hooks.checked_frontend_main()  # exit 2 on an unsupported version
    own_freeze = stand_down.upstream_freeze_in(upstream)
    if own_freeze is not None:
        # Upstream freezes this process itself: its parser gets the GC flags (the same names),
        # the adapter keeps only its own options, and adds no extension.
        stand_down.stand_down(UPSTREAM_PROGRAM, own_freeze, frontend_freeze.not_served(config))
        frontend_freeze.mark_stood_down()
        sys.argv = [UPSTREAM_PROGRAM, *frontend_settings.without_adapter_options(args)]
        interrupts.hand_over()  # a stop recorded meanwhile stops here; then signals are upstream's
        upstream.main()
        return
    upstream_main = upstream.main
    # a maintenance the chat processor cannot host: exit 2 now, before upstream builds anything
    frontend_freeze.maintained_paths(config, UPSTREAM_PROGRAM, rest)
    frontend_freeze.configure(config)
    mode = frontend_hooks.non_http_mode(rest)
    upstream_args = upstream_argv(rest, mode)
    if mode is not None:
        logger.warning(
            "GC heap not frozen: upstream's %s mode serves no HTTP and calls no route extension, "
            "the only point where the adapter freezes",
            mode,
        )
    sys.argv = [UPSTREAM_PROGRAM, *upstream_args]
    interrupts.hand_over()
    upstream_main()
