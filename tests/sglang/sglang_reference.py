"""What SGLang itself makes of a chat, for the tests to compare the frontend against (this
module holds no tests; it imports SGLang, so only tests marked ``sglang`` use it)."""

from __future__ import annotations


def sglang_prompt_ids(tokenizer_dir: str, messages: list[dict]) -> list[int]:
    """SGLang's own preprocessing of ``messages``, as upstream Dynamo's SGLang processor calls
    it: content normalised for the template, then one ``apply_chat_template(tokenize=True)``."""
    from sglang.srt.parser.jinja_template_utils import (
        detect_jinja_template_content_format,
        process_content_for_template_format,
    )
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    tokenizer = get_tokenizer(tokenizer_dir)
    content_format = detect_jinja_template_content_format(tokenizer.chat_template)
    normalised = [
        process_content_for_template_format(dict(m), content_format, [], [], [], [])
        for m in messages
    ]
    rendered = tokenizer.apply_chat_template(normalised, add_generation_prompt=True, tokenize=True)
    return list(getattr(rendered, "input_ids", rendered))


def sglang_decode(tokenizer_dir: str, ids: list[int]) -> str:
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    return get_tokenizer(tokenizer_dir).decode(ids, skip_special_tokens=True)
