"""Strict value kinds shared by every option.

Each kind turns the text an operator typed (on the command line or in an env var) into a value,
or raises ``ValueError`` with the reason. The option that owns the kind adds the flag, the env var
and the bad value to the message, so every error names all three.

We do not use ``float``/``int`` as argparse ``type=`` directly: ``float`` happily accepts ``nan``,
``inf`` and negatives, and argparse's own message names the flag but not the env var.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def parse_bool_word(text: str) -> bool:
    """The env-var spelling of a boolean: 1/0/true/false/yes/no/on/off, any case."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off (any case)")


@dataclass(frozen=True)
class FiniteFloat:
    """A finite number no smaller than ``minimum``."""

    minimum: float = 0.0

    def parse(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError("not a number") from None
        if not math.isfinite(value):  # covers nan, inf, -inf and overflow such as 1e309
            raise ValueError("must be a finite number")
        if value < self.minimum:
            raise ValueError(f"must be >= {self.minimum:g}")
        return value

    def describe(self) -> str:
        return f"number >= {self.minimum:g}"


@dataclass(frozen=True)
class IntRange:
    """A whole number in ``[minimum, maximum]``."""

    minimum: int
    maximum: int | None = None

    def parse(self, text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise ValueError("not a whole number") from None
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            raise ValueError(f"must be {self.describe_range()}")
        return value

    def describe_range(self) -> str:
        if self.maximum is None:
            return f">= {self.minimum}"
        return f"between {self.minimum} and {self.maximum}"

    def describe(self) -> str:
        return f"integer {self.describe_range()}"


@dataclass(frozen=True)
class Choice:
    """One word out of a fixed set (matched exactly, after stripping blanks)."""

    words: tuple[str, ...]

    def parse(self, text: str) -> str:
        word = text.strip()
        if word not in self.words:
            raise ValueError(f"choose one of {', '.join(self.words)}")
        return word

    def describe(self) -> str:
        return "one of " + ", ".join(f"`{w}`" for w in self.words)


@dataclass(frozen=True)
class Text:
    """Free text that must not be empty (names, hosts, paths)."""

    what: str = "text"

    def parse(self, text: str) -> str:
        if not text.strip():
            raise ValueError(f"{self.what} must not be empty")
        return text

    def describe(self) -> str:
        return self.what
