"""scripts/make_tiny_model.py's cache under parallel test workers: a second builder waits for the
first and reuses its directory, instead of replacing it under the first one's readers."""

from __future__ import annotations

import fcntl
import threading

import make_tiny_model


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
