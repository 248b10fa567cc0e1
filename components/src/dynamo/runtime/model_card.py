"""The model card: what a frontend needs to serve a model, published in its discovery record.

A worker fills it in at ``register_model`` from what its engine resolved (vLLM's served name,
the tokenizer directory, ``max_model_len``, the EOS ids of the model's generation config); the
frontend builds the model's chat processor from it and nothing else. A record without a card
(written by an older worker) is not served: serving it with a tokenizer that is not the model's
own would return garbage, silently.

The tokenizer and chat template are named by path, not copied into the record: a real
``tokenizer.json`` is megabytes (etcd refuses values over 1.5 MiB by default). A frontend on
another host therefore needs the same model directory mounted at the same path, as vLLM itself
does for ``--model``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
# The longest context a card may claim: 2^24 = 16,777,216 tokens. The longest context window a
# released model has is Llama 4 Scout's 10M tokens (MiniMax-Text-01: 4M); most top out at
# 128k-1M. A card is a peer's word, and a request without max_tokens gets the rest of the
# context as its budget (and the whole stream a byte budget derived from it), so an unbounded
# claim (2147483647) would be a budget no frontend can spend; this bound is a power of two above
# every real model, with room for the next. A worker whose engine claims more is refused by the
# same schema at start-up (exit 2), before any frontend sees its record.
MAX_CONTEXT_LENGTH = 2**24
# A parser's name as the registries spell them (qwen25, deepseek-r1, deepseek_r1, llama3_json):
# a peer's word, so held to that shape; whether the frontend knows it is the frontend's call.
ParserName = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class ModelCard(BaseModel):
    """One model as its worker serves it; immutable, validated on both ends."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    # The name clients use in "model" (vLLM's first --served-model-name, else --model).
    served_model_name: NonEmptyStr
    # What --model named, as the engine resolved it (a local directory for a local model).
    model_path: NonEmptyStr
    # A directory with tokenizer.json (and tokenizer_config.json, chat_template.jinja when the
    # model has them): --tokenizer when given, else the model directory.
    tokenizer_path: NonEmptyStr
    # The longest sequence (prompt + completion) the engine accepts, in the model's tokens.
    context_length: Annotated[StrictInt, Field(ge=1, le=MAX_CONTEXT_LENGTH)]
    # Token ids that end a completion (finish_reason "stop"), from the model's generation
    # config and tokenizer; empty for a model without an end-of-sequence token.
    eos_token_ids: tuple[Annotated[StrictInt, Field(ge=0)], ...] = ()
    # A chat template file that overrides the tokenizer's own (vLLM's --chat-template), if any.
    chat_template_path: NonEmptyStr | None = None
    # The largest token id a prompt may hold, as the engine checks it: vLLM takes the larger of
    # the tokenizer's largest id and the model's vocabulary size - 1 (a model's embedding can
    # have rows its tokenizer has no token for, Qwen3's for one). The frontend refuses a prompt
    # of ids above it with vLLM's words; absent (an older worker), it uses its tokenizer's.
    max_token_id: Annotated[StrictInt, Field(ge=0)] | None = None
    # The worker's --dyn-tool-call-parser / --dyn-reasoning-parser (upstream's names): the
    # parsers the frontend runs over this model's output unless its own --tool-call-parser /
    # --reasoning-parser override them. None: the worker named none.
    tool_call_parser: ParserName | None = None
    reasoning_parser: ParserName | None = None


def out_of_vocabulary(token_ids: Sequence[int], max_token_id: int) -> tuple[int, str] | None:
    """The first prompt id above ``max_token_id``: its index and vLLM's words for it, else None.

    One rule for the frontend (a 400 naming the prompt) and both engines (a 400 on the request
    plane), so a prompt is refused the same way wherever it is checked.
    """
    for index, token_id in enumerate(token_ids):
        if token_id > max_token_id:
            return index, (
                f"Token id {token_id} is out of vocabulary (the model's largest token id is "
                f"{max_token_id})"
            )
    return None
