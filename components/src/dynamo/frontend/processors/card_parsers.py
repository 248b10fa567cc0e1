"""Which tool-call and reasoning parsers a model's output goes through: the frontend's own
``--tool-call-parser`` / ``--reasoning-parser``, else the names its worker published in the
model card (``--dyn-tool-call-parser`` / ``--dyn-reasoning-parser``), as upstream Dynamo's
frontend falls back to the card.

A card's names are a peer's words (docs/design.md, trust model): the card's schema holds them
to a name's shape, and here the processor's own registry decides. A name it does not know is
logged (escaped, one line per model, name and interval) and the model is **served without that
parser**, not refused: a parser is an optional part of the answer, and refusing the model would
take it out of service for every client over one worker's typo, while an operator who needs the
parser gives the frontend the right name (its flag wins). With a processor that parses nothing
(``hf``) a card that names parsers gets the same WARNING: its output is served as
the model wrote it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from dynamo.frontend.parsing import vllm_output_parser
from dynamo.runtime import peer_text
from dynamo.runtime.log_budget import CauseBudgets
from dynamo.runtime.model_card import ModelCard

from . import sglang_processor

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 60.0
# Per kind of problem, not per model or parser name: those are a peer's to invent, and a line
# per new name would be a line per record.
_unknown = CauseBudgets(logger, lines=5, interval_s=LOG_INTERVAL_S)


def _from_card(
    card: ModelCard, what: str, name: str | None, problem: Callable[[str], str | None]
) -> str | None:
    if name is None:
        return None
    found = problem(name)
    if found is None:
        return name
    _unknown.emit(
        ("unusable parser", what),
        "Model %s: its worker names %s parser %s, which this frontend cannot use (%s); the "
        "model is served without it (give the frontend its own --%s-parser to override)",
        peer_text.escape(card.served_model_name),
        what,
        peer_text.escape(name),
        peer_text.escape(found),
        what,
    )
    return None


def sglang_settings(
    card: ModelCard, settings: sglang_processor.SglangSettings
) -> sglang_processor.SglangSettings:
    """The sglang processor's settings for ``card``'s model: the frontend's parser names, each
    one the frontend did not set taken from the card when SGLang has it."""
    tool = settings.tool_call_parser or _from_card(
        card, "tool-call", card.tool_call_parser, sglang_processor.tool_call_parser_problem
    )
    reasoning = settings.reasoning_parser or _from_card(
        card, "reasoning", card.reasoning_parser, sglang_processor.reasoning_parser_problem
    )
    return dataclasses.replace(settings, tool_call_parser=tool, reasoning_parser=reasoning)


def vllm_settings(
    card: ModelCard, settings: sglang_processor.SglangSettings
) -> sglang_processor.SglangSettings:
    """The same for ``--dyn-chat-processor vllm``, against vLLM's registries."""
    tool = settings.tool_call_parser or _from_card(
        card, "tool-call", card.tool_call_parser, vllm_output_parser.tool_call_parser_problem
    )
    reasoning = settings.reasoning_parser or _from_card(
        card, "reasoning", card.reasoning_parser, vllm_output_parser.reasoning_parser_problem
    )
    return dataclasses.replace(settings, tool_call_parser=tool, reasoning_parser=reasoning)


def warn_unparsed(card: ModelCard, kind: str) -> None:
    """A card naming parsers, with a processor that has none: say so, once per interval."""
    for what, name in (("tool-call", card.tool_call_parser), ("reasoning", card.reasoning_parser)):
        if name is not None:
            _unknown.emit(
                ("unparsed", what),
                "Model %s: its worker names %s parser %s, but --dyn-chat-processor %s parses "
                "no output; the model is served without it",
                peer_text.escape(card.served_model_name),
                what,
                peer_text.escape(name),
                kind,
            )
