"""Which upstream ai-dynamo is installed, and which versions the adapters were checked against.

The symbol checks in :mod:`.hooks` decide whether an adapter can run; this list says which
versions those checks (and the tests on the real wheels) were made with. A version outside it
whose hooked symbols are all there runs, with a WARNING; one whose symbols are missing or changed
is an exit 2 naming the version and the symbol.
"""

from __future__ import annotations

import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import NoReturn

logger = logging.getLogger(__name__)

DISTRIBUTION = "ai-dynamo"
# Every release on PyPI since upstream's frontend has route extensions (1.4.0; 1.3.1 and older have
# none and ignore DYN_FRONTEND_ROUTE_EXTENSIONS): each one's hooked symbols are read from its wheel
# by tests/upstream/test_releases.py, and CI runs the adapters end to end on 1.6.1 (frontend,
# mocker, the vLLM worker) and 1.6.0 (frontend and mocker). 1.7.0 was released upstream but is not
# on PyPI (`pip download ai-dynamo==1.7.0`: no matching distribution), so it could not be checked.
SUPPORTED_VERSIONS = ("1.4.0", "1.4.1", "1.4.2", "1.5.0", "1.5.1", "1.6.0", "1.6.1")
# The first release whose frontend calls route extensions (the `gc-freeze` way in), and the last
# one before it (the wheel tests read it too, to keep "first" true).
ROUTE_EXTENSIONS_SINCE = "1.4.0"
LAST_RELEASE_WITHOUT_ROUTE_EXTENSIONS = "1.3.1"
# How an error or a warning from the `gc-freeze` route extension names its program: the operator
# ran upstream's command, and the extension got into it by the env var (or upstream's flag).
EXTENSION_NAME_IN_ERRORS = (
    "python -m dynamo.frontend, gc-freeze route extension (DYN_FRONTEND_ROUTE_EXTENSIONS)"
)


def installed_version() -> str | None:
    """The installed ai-dynamo's version, or ``None`` when it is not installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return None


def describe_installed() -> str:
    """``ai-dynamo 1.6.1``, or ``ai-dynamo (not installed)``: the start of every refusal."""
    found = installed_version()
    return f"{DISTRIBUTION} {found}" if found else f"{DISTRIBUTION} (not installed)"


def refuse(program: str, symbol: str, problem: str) -> NoReturn:
    """Exit 2 naming the installed version, the upstream symbol and what is wrong with it."""
    print(
        f"{program}: error: {describe_installed()}: {symbol} {problem}; this adapter supports "
        f"{DISTRIBUTION} {', '.join(SUPPORTED_VERSIONS)}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(2)


def warn_if_unchecked(program: str) -> None:
    """A WARNING when the installed version is not one the adapters were checked against."""
    found = installed_version()
    if found is not None and found not in SUPPORTED_VERSIONS:
        logger.warning(
            "%s: %s %s was not checked with this adapter (checked: %s); its hooked symbols are "
            "present, so it runs",
            program,
            DISTRIBUTION,
            found,
            ", ".join(SUPPORTED_VERSIONS),
        )
