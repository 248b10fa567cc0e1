"""A tiny model that thinks before it calls: the tiny model's recipe (scripts/make_tiny_model.py)
with its weights set so that greedy decoding writes a known reasoning, then whatever call a
grammar asks for, then stops. Built here from nothing (no download), for the conformance tests
of forced tool calls on a reasoning model against ``vllm serve`` (issue 37).

The tokenizer is the tiny model's with Qwen3's markers added as tokens of their own (``<think>``,
``</think>``, ``<tool_call>``, ``</tool_call>``, and ``<|assistant|>`` so the prompt always ends
on one known token). The model is a bigram model: every layer's attention and MLP write nothing
(``o_proj`` and ``down_proj`` are zero), so the last hidden state is the current token's
embedding, and the output head decides the next token from it alone:

* a chain of tokens the model always continues the same way (:data:`CHAIN`): after the
  prompt's ``<|assistant|>`` it writes ``<think>``, :data:`REASONING`, ``</think>`` and
  ``<tool_call>``. Unconstrained, that is a reasoning, then the start of a call;
* every other token prefers, in this order, the end of text, the tokens that close or open JSON
  and a call (``</tool_call>``, ``]``, ``}``, ``{``, ``[``, ``"``, ``:``, ``,``, ``<tool_call>``),
  then the rest, and least of all whitespace. Where a grammar decides (a forced call's structural
  tag or JSON schema), that order picks among what it allows: the shortest call it admits (empty
  arguments), then the end of text, never a run of whitespace.

So with ``tool_choice`` ``required`` or a named function, a server whose grammar waits for the
reasoning to end answers the reasoning, then the call; one whose grammar starts at the first
token answers the call alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import make_tiny_model  # scripts/ is on sys.path (pyproject.toml: pytest's pythonpath)

ASSISTANT = "<|assistant|>"
THINK, END_THINK = "<think>", "</think>"
TOOL_CALL, END_TOOL_CALL = "<tool_call>", "</tool_call>"
ADDED = [ASSISTANT, THINK, END_THINK, TOOL_CALL, END_TOOL_CALL]
# The reasoning the model writes (tokens of the tiny vocabulary).
REASONING_TOKENS = ["Ġthe", "Ġweather", "Ġis", "Ġsunny"]
REASONING = " the weather is sunny"
# What each chained token is always followed by.
CHAIN = [ASSISTANT, THINK, *REASONING_TOKENS, END_THINK, TOOL_CALL]
# The rest prefer these, best first (see the module docstring).
# ("Ġ{" is " {", which a grammar's "arguments": may ask for.)
PREFERRED = [
    make_tiny_model.EOS, END_TOOL_CALL, "]", "}", "{", "Ġ{", "[", '"', ":", ",", TOOL_CALL
]  # fmt: skip
# A reasoning-style template (Qwen3's rule: the thinking closed in the prompt when the client
# turns it off), ending the generation prompt on the ASSISTANT token.
TEMPLATE = (
    "{%- if tools %}<|tools|>{{ tools | map(attribute='function') | map(attribute='name') "
    "| join(',') }}\n{% endif %}"
    "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}\n{% endfor %}"
    "{%- if add_generation_prompt %}" + ASSISTANT
    + "{%- if enable_thinking is defined and enable_thinking is false %}"
    + THINK + "\n\n" + END_THINK + "\n\n{%- endif %}{%- endif %}"
)  # fmt: skip

CHAIN_WEIGHT = 20.0  # far above any preference
STAMP = "thinking-model.json"


def build_thinking_model(out: Path) -> Path:
    """The model directory (weights, tokenizer, TEMPLATE as its chat template) in ``out``."""
    from tokenizers import AddedToken

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tiny_model.train_tokenizer()
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    model = make_tiny_model.build_model(tokenizer)
    _set_weights(model, tokenizer)
    model.save_pretrained(out)
    make_tiny_model.write_tokenizer_files(tokenizer, out)
    (out / "chat_template.jinja").write_text(TEMPLATE, encoding="utf-8")
    (out / STAMP).write_text(json.dumps({"chain": CHAIN, "preferred": PREFERRED}) + "\n")
    return out


def _ids(tokenizer, tokens: list[str]) -> list[int]:
    ids = [tokenizer.token_to_id(token) for token in tokens]
    missing = [token for token, id_ in zip(tokens, ids, strict=True) if id_ is None]
    if missing:
        raise RuntimeError(f"the tiny vocabulary lacks {missing}: change the thinking model")
    return ids


def _set_weights(model, tokenizer) -> None:
    import torch

    vocab = tokenizer.get_vocab_size()
    hidden = model.config.hidden_size
    chain = _ids(tokenizer, CHAIN)
    if len(chain) + 1 > hidden:
        raise RuntimeError("the chain needs one hidden dimension per token, and one more")
    preferred = _ids(tokenizer, PREFERRED)
    with torch.no_grad():
        for layer in model.model.layers:  # each layer adds nothing to the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        embed = torch.zeros(vocab, hidden)
        embed[:, 0] = 1.0  # what every token shares: the preferences read it
        head = torch.zeros(vocab, hidden)
        # The preferences: the listed tokens, best first; whitespace least of all.
        for rank, id_ in enumerate(preferred):
            head[id_, 0] = float(len(preferred) - rank)
        for id_ in tokenizer.get_vocab().values():
            decoded = tokenizer.decode([id_])
            if decoded and not decoded.strip():
                head[id_, 0] = -5.0
        # The chain: each chained token has a dimension of its own, which only its successor's
        # row of the head reads.
        pairs = zip(chain[:-1], chain[1:], strict=True)
        for dimension, (token, successor) in enumerate(pairs, start=1):
            embed[token, dimension] = 1.0
            head[successor, dimension] = CHAIN_WEIGHT
        dtype = model.model.embed_tokens.weight.dtype
        model.model.embed_tokens.weight.copy_(embed.to(dtype))
        model.lm_head.weight.copy_(head.to(dtype))


def build_with(python: str, out: Path) -> str:
    """Build into ``out`` with ``python`` (an environment with torch and transformers: the
    vLLM one), in a process of its own and offline; the directory."""
    from bench_common import built_model_dir

    return built_model_dir([python, str(Path(__file__).resolve()), str(out)])


def main() -> None:
    """``python tests/support/thinking_model.py OUT`` (scripts/ on ``PYTHONPATH``): build into
    OUT, print it. The tests build it in a process of their own, offline, as the tiny model."""
    import sys

    print(build_thinking_model(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
