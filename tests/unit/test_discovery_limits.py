"""The file backend's bounds: records over the size limit are never read whole, and a record that
can never be read warns once per cause, not at every poll (issue 14, item 4)."""

from __future__ import annotations

import logging
import os

import pytest

from dynamo.runtime.discovery import file_backend as discovery
from dynamo.runtime.discovery import file_watcher
from dynamo.runtime.discovery.file_store import DiscoveryStore
from dynamo.runtime.discovery.record import MAX_RECORD_BYTES, ModelRecord
from tests.support.watched import TTL_S, Watched


def _warnings(caplog, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and text in r.getMessage()
    ]


def test_an_oversized_record_is_skipped_unread_with_one_warning(tmp_path, caplog, mocker):
    DiscoveryStore(tmp_path).register(ModelRecord(model="m", endpoint="http://x", instance_id="ok"))
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:  # sparse: 200 MB on paper, nothing on disk
        handle.truncate(200 * 1024 * 1024)
    opened = mocker.patch.object(
        file_watcher, "read_record_file", wraps=file_watcher.read_record_file
    )
    watched = Watched(tmp_path)
    for _ in range(4):
        watched.poll()
        watched.clock.advance(TTL_S)  # past the re-read interval: every poll looks again
    assert watched.live() == {"ok"}
    warned = _warnings(caplog, "Ignoring malformed discovery record")
    assert len(warned) == 1 and "huge.json" in warned[0]
    assert f"over the {MAX_RECORD_BYTES}-byte record limit" in warned[0]
    assert all(str(call.args[0]) != str(huge) for call in opened.call_args_list if call.args)


def test_a_record_that_grows_past_the_limit_after_its_stat_is_not_read_whole(tmp_path, caplog):
    path = tmp_path / "grows.json"
    path.write_bytes(b"{}")
    real_stat = os.lstat

    def stat_before_growth(p, *args, **kwargs):
        result = real_stat(p, *args, **kwargs)
        if str(p) == str(path) and result.st_size < MAX_RECORD_BYTES:
            path.write_bytes(b" " * (MAX_RECORD_BYTES + 10))  # grows between stat and read
        return result

    watched = Watched(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(discovery.os, "lstat", stat_before_growth)
        watched.poll()
    assert watched.live() == set()
    assert len(_warnings(caplog, "record limit")) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file whatever its mode")
def test_an_unreadable_record_warns_once_not_at_every_poll(tmp_path, caplog):
    path = tmp_path / "locked.json"
    path.write_text(ModelRecord(model="m", endpoint="http://x").to_json())
    path.chmod(0)
    watched = Watched(tmp_path)
    for _ in range(5):
        watched.poll()
        watched.clock.advance(TTL_S)
    assert len(_warnings(caplog, "Cannot read discovery record")) == 1


def test_a_symlink_is_never_followed_warned_once_and_again_after_it_was_fixed_and_broken(
    tmp_path, caplog
):
    """A record file is a worker's own regular file: a symbolic link (to a record elsewhere, to a
    loop, to a FIFO) is not one, whatever it points at."""
    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    watched = Watched(tmp_path)
    for _ in range(5):
        watched.poll()
        watched.clock.advance(1.0)
    assert len(_warnings(caplog, "symbolic link")) == 1

    loop.unlink()  # fixed: a readable record
    DiscoveryStore(tmp_path).register(
        ModelRecord(model="m", endpoint="http://x", instance_id="loop")
    )
    watched.poll()
    assert watched.live() == {"loop"}

    loop.unlink()
    os.symlink(loop, loop)  # the same cause again, after a recovery: warned again
    for _ in range(3):
        watched.poll()
        watched.clock.advance(1.0)
    assert len(_warnings(caplog, "symbolic link")) == 2
    assert watched.live() == set()
