"""Exceptions of the archive's storage layer (catalog, segment files, mark file)."""

from __future__ import annotations

import errno
import os

from fulmar.errors import FulmarError


class ArchiveError(FulmarError):
    """Base class of the archive's errors."""


class CatalogError(ArchiveError):
    """``archive.catalog`` is corrupt, unreadable or cannot take another entry.

    The message names the file, the byte offset (when one applies) and what is wrong.
    """


class RecordingUnknownError(ArchiveError):
    """No valid recording has the given id."""

    def __init__(self, recording_id: int) -> None:
        super().__init__(f"unknown recording id {recording_id}")
        self.recording_id = recording_id


class SegmentError(ArchiveError):
    """A segment file is missing, short, holds a hole, or an I/O call on it failed."""


class ArchiveAlreadyActiveError(ArchiveError):
    """Another live archive process owns the directory (its mark file is fresh and its pid alive)."""

    def __init__(self, path: str, pid: int, activity_age_ms: int) -> None:
        super().__init__(
            f"archive directory is in use: {path} belongs to live pid {pid} (last activity {activity_age_ms} ms ago)"
        )
        self.path = path
        self.pid = pid


def describe_os_error(ex: OSError) -> str:
    """``ENOSPC`` → "no space left on device": the errno's meaning, lower-cased, for messages."""
    code = ex.errno
    if code is None:
        return str(ex)
    text = os.strerror(code)
    name = errno.errorcode.get(code, str(code))
    return f"{text[:1].lower()}{text[1:]} ({name})"
