"""The logprobs on a request-plane stream's items, checked against what the request asked for.

The request plane's client (:func:`dynamo.runtime.request_plane.parse_item`) asks these for
every item it reads; a problem is a worker that breaks the wire format (its
:class:`~dynamo.runtime.request_plane.WorkerProtocolError`, with the text returned here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

# One generated token's log probabilities as items carry them: the sampled id's [id, logprob]
# pair, then the alternatives'.
Position = Sequence[Sequence[Any]]


class PromptLogprobs(BaseModel):
    """What the first item's ``prompt_logprobs`` must be: for these ``token_ids``, with at most
    ``alternatives`` each."""

    model_config = ConfigDict(frozen=True)

    token_ids: tuple[int, ...]
    alternatives: int


def prompt_logprobs_problem(
    item: Any, max_token_id: int | None, asked: PromptLogprobs | None
) -> str | None:
    """What is wrong with an item's prompt logprobs and ranks (``asked``: what the first item
    must carry, None for every other item), or None."""
    positions = getattr(item, "prompt_logprobs", None)
    ranks = getattr(item, "prompt_ranks", None)
    if asked is None:
        if positions is not None or ranks is not None:
            return "worker sent prompt logprobs where none belong"
        return None
    if positions is None or len(positions) != len(asked.token_ids):
        return "worker sent no prompt logprobs, or not one per prompt id"
    if positions[0] is not None:
        return "worker sent prompt logprobs for the first prompt id"
    for token_id, position in zip(asked.token_ids[1:], positions[1:], strict=True):
        if position is None:
            return "worker sent a null prompt logprob after the first"
        problem = _position_problem(token_id, position, asked.alternatives, max_token_id)
        if problem is not None:
            return problem
    if ranks is None or [r is None for r in ranks] != [p is None for p in positions]:
        return "worker sent no prompt ranks, or not one per prompt logprob"
    return None


def logprobs_problem(item: Any, max_token_id: int | None, asked: int | None) -> str | None:
    """What is wrong with an item's logprobs, or None: they must be what the request asked for
    (``asked`` alternatives, None: none asked), one position per id, the sampled id first, at
    most ``asked`` alternatives, every id in the vocabulary."""
    positions = item.logprobs
    if positions is None:
        if asked is not None and item.token_ids:
            return "worker sent token ids without the logprobs asked for"
        return None
    if asked is None:
        return "worker sent logprobs the request did not ask for"
    if len(positions) != len(item.token_ids):
        return f"worker sent {len(positions)} logprob position(s) for {len(item.token_ids)} id(s)"
    for token_id, position in zip(item.token_ids, positions, strict=True):
        problem = _position_problem(token_id, position, asked, max_token_id)
        if problem is not None:
            return problem
    return None


def _position_problem(
    token_id: int, position: Position, asked: int, max_token_id: int | None
) -> str | None:
    if position[0][0] != token_id:
        return (
            f"worker sent logprobs whose first id {position[0][0]} is not the sampled id {token_id}"
        )
    if len(position) > asked + 1:
        return (
            f"worker sent {len(position) - 1} logprob alternatives, more than the {asked} asked for"
        )
    ids = [alternative for alternative, _ in position]
    if max_token_id is not None and max(ids) > max_token_id:
        return (
            f"worker sent a logprob for token id {max(ids)}, outside the model's vocabulary "
            f"(largest id {max_token_id})"
        )
    # vLLM's alternatives are its top k, best first, each id once: the frontend ranks them by
    # their order, so any other order or a repeated id would be a quietly wrong answer.
    ranked = [logprob for _, logprob in position[1:]]
    if len(set(ids)) != len(ids) or ranked != sorted(ranked, reverse=True):
        return "worker sent logprob alternatives repeated or out of rank order"
    return None
