"""Strict value kinds shared by every option.

Each kind turns the text an operator typed (on the command line or in an env var) into a value,
or raises ``ValueError`` with the reason. The option that owns the kind adds the flag, the env var
and the bad value to the message, so every error names all three.

We do not use ``float``/``int`` as argparse ``type=`` directly: ``float`` happily accepts ``nan``,
``inf`` and negatives, and argparse's own message names the flag but not the env var. Nor do we
let ``int``/``float`` decide what a digit is: they read every Unicode decimal digit (a fullwidth
``５`` is 5, Arabic-Indic ``٣`` is 3) and ``1_000`` as 1000, so a stray character in a manifest
would become a number nobody wrote. Numbers here are ASCII: sign, digits, and for floats one
point and an exponent.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import math
import re
import socket
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

# ASCII blanks around a value are forgiven (a trailing newline from a ConfigMap); others are not.
_ASCII_BLANKS = " \t\r\n"
_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_ASCII_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NON_FINITE_WORDS = frozenset({"nan", "inf", "infinity"})
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _control_character_problem(text: str) -> str | None:
    match = _CONTROL.search(text)
    if match is None:
        return None
    return (
        f"must not contain control characters (found {match.group()!r} at position {match.start()})"
    )


def undecodable_problem(text: str) -> str | None:
    """Why ``text`` is not valid UTF-8, or None.

    Python hands over the bytes of an argument or env var that are not UTF-8 as lone surrogates
    (``\\udcff`` for the byte 0xff). Such a value cannot be logged as it is, nor written into a
    record or a model card (JSON is UTF-8): refused at parse time, where the option is known.
    """
    for position, char in enumerate(text):
        if "\ud800" <= char <= "\udfff":
            byte = ord(char) - 0xDC00 if "\udc80" <= char <= "\udcff" else None
            found = f"byte 0x{byte:02x}" if byte is not None else repr(char)
            return f"not valid UTF-8 ({found} at position {position})"
    return None


# The longest wait any duration option may ask for, in seconds: what ``threading`` accepts
# (``threading.TIMEOUT_MAX``, about 292 years on Linux). A longer one is a typo, and a thread
# given it would die with an OverflowError long after start-up, silently.
MAX_WAIT_S = float(threading.TIMEOUT_MAX)
MAX_WAIT_MS = MAX_WAIT_S * 1000.0
# What an error and the docs say about that limit: the bare number (9223372036000 ms) reads like a
# mistake of ours, so they say what it is.
MAX_WAIT_REASON = (
    f"about {MAX_WAIT_S / (365.25 * 86400):.0f} years: the longest wait Python's threading accepts"
)


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
class _Bounded:
    """A number no smaller than ``minimum`` (and no larger than ``maximum``, if set)."""

    minimum: Any
    maximum: Any = None
    # What the maximum is, in words, when the number alone does not say (errors and docs add it).
    maximum_reason: str | None = None
    NUMBER_FORMAT: ClassVar[str] = "g"

    def checked(self, value: Any) -> Any:
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            raise ValueError(f"must be {self.describe_range()}")
        return value

    def describe_range(self) -> str:
        low = self._render(self.minimum)
        if self.maximum is None:
            return f">= {low}"
        reason = f" ({self.maximum_reason})" if self.maximum_reason else ""
        return f"between {low} and {self._render(self.maximum)}{reason}"

    def _render(self, number: Any) -> str:
        # A whole number as one (the longest wait is 9223372036 s, not 9.22337e+09).
        if isinstance(number, float) and number.is_integer():
            return str(int(number))
        return format(number, self.NUMBER_FORMAT)


@dataclass(frozen=True)
class FiniteFloat(_Bounded):
    """A finite number no smaller than ``minimum`` (and no larger than ``maximum``, if set)."""

    minimum: float = 0.0
    maximum: float | None = None
    maximum_reason: str | None = None

    def parse(self, text: str) -> float:
        word = text.strip(_ASCII_BLANKS)
        if word.lower().lstrip("+-") in _NON_FINITE_WORDS:
            raise ValueError("must be a finite number")
        if not _ASCII_FLOAT.fullmatch(word):
            raise ValueError("not a number (ASCII digits, an optional point and exponent)")
        value = float(word)
        if not math.isfinite(value):  # covers nan, inf, -inf and overflow such as 1e309
            raise ValueError("must be a finite number")
        return self.checked(value)

    def describe(self) -> str:
        return f"number {self.describe_range()}"


@dataclass(frozen=True)
class PositiveFloat(FiniteFloat):
    """A finite number above 0 (0 itself refused), no larger than ``maximum`` if set."""

    def parse(self, text: str) -> float:
        value = super().parse(text)
        if value <= 0.0:
            raise ValueError(f"must be {self.describe_range()}")
        return value

    def describe_range(self) -> str:
        if self.maximum is None:
            return "above 0"
        return f"above 0 and at most {self._render(self.maximum)}"


@dataclass(frozen=True)
class IntRange(_Bounded):
    """A whole number in ``[minimum, maximum]``."""

    minimum: int
    maximum: int | None = None
    maximum_reason: str | None = None
    NUMBER_FORMAT: ClassVar[str] = "d"

    def parse(self, text: str) -> int:
        word = text.strip(_ASCII_BLANKS)
        if not _ASCII_INT.fullmatch(word):
            raise ValueError("not a whole number (ASCII digits only)")
        if len(word.lstrip("+-")) > 18:  # int() would take 4300 digits; no option needs 19
            raise ValueError(f"must be {self.describe_range()}")
        return self.checked(int(word, 10))

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
    """Free text that must not be empty nor hold control characters (names, paths).

    A control character in a name or a path is always a mistake (a newline pasted into an env
    var), and would otherwise surface much later, as a model nobody can ask for or a file
    nobody can find.
    """

    what: str = "text"

    def parse(self, text: str) -> str:
        if not text.strip():
            raise ValueError(f"{self.what} must not be empty")
        problem = _control_character_problem(text)
        if problem is not None:
            raise ValueError(f"{self.what} {problem}")
        return text

    def describe(self) -> str:
        return self.what


# How long the parser waits for the resolver before calling a host unresolvable. A host that
# takes longer at start-up would make every later bind or connect as slow.
RESOLVE_TIMEOUT_S = 5.0


def _resolve(host: str) -> None:
    socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)


@dataclass(frozen=True)
class Host:
    """A host to listen on or connect to: an IP address, or a name that resolves now.

    Checked at parse time so that a bad host exits 2 naming its option, instead of failing at
    bind time (exit 1, or a traceback from the resolver's IDNA codec): the name must be
    IDNA-encodable (labels of 1-63 characters, 253 in all) and must resolve within
    :data:`RESOLVE_TIMEOUT_S`. IPv6 addresses are written without brackets.
    """

    what: str = "host"

    def parse(self, text: str) -> str:
        host = text.strip(_ASCII_BLANKS)
        if not host:
            raise ValueError(f"{self.what} must not be empty")
        problem = _control_character_problem(host)
        if problem is not None:
            raise ValueError(f"{self.what} {problem}")
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            pass
        if not host.isascii():
            # The resolver would map fullwidth digits and other look-alikes to ASCII (IDNA
            # nameprep), so "１２７.０.０.１" would quietly mean 127.0.0.1.
            raise ValueError(
                "not an ASCII host name (write an internationalised name in its xn-- form)"
            )
        last_label = host.rstrip(".").rsplit(".", 1)[-1]
        if last_label.isdigit() or last_label.lower().startswith("0x"):
            # The C resolver reads "1.2.3" and "0x7f.1" as IPv4 addresses; nobody means that.
            raise ValueError(
                "not a valid IP address, nor a host name (no top-level domain is numeric)"
            )
        if host.startswith("[") or "/" in host or " " in host:
            raise ValueError(
                "not a host name or IP address (write IPv6 addresses without brackets, and no "
                "scheme, port or path)"
            )
        try:
            encoded = host.encode("idna")
        except UnicodeError as exc:
            reason = str(exc.__cause__ or exc).split("(", 1)[-1].rstrip(")") or "invalid"
            raise ValueError(
                f"not a valid host name ({reason}: labels are 1-63 characters)"
            ) from None
        if len(encoded.rstrip(b".")) > 253:
            raise ValueError("not a valid host name (longer than 253 characters)")
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="resolve")
        try:
            pool.submit(_resolve, host).result(timeout=RESOLVE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            raise ValueError(
                f"cannot be resolved: the resolver did not answer within {RESOLVE_TIMEOUT_S:g} s"
            ) from None
        except (OSError, UnicodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ValueError(f"cannot be resolved ({reason})") from None
        finally:
            # A resolver that hangs keeps its thread; the program exits 2 anyway.
            pool.shutdown(wait=False)
        return host

    def describe(self) -> str:
        return "host name (resolved at start-up) or IP address"
