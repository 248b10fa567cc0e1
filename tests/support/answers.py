"""Reading the frontend's OpenAI answers, in-process or over the wire: an error object, the
events of a stream (server-sent events, ``data: `` lines ending with ``[DONE]``) and its text."""

from __future__ import annotations

import json


def sse_payload(raw: bytes | str) -> dict | str | None:
    """One line of a stream: its JSON payload, the ``"[DONE]"`` string, or ``None`` (blank)."""
    line = (raw.decode() if isinstance(raw, bytes) else raw).strip()
    if not line:
        return None
    assert line.startswith("data: "), line
    payload = line[len("data: ") :]
    return payload if payload == "[DONE]" else json.loads(payload)


async def sse_events(response) -> list:
    """Every payload of an aiohttp streaming response (dicts, then ``"[DONE]"``)."""
    events = []
    async for line in response.content:
        payload = sse_payload(line)
        if payload is not None:
            events.append(payload)
    return events


def streamed_pieces(events: list) -> list[str]:
    """The text pieces of a streamed chat or text completion, in order."""
    pieces = []
    for event in events:
        if isinstance(event, dict) and event.get("choices"):
            choice = event["choices"][0]
            piece = choice["delta"].get("content") if "delta" in choice else choice["text"]
            if piece:
                pieces.append(piece)
    return pieces


def streamed_text(events: list) -> str:
    return "".join(streamed_pieces(events))


def assert_openai_error(
    body: dict, status: int | None = None, expected_status: int | None = None, *, param=None
) -> dict:
    """Check that ``body`` is an OpenAI error object (and, given both, that the HTTP status is
    the expected one; given ``param``, that the error names it); return the error."""
    if expected_status is not None:
        assert status == expected_status, body
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    if param is not None:
        assert error["param"] == param, error
    return error
