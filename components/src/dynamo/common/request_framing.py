"""Where a request marked ``Connection: close`` ends on its connection, so that what follows it
is never handed to aiohttp's parser.

RFC 9112, 9.6: a server that receives the "close" option answers that request, then closes,
and MUST NOT process any further request received on the connection. aiohttp's parsers (llhttp
and the Python one) refuse data after such a request instead, and when both arrive in one read
the handler answers a 400 in place of the request that was whole: a client that pipelines
after ``Connection: close`` in one packet got a 400 for its first request. When the data comes
in a later read, aiohttp already does the right thing (the first is answered, the connection
closes, the rest is never answered).

:class:`RequestFraming` follows each request's framing in the bytes of one connection (the head
to its blank line, then its ``Content-Length`` or chunked body: chunk sizes, data, trailers)
and, at a request marked close (or an HTTP/1.0 one without keep-alive), hands on that request
and nothing after it. Whatever it cannot follow (an upgrade, a head over
:data:`MAX_HEAD_BYTES`, a malformed length or chunk size, a last coding other than chunked) it
hands on as it comes, for the parser to judge as before.
"""

from __future__ import annotations

import enum

# A request head longer than this is aiohttp's to refuse (its line and header limits are far
# below); the framing stops following the connection.
MAX_HEAD_BYTES = 256 * 1024
_CRLF = b"\r\n"
_HEAD_END = b"\r\n\r\n"


class _State(enum.Enum):
    HEAD = "head"  # reading a request head
    BODY = "body"  # handing on a Content-Length body
    CHUNK_SIZE = "chunk size line"  # a chunked body: a chunk's size line
    CHUNK_DATA = "chunk data"  # its data and the CRLF after it
    TRAILERS = "trailer lines"  # after the last chunk, to the blank line
    DONE = "after the last request"  # nothing more is handed on
    OFF = "not followed"  # everything handed on as it comes


class RequestFraming:
    """One connection's request framing (see the module docstring)."""

    def __init__(self) -> None:
        self._state = _State.HEAD
        self._line = bytearray()  # the head, or the chunk-size or trailer line, read so far
        self._left = 0  # bytes of a body or a chunk (with its CRLF) still to hand on
        self._last = False  # the request being read is marked close

    def split(self, data: bytes) -> list[bytes]:
        """The part of ``data`` to hand on to the parser (nothing, or one piece)."""
        position = 0
        while position < len(data) and self._state not in (_State.DONE, _State.OFF):
            if self._state in (_State.BODY, _State.CHUNK_DATA):
                taken = min(self._left, len(data) - position)
                position += taken
                self._left -= taken
                if self._left == 0:
                    self._body_part_done()
            else:
                position = self._read_line(data, position)
        if self._state is _State.OFF:
            position = len(data)
        return [data[:position]] if position else []

    def _body_part_done(self) -> None:
        if self._state is _State.CHUNK_DATA:
            self._state = _State.CHUNK_SIZE
        else:
            self._request_done()

    def _request_done(self) -> None:
        self._state = _State.DONE if self._last else _State.HEAD

    def _read_line(self, data: bytes, position: int) -> int:
        """Take the head's (or a chunk-size or trailer line's) bytes from ``data`` at
        ``position``; where its part in ``data`` ends."""
        if self._state is _State.HEAD and not self._line:
            while data.startswith(_CRLF, position):  # blank lines before a request line
                position += len(_CRLF)
            if position == len(data):
                return position
        end_mark = _HEAD_END if self._state is _State.HEAD else _CRLF
        seen = len(self._line)
        self._line += data[position:]
        end = self._line.find(end_mark, max(0, seen - len(end_mark) + 1))
        if end < 0:
            if len(self._line) > MAX_HEAD_BYTES:
                self._state = _State.OFF
            return len(data)
        length = end + len(end_mark)
        consumed = position + length - seen
        line, self._line = bytes(self._line[:end]), bytearray()
        if self._state is _State.HEAD:
            self._begin_body(line)
        elif self._state is _State.CHUNK_SIZE:
            self._begin_chunk(line)
        elif not line:  # TRAILERS: the blank line ends the body
            self._request_done()
        return consumed

    def _begin_body(self, head: bytes) -> None:
        lines = head.split(_CRLF)
        version = lines[0].rsplit(b" ", 1)[-1].upper()
        connection: set[bytes] = set()
        lengths: list[bytes] = []
        codings: list[bytes] = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                continue
            name = name.strip().lower()
            if name == b"connection":
                connection |= {token.strip().lower() for token in value.split(b",")}
            elif name == b"content-length":
                lengths.append(value.strip())
            elif name == b"transfer-encoding":
                codings += [coding.strip().lower() for coding in value.split(b",")]
        self._last = b"close" in connection or (
            version == b"HTTP/1.0" and b"keep-alive" not in connection
        )
        if b"upgrade" in connection or len(lengths) > 1 or (codings and lengths):
            self._state = _State.OFF  # another protocol follows, or the parser's 400
        elif codings:
            self._state = _State.CHUNK_SIZE if codings[-1] == b"chunked" else _State.OFF
        elif lengths and not lengths[0].isdigit():
            self._state = _State.OFF
        elif lengths and int(lengths[0]) > 0:
            self._state, self._left = _State.BODY, int(lengths[0])
        else:
            self._request_done()

    def _begin_chunk(self, line: bytes) -> None:
        size = line.split(b";", 1)[0].strip()
        if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
            self._state = _State.OFF  # the parser's to refuse
        elif int(size, 16) == 0:
            self._state = _State.TRAILERS
        else:
            self._state, self._left = _State.CHUNK_DATA, int(size, 16) + len(_CRLF)
