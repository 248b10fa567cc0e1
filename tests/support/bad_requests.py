"""HTTP request heads no parser accepts, which every listener must answer with a 400 (never a
traceback): sent in-process to the frontend's service and over the wire to both real processes."""

from __future__ import annotations

MALFORMED_HEADS = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"b" * 10000 + b"\r\n\r\n",
]
