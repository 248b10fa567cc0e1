"""Peer text in log lines: escaped and bounded (a record or a worker cannot forge a line)."""

from __future__ import annotations

import pytest

from dynamo.runtime.peer_text import escape


@pytest.mark.parametrize(
    ("value", "logged"),
    [
        ("plain text ❄", "plain text ❄"),
        ("line\nforged WARNING line", "line\\nforged WARNING line"),
        ("nul\x00 and \x1b[31mred", "nul\\x00 and \\x1b[31mred"),
        ("\r\t\u2028\u0085", "\\r\\t\\u2028\\x85"),
        ("\ud800", "\\ud800"),  # a lone surrogate (JSON can carry one)
        (b"\xff\xfebytes\n", "\\xff\\xfebytes\\n"),
        (42, "42"),
    ],
)
def test_control_characters_are_escaped(value, logged):
    assert escape(value) == logged


def test_long_text_is_cut_and_says_how_much_was_cut():
    assert escape("x" * 1000, limit=10) == "x" * 10 + "…(990 more)"
    assert escape("y" * 10, limit=10) == "y" * 10


def test_no_output_line_is_much_longer_than_the_limit_whatever_the_input():
    worst = "\x00" * 10_000  # every character escapes to four
    assert len(escape(worst, limit=200)) < 1000
