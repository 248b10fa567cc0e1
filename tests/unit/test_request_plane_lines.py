"""The request plane's line reader against a worker that trickles a long line: echo with
logprobs grows the first line's bound to 64 B per prompt pair (megabytes for a long prompt),
and a worker decides how its bytes are cut into chunks. Finding each line's end costs the
bytes that arrived, once: a line in a thousand pieces costs what it costs whole, not a
search of everything held at every piece (quadratic: seconds of the event loop a line)."""

from __future__ import annotations

import asyncio
import time

import pytest

from dynamo.runtime.request_plane import WorkerProtocolError, _lines


class Chunks:
    """A response body arriving in the chunks the test chooses (aiohttp's ``iter_any``)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def iter_any(self):
        for chunk in self._chunks:
            yield chunk


def cut(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def read(chunks: list[bytes], line_limit: int) -> tuple[float, list[bytes]]:
    async def lines() -> list[bytes]:
        return [line async for line in _lines(Chunks(chunks), 1 << 40, line_limit)]  # type: ignore[arg-type]  # an iter_any is all _lines reads

    # This process's CPU time, not the wall clock, which also counts what the scheduler gives
    # other processes (a parallel test worker, a loaded CI machine) and can differ between the
    # two reads a test compares.
    started = time.process_time()
    got = asyncio.run(lines())
    return time.process_time() - started, got


def test_a_long_line_trickled_costs_what_it_costs_whole():
    line = b"x" * (16 << 20)
    whole, got = read([line + b"\n{}\n"], len(line))
    assert got == [line, b"{}"]
    trickled, got = read(cut(line + b"\n{}\n", 1024), len(line))
    assert got == [line, b"{}"]
    assert trickled < 5 * whole + 0.3, f"{trickled:.2f} s in 1 KiB chunks, {whole:.2f} s whole"


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_lines_cut_anywhere_come_out_the_same(size):
    data = b'{"a": 1}\n\n  \n{"b": 2}\n' + b"y" * 100 + b"\n" + b"z" * 10
    _, got = read(cut(data, size), 100)
    assert got == [b'{"a": 1}', b'{"b": 2}', b"y" * 100, b"z" * 10]


@pytest.mark.parametrize("size", [1, 50, 4096])
def test_a_line_over_the_limit_is_refused_however_it_is_cut(size):
    data = b"ok\n" + b"y" * 101 + b"\n"
    with pytest.raises(WorkerProtocolError, match="over 100 bytes"):
        read(cut(data, size), 100)
