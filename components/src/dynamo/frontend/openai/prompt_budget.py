"""What a request may cost its worker, decided before it is sent: a prompt's text within what
the model's context could hold, before it is tokenised; the prompt cut as the client asked
(``truncate_prompt_tokens``), the completion's ``max_tokens`` within the model's context (vLLM's
rules and wording for the 400s), the ids a request names within the model's vocabulary, and
which OpenAI field a worker's refusal is about."""

from __future__ import annotations

from dynamo.runtime.model_card import ModelCard, out_of_vocabulary

from . import protocol as oai


def refused_param(field: str, prompt_param: str) -> str | None:
    """The OpenAI field a worker's refusal is about: ``token_ids...`` is the prompt (or the
    messages it was rendered from), ``sampling.top_k`` is ``top_k`` (the request plane uses
    the OpenAI names), bare ``sampling`` is the sampling fields together (no one field)."""
    head, _, rest = field.partition(".")
    if head == "token_ids":
        return prompt_param
    return rest.split(".", 1)[0] or None


# The most characters one token is taken to hold, to refuse a prompt before tokenising it.
# Generous: text averages 3-5 characters a token, and the longest tokens of real vocabularies
# (runs of spaces or punctuation) hold a few dozen; a prompt made only of those is no real
# prompt. Tokenising costs time and memory per character (the worst text here: ~5 us and
# ~200 B a character), and a chat's prompt is as long as the model's template makes it.
MAX_CHARS_PER_TOKEN = 32


def prompt_within_context(prompt: str, context_length: int, *, param: str, chat: bool) -> None:
    """A 400 (vLLM's ``context_length_exceeded``) for a prompt longer than ``context_length``
    tokens could hold at :data:`MAX_CHARS_PER_TOKEN` characters each, before it is tokenised
    (whatever ``truncate_prompt_tokens`` says: it cuts tokens, after tokenising); ``chat``: the
    prompt is the one the model's chat template rendered from the messages."""
    limit = context_length * MAX_CHARS_PER_TOKEN
    if len(prompt) <= limit:
        return
    what = (
        "the prompt the model's chat template renders from your messages"
        if chat
        else ("your prompt")
    )
    raise oai.invalid_request(
        f"This model's maximum context length is {context_length} tokens. However, {what} is "
        f"{len(prompt)} characters long, more than {context_length} tokens hold (at most "
        f"{MAX_CHARS_PER_TOKEN} characters a token): it was not tokenized. Please reduce the "
        "length of the input prompt.",
        param=param,
        code="context_length_exceeded",
    )


def truncated_prompt(req: oai._SamplingRequest, ids: list[int], context: int) -> list[int]:
    """The prompt cut to ``truncate_prompt_tokens`` (vLLM's rule: -1 is as many as leave room
    for one completion token; more than that is a 400), from the ``truncation_side``: left
    (the default, vLLM's tokenizers') keeps the last tokens, right the first."""
    keep = req.truncate_prompt_tokens
    if keep is None:
        return ids
    room = context - 1
    if keep > room:
        raise oai.invalid_request(
            f"`truncate_prompt_tokens` ({keep}) must be at most {room} for this model",
            param="truncate_prompt_tokens",
        )
    keep = room if keep == -1 else keep
    if len(ids) <= keep:
        return ids
    return ids[:keep] if req.truncation_side == "right" else ids[len(ids) - keep :]


def completion_budget(
    req: oai._SamplingRequest, card: ModelCard, prompt_tokens: int, prompt_param: str
) -> int:
    """The ``max_tokens`` the worker gets: what the client asked for, or what is left of the
    model's context; a 400 (vLLM's wording) when the prompt, or prompt + max_tokens, does not
    fit."""
    context = card.context_length
    if prompt_tokens == 0:
        raise oai.invalid_request("the prompt is empty", param=prompt_param)
    if prompt_tokens >= context:
        raise context_length_exceeded(
            context_length=context, prompt_tokens=prompt_tokens, param=prompt_param
        )
    room = context - prompt_tokens
    requested = req.requested_max_tokens
    if requested is None:
        max_tokens = room
    else:
        name, max_tokens = requested
        if max_tokens > room:
            raise completion_too_long(
                context_length=context,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                param=name,
            )
    min_tokens = req.min_tokens or 0
    if min_tokens > max_tokens:
        raise oai.invalid_request(
            f"`min_tokens` ({min_tokens}) must be at most `max_tokens` ({max_tokens})",
            param="min_tokens",
        )
    _whole_logprobs_bounded(req, max_tokens, prompt_tokens)
    return max_tokens


