"""scripts/make_tiny_model.py's cache under parallel test workers: a second builder waits for the
first and reuses its directory, instead of replacing it under the first one's readers."""

from __future__ import annotations

import fcntl
import shutil
import threading
from pathlib import Path

import make_tiny_model
import pytest


def test_a_build_waiting_on_the_lock_reuses_what_the_holder_built(tmp_path, mocker):
    out = tmp_path / "tokenizer"
    out.parent.mkdir(exist_ok=True)
    built_by = []
    build_into = make_tiny_model._build_into

    def recording_build_into(*args, **kwargs):
        built_by.append(threading.current_thread())
        build_into(*args, **kwargs)

    mocker.patch.object(make_tiny_model, "_build_into", side_effect=recording_build_into)
    result = []
    with open(tmp_path / ".tokenizer.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another builder holds the lock
        second = threading.Thread(
            target=lambda: result.append(make_tiny_model.build(out, tokenizer_only=True))
        )
        second.start()  # it finds no directory, so it waits for the lock
        make_tiny_model._build_into(out, tokenizer_only=True)  # what the holder builds
    second.join(timeout=60)
    assert not second.is_alive()
    assert result == [out.resolve()]
    assert built_by == [threading.main_thread()]  # the waiter built nothing
    assert make_tiny_model.is_built(out, tokenizer_only=True)


def test_a_forced_build_replaces_the_directory(tmp_path):
    out = make_tiny_model.build(tmp_path / "tokenizer", tokenizer_only=True)
    (out / "marker").write_text("old")
    assert make_tiny_model.build(out, tokenizer_only=True) == out
    assert (out / "marker").exists()  # reused
    assert make_tiny_model.build(out, force=True, tokenizer_only=True) == out
    assert not (out / "marker").exists()  # rebuilt


def test_a_cache_that_cannot_be_written_gives_a_private_copy_and_a_warning(tmp_path, monkeypatch):
    from tests.support import tiny_model

    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("", encoding="utf-8")
    monkeypatch.setenv("DYNAMO_TINY_TOKENIZER_DIR", str(not_a_directory / "tokenizer"))
    monkeypatch.setattr(tiny_model, "_built", None)  # this process's first use

    with pytest.warns(UserWarning, match="cannot be used"):
        built = Path(tiny_model.tiny_tokenizer_dir())
    try:
        assert not built.is_relative_to(tmp_path)
        assert (built / "tokenizer.json").is_file() and (built / "chat_template.jinja").is_file()
        assert tiny_model.tiny_tokenizer_dir() == str(built)  # built once
    finally:
        shutil.rmtree(built.parent)
