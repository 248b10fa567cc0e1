"""The frontend's `hf` chat processor on the tiny model's real tokenizer files, and stop strings.

Real parts only: ``tokenizers`` loads the tiny model's tokenizer.json, ``jinja2`` renders its
template (tests/vllm checks the rendering against transformers' apply_chat_template).
"""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer

from dynamo.frontend.processors.chat_processor import (
    ChatTemplateError,
    ModelFilesError,
    NoChatTemplate,
    build_chat_processor,
)
from dynamo.frontend.processors.hf_processor import (
    ChatTemplateFailed,
    HfChatTemplate,
    find_chat_template,
    special_tokens,
)
from dynamo.frontend.serving.stop_strings import StopStringMatcher
from dynamo.runtime.tokenizer_config import token_text
from tests.support.tiny_model import BOS, EOS, build_tiny_tokenizer, tiny_card

MULTI_BYTE = "Hello 🧊 世界! émoji 👩‍👩‍👧 and ǅ, done."


@pytest.fixture
def processor(tiny_tokenizer_dir):
    return build_chat_processor(tiny_card(tiny_tokenizer_dir))


def test_the_tiny_models_template_renders_with_its_bos_and_eos(processor):
    prompt = processor.render([{"role": "user", "content": "hi"}])
    assert prompt == f"{BOS}<|user|>\nhi{EOS}\n<|assistant|>\n"
    ids = processor.encode_chat(prompt)
    raw = Tokenizer.from_file(processor.card.tokenizer_path + "/tokenizer.json")
    assert ids[0] == raw.token_to_id(BOS) and raw.token_to_id(EOS) in ids
    assert ids == raw.encode(prompt, add_special_tokens=False).ids


def test_streamed_decoding_is_byte_exact_whatever_the_chunk_boundaries(processor):
    ids = processor.encode_completion(MULTI_BYTE)
    assert len(ids) > len(MULTI_BYTE.split())  # several characters span several tokens
    rng = random.Random(7)
    for _ in range(50):
        detokenizer = processor.detokenizer()
        pieces, start = [], 0
        while start < len(ids):
            size = rng.randint(1, 4)
            pieces.append(detokenizer.add(ids[start : start + size]))
            start += size
        pieces.append(detokenizer.finish())
        assert "".join(pieces) == MULTI_BYTE
        assert "\ufffd" not in "".join(pieces[:-1])  # never half a character on the way


def test_one_id_at_a_time_never_shows_half_a_character(processor):
    ids = processor.encode_completion("🧊")
    assert len(ids) > 1
    detokenizer = processor.detokenizer()
    assert [detokenizer.add([i]) for i in ids] == [""] * (len(ids) - 1) + ["🧊"]


def test_special_tokens_are_hidden_and_an_unfinished_character_is_dropped_as_vllm_does(
    processor,
):
    eos = processor.card.eos_token_ids[0]
    ids = processor.encode_completion("ok") + [eos]
    detokenizer = processor.detokenizer()
    assert detokenizer.add(ids) + detokenizer.finish() == "ok"
    cut = processor.encode_completion("🧊")[:-1]
    detokenizer = processor.detokenizer()
    # vLLM's detokenizer never flushes it (tests/vllm/test_vllm_conformance.py, n-seed).
    assert detokenizer.add(cut) == "" and detokenizer.finish() == ""
    # An id outside the vocabulary (a worker bug) is dropped, not a crash.
    detokenizer = processor.detokenizer()
    assert detokenizer.add([10**6, -1] + processor.encode_completion("x")) == "x"


def test_a_model_without_a_template_refuses_chat_but_encodes_completions(tmp_path):
    directory = build_tiny_tokenizer(tmp_path / "plain", chat_template=False)
    processor = build_chat_processor(tiny_card(directory))
    assert processor.template is None
    with pytest.raises(NoChatTemplate, match="no chat template"):
        processor.render([{"role": "user", "content": "hi"}])
    assert processor.encode_completion("hi")


def test_template_sources_in_order_override_file_then_config(tmp_path):
    directory = build_tiny_tokenizer(tmp_path / "m", chat_template=False)
    config = {"chat_template": "from-config"}
    assert find_chat_template(directory, config) == "from-config"
    named = {
        "chat_template": [
            {"name": "tool_use", "template": "t"},
            {"name": "default", "template": "d"},
        ]
    }
    assert find_chat_template(directory, named) == "d"
    (directory / "chat_template.jinja").write_text("from-file", encoding="utf-8")
    assert find_chat_template(directory, config) == "from-file"
    override = tmp_path / "override.jinja"
    override.write_text("from-override", encoding="utf-8")
    assert find_chat_template(directory, config, str(override)) == "from-override"
    with pytest.raises(ModelFilesError, match="does not exist"):
        find_chat_template(directory, config, str(tmp_path / "missing.jinja"))


