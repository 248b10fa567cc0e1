"""What the frontend does with each field of an OpenAI request: one declaration per field.

The reference is vLLM's OpenAI server (its ``ChatCompletionRequest`` and ``CompletionRequest``):
every field those models declare is classified here, for each endpoint, as

* **applied**: the request models (:mod:`.protocol`) declare it and it has its effect;
* **refused**: this server does not honour it, so a value that asks for something (anything but
  vLLM's default, listed in ``neutral``, or ``null``) is a 400 in the OpenAI error shape whose
  ``param`` and message name the field, with the reason: never dropped quietly;
* **accepted without effect**: a field whose absence of effect is its meaning here (vLLM ignores
  it too, or it is a hint with no observable result).

A field vLLM does not declare is *unknown*: accepted with one WARNING per field name and
interval (vLLM's behaviour: its models allow extra fields and log them), or a 400 naming it
under ``--dyn-strict-request-fields``. The request models, the tests (against a checked-in
snapshot of vLLM's field names, and against the installed vLLM in the vllm-marked suite) and the
generated page docs/openai-fields.md all read :data:`FIELDS`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from dynamo.runtime import peer_text
from dynamo.runtime.log_budget import LogBudget

logger = logging.getLogger(__name__)

CHAT = "chat"
COMPLETION = "completion"
ENDPOINTS = (CHAT, COMPLETION)
_BOTH = ENDPOINTS


class Treatment(str, Enum):
    APPLIED = "applied"
    REFUSED = "refused"
    NO_EFFECT = "accepted without effect"


@dataclass(frozen=True)
class FieldRule:
    name: str
    treatment: Treatment
    reason: str
    # REFUSED only: the values that ask for nothing (vLLM's default), accepted; null always is.
    neutral: tuple[Any, ...] = ()
    endpoints: tuple[str, ...] = _BOTH
    # APPLIED only: (another field, vLLM's words) when this one may ask for something only with
    # the other true: a value that asks (vLLM's test: any value but null, false or empty)
    # without it is refused with those words, never applied to nothing or dropped.
    needs: tuple[str, str] | None = None

    def asks_for_something(self, value: Any) -> bool:
        """Whether ``value`` asks this refused field for an effect (not null, not neutral).
        Types must match too: ``0`` is not ``false`` (``logprobs: 0`` asks for logprobs)."""
        if value is None:
            return False
        return not any(type(value) is type(n) and value == n for n in self.neutral)


def applied(
    name: str,
    reason: str,
    endpoints: tuple[str, ...] = _BOTH,
    *,
    needs: tuple[str, str] | None = None,
) -> FieldRule:
    return FieldRule(name, Treatment.APPLIED, reason, endpoints=endpoints, needs=needs)


def refused(name: str, reason: str, *neutral: Any, endpoints: tuple[str, ...] = _BOTH) -> FieldRule:
    return FieldRule(name, Treatment.REFUSED, reason, neutral, endpoints)


def no_effect(name: str, reason: str, endpoints: tuple[str, ...] = _BOTH) -> FieldRule:
    return FieldRule(name, Treatment.NO_EFFECT, reason, endpoints=endpoints)


_SAMPLER = "passed to the engine's sampler with vLLM's range (the mock engine does not sample)"
_NOT_YET = "not implemented by this server yet"
_STRUCTURED = (
    "the engine forces the output into that shape (vLLM's structured outputs, compiled by "
    "vLLM: an invalid schema is a 400 naming this field); schemas, regexes and grammars at "
    "most 64 KiB; structured_outputs.structural_tag is xgrammar's structural tag as JSON text "
    "(an object, at most 64 KiB), applied as vLLM applies it, and response_format's "
    "structural_tag type is refused by name; the mock engine refuses them by name"
)
_MULTIMODAL = "this server serves text-only models"
_DISAGG = "disaggregated serving (KV / encoder cache transfer) is not part of this server"
_VLLM_ONLY = "a vLLM server extension this server does not implement"

RULES: tuple[FieldRule, ...] = (
    # -- applied ---------------------------------------------------------------------------
    applied("model", "selects the model among those the workers registered"),
    applied("messages", "rendered with the model's own chat template", (CHAT,)),
    applied("prompt", "a text, a list of one text, or token ids", (COMPLETION,)),
    applied(
        "max_tokens",
        "capped by the model's context; unset: the rest of the context (vLLM's completions "
        "default to 16); 0 with a completion's echo: the prompt alone (its logprobs too), as "
        "vLLM answers it",
    ),
    applied("max_completion_tokens", "wins over max_tokens, as in vLLM", (CHAT,)),
    applied(
        "tools",
        "rendered into the chat template, as vLLM does (at most 128); the model's tool calls "
        "come back as tool_calls when its processor has a tool-call parser (see tool_choice)",
        (CHAT,),
    ),
    applied(
        "tool_choice",
        "none renders the tools without calls being parsed; auto (the default when tools are "
        "given) needs the model served with a tool-call parser (--tool-call-parser, or the "
        "worker's --dyn-tool-call-parser), else it is refused by name; required and a named "
        "function force the output into calls (structured outputs: the mock engine refuses "
        "them by name), parsed into tool_calls (finish_reason tool_calls for required, stop "
        "for a named function, as vLLM): with --dyn-chat-processor vllm and a tool-call "
        "parser, forced as vLLM 0.32 forces them (its parser's adjust_request: hermes' "
        "<tool_call> structural tag with free JSON arguments) and parsed by vLLM's parsers, "
        "the reasoning first, the arguments streamed as they come; with sglang and a parser, "
        "as SGLang forces them (a JSON array of calls, the reasoning first, handed out whole); "
        "otherwise forced with vLLM's JSON schema from the tools, handed out whole at the end",
        (CHAT,),
    ),
    applied(
        "continue_final_message",
        "the prompt ends inside the final message, for the model to continue it, as "
        "transformers renders it (with add_generation_prompt false, as vLLM requires)",
        (CHAT,),
    ),
    applied(
        "documents",
        "the chat template's documents (RAG templates), as vLLM passes them; at most 64",
        (CHAT,),
    ),
    applied(
        "reasoning_effort",
        "none, minimal, low, medium, high, xhigh or max (vLLM's values): a variable of the chat "
        "template, which also gets enable_thinking (false for none) unless "
        "chat_template_kwargs sets it, as vLLM renders it",
        (CHAT,),
    ),
    applied(
        "include_reasoning",
        "false: no reasoning field (a streamed piece that was only reasoning is no chunk), "
        "and, when the model's output is parsed, no logprobs either (their tokens would show "
        "the reasoning), as vLLM hides them",
        (CHAT,),
    ),
    applied(
        "return_token_ids",
        "true: the prompt's ids (chat: the body's prompt_token_ids; completions: each "
        "choice's) and each choice's generated ids (its token_ids, the stop token's too; "
        "streamed: those of each chunk), where vLLM puts them; with include_reasoning false "
        "on a parsed chat, the choice's ids are hidden as vLLM hides them",
    ),
    applied(
        "return_prompt_text",
        "true: the prompt the chat template rendered, as the body's prompt_text (streamed: on "
        "each choice's first chunk), as in vLLM",
        (CHAT,),
    ),
    applied(
        "spaces_between_special_tokens",
        "false, with skip_special_tokens false: two added tokens in a row are decoded without "
        "the space between them, as vLLM's fast incremental detokenizer does (the sglang "
        "processor passes it to the tokenizer's decode, as SGLang does)",
    ),
    applied(
        "add_generation_prompt",
        "the chat template's variable (default true); false: the answer takes the last "
        "message's role, as in vLLM",
        (CHAT,),
    ),
    applied(
        "chat_template_kwargs",
        "extra variables of the chat template (at most 64), as in vLLM; those that would "
        "bypass a request field (messages, tools, documents, add_generation_prompt, "
        "continue_final_message, chat_template, tokenize) are refused by name",
        (CHAT,),
    ),
    applied(
        "n",
        "n choices, each a request to the engine with the seed seed + index (vLLM's parallel "
        "sampling), streamed interleaved by index; usage counts the prompt once; at most 16 "
        "(this server's bound: vLLM has none), refused by name above and above 1 with "
        "temperature 0 (vLLM's rule: greedy choices would be one answer n times)",
    ),
    applied(
        "stop",
        "matched on the detokenized text by the frontend; never in the output; the string "
        "found is the choice's stop_reason, as in vLLM",
    ),
    applied("stream", "server-sent events, as vLLM sends them"),
    applied(
        "stream_options",
        "include_usage; continuous_usage_stats: true is refused by name; only with stream "
        "true, else refused by name as vLLM 0.32 refuses it (an empty object or null asks for "
        "nothing and is accepted)",
        needs=("stream", "Stream options can only be defined when `stream=True`."),
    ),
    applied("ignore_eos", "the model's EOS ids are then not sent as stop ids"),
    applied(
        "stop_token_ids",
        "end the completion as the EOS ids do (finish_reason stop, the id's text not in the "
        "output; the id is the choice's stop_reason, as in vLLM); at most 64, each within the "
        "model's vocabulary",
    ),
    applied(
        "skip_special_tokens",
        "the frontend decodes the completion: false shows special tokens, as in vLLM (a stop "
        "token's text is never shown)",
    ),
    applied(
        "logit_bias",
        "added to the logits by vLLM (biases clamped to [-100, 100] as vLLM does; at most "
        "1024 ids, each within the vocabulary); the mock engine refuses it by name",
    ),
    applied(
        "include_stop_str_in_output",
        "the frontend matches stop strings and tokens: true ends the output just after the "
        "stop string (or the stop token's text), as in vLLM",
    ),
    applied(
        "truncate_prompt_tokens",
        "keeps that many prompt tokens (-1: as many as the context leaves room for with one "
        "completion token), as in vLLM; more than that is a 400",
    ),
    applied("truncation_side", "left (the default) keeps the last tokens, right the first"),
    applied(
        "add_special_tokens",
        "whether the tokenizer adds its special tokens (BOS, ...) to a text prompt: vLLM's "
        "defaults, false for chat (the template wrote them), true for completions",
    ),
    applied(
        "allowed_token_ids",
        "the only ids vLLM may sample (at most 1024, each within the vocabulary); the mock "
        "engine refuses it by name",
    ),
    applied(
        "bad_words",
        "words vLLM must not generate (at most 64); the mock engine refuses it by name",
    ),
    applied("response_format", "json_object or json_schema (its schema): " + _STRUCTURED),
    applied(
        "structured_outputs",
        "vLLM's fields (json, regex, choice, grammar, json_object, disable_any_whitespace, "
        "disable_additional_properties, whitespace_pattern), one constraint, not with "
        "response_format: " + _STRUCTURED,
    ),
    applied(
        "parallel_tool_calls",
        "false: the first tool call only (vLLM's rule), and with tool_choice required the "
        "forced schema allows one (maxItems 1, as vLLM)",
        (CHAT,),
    ),
    applied("min_tokens", "the engine suppresses stop tokens until then"),
    applied(
        "logprobs",
        "true: each token's log probability in choices[].logprobs.content, as vLLM builds it "
        "(the frontend decodes the token strings as vLLM does: SentencePiece leading spaces "
        "restored, a character split across tokens carried by its last token, the others "
        '""; -inf is -9999.0). So the tokens joined can differ from the content, as in vLLM: '
        "bytes that never complete a character (a small or random model makes them) are "
        'U+FFFD in the content but "" (bytes []) as tokens. The mock engine, which '
        "has no distribution, refuses it by name",
        (CHAT,),
    ),
    applied(
        "top_logprobs",
        "that many alternatives per token (0 to 20, vLLM's default --max-logprobs, with its "
        "error above); needs logprobs true",
        (CHAT,),
    ),
    applied(
        "logprobs",
        "that many alternatives per token (0 to 20, vLLM's default --max-logprobs, with its "
        "error above) in choices[].logprobs {tokens, token_logprobs, top_logprobs, "
        "text_offset}; with echo the prompt's come first (the first token's null), as in "
        "vLLM; the mock engine refuses it by name",
        (COMPLETION,),
    ),
    applied(
        "return_tokens_as_token_ids",
        "logprobs' tokens as token_id:<id>, as in vLLM",
    ),
    *(
        applied(name, _SAMPLER)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        )
    ),
    applied(
        "prompt_logprobs",
        "each prompt token's log probability and that many alternatives (0 to 20, vLLM's "
        "default --max-logprobs; -1 is the whole vocabulary, over that bound), as vLLM returns "
        "them: [null, {token_id: {logprob, rank, decoded_token}}, ...] in the chat response's "
        "prompt_logprobs, in each completion choice's; refused with stream above 0 (vLLM's "
        "rule); the mock engine refuses it by name",
    ),
    applied(
        "echo",
        "true: the last message's content first in each choice's content when the answer "
        "continues its role (the last message is the assistant's, or add_generation_prompt is "
        "false), whole and as a chunk after the role's, as in vLLM (whose whole answer also "
        "carries the prompt's logprobs unasked: here only when prompt_logprobs asks)",
        (CHAT,),
    ),
    applied(
        "echo",
        "the prompt comes first in the text (as sent, or decoded from its ids when they were "
        "given or truncated), whole and in the first streamed chunk, as in vLLM",
        (COMPLETION,),
    ),
    # -- accepted without effect -----------------------------------------------------------
    no_effect("user", "OpenAI's end-user id for abuse monitoring; vLLM ignores it too"),
    # -- refused: what this server does not honour (yet) -----------------------------------
    refused("logprob_token_ids", "logprobs of chosen token ids are " + _NOT_YET),
    refused("thinking_token_budget", "reasoning controls are " + _NOT_YET),
    refused("use_beam_search", "beam search is " + _NOT_YET, False),
    refused("length_penalty", "a beam-search setting; beam search is " + _NOT_YET, 1.0, 1),
    refused("suffix", "suffixes are not supported (nor by vLLM)", endpoints=(COMPLETION,)),
    refused(
        "chat_template",
        "a client's own chat template is not accepted (vLLM refuses it "
        "too unless --trust-request-chat-template)",
        endpoints=(CHAT,),
    ),
    refused("media_io_kwargs", _MULTIMODAL, {}, endpoints=(CHAT,)),
    refused("mm_processor_kwargs", _MULTIMODAL, {}, endpoints=(CHAT,)),
    refused("mm_payload", _MULTIMODAL, "tensors"),
    refused("return_mm_kwargs", _MULTIMODAL, False),
    refused("prompt_embeds", "prompt embeddings are " + _NOT_YET, endpoints=(COMPLETION,)),
    refused("priority", "priority scheduling is " + _NOT_YET, 0),
    refused("request_id", "the frontend names every request itself (chatcmpl-/cmpl-<uuid>)"),
    refused("session_id", "sessions are " + _NOT_YET),
    refused("cache_salt", "prefix-cache salting is " + _NOT_YET),
    refused("return_token_offsets", "token offsets are not returned by this server", False),
    refused("routed_experts_prompt_start", _VLLM_ONLY, 0),
    refused("watermarking", _VLLM_ONLY, False),
    refused("repetition_detection", _VLLM_ONLY),
    refused("vllm_xargs", _VLLM_ONLY, {}),
    refused("stream_interval", "tokens are streamed as the worker sends them"),
    refused("kv_transfer_params", _DISAGG),
    refused("ec_transfer_params", _DISAGG),
    # -- a field vLLM removed (VLLM_REMOVED): unknown to it, but answering it quietly wrong
    applied(
        "best_of",
        "vLLM removed best_of (the best of several completions) with its V0 engine: equal to "
        "n (or null) asks for nothing and is accepted; any other value is refused by name",
    ),
)
# Fields the installed vLLM no longer declares, classified here all the same: vLLM would ignore
# them (an unknown field), which would be a quietly wrong answer.
VLLM_REMOVED = frozenset({"best_of"})


def _by_endpoint() -> dict[str, dict[str, FieldRule]]:
    table: dict[str, dict[str, FieldRule]] = {endpoint: {} for endpoint in ENDPOINTS}
    for rule in RULES:
        for endpoint in rule.endpoints:
            if rule.name in table[endpoint]:
                raise ValueError(f"{rule.name} declared twice for {endpoint}")
            table[endpoint][rule.name] = rule
    return table


# endpoint -> field name -> its rule.
FIELDS: Mapping[str, Mapping[str, FieldRule]] = _by_endpoint()


def applied_names(endpoint: str) -> frozenset[str]:
    return frozenset(n for n, r in FIELDS[endpoint].items() if r.treatment is Treatment.APPLIED)


class FieldRefused(Exception):
    """A request field this server refuses (see the module docstring): the client's 400."""

    def __init__(self, param: str, message: str, code: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message
        self.code = code


def screen(endpoint: str, body: dict[str, Any], *, strict: bool) -> dict[str, Any]:
    """The body the request model validates: its applied fields, and its unknown fields'
    names (with ``None``: their values are never read). Raises :class:`FieldRefused` for a
    refused field that asks for something, and for an unknown field when ``strict``."""
    rules = FIELDS[endpoint]
    kept: dict[str, Any] = {}
    for name, value in body.items():
        rule = rules.get(name)
        if rule is None:
            if strict:
                shown = peer_text.escape(name)  # the client's text, bounded
                raise FieldRefused(
                    shown,
                    f"Unrecognized request argument supplied: {shown} (this server refuses "
                    "fields it does not know: --dyn-strict-request-fields)",
                    "unknown_parameter",
                )
            kept[name] = None
        elif rule.treatment is Treatment.APPLIED:
            if rule.needs is not None and value and not body.get(rule.needs[0]):
                raise FieldRefused(name, rule.needs[1], "invalid_value")
            kept[name] = value
        elif rule.treatment is Treatment.REFUSED and rule.asks_for_something(value):
            raise FieldRefused(
                name,
                f"`{name}` is not supported by this server: {rule.reason}",
                "unsupported_parameter",
            )
    return kept


class UnknownFieldLog:
    """The WARNING of an unknown request field: one per field name per ``interval_s``, and at
    most ``lines`` per interval in all (a client inventing a new name per request must not
    become a line per request); the name escaped (it is the client's text)."""

    def __init__(
        self,
        *,
        lines: int = 10,
        interval_s: float = 60.0,
        names: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._budget = LogBudget(logger, lines=lines, interval_s=interval_s, clock=clock)
        self._interval_s = interval_s
        self._clock = clock
        self._names = names
        self._logged: dict[str, float] = {}  # name -> when it was last logged, oldest first

    def seen(self, endpoint: str, names: tuple[str, ...]) -> None:
        now = self._clock()
        for name in names:
            last = self._logged.get(name)
            if last is not None and now - last < self._interval_s:
                continue
            if not self._budget.emit(
                "Request field %s is not one this server or vLLM knows: ignored, as vLLM "
                "ignores it (--dyn-strict-request-fields refuses it) [%s]",
                peer_text.escape(name),
                endpoint,
            ):
                continue
            self._logged.pop(name, None)
            self._logged[name] = now
            while len(self._logged) > self._names:
                del self._logged[next(iter(self._logged))]
