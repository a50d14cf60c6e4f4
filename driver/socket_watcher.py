"""Wakes a sleeping driver when a datagram arrives.

The driver sleeps on its futex doorbell, which clients ring; sockets cannot
ring a futex, so a native thread waits on the driver's UDP sockets (epoll,
one-shot) and rings the doorbell for them.  Before sleeping, the driver
re-arms the sockets it has drained, so a socket that stays busy while the
driver works costs no wake-ups.
"""

from __future__ import annotations

import os

from fulmar._native import ffi, lib
from fulmar.idle import Doorbell


class SocketWatcher:
    def __init__(self, doorbell: Doorbell) -> None:
        self._doorbell = doorbell  # keeps the mapping the thread rings alive
        self._handle = lib.fulmar_watcher_start(doorbell.buffer.address, doorbell.offset)
        if self._handle == ffi.NULL:
            raise OSError("cannot start the socket watcher thread")
        self._fds: set[int] = set()

    def add(self, fd: int) -> None:
        self._check(lib.fulmar_watcher_add(self._handle, fd), "watch", fd)
        self._fds.add(fd)

    def remove(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.discard(fd)
            lib.fulmar_watcher_remove(self._handle, fd)

    def rearm(self) -> None:
        """Watch every socket again (one-shot: each wake disarms the socket that caused it)."""
        for fd in self._fds:
            lib.fulmar_watcher_rearm(self._handle, fd)

    def close(self) -> None:
        if self._handle != ffi.NULL:
            lib.fulmar_watcher_stop(self._handle)
            self._handle = ffi.NULL
            self._fds.clear()

    @staticmethod
    def _check(result: int, action: str, fd: int) -> None:
        if result < 0:
            raise OSError(-result, f"cannot {action} socket {fd}: {os.strerror(-result)}")
