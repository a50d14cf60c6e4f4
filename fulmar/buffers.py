"""Memory-mapped files and bounds-checked atomic access to them.

Python has no atomic loads or stores on shared memory, so every word that
another process reads or writes concurrently goes through the native
extension.  ``AtomicBuffer`` checks bounds and natural alignment in Python
(cheap, and it turns a would-be segfault into an ``IndexError``) and then
calls one native function.  Hot paths do not use these per-word calls: they
hand whole batches to native functions that take the buffer's address.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

from fulmar._native import ffi, lib
from fulmar.permissions import open_new_file

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")


class AtomicBuffer:
    """A window onto writable memory with atomic 32/64-bit access by offset."""

    __slots__ = ("view", "address", "capacity", "_array", "_released")

    def __init__(self, memory: Any, offset: int = 0, length: int | None = None) -> None:
        whole = memoryview(memory).cast("B")
        if length is None:
            length = len(whole) - offset
        if offset < 0 or length < 0 or offset + length > len(whole):
            raise IndexError(f"window [{offset}, {offset + length}) outside memory of {len(whole)} bytes")
        self.view = whole[offset : offset + length]
        if self.view.readonly:
            raise ValueError("AtomicBuffer needs writable memory")
        # cffi keeps the buffer export alive until release(), so the mapping
        # cannot be closed underneath it.  Native calls get a plain char*:
        # converting the char[] array at every call costs ~45 ns more.
        self._array = ffi.from_buffer("char[]", self.view, require_writable=True)
        self.address = ffi.cast("char *", self._array)
        self.capacity = length
        self._released = False

    def _check(self, offset: int, size: int) -> None:
        if offset < 0 or offset + size > self.capacity:
            raise IndexError(f"offset {offset} (+{size}) outside buffer of {self.capacity} bytes")
        if offset & (size - 1):
            raise ValueError(f"offset {offset} is not aligned to {size} bytes for an atomic access")

    # Atomic (cross-process) access.
    def get_int32_volatile(self, offset: int) -> int:
        self._check(offset, 4)
        return int(lib.fulmar_get_int32_volatile(self.address, offset))

    def get_int64_volatile(self, offset: int) -> int:
        self._check(offset, 8)
        return int(lib.fulmar_get_int64_volatile(self.address, offset))

    def put_int32_ordered(self, offset: int, value: int) -> None:
        self._check(offset, 4)
        lib.fulmar_put_int32_ordered(self.address, offset, value)

    def put_int64_ordered(self, offset: int, value: int) -> None:
        self._check(offset, 8)
        lib.fulmar_put_int64_ordered(self.address, offset, value)

    def compare_and_set_int32(self, offset: int, expected: int, desired: int) -> bool:
        self._check(offset, 4)
        return bool(lib.fulmar_compare_and_set_int32(self.address, offset, expected, desired))

    def compare_and_set_int64(self, offset: int, expected: int, desired: int) -> bool:
        self._check(offset, 8)
        return bool(lib.fulmar_compare_and_set_int64(self.address, offset, expected, desired))

    def get_and_add_int32(self, offset: int, delta: int) -> int:
        self._check(offset, 4)
        return int(lib.fulmar_get_and_add_int32(self.address, offset, delta))

    def get_and_add_int64(self, offset: int, delta: int) -> int:
        self._check(offset, 8)
        return int(lib.fulmar_get_and_add_int64(self.address, offset, delta))

    # Plain access, for fields no other process touches concurrently.
    def get_int32(self, offset: int) -> int:
        return int(_I32.unpack_from(self.view, offset)[0])

    def get_int64(self, offset: int) -> int:
        return int(_I64.unpack_from(self.view, offset)[0])

    def put_int32(self, offset: int, value: int) -> None:
        _I32.pack_into(self.view, offset, value)

    def put_int64(self, offset: int, value: int) -> None:
        _I64.pack_into(self.view, offset, value)

    def get_bytes(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.capacity:
            raise IndexError(f"range [{offset}, {offset + length}) outside buffer of {self.capacity} bytes")
        return bytes(self.view[offset : offset + length])

    def put_bytes(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        end = offset + len(data)
        if offset < 0 or end > self.capacity:
            raise IndexError(f"range [{offset}, {end}) outside buffer of {self.capacity} bytes")
        self.view[offset:end] = data

    def set_memory(self, offset: int, length: int, value: int = 0) -> None:
        if offset < 0 or length < 0 or offset + length > self.capacity:
            raise IndexError(f"range [{offset}, {offset + length}) outside buffer of {self.capacity} bytes")
        lib.fulmar_set_memory(self.address, offset, length, value)

    def release(self) -> None:
        """Drop the buffer export so the underlying mapping can be closed."""
        if not self._released:
            self._released = True
            ffi.release(self._array)
            self.view.release()


class MappedFile:
    """A file mapped shared into this process; ``close`` unmaps it.

    Buffers handed out by :meth:`buffer` are released on close, so a mapping
    is never left pinned by a stray memoryview.
    """

    def __init__(self, path: Path, memory: mmap.mmap, identity: tuple[int, int]) -> None:
        self.path = path
        self._mmap = memory
        self._buffers: list[AtomicBuffer] = []
        # (device, inode) of the file mapped: while mapped, no other file on
        # that device has it, so a path naming another identity names another file.
        self.identity = identity

    @classmethod
    def create(cls, path: str | os.PathLike[str], length: int, mode: int | None = None) -> MappedFile:
        """Create (or replace) a zero-filled file of ``length`` bytes and map it.

        Without ``mode`` the file gets the node's permissions (owner-only, or
        the file group's: see :mod:`fulmar.permissions`)."""
        path = Path(path)
        if length <= 0:
            raise ValueError(f"cannot map a file of {length} bytes")
        if mode is None:
            fd = open_new_file(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.ftruncate(fd, length)
            memory = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            status = os.fstat(fd)
        finally:
            os.close(fd)
        return cls(path, memory, (status.st_dev, status.st_ino))

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> MappedFile:
        """Map an existing file, read-write, at its current length."""
        path = Path(path)
        fd = os.open(path, os.O_RDWR)
        try:
            status = os.fstat(fd)
            length = status.st_size
            if length == 0:
                raise ValueError(f"{path} is empty")
            memory = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path, memory, (status.st_dev, status.st_ino))

    @property
    def length(self) -> int:
        return len(self._mmap)

    @property
    def closed(self) -> bool:
        return self._mmap.closed

    def is_replaced(self) -> bool:
        """Whether its path now names another file than the one mapped (one
        stat: removed and made again, or renamed over).  A path that names no
        file at all is not a replacement."""
        try:
            status = os.stat(self.path)
        except OSError:
            return False
        return (status.st_dev, status.st_ino) != self.identity

    def buffer(self, offset: int = 0, length: int | None = None) -> AtomicBuffer:
        buf = AtomicBuffer(self._mmap, offset, length)
        self._buffers.append(buf)
        return buf

    def close(self) -> None:
        for buf in self._buffers:
            buf.release()
        self._buffers.clear()
        if not self._mmap.closed:
            self._mmap.close()

    def __enter__(self) -> MappedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
