"""What a model card can make the frontend read (issue 19, item 1, the frontend's half): the
real processor builder on hostile cards and model directories this test writes (symlinks,
``..``, FIFOs, sparse files over the bounds, Hugging Face cache layouts), with and without the
operator's ``--dyn-model-dirs``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dynamo.frontend.frontend_args import parse_args as parse_frontend
from dynamo.frontend.processors.chat_processor import build_chat_processor, model_files
from dynamo.frontend.processors.model_files import (
    MAX_CONFIG_BYTES,
    MAX_TOKENIZER_BYTES,
    ModelFilesError,
)
from dynamo.runtime.template_files import MAX_TEMPLATE_BYTES
from tests.support.tiny_model import build_tiny_tokenizer, tiny_card

TEMPLATE = "{% for m in messages %}[{{ m.content }}]{% endfor %}"


@pytest.fixture
def model(tmp_path) -> Path:
    """A copy of the tiny model in ``models/tiny`` (the operator's directory is ``models``)."""
    (tmp_path / "models").mkdir()
    return build_tiny_tokenizer(tmp_path / "models" / "tiny")


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory outside the model's, holding files a hostile card would like read."""
    directory = tmp_path / "secrets"
    build_tiny_tokenizer(directory)
    (directory / "passwd").write_text("root:x:0:0:secret\n", encoding="utf-8")
    (directory / "secret.jinja").write_text("{{ 'secret' }}", encoding="utf-8")
    return directory


def refused(card, model_dirs=(), match: str | None = None) -> str:
    with pytest.raises(ModelFilesError, match=match) as caught:
        build_chat_processor(card, model_dirs=model_dirs)
    return str(caught.value)


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


# --- the tokenizer directory -------------------------------------------------------------------


@pytest.mark.parametrize("named", ["missing", "file", "/dev/null"])
def test_a_tokenizer_directory_that_is_not_one_is_refused(model, tmp_path, named):
    path = {"missing": str(tmp_path / "nope"), "file": str(model / "tokenizer.json")}.get(
        named, named
    )
    refused(tiny_card(model).model_copy(update={"tokenizer_path": path}), match="not a directory")


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("tokenizer.json", "tokenizer.json"),  # a valid tokenizer, but not the model's own
        ("tokenizer_config.json", "tokenizer_config.json"),
        ("chat_template.jinja", "secret.jinja"),
        ("tokenizer.json", "passwd"),
    ],
)
@pytest.mark.parametrize("how", ["absolute", "dot-dot"])
def test_a_model_file_that_leads_outside_the_model_directory_is_refused(
    model, outside, name, target, how
):
    card = tiny_card(model)  # (the test's card reads the tokenizer itself)
    (model / name).unlink(missing_ok=True)
    link = outside / target if how == "absolute" else Path("..", "..", "secrets", target)
    (model / name).symlink_to(link)
    message = refused(card, match="leads outside the model's directory")
    assert str(outside) in message


def test_links_inside_the_model_directory_are_followed(model):
    (model / "real.json").write_bytes((model / "tokenizer.json").read_bytes())
    (model / "tokenizer.json").unlink()
    (model / "tokenizer.json").symlink_to("real.json")
    assert build_chat_processor(tiny_card(model)).render([{"role": "user", "content": "x"}])


def test_a_fifo_is_refused_without_blocking(model):
    (model / "tokenizer_config.json").unlink()
    os.mkfifo(model / "tokenizer_config.json")  # a read would block forever: it is never read
    refused(tiny_card(model), match="not a regular file")


@pytest.mark.parametrize(
    ("name", "bound"),
    [("tokenizer.json", MAX_TOKENIZER_BYTES), ("tokenizer_config.json", MAX_CONFIG_BYTES),
     ("chat_template.jinja", MAX_TEMPLATE_BYTES), ("vocab.json", MAX_TOKENIZER_BYTES)],
)  # fmt: skip
def test_a_file_over_its_bound_is_refused_before_it_is_read(model, name, bound):
    card = tiny_card(model)
    sparse(model / name, bound + 1)  # sparse: no disk, and never read
    refused(card, match=f"over the frontend's bound of {bound}")


def test_a_directory_named_like_a_model_file_is_refused(model):
    (model / "chat_template.jinja").unlink()
    (model / "chat_template.jinja").mkdir()
    refused(tiny_card(model), match="not a regular file")


def test_a_hugging_face_cache_snapshot_may_link_to_its_own_blobs(tmp_path, model, outside):
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for source in model.iterdir():
        blob = repo / "blobs" / f"sha-{source.name}"
        blob.write_bytes(source.read_bytes())
        (snapshot / source.name).symlink_to(Path("..", "..", "blobs", blob.name))
    processor = build_chat_processor(tiny_card(snapshot))
    assert processor.encode_completion("hello")
    # ... but not beyond the repository directory.
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    refused(tiny_card(snapshot), match="leads outside")


def test_library_files_are_checked_for_every_processor_kind(model, outside):
    # vLLM's and SGLang's loaders open these themselves: they are checked first.
    (model / "vocab.json").symlink_to(outside / "passwd")
    with pytest.raises(ModelFilesError, match="leads outside"):
        model_files(tiny_card(model))


# --- the chat template a card names ------------------------------------------------------------


