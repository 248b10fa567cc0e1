"""What whoever can write a discovery record cannot make the frontend do (issue 19, the discovery
kinds): block a read, follow a link, grow the frontend's memory or log without bound, put two
records for one instance, or hide a change; and the default directory is this user's own.

Real files, real FIFOs and (as root) real device nodes; the watcher is polled by hand on an
injected clock (tests/support/watched.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from dynamo.runtime.discovery import (
    DiscoveryDirError,
    DiscoverySettings,
    file_watcher,
    open_discovery,
    periodic,
)
from dynamo.runtime.discovery.file_backend import FileDiscovery
from dynamo.runtime.discovery.file_store import DiscoveryStore, check_private_directory
from dynamo.runtime.discovery.record import MAX_RECORD_BYTES, ModelRecord, record_problem
from dynamo.runtime.model_card import MAX_CONTEXT_LENGTH, ModelCard
from tests.support import wait_until_async
from tests.support.watched import Watched, leased

LOGGER = "dynamo.runtime.discovery"


def _warnings(caplog, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(LOGGER) and r.levelno == logging.WARNING and text in r.getMessage()
    ]


# --- reads that cannot block -------------------------------------------------------------


def test_a_fifo_record_is_refused_without_blocking(tmp_path, caplog):
    os.mkfifo(tmp_path / "fifo.json")  # opening it for reading would wait for a writer
    DiscoveryStore(tmp_path).register(leased("ok"))
    watched = Watched(tmp_path)
    watched.poll()
    assert watched.live() == {"ok"}
    assert len(_warnings(caplog, "not a regular file")) == 1


@pytest.mark.parametrize("target", ["fifo", "record"])
def test_a_symlink_is_never_followed_whatever_it_points_at(tmp_path, caplog, target):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if target == "fifo":
        os.mkfifo(elsewhere / "x")
    else:
        (elsewhere / "x").write_text(ModelRecord("m", "http://w:1", "link").to_json())
    records = tmp_path / "records"
    records.mkdir()
    os.symlink(elsewhere / "x", records / "link.json")
    watched = Watched(records)
    watched.poll()
    assert watched.live() == set()
    assert len(_warnings(caplog, "symbolic link")) == 1


def test_a_fifo_swapped_in_between_the_stat_and_the_open_does_not_block(tmp_path, mocker, caplog):
    """The race the stat cannot see: what is opened is checked again, and the open cannot
    block (O_NONBLOCK), so a FIFO renamed over the record after its stat is refused."""
    path = tmp_path / "swapped.json"
    path.write_text(ModelRecord("m", "http://w:1", "swapped").to_json())
    fifo = tmp_path / ".fifo"
    os.mkfifo(fifo)
    real_lstat = os.lstat

    def lstat_then_swap(target, *args, **kwargs):
        result = real_lstat(target, *args, **kwargs)
        if str(target) == str(path) and stat.S_ISREG(result.st_mode):
            os.replace(fifo, path)  # the FIFO takes the record's name after its stat
        return result

    mocker.patch.object(file_watcher.os, "lstat", lstat_then_swap)
    watched = Watched(tmp_path)
    done = threading.Event()

    def poll() -> None:
        watched.poll()
        done.set()

    threading.Thread(target=poll, daemon=True).start()
    assert done.wait(30), "the poll blocked on the FIFO"
    assert watched.live() == set()
    assert len(_warnings(caplog, "not a regular file")) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device node needs root")
def test_a_device_node_is_refused_without_being_read(tmp_path, caplog):
    os.mknod(tmp_path / "zero.json", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
    watched = Watched(tmp_path)
    watched.poll()
    assert watched.live() == set()
    assert len(_warnings(caplog, "not a regular file")) == 1


def test_a_stuck_file_system_call_degrades_the_watcher_and_never_holds_its_stop(
    tmp_path, mocker, caplog
):
    """A poll stuck in the kernel (a hard NFS mount gone): /health's discovery state says
    degraded after a TTL, and stopping the watcher returns within its bound; the stuck thread
    is a daemon, left behind."""
    DiscoveryStore(tmp_path).register(leased("i1"))
    release = threading.Event()
    real_read = file_watcher.read_record_file

    def stuck_read(path):
        release.wait(60)
        return real_read(path)

    mocker.patch.object(file_watcher, "read_record_file", stuck_read)
    mocker.patch.object(file_watcher, "STUCK_POLL_FLOOR_S", 0.2)
    mocker.patch.object(periodic, "STOP_BOUND_S", 0.5)
    discovery = FileDiscovery(str(tmp_path), ttl_s=0.2)
    watcher = discovery.watcher(on_add=lambda r: None, on_remove=lambda r: None)

    async def scenario() -> None:
        watcher.start()
        await wait_until_async(lambda: watcher.state == "degraded", deadline_s=30)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await watcher.stop()
        assert loop.time() - began < 5

    try:
        asyncio.run(scenario())
    finally:
        release.set()
    assert _warnings(caplog, "did not stop within")


# --- bounded memory and log -------------------------------------------------------------


def test_records_past_the_limit_are_ignored_the_same_ones_every_time(tmp_path, caplog):
    store = DiscoveryStore(tmp_path)
    for n in range(7):
        store.register(leased(f"i{n}"))
    watched = Watched(tmp_path, max_records=5)
    for _ in range(3):
        watched.poll()
    assert watched.live() == {f"i{n}" for n in range(5)}  # the first five names, every poll
    assert len(_warnings(caplog, "over the limit of 5")) == 1  # one a minute


def test_a_flood_of_malformed_records_is_a_bounded_number_of_lines(tmp_path, caplog):
    for n in range(300):
        (tmp_path / f"junk{n}.json").write_text("{")
    watched = Watched(tmp_path)
    watched.poll()
    lines = _warnings(caplog, "Ignoring malformed discovery record")
    assert len(lines) == file_watcher.MALFORMED_LINES_PER_MINUTE


def test_a_record_over_the_size_limit_is_never_read(tmp_path, caplog):
    (tmp_path / "big.json").write_bytes(b" " * (MAX_RECORD_BYTES + 1))
    watched = Watched(tmp_path)
    watched.poll()
    assert len(_warnings(caplog, "record limit")) == 1


def test_peer_text_in_a_warning_is_escaped_and_bounded(tmp_path, caplog):
    name = "forged\nWARNING fake line\x1b[31m" + "x" * 210 + ".json"
    (tmp_path / name).write_text("{")
    watched = Watched(tmp_path)
    watched.poll()
    (line,) = _warnings(caplog, "Ignoring malformed discovery record")
    assert "\n" not in line and "\x1b" not in line and "\\n" in line
    assert len(line) < 2000


# --- records that change or collide -------------------------------------------------------


def test_a_record_rewritten_in_place_to_serve_elsewhere_replaces_the_old_one(tmp_path):
    path = tmp_path / "i1.json"
    path.write_text(leased("i1", port=40001).to_json())
    watched = Watched(tmp_path)
    watched.poll()
    with open(path, "w", encoding="utf-8") as handle:  # in place: same inode, same name
        handle.write(leased("i1", port=40002).to_json())
    watched.poll()
    assert watched.added == ["i1", "i1"] and watched.removed == ["i1"]
    assert watched.watcher.known["i1"].endpoint == "http://127.0.0.1:40002"


def test_a_renewal_is_not_a_change_of_instance(tmp_path):
    store = DiscoveryStore(tmp_path)
    record = leased("i1")
    store.register(record)
    watched = Watched(tmp_path)
    watched.poll()
    for _ in range(3):
        record = store.renew(record)
        watched.poll()
    assert watched.added == ["i1"] and watched.removed == []


def test_a_record_under_another_instances_name_is_malformed(tmp_path, caplog):
    """One instance, one record: a copy under another name never makes a second one, and the
    rule is the same on etcd (the key is the instance id)."""
    store = DiscoveryStore(tmp_path)
    store.register(leased("i1"))
    (tmp_path / "copy.json").write_text(leased("i1", port=40009).to_json())
    watched = Watched(tmp_path)
    watched.poll()
    assert watched.added == ["i1"]
    assert watched.watcher.known["i1"].endpoint == "http://127.0.0.1:40001"
    assert len(_warnings(caplog, "whose record is i1.json")) == 1


# --- the default directory ----------------------------------------------------------------


def test_the_default_directory_is_created_as_this_users_own(tmp_path):
    directory = tmp_path / "dynamo-me" / "discovery"
    check_private_directory(directory, tmp_path)
    for part in (tmp_path / "dynamo-me", directory):
        status = os.lstat(part)
        assert stat.S_IMODE(status.st_mode) == 0o700 and status.st_uid == os.geteuid()


@pytest.mark.parametrize("problem", ["writable-by-others", "symlink", "a-file"])
def test_a_default_directory_another_user_could_control_is_refused(tmp_path, problem):
    first = tmp_path / "dynamo-me"
    if problem == "writable-by-others":
        first.mkdir()
        first.chmod(0o777)
    elif problem == "symlink":
        (tmp_path / "theirs").mkdir()
        first.symlink_to(tmp_path / "theirs")
    else:
        first.write_text("")
    with pytest.raises(DiscoveryDirError, match="another user could put discovery records"):
        check_private_directory(first / "discovery", tmp_path)


def test_a_default_directory_owned_by_another_user_is_refused(tmp_path, mocker):
    (tmp_path / "dynamo-me").mkdir(mode=0o700)
    mocker.patch.object(os, "geteuid", return_value=os.geteuid() + 1)
    with pytest.raises(DiscoveryDirError, match="belongs to uid"):
        check_private_directory(tmp_path / "dynamo-me" / "discovery", tmp_path)


def _settings(directory: Path, *, default: bool) -> DiscoverySettings:
    return DiscoverySettings(
        backend="file",
        directory=str(directory),
        ttl_s=10.0,
        etcd_endpoints=(),
        namespace="n",
        directory_is_default=default,
    )


def test_the_default_directory_is_checked_and_a_chosen_one_only_warned_about(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    shared = tmp_path / "dynamo"
    shared.mkdir()
    shared.chmod(0o777)
    default = open_discovery(_settings(shared / "discovery", default=True))
    with pytest.raises(DiscoveryDirError, match="writable by other users"):
        default.check(writer=False)
    # The same directory, chosen by an operator (--discovery-dir): theirs to judge, one WARNING.
    chosen_dir = tmp_path / "chosen"
    chosen_dir.mkdir()
    chosen_dir.chmod(0o777)
    open_discovery(_settings(chosen_dir, default=False)).check(writer=True)
    assert _warnings(caplog, "writable by every user of this host")


# --- what a record carries -----------------------------------------------------------------


def test_a_record_carries_only_what_a_frontend_routes_with(tmp_path):
    record = leased("i1")
    written = json.loads(DiscoveryStore(tmp_path).register(record).read_text())
    assert set(written) == {"model", "endpoint", "instance_id", "heartbeat", "heartbeat_interval_s"}


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (ModelRecord("m" * 513, "http://127.0.0.1:1"), "model"),
        (ModelRecord("m", "http://127.0.0.1:1/path"), "endpoint"),
        (ModelRecord("m", "http://127.0.0.1:1", instance_id="a/b"), "instance_id"),
        (ModelRecord("m" * 512, "http://127.0.0.1:1"), None),
    ],
    ids=["name over 512", "endpoint with a path", "instance id", "name at 512"],
)
def test_record_problem_is_the_readers_verdict(record, field):
    """What a worker asks of its own record before writing it is what a frontend's reader
    decides: one schema, not a copy."""
    problem = record_problem(record)
    if field is None:
        assert problem is None
        assert ModelRecord.from_json(record.to_json()) == record
        return
    assert problem is not None and problem.field == field
    with pytest.raises(ValueError) as refused:
        ModelRecord.from_json(record.to_json())
    assert str(refused.value) == str(problem)


def test_record_problem_refuses_a_record_over_the_size_bound():
    huge = ModelRecord("m", "http://127.0.0.1:1", card=tiny_card_for_size("x" * 70_000))
    problem = record_problem(huge)
    assert problem is not None and "over the frontend's bound" in str(problem)


def tiny_card_for_size(path: str) -> ModelCard:
    return ModelCard(served_model_name="m", model_path=path, tokenizer_path=path, context_length=1)


@pytest.mark.parametrize(
    ("context_length", "refused"),
    [(MAX_CONTEXT_LENGTH, False), (MAX_CONTEXT_LENGTH + 1, True), (2**31 - 1, True)],
)
def test_a_cards_context_length_is_bounded(tmp_path, context_length, refused):
    """Issue 37: a card claiming 2^31 tokens of context gave a request without max_tokens a
    2^31-token budget (and its stream a ~512 GiB byte budget)."""
    written = json.loads(
        ModelRecord("m", "http://127.0.0.1:1", card=tiny_card_for_size("/m")).to_json()
    )
    written["card"]["context_length"] = context_length
    text = json.dumps(written)
    if not refused:
        assert ModelRecord.from_json(text).card.context_length == context_length
        return
    with pytest.raises(ValueError) as refusal:
        ModelRecord.from_json(text)
    assert "context_length" in str(refusal.value) and str(MAX_CONTEXT_LENGTH) in str(refusal.value)
