"""Who may open what a node writes: its owner only, by default.

Every file a node creates (cnc.dat, log buffers, the archive's catalog,
segments and mark file, the recording log, the cluster mark files) is
created owner read-write, and every directory owner-only, so that another
user on the machine can neither read the log nor attach to the driver (its
shared memory would let it forge commands and frames).  The process umask
can only narrow these further.  Tools that read a node's files (cluster-tool)
run as the node's user.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def make_directory(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` and its missing parents owner-only (an existing one is left as it is)."""
    directory = Path(path)
    # Path.mkdir(parents=True) gives the parents the default mode, not ``mode``.
    missing = [p for p in (directory, *directory.parents) if not p.exists()]
    for part in reversed(missing):
        try:
            part.mkdir(mode=DIRECTORY_MODE)
        except FileExistsError:
            pass  # made meanwhile by another process
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory} is not a directory")
    return directory