@pytest.mark.parametrize("target", ["passwd", "tokenizer.json", "/proc/self/environ"])
def test_a_chat_template_that_is_not_a_jinja_file_is_refused(model, outside, target):
    path = target if target.startswith("/") else str(outside / target)
    message = refused(tiny_card(model, chat_template_path=path), match="is not a Jinja file")
    assert "root:x" not in message


def test_a_jinja_name_linking_to_another_file_is_refused(model, outside, tmp_path):
    (tmp_path / "innocent.jinja").symlink_to(outside / "passwd")
    refused(
        tiny_card(model, chat_template_path=str(tmp_path / "innocent.jinja")),
        match="resolves to",
    )
    dotted = str(model / ".." / ".." / "secrets" / "passwd")
    refused(tiny_card(model, chat_template_path=dotted), match="not a Jinja file")


def test_a_chat_template_fifo_or_oversized_is_refused(model, tmp_path):
    os.mkfifo(tmp_path / "fifo.jinja")
    refused(tiny_card(model, chat_template_path=str(tmp_path / "fifo.jinja")), match="regular")
    big = sparse(tmp_path / "big.jinja", MAX_TEMPLATE_BYTES + 1)
    refused(tiny_card(model, chat_template_path=str(big)), match="over the frontend's bound")


def test_a_jinja_template_outside_the_model_directory_is_served_by_default(model, tmp_path):
    # vLLM's --chat-template often lives elsewhere (existing deployments keep working).
    (tmp_path / "t.jinja").write_text(TEMPLATE, encoding="utf-8")
    card = tiny_card(model, chat_template_path=str(tmp_path / "t.jinja"))
    assert build_chat_processor(card).render([{"role": "user", "content": "x"}]) == "[x]"


# --- the operator's directories ----------------------------------------------------------------


def test_with_model_dirs_a_card_inside_them_is_served(model, tmp_path):
    (model / "t.jinja").write_text(TEMPLATE, encoding="utf-8")
    card = tiny_card(model, chat_template_path=str(model / "t.jinja"))
    dirs = (str(tmp_path / "elsewhere"), str(tmp_path / "models"))
    assert build_chat_processor(card, model_dirs=dirs).render([{"role": "user", "content": "y"}])


@pytest.mark.parametrize(
    "case", ["directory outside", "dot-dot out", "linked directory", "template outside"]
)
def test_with_model_dirs_anything_resolving_outside_them_is_refused(model, outside, tmp_path, case):
    allowed = tmp_path / "models"
    card = {
        "directory outside": lambda: tiny_card(outside),
        "dot-dot out": lambda: tiny_card(f"{allowed}/../secrets"),
        "linked directory": lambda: tiny_card(_link(allowed / "innocent", outside)),
        "template outside": lambda: tiny_card(
            model, chat_template_path=str(outside / "secret.jinja")
        ),
    }[case]()
    message = refused(card, model_dirs=(str(allowed),), match="--dyn-model-dirs / DYN_MODEL_DIRS")
    assert str(allowed) in message


def _link(link: Path, target: Path) -> Path:
    link.symlink_to(target, target_is_directory=True)
    return link


def test_peer_text_in_the_refusal_is_escaped(tmp_path):
    card = tiny_card(build_tiny_tokenizer(tmp_path / "m"))
    card = card.model_copy(update={"chat_template_path": "/x\nWARNING forged\x00.txt"})
    message = refused(card)
    assert "\n" not in message and "\x00" not in message


def test_with_model_dirs_the_template_must_still_be_a_jinja_file(model, tmp_path):
    # The option only adds rules: inside the operator's directories a `token` file or any
    # other non-template file is still refused as a chat template.
    (model / "token").write_text("hf_secret\n", encoding="utf-8")
    card = tiny_card(model, chat_template_path=str(model / "token"))
    refused(card, model_dirs=(str(tmp_path / "models"),), match="not a Jinja file")


@pytest.mark.parametrize(
    ("value", "dirs"),
    [("/a", ("/a",)), ("/a:/b c:", ("/a", "/b c")), (":: :/m", ("/m",))],
)
def test_model_dirs_parse_to_the_resolved_directories(tmp_path, value, dirs):
    for directory in dirs:
        (tmp_path / directory.lstrip("/")).mkdir()
    rooted = ":".join(f"{tmp_path}{part}" if part.strip() else part for part in value.split(":"))
    config = parse_frontend([], {"DYN_MODEL_DIRS": rooted})
    assert config.dyn_model_dirs == tuple(f"{tmp_path}{d}" for d in dirs)
    assert parse_frontend([], {}).dyn_model_dirs is None


@pytest.mark.parametrize("case", ["empty", "separators only", "missing", "a regular file"])
@pytest.mark.parametrize("via", ["flag", "env"])
def test_model_dirs_that_would_confine_nothing_exit_2_at_parse_time(
    model, tmp_path, capsys, case, via
):
    value = {
        "empty": "",
        "separators only": ": :",
        "missing": f"{tmp_path}/models:{tmp_path}/nope",
        "a regular file": f"{tmp_path}/models:{model}/tokenizer.json",
    }[case]
    argv, env = (
        ([f"--dyn-model-dirs={value}"], {}) if via == "flag" else ([], {"DYN_MODEL_DIRS": value})
    )
    with pytest.raises(SystemExit) as exc:
        parse_frontend(argv, env)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--dyn-model-dirs" in err and "DYN_MODEL_DIRS" in err, err
    assert {"missing": "does not exist", "a regular file": "is not a directory"}.get(
        case, "names no directory"
    ) in err
