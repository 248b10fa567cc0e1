"""The frontend's options for ``--dyn-chat-processor sglang`` (upstream Dynamo's flag names).

Upstream's frontend takes ``--tool-call-parser``, ``--reasoning-parser`` and ``--chat-template``
in sglang mode; here they are declared once like every other option (with env mirrors, a docs
row), and checked at start-up, after SGLang is imported, against SGLang's own registries:

* given with another processor: exit 2 (the parser names apply with ``sglang`` and ``vllm``,
  ``--chat-template`` with ``sglang`` only; silently ignoring a parser would hand a client
  plain text where it expects parsed calls);
* a parser name SGLang does not have: exit 2 naming the flag and env var, listing SGLang's names;
* a ``--chat-template`` that is one of SGLang's built-in names, not a file, or not ``.jinja``:
  exit 2, as upstream refuses it.

The model card carries the worker's parser names (``--dyn-tool-call-parser`` /
``--dyn-reasoning-parser``); the flags here override them, as upstream's do
(:mod:`dynamo.frontend.processors.card_parsers`).

One env var, one meaning: ``DYN_TOOL_CALL_PARSER`` / ``DYN_REASONING_PARSER`` are the worker's
(upstream's names for ``--dyn-tool-call-parser`` / ``--dyn-reasoning-parser``). Upstream's
frontend reads no env var for its ``--tool-call-parser`` / ``--reasoning-parser``, so the
frontend's are its own (``DYN_FRONTEND_*``, upstream's prefix for frontend-only settings): an
environment shared by workers and a frontend no longer makes an ``hf`` frontend exit 2, nor a
``vllm`` / ``sglang`` frontend override every model's card.
"""

from __future__ import annotations

from dynamo.common.configuration import text_option

TOOL_CALL_PARSER = text_option(
    "tool-call-parser",
    "DYN_FRONTEND_TOOL_CALL_PARSER",
    (
        "With --dyn-chat-processor sglang: SGLang's tool-call parser, which finds the tool "
        "calls in the model's output (qwen25, hermes, llama3, ...: any name of SGLang's "
        "FunctionCallParser registry); with vllm: vLLM's (hermes, llama3_json, ...: its "
        "ToolParserManager). Overrides the worker's --dyn-tool-call-parser in the model card. "
        "Unset: the card's, else none"
    ),
    what="parser name",
    metavar="NAME",
)

REASONING_PARSER = text_option(
    "reasoning-parser",
    "DYN_FRONTEND_REASONING_PARSER",
    (
        "With --dyn-chat-processor sglang: SGLang's reasoning parser, which splits the "
        "model's reasoning from its answer (deepseek-r1, qwen3, ...: any name of SGLang's "
        "ReasoningParser registry); with vllm: vLLM's (deepseek_r1, qwen3, ...: its "
        "ReasoningParserManager). Overrides the worker's --dyn-reasoning-parser in the model "
        "card. Unset: the card's, else none"
    ),
    what="parser name",
    metavar="NAME",
)

CHAT_TEMPLATE = text_option(
    "chat-template",
    "DYN_CHAT_TEMPLATE",
    (
        "With --dyn-chat-processor sglang: a .jinja chat template that every model is rendered "
        "with instead of its own (and of its worker's --chat-template); SGLang's built-in "
        "template names are refused, as upstream"
    ),
    what="path",
    metavar="PATH",
)

SGLANG_OPTIONS = [TOOL_CALL_PARSER, REASONING_PARSER, CHAT_TEMPLATE]
