"""Is a directory on a file system other hosts read (NFS, CephFS, a FUSE mount, ...)?

The file store's records are readable beyond this host when its directory lives on a network or
cluster file system, as a Kubernetes ReadWriteMany volume does. The file system type comes from
the kernel's mount table (``/proc/self/mountinfo``): the mount with the longest mount point that
contains the directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

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


def network_filesystem_of(directory: str, *, mountinfo_path: str | None = None) -> Mount | None:
    """The network file system ``directory`` lives on, or None (local, or not known)."""
    mounts = _read_mounts(mountinfo_path or MOUNTINFO)
    mount = filesystem_of(_existing_real_path(directory), mounts)
    return mount if mount is not None and is_network_fs(mount.fs_type) else None
