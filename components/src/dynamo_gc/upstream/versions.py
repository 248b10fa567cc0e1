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
# 1.6.1: read from the wheel and run in tests/upstream. 1.7.0 was released upstream but is not on
# PyPI (`pip download ai-dynamo==1.7.0`: no matching distribution), so it could not be checked.
SUPPORTED_VERSIONS = ("1.6.1",)


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
