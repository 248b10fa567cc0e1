"""What option help says: limits as an operator writes them, each launcher's own behaviour."""

from __future__ import annotations

from dynamo.frontend import frontend_args
from dynamo.vllm import backend_args
from dynamo_gc.configuration.values import MAX_WAIT_MS, MAX_WAIT_S, FiniteFloat, IntRange


def test_whole_limits_print_as_whole_numbers():
    assert FiniteFloat(0.0, MAX_WAIT_S).describe() == "number between 0 and 9223372036"
    assert FiniteFloat(0.0, MAX_WAIT_MS).describe() == "number between 0 and 9223372036000"
    assert FiniteFloat(0.5).describe() == "number >= 0.5"
    assert "between 1 and 16" in IntRange(1, 16).describe_range()


def _help_of(options, flag: str) -> str:
    (option,) = [option for option in options if option.flag == flag]
    return option.help


def test_each_drain_timeout_help_describes_its_own_launchers_ending():
    frontend = _help_of(frontend_args.SURFACE.options, "--dyn-drain-timeout")
    worker = _help_of(backend_args.ALL_OPTIONS, "--drain-timeout")
    assert "an SSE error event, then [DONE]" in frontend and "in-band" not in frontend
    assert "an in-band error line" in worker