# The logprob entries a response may hold at once (a choice's tokens times the entries of
# each, over its n choices): about 450 bytes of the frontend's memory each while it is built.
MAX_WHOLE_LOGPROBS = 1 << 20


def _whole_logprobs_bounded(req: oai._SamplingRequest, max_tokens: int, prompt_tokens: int) -> None:
    """A 400 naming the logprobs field when a response would hold more than
    :data:`MAX_WHOLE_LOGPROBS` entries at once: not streamed, n x max_tokens x (k + 1) and the
    echoed prompt's; streamed, the echoed prompt's only (they come on one line of each choice's
    stream, read whole), the rest being sent as it comes."""
    if not isinstance(req, oai.ChatCompletionRequest | oai.CompletionRequest):
        return  # the endpoints' requests carry logprobs and n
    top, prompt_top = req.logprobs_asked(), req.prompt_logprobs_asked()
    if top is None and prompt_top is None:
        return
    per_choice = 0 if prompt_top is None else prompt_tokens * (prompt_top + 1)
    if not req.stream and top is not None:
        per_choice += max_tokens * (top + 1)
    entries = (req.n or 1) * per_choice
    if entries > MAX_WHOLE_LOGPROBS:
        param = req.LOGPROBS_PARAM if top is not None else "prompt_logprobs"
        raise oai.invalid_request(
            f"`{param}`: a response holds at most {MAX_WHOLE_LOGPROBS} logprobs at once (n x "
            "(max_tokens, unless streamed, + the echoed prompt's tokens) x (alternatives + 1) "
            f"is {entries}): stream it, or ask for fewer tokens, choices or alternatives",
            param=param,
        )


def context_length_exceeded(*, context_length: int, prompt_tokens: int, param: str) -> oai.ApiError:
    # vLLM's wording (renderers/params.py), so clients that parse it keep working.
    return oai.invalid_request(
        f"This model's maximum context length is {context_length} tokens. However, your "
        f"prompt contains {prompt_tokens} input tokens, which exceeds this limit even without "
        "any output tokens. Please reduce the length of the input prompt.",
        param=param,
        code="context_length_exceeded",
    )


def completion_too_long(
    *, context_length: int, prompt_tokens: int, max_tokens: int, param: str
) -> oai.ApiError:
    return oai.invalid_request(
        f"This model's maximum context length is {context_length} tokens. However, you "
        f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
        f"{max_tokens} for the completion). Please reduce the length of the prompt or "
        f"`{param}`.",
        param=param,
        code="context_length_exceeded",
    )


def token_ids_within_vocabulary(req: oai._SamplingRequest, max_token_id: int) -> None:
    """A 400 naming the first id of ``stop_token_ids``, ``logit_bias`` or ``allowed_token_ids``
    that the model's vocabulary does not have (its largest id ``max_token_id``)."""
    found = out_of_vocabulary(req.stop_token_ids or (), max_token_id)
    if found is not None:
        raise oai.invalid_request(found[1], param=f"stop_token_ids[{found[0]}]")
    found = out_of_vocabulary([t for t, _ in req.logit_bias_pairs()], max_token_id)
    if found is not None:
        raise oai.invalid_request(found[1], param="logit_bias")
    found = out_of_vocabulary(req.allowed_token_ids or (), max_token_id)
    if found is not None:
        raise oai.invalid_request(found[1], param=f"allowed_token_ids[{found[0]}]")
