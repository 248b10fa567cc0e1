"""The frontend's options for ``--dyn-chat-processor sglang`` (upstream Dynamo's flag names).

Upstream's frontend takes ``--tool-call-parser``, ``--reasoning-parser`` and ``--chat-template``
in sglang mode; here they are declared once like every other option (with env mirrors, a docs
row), and checked at start-up, after SGLang is imported, against SGLang's own registries:

* given with another processor: exit 2 (only the sglang processor applies them here; silently
  ignoring a parser would hand a client plain text where it expects parsed calls);
* a parser name SGLang does not have: exit 2 naming the flag and env var, listing SGLang's names;
* a ``--chat-template`` that is one of SGLang's built-in names, not a file, or not ``.jinja``:
  exit 2, as upstream refuses it.

The model card does not carry the worker's parser names yet; when it does, the flags here
override it, as upstream's do.
"""

from __future__ import annotations

from dynamo.common.configuration import Option, Text

TOOL_CALL_PARSER = Option(
    name="tool-call-parser",
    env_var="DYN_TOOL_CALL_PARSER",
    default=None,
    kind=Text("parser name"),
    metavar="NAME",
    help=(
        "With --dyn-chat-processor sglang: SGLang's tool-call parser, which finds the tool "
        "calls in the model's output (qwen25, hermes, llama3, ...: any name of SGLang's "
        "FunctionCallParser registry). Unset: no tool-call parsing"
    ),
)

REASONING_PARSER = Option(
    name="reasoning-parser",
    env_var="DYN_REASONING_PARSER",
    default=None,
    kind=Text("parser name"),
    metavar="NAME",
    help=(
        "With --dyn-chat-processor sglang: SGLang's reasoning parser, which splits the "
        "model's reasoning from its answer (deepseek-r1, qwen3, ...: any name of SGLang's "
        "ReasoningParser registry). Unset: no reasoning parsing"
    ),
)

CHAT_TEMPLATE = Option(
    name="chat-template",
    env_var="DYN_CHAT_TEMPLATE",
    default=None,
    kind=Text("path"),
    metavar="PATH",
    help=(
        "With --dyn-chat-processor sglang: a .jinja chat template that every model is rendered "
        "with instead of its own (and of its worker's --chat-template); SGLang's built-in "
        "template names are refused, as upstream"
    ),
)

SGLANG_OPTIONS = [TOOL_CALL_PARSER, REASONING_PARSER, CHAT_TEMPLATE]
