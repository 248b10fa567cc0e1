"""The request fields that say how many choices to make: ``n`` and ``best_of``.

``n`` is bounded (:data:`MAX_N`): vLLM has no bound, but here each choice is a request to the
engine and a stream to read (:mod:`dynamo.frontend.serving.choices`), so one client request must not
become thousands.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictInt, model_validator

from .fields import FieldRefused

MAX_N = 16
# Below this temperature vLLM samples greedily (vllm/sampling_params.py's _SAMPLING_EPS), and
# refuses n > 1: n greedy choices would be n copies of one.
GREEDY_BELOW = 1e-5
# The largest seed vLLM takes (a C long): seed + n - 1 must fit.
MAX_SEED = 2**63 - 1


class ChoicesFields(BaseModel):
    """``n`` and ``best_of`` (mixed into each endpoint's request model)."""

    n: Annotated[StrictInt, Field(ge=1)] | None = 1
    # vLLM removed best_of with its V0 engine: only "the best of n" (or null) asks for nothing.
    best_of: StrictInt | None = None

    @property
    def choices(self) -> int:
        return self.n or 1

    @model_validator(mode="after")
    def _bounded(self) -> Any:
        if self.choices > MAX_N:
            raise FieldRefused(
                "n",
                f"`n` must be at most {MAX_N} on this server (each choice is a request to the "
                "model's engine)",
                "invalid_value",
            )
        temperature = getattr(self, "temperature", None)
        if self.choices > 1 and temperature is not None and temperature < GREEDY_BELOW:
            raise FieldRefused(
                "n",
                f"`n` must be 1 when using greedy sampling (temperature 0), got {self.choices}",
                "invalid_value",
            )
        if self.best_of is not None and self.best_of != self.choices:
            raise FieldRefused(
                "best_of",
                "`best_of` is not supported by this server: vLLM removed best_of (the best of "
                "several completions) with its V0 engine; only best_of equal to n asks for "
                "nothing",
                "unsupported_parameter",
            )
        seed = getattr(self, "seed", None)
        if seed is not None and seed + self.choices - 1 > MAX_SEED:
            raise FieldRefused(
                "seed",
                f"`seed` + n - 1 must be at most {MAX_SEED} (choice i samples with seed + i)",
                "invalid_value",
            )
        return self
