"""Text that came from a peer, made safe for a log line.

Discovery records and request-plane answers come from peers, not administrators
(docs/security.md). Whatever of theirs reaches a log line goes through :func:`escape`: control
characters (a newline that would forge a second log line, a NUL, an ANSI escape that repaints a
terminal) are written as escapes, and the text is cut to a bound, so one peer cannot flood the
log or make a line of megabytes.
"""

from __future__ import annotations

# Long enough for a path, a model name or an error message; a log line quoting two or three of
# them stays well under a few KB.
DEFAULT_LIMIT = 200


def escape(value: object, limit: int = DEFAULT_LIMIT) -> str:
    """``value`` as printable text of at most about ``limit`` characters: ``str(value)`` with
    every character outside printable Unicode (control characters, line and paragraph
    separators, lone surrogates) escaped the way ``repr`` escapes them, and ``…(N more)`` in place
    of what was cut. Bytes are decoded as UTF-8, undecodable bytes escaped."""
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", errors="backslashreplace")
    else:
        text = str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    escaped = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return f"{escaped}…({cut} more)" if cut > 0 else escaped
