"""Is the worker's advertised request-plane address one that its readers can reach?

A worker publishes its request-plane URL in its discovery record. The default request-plane host
is 127.0.0.1: right when the frontend runs on the same host, useless when the record is read
from other hosts, whose frontend would find the worker and then fail to connect to it. Nothing
fails at start-up in that case, so the worker logs one WARNING (:func:`unreachable_reason`).

Who can read the record depends on the discovery backend:

* ``file``: a directory. Other hosts read it when it lives on a network or cluster file system
  (NFS, SMB/CIFS, CephFS, GlusterFS, Lustre, a FUSE mount such as gcsfuse or s3fs, ...), as a
  Kubernetes ReadWriteMany volume does. The file system type comes from the kernel's mount
  table (``/proc/self/mountinfo``): the mount with the longest mount point that contains the
  directory.
* ``etcd``: a store every host may reach. Any endpoint that is not a loopback address (or
  ``localhost``) means other hosts may read it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

MOUNTINFO = "/proc/self/mountinfo"

# Kernel file system types whose files other hosts see (plus every "fuse.*" subtype).
NETWORK_FS_TYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs",
        "beegfs", "afs", "ocfs2", "gfs2", "9p", "fuse", "fuseblk",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Mount:
    mount_point: str
    fs_type: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as three octal digits (\040 ...).
    out, i = [], 0
    while i < len(field):
        digits = field[i + 1 : i + 4]
        if field[i] == "\\" and len(digits) == 3 and digits.isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``/proc/<pid>/mountinfo`` text (see proc(5)); odd lines are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        separator = fields.index("-")
        if separator < 5 or separator + 1 >= len(fields):
            continue
        mounts.append(Mount(_unescape(fields[4]), fields[separator + 1]))
    return mounts


def _contains(mount_point: str, path: str) -> bool:
    if mount_point == "/":
        return True
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def filesystem_of(path: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount ``path`` lives on (the last of the longest matching mount points wins, as a
    later mount over the same point hides the earlier one)."""
    best: Mount | None = None
    for mount in mounts:
        if _contains(mount.mount_point, path) and (
            best is None or len(mount.mount_point) >= len(best.mount_point)
        ):
            best = mount
    return best


def is_network_fs(fs_type: str) -> bool:
    return fs_type in NETWORK_FS_TYPES or fs_type.startswith("fuse.")


def _existing_real_path(path: str) -> str:
    """``path`` with the symlinks of its existing part resolved (the mount table names real
    paths); a tail not created yet is kept as it is."""
    head, tail = os.path.abspath(path), ""
    while not os.path.exists(head) and os.path.dirname(head) != head:
        head, name = os.path.split(head)
        tail = os.path.join(name, tail) if tail else name
    real = os.path.realpath(head)
    return os.path.join(real, tail) if tail else real


def _read_mounts(mountinfo_path: str) -> list[Mount]:
    try:
        with open(mountinfo_path, encoding="utf-8", errors="replace") as file:
            return parse_mountinfo(file.read())
    except OSError:
        return []  # not Linux, or no /proc: nothing known, nothing to warn about


def host_of(endpoint: str) -> str | None:
    """The host part of ``http://h:p``, ``h:p``, ``[v6]:p`` or a bare host."""
    text = endpoint.strip()
    if not text:
        return None
    if "://" not in text:
        text = "//" + text
    try:
        return urlsplit(text).hostname
    except ValueError:
        return None


def is_loopback_host(host: str | None, *, resolve: bool = False) -> bool:
    """An address (or ``localhost``) only this host reaches. With ``resolve``, a host name that
    resolves to loopback addresses only counts too (Debian maps the host's own name to
    127.0.1.1)."""
    if not host:
        return False
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    if not resolve:
        return False
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def readable_from_other_hosts(
    backend: str,
    directory: str | None = None,
    etcd_endpoints: Iterable[str] | str = (),
    *,
    mountinfo_path: str = MOUNTINFO,
) -> str | None:
    """Why other hosts can read records published on this discovery backend, or ``None``.

    ``etcd_endpoints`` may be a list or one comma-separated string (``ETCD_ENDPOINTS``' form).
    """
    if backend == "file":
        if not directory:
            return None
        real = _existing_real_path(directory)
        mount = filesystem_of(real, _read_mounts(mountinfo_path))
        if mount is not None and is_network_fs(mount.fs_type):
            return (
                f"the discovery directory {directory} is on a {mount.fs_type} file system "
                f"(mounted at {mount.mount_point}), which other hosts read"
            )
        return None
    if backend == "etcd":
        if isinstance(etcd_endpoints, str):
            etcd_endpoints = etcd_endpoints.split(",")
        remote = [
            e.strip() for e in etcd_endpoints if e.strip() and not is_loopback_host(host_of(e))
        ]
        if remote:
            return f"its etcd endpoint(s) {', '.join(remote)} are reachable from other hosts"
        return None
    return None


def unreachable_reason(
    advertised_endpoint: str,
    backend: str,
    directory: str | None = None,
    etcd_endpoints: Iterable[str] | str = (),
    *,
    mountinfo_path: str = MOUNTINFO,
) -> str | None:
    """The WARNING to log when the advertised request plane is loopback but the discovery
    record is readable from other hosts, or ``None``. May resolve the advertised host name:
    call it off the event loop."""
    host = host_of(advertised_endpoint)
    if not is_loopback_host(host, resolve=True):
        return None
    why = readable_from_other_hosts(
        backend, directory, etcd_endpoints, mountinfo_path=mountinfo_path
    )
    if why is None:
        return None
    return (
        f"The request plane is advertised at {advertised_endpoint}, a loopback address, but "
        f"this worker's discovery record can be read from other hosts ({backend} backend: "
        f"{why}): a frontend on another host would find this worker and fail to connect to "
        "it. Set --request-plane-host / DYN_VLLM_REQUEST_PLANE_HOST to an address other hosts "
        "reach (in Kubernetes, the pod IP)"
    )