def test_the_card_chat_template_path_overrides_the_models_own(tiny_tokenizer_dir, tmp_path):
    override = tmp_path / "t.jinja"
    override.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}", encoding="utf-8")
    card = tiny_card(tiny_tokenizer_dir, chat_template_path=str(override))
    assert build_chat_processor(card).render([{"role": "user", "content": "x"}]) == "[x]"


def test_special_tokens_from_added_token_dicts():
    config = {
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False},
        "eos_token": "</s>",
        "unk_token": None,
        "chat_template": "ignored",
    }
    assert special_tokens(config) == {"bos_token": "<s>", "eos_token": "</s>"}
    assert token_text(5) is None


def test_the_environment_is_transformers_one():
    source = (
        "{% for m in messages %}\n"
        "  {{- m['content'] | tojson }}\n"
        "{% if loop.index == 1 %}{% continue %}{% endif %}"
        "{{ strftime_now('%Y') | length }}\n"
        "{% endfor %}"
        "{% if messages | length > 2 %}{{ raise_exception('too many: ' ~ messages|length) }}"
        "{% endif %}"
    )
    template = HfChatTemplate(source, {})
    rendered = template.render([{"content": "<b>é</b>"}, {"content": "x"}])
    # tojson keeps HTML and non-ASCII as they are; trim_blocks eats the newline after a block
    # tag (not after an expression), lstrip_blocks the indent before one; loopcontrols is on.
    assert rendered == json.dumps("<b>é</b>", ensure_ascii=False) + '\n"x"\n4\n'
    with pytest.raises(ChatTemplateError, match="too many: 3"):
        template.render([{"content": "a"}] * 3)


def test_the_sandbox_refuses_what_a_hostile_template_tries():
    """What the sandbox forbids is the template failing (the model's fault), not the template
    refusing the request."""
    template = HfChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(ChatTemplateFailed, match="SecurityError"):
        template.render([{"content": "a"}])
    mutating = HfChatTemplate("{% set _ = messages.append(1) %}", {})
    with pytest.raises(ChatTemplateFailed, match="SecurityError"):
        mutating.render([])


def test_a_template_that_does_not_compile_or_a_missing_tokenizer_is_a_model_files_error(
    tiny_tokenizer_dir, tmp_path
):
    with pytest.raises(ModelFilesError, match="does not compile"):
        HfChatTemplate("{% for %}", {})
    with pytest.raises(ModelFilesError, match="tokenizer.json"):
        build_chat_processor(tiny_card(tiny_tokenizer_dir, tokenizer_path=str(tmp_path)))
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelFilesError, match="cannot load"):
        build_chat_processor(tiny_card(tiny_tokenizer_dir, tokenizer_path=str(tmp_path)))


# -- stop strings ------------------------------------------------------------------------------


def run_matcher(stops, chunks):
    matcher = StopStringMatcher(stops)
    sent = []
    for chunk in chunks:
        sent.append(matcher.feed(chunk))
        if matcher.stopped:
            break
    sent.append(matcher.flush())
    return sent, matcher.stopped


@pytest.mark.parametrize("split", range(1, 12))
def test_a_stop_string_split_anywhere_never_leaks(split):
    text = "one two STOP three"
    chunks = [text[i : i + split] for i in range(0, len(text), split)]
    sent, stopped = run_matcher(["STOP"], chunks)
    assert stopped and "".join(sent) == "one two "
    assert not any("S" in piece for piece in sent)  # not even a partial match went out


def test_a_partial_match_that_does_not_complete_is_sent_later():
    sent, stopped = run_matcher(["STOP"], ["a ST", "ORE b", " STO"])
    assert not stopped
    assert sent == ["a ", "STORE b", " ", "STO"]  # the tail "STO" only at the end


def test_the_earliest_of_several_stop_strings_wins():
    sent, stopped = run_matcher(["bb", "abc"], ["xxab", "cbb"])
    assert stopped and "".join(sent) == "xx"


def test_no_stop_strings_pass_everything_through():
    assert run_matcher([], ["a", "b"]) == (["a", "b", ""], False)
