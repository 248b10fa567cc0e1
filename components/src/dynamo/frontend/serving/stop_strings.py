"""Stop strings on streamed text: the output ends before the first stop string and never shows it.

The frontend is authoritative for stop strings (the worker only sees token ids): a stop string
can span tokens, chunks and characters, so it is matched on the detokenized text. While
streaming, the tail that could still become a stop string (a prefix of one) is held back until
the next text decides: either it completes the stop string (the output ends there, the tail is
dropped) or it does not (the tail is sent). So neither a stop string nor a partial match of one
ever reaches the client, unless the request asked for it (``include_stop_str_in_output``: the
output then ends just after the stop string, as in vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stops: Sequence[str], *, include: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._include = include
        self._longest = max((len(s) for s in self._stops), default=0)
        self._pending = ""  # text not yet sent: it may be the start of a stop string
        # How much of the pending text came unchecked (before min_tokens were out): a stop
        # string may start there but must end in checked text, as vLLM matches it.
        self._unchecked = 0
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the output

    def feed(self, text: str, *, check: bool = True) -> str:
        """The part of ``text`` (plus what was held) that is safe to send now.

        After a stop string is found, :attr:`stopped` is true and everything from the stop
        string on is discarded (later calls return ""). ``check=False``: text that cannot end
        the output (generated before ``min_tokens`` were out, as vLLM has it) is never matched
        alone, but a stop string may start in it and end in checked text (vLLM looks back
        from the checked text), so its tail that could start one is held all the same.
        """
        if self.stopped:
            return ""
        if not self._stops:
            return text
        window = self._pending + text
        if not check:
            hold = self._partial_match_length(window)
            self._pending = window[len(window) - hold :] if hold else ""
            self._unchecked = hold
            return window[: len(window) - hold]
        unchecked, self._unchecked = self._unchecked, 0
        found = [
            (i, -len(s))
            for i, s in ((window.find(s, max(0, unchecked - len(s) + 1)), s) for s in self._stops)
            if i >= 0
        ]
        if found:
            cut, minus_length = min(found)  # the earliest; at one place, the longest
            self.stopped = True
            self.matched = window[cut : cut - minus_length]
            self._pending = ""
            return window[: cut - minus_length if self._include else cut]
        hold = self._partial_match_length(window)
        self._pending = window[len(window) - hold :] if hold else ""
        return window[: len(window) - hold]

    def _partial_match_length(self, window: str) -> int:
        """Length of the longest suffix of ``window`` that is a proper prefix of a stop string."""
        for length in range(min(self._longest - 1, len(window)), 0, -1):
            suffix = window[-length:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return length
        return 0

    def flush(self) -> str:
        """The end of the completion: a held partial match was not a stop string after all."""
        pending, self._pending = self._pending, ""
        return "" if self.stopped else pending
