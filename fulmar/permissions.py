"""Who may open what a node writes: its owner only, by default; optionally
also one group.

Every file a node creates (cnc.dat, log buffers, the archive's catalog,
segments and mark file, the recording log, the cluster mark files) is
created owner read-write, and every directory owner-only, so that another
user on the machine can neither read the log nor attach to the driver (its
shared memory would let it forge commands and frames).  The process umask
can only narrow these further.  Tools that read a node's files (cluster-tool)
run as the node's user.

With a file group (``FULMAR_FILE_GROUP``, or ``cluster-node --file-group``,
which sets it for the node's processes), the members of that group are let
in too: files are group read-write (0o660) and directories 0o2770, both
owned by the group.  The set-group-id bit makes what another process creates
in such a directory inherit the group.  These modes are set explicitly after
creation, so a umask such as 022 cannot take the group's write access away
(a client of the driver writes commands into cnc.dat).
"""

from __future__ import annotations

import grp
import os
from pathlib import Path

from fulmar.errors import FulmarError

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
GROUP_FILE_MODE = 0o660
GROUP_DIRECTORY_MODE = 0o2770
FILE_GROUP_ENV = "FULMAR_FILE_GROUP"


class FileGroupError(FulmarError, ValueError):
    """The configured file group does not exist or this process may not use it."""


# name -> gid, checked once per process (every file created asks).
_checked_groups: dict[str, int] = {}


def check_file_group(name: str) -> int:
    """The gid of group ``name``, if this process may give its files to it.

    Raises FileGroupError naming the group and the reason otherwise: an
    unknown group is a configuration error to report at start, not on the
    first file created.
    """
    gid = _checked_groups.get(name)
    if gid is not None:
        return gid
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        if not name.isdigit():
            raise FileGroupError(
                f"file group {name!r} does not exist on this machine "
                f"(set {FILE_GROUP_ENV} or --file-group to an existing group)"
            ) from None
        gid = int(name)
        try:
            grp.getgrgid(gid)
        except KeyError:
            raise FileGroupError(f"file group id {gid} does not exist on this machine") from None
    # Only root may give a file to a group its owner is not a member of.
    if os.geteuid() != 0 and gid != os.getegid() and gid not in os.getgroups():
        raise FileGroupError(
            f"user {os.geteuid()} is not a member of file group {name!r} (gid {gid}), "
            "so it cannot give its files to that group"
        )
    _checked_groups[name] = gid
    return gid


def file_group() -> int | None:
    """The configured file group's gid, or None (owner-only)."""
    name = os.environ.get(FILE_GROUP_ENV, "").strip()
    return check_file_group(name) if name else None


def file_mode() -> int:
    return FILE_MODE if file_group() is None else GROUP_FILE_MODE


def directory_mode() -> int:
    return DIRECTORY_MODE if file_group() is None else GROUP_DIRECTORY_MODE


def open_new_file(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open(path, flags)`` with the node's file mode (``flags`` include
    O_CREAT); a file it creates is given to the file group, if one is set."""
    fd = os.open(path, flags, file_mode())
    try:
        apply_file_group(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def apply_file_group(fd: int) -> None:
    """Give an open file to the file group, group read-write (nothing without a group)."""
    gid = file_group()
    if gid is None:
        return
    stat = os.fstat(fd)
    if stat.st_uid != os.geteuid():
        return  # another user's file (opened, not created, here): not ours to change
    if stat.st_gid != gid:
        os.fchown(fd, -1, gid)
    os.fchmod(fd, GROUP_FILE_MODE)


def make_directory(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` and its missing parents owner-only, or with the file
    group's mode and group (an existing one is left as it is)."""
    directory = Path(path)
    gid = file_group()
    mode = directory_mode()
    # Path.mkdir(parents=True) gives the parents the default mode, not ``mode``.
    missing = [p for p in (directory, *directory.parents) if not p.exists()]
    for part in reversed(missing):
        try:
            part.mkdir(mode=mode)
        except FileExistsError:
            continue  # made meanwhile by another process
        if gid is not None:
            # mkdir ignores the set-group-id bit and the umask may drop the
            # group's access: both are set explicitly.
            os.chown(part, -1, gid)
            os.chmod(part, mode)
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory} is not a directory")
    return directory
