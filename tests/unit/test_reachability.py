"""The loopback warning: a loopback request plane published where other hosts read it.

Who can read the records is the discovery store's to say (its ``readable_beyond_host``); the
mount table decides it for the file store, the endpoints for etcd.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from dynamo.runtime.discovery import mounts
from dynamo.runtime.discovery.etcd_backend import EtcdDiscovery
from dynamo.runtime.discovery.etcd_endpoints import parse_endpoints
from dynamo.runtime.discovery.file_backend import FileDiscovery
from dynamo.vllm import reachability, worker_process

# Shaped like a Kubernetes pod's /proc/self/mountinfo: an overlay root, a tmpfs, an NFS volume
# (a ReadWriteMany PVC), a gcsfuse mount and a path with a space (escaped as \040).
MOUNTINFO = """\
22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u
23 22 0:22 / /tmp rw,nosuid - tmpfs tmpfs rw
24 22 0:23 /exports/dynamo /data-h13/dynamo rw,relatime shared:5 - nfs4 10.0.0.5:/exports rw
25 22 0:24 / /mnt/bucket rw - fuse.gcsfuse bucket rw,user_id=0
26 22 0:25 / /mnt/my\\040share rw - cifs //srv/share rw
27 24 0:26 / /data-h13/dynamo/local rw - tmpfs tmpfs rw
garbage line
"""


@pytest.fixture
def mountinfo(tmp_path, monkeypatch):
    """This file is the process's mount table for the test."""
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    monkeypatch.setattr(mounts, "MOUNTINFO", str(path))
    return str(path)


def test_mountinfo_is_parsed_with_its_escapes():
    found = mounts.parse_mountinfo(MOUNTINFO)
    assert mounts.Mount("/mnt/my share", "cifs") in found
    assert len(found) == 6


@pytest.mark.parametrize(
    ("directory", "fs_type"),
    [
        ("/data-h13/dynamo/discovery", "nfs4"),
        ("/data-h13/dynamo", "nfs4"),
        ("/data-h13/dynamo/local/discovery", "tmpfs"),  # a later, deeper mount wins
        ("/data-h13/dynamoX", "overlay"),  # a prefix of the name is not the mount point
        ("/mnt/bucket/d", "fuse.gcsfuse"),
        ("/mnt/my share/d", "cifs"),
        ("/tmp/d", "tmpfs"),
    ],
)
def test_the_mount_holding_a_directory(directory, fs_type):
    mount = mounts.filesystem_of(directory, mounts.parse_mountinfo(MOUNTINFO))
    assert mount is not None and mount.fs_type == fs_type


@pytest.mark.parametrize(
    ("directory", "remote"),
    [
        ("/data-h13/dynamo/discovery", True),
        ("/mnt/bucket/discovery", True),
        ("/mnt/my share/discovery", True),
        ("/data-h13/dynamo/local/discovery", False),
        ("/tmp/discovery", False),
        ("/srv/discovery", False),
    ],
)
def test_file_backend_is_remote_on_network_file_systems(mountinfo, directory, remote):
    why = FileDiscovery(directory).readable_beyond_host()
    assert (why is not None) is remote, why


@pytest.mark.parametrize(
    ("endpoints", "remote"),
    [
        ("http://127.0.0.1:2379", False),
        ("localhost:2379,http://[::1]:2379", False),
        ("http://127.0.0.1:2379,http://127.0.0.2:2379", False),
        ("http://127.0.0.1:2379,http://etcd-0.etcd:2379", True),
        ("10.0.0.7:2379", True),
        ("http://[2001:db8::1]:2379", True),
    ],
)
def test_etcd_is_remote_when_any_endpoint_is_not_loopback(endpoints, remote):
    why = EtcdDiscovery(parse_endpoints(endpoints), "ns").readable_beyond_host()
    assert (why is not None) is remote, why


@pytest.mark.parametrize(
    ("endpoint", "warns"),
    [
        ("http://127.0.0.1:9100", True),
        ("http://[::1]:9100", True),
        ("http://localhost:9100", True),
        ("http://10.1.2.3:9100", False),
    ],
)
def test_only_a_loopback_advertised_address_warns(mountinfo, endpoint, warns):
    reason = reachability.unreachable_reason(endpoint, FileDiscovery("/data-h13/dynamo/discovery"))
    assert (reason is not None) is warns
    if warns:
        assert endpoint in reason and "nfs4" in reason
        assert "--request-plane-host / DYN_VLLM_REQUEST_PLANE_HOST" in reason


def test_a_local_directory_and_loopback_etcd_do_not_warn(mountinfo):
    local = FileDiscovery("/tmp/discovery")
    assert reachability.unreachable_reason("http://127.0.0.1:9100", local) is None
    etcd = EtcdDiscovery(parse_endpoints("http://127.0.0.1:2379"), "ns")
    assert reachability.unreachable_reason("http://127.0.0.1:9100", etcd) is None


def test_an_etcd_backend_reachable_elsewhere_warns():
    etcd = EtcdDiscovery(parse_endpoints("http://etcd.default.svc:2379"), "ns")
    reason = reachability.unreachable_reason("http://127.0.0.1:9100", etcd)
    assert reason is not None and "etcd.default.svc:2379" in reason and "etcd backend" in reason


def test_no_mount_table_means_nothing_to_warn_about(tmp_path, monkeypatch):
    monkeypatch.setattr(mounts, "MOUNTINFO", str(tmp_path / "no-such-mountinfo"))
    assert FileDiscovery("/x").readable_beyond_host() is None


def test_a_directory_not_created_yet_is_judged_by_its_nearest_parent(tmp_path, mocker):
    mocker.patch.object(
        mounts,
        "_read_mounts",
        return_value=[mounts.Mount("/", "ext4"), mounts.Mount(str(tmp_path), "nfs")],
    )
    why = FileDiscovery(str(tmp_path / "a" / "b")).readable_beyond_host()
    assert why is not None and "nfs" in why


def test_the_worker_logs_it_once_with_the_discovery_it_opened(mocker, caplog):
    seen = []

    def fake(endpoint, discovery):
        seen.append((endpoint, discovery))
        return "the warning"

    mocker.patch.object(reachability, "unreachable_reason", side_effect=fake)
    caplog.set_level(logging.WARNING, logger="dynamo.vllm.worker_process")
    plain = FileDiscovery("/d")
    etcd = EtcdDiscovery(parse_endpoints("http://e:2379"), "ns")
    assert (
        asyncio.run(worker_process.warn_if_unreachable(plain, "http://127.0.0.1:1"))
        == "the warning"
    )
    asyncio.run(worker_process.warn_if_unreachable(etcd, "http://127.0.0.1:1"))
    assert seen == [("http://127.0.0.1:1", plain), ("http://127.0.0.1:1", etcd)]
    assert [r.getMessage() for r in caplog.records] == ["the warning", "the warning"]
