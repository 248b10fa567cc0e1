"""A model's long native calls take turns (dynamo.frontend.processors.native_calls, issue 37):
never two at once, and after each the event loop's turn before the next one starts."""

from __future__ import annotations

import threading
import time

from dynamo.frontend.processors import hf_processor, native_calls
from dynamo.frontend.processors.native_calls import LOOP_TURN_S, native_call


def test_long_calls_from_many_threads_never_overlap_and_leave_a_turn_between_them():
    spans: list[tuple[float, float]] = []

    def call() -> None:
        started = time.monotonic()
        time.sleep(0.01)  # stands for a native call (this one lets the GIL go)
        spans.append((started, time.monotonic()))

    threads = [threading.Thread(target=native_call, args=(call,)) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spans.sort()
    assert len(spans) == 6
    for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False):
        assert next_start - end >= LOOP_TURN_S * 0.9, spans


def test_a_failing_call_still_gives_the_turn_back():
    def fails() -> None:
        raise ValueError("bad tokenizer")

    for _ in range(2):
        try:
            native_call(fails)
        except ValueError:
            pass
    assert not native_calls._turn.locked()


def test_a_tokenizers_load_is_made_in_turn(tiny_tokenizer_dir, mocker):
    spy = mocker.spy(hf_processor, "native_call")
    tokenizer = hf_processor.HfTokenizer(tiny_tokenizer_dir)
    assert tokenizer.max_token_id > 0
    assert [call.args[0].__name__ for call in spy.call_args_list] == ["from_str", "get_vocab"]
