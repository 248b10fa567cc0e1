""":class:`~dynamo.frontend.parsing.output_parser.OutputParsers`: the one call signature of the chat
processors' parser factories (vLLM's and SGLang's build from the :class:`ParserRequest`)."""

from __future__ import annotations

import pytest

from dynamo.frontend.parsing.output_parser import OutputParser, OutputParsers, ParserRequest

TOOLS = [{"type": "function", "function": {"name": "f"}}]
MESSAGES = [{"role": "user", "content": "hi"}]


class Recording(OutputParsers):
    def __init__(self) -> None:
        self.requests: list[ParserRequest] = []

    def build(self, request: ParserRequest) -> OutputParser | None:
        self.requests.append(request)
        return None


def test_the_call_reaches_build_as_one_request():
    factory = Recording()
    assert factory() is None
    factory(TOOLS, "required", MESSAGES, False)
    factory(tools=TOOLS, messages=MESSAGES)
    assert factory.requests == [
        ParserRequest(None, "auto", (), True),
        ParserRequest(TOOLS, "required", MESSAGES, False),
        ParserRequest(TOOLS, "auto", MESSAGES, True),
    ]


def test_a_factory_must_say_how_it_builds():
    with pytest.raises(NotImplementedError):
        OutputParsers()(TOOLS)
