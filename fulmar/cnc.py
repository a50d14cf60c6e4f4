"""cnc.dat: the command-and-control file a media driver shares with its clients.

Layout (Aeron's ``CncFileDescriptor``): a 128-byte header (version, buffer
lengths, client liveness timeout, start time, pid), then the to-driver
many-to-one ring buffer, the to-clients broadcast buffer, the counters
metadata and values, and the distinct error log.  The version is written
last with a release store: a client that sees a non-zero version sees a
complete file.

fulmar also keeps four doorbells (see ``fulmar.idle``) in the unused part of
the header, so an idle node burns no CPU yet wakes at once: clients ring the
driver's after writing a command, the driver rings the clients' after
answering, publications ring the data doorbell after appending, which idle
subscribers without a doorbell of their own sleep on, and UDP publications
ring the driver's data doorbell, which its data plane thread sleeps on (in
epoll with its sockets, so that one is rung through the FIFO
``data-doorbell`` in the driver's directory).  They are separate so that a
stream of data does not keep waking conductors that only wait for commands.
Aeron's own clients never touch those bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fulmar.buffers import MappedFile
from fulmar.errors import FulmarError
from fulmar.frames import align
from fulmar.idle import Doorbell

CNC_FILE = "cnc.dat"
CNC_VERSION = (0 << 16) | (2 << 8) | 0  # semantic version 0.2.0

VERSION_OFFSET = 0
TO_DRIVER_LENGTH_OFFSET = 4
TO_CLIENTS_LENGTH_OFFSET = 8
COUNTERS_METADATA_LENGTH_OFFSET = 12
COUNTERS_VALUES_LENGTH_OFFSET = 16
ERROR_LOG_LENGTH_OFFSET = 20
CLIENT_LIVENESS_TIMEOUT_OFFSET = 24
START_TIMESTAMP_OFFSET = 32
PID_OFFSET = 40
META_DATA_LENGTH = 48
END_OF_METADATA_OFFSET = 128
# fulmar's doorbells, inside the header's padding.
DRIVER_DOORBELL_OFFSET = 64
CLIENTS_DOORBELL_OFFSET = 72
DATA_DOORBELL_OFFSET = 80
# What the driver's data plane thread sleeps on (with its sockets): rung
# through the FIFO of this name in the driver's directory (doorbell.h).
DRIVER_DATA_DOORBELL_OFFSET = 88
DRIVER_DATA_FIFO = "data-doorbell"

RING_BUFFER_TRAILER_LENGTH = 768
BROADCAST_TRAILER_LENGTH = 128
FILE_PAGE_SIZE = 4096

DEFAULT_TO_DRIVER_CAPACITY = 1024 * 1024
DEFAULT_TO_CLIENTS_CAPACITY = 1024 * 1024
DEFAULT_COUNTERS_VALUES_LENGTH = 1024 * 1024
DEFAULT_ERROR_LOG_LENGTH = 1024 * 1024
DEFAULT_CLIENT_LIVENESS_TIMEOUT_NS = 10_000_000_000


class CncError(FulmarError):
    """cnc.dat is missing, not ready, of another version, or inconsistent."""


@dataclass(frozen=True)
class CncLayout:
    to_driver_length: int = DEFAULT_TO_DRIVER_CAPACITY + RING_BUFFER_TRAILER_LENGTH
    to_clients_length: int = DEFAULT_TO_CLIENTS_CAPACITY + BROADCAST_TRAILER_LENGTH
    counters_values_length: int = DEFAULT_COUNTERS_VALUES_LENGTH
    error_log_length: int = DEFAULT_ERROR_LOG_LENGTH

    @property
    def counters_metadata_length(self) -> int:
        return 4 * self.counters_values_length

    @property
    def to_driver_offset(self) -> int:
        return END_OF_METADATA_OFFSET

    @property
    def to_clients_offset(self) -> int:
        return self.to_driver_offset + self.to_driver_length

    @property
    def counters_metadata_offset(self) -> int:
        return self.to_clients_offset + self.to_clients_length

    @property
    def counters_values_offset(self) -> int:
        return self.counters_metadata_offset + self.counters_metadata_length

    @property
    def error_log_offset(self) -> int:
        return self.counters_values_offset + self.counters_values_length

    @property
    def file_length(self) -> int:
        return align(self.error_log_offset + self.error_log_length, FILE_PAGE_SIZE)

    @classmethod
    def sized(
        cls,
        to_driver_capacity: int = DEFAULT_TO_DRIVER_CAPACITY,
        to_clients_capacity: int = DEFAULT_TO_CLIENTS_CAPACITY,
        counters_values_length: int = DEFAULT_COUNTERS_VALUES_LENGTH,
        error_log_length: int = DEFAULT_ERROR_LOG_LENGTH,
    ) -> CncLayout:
        return cls(
            to_driver_capacity + RING_BUFFER_TRAILER_LENGTH,
            to_clients_capacity + BROADCAST_TRAILER_LENGTH,
            counters_values_length,
            error_log_length,
        )


class CncFile:
    """A mapped cnc.dat with a buffer for each section."""

    def __init__(self, mapped: MappedFile, layout: CncLayout) -> None:
        self.mapped = mapped
        self.layout = layout
        self.header = mapped.buffer(0, END_OF_METADATA_OFFSET)
        self.to_driver = mapped.buffer(layout.to_driver_offset, layout.to_driver_length)
        self.to_clients = mapped.buffer(layout.to_clients_offset, layout.to_clients_length)
        self.counters_metadata = mapped.buffer(layout.counters_metadata_offset, layout.counters_metadata_length)
        self.counters_values = mapped.buffer(layout.counters_values_offset, layout.counters_values_length)
        self.error_log = mapped.buffer(layout.error_log_offset, layout.error_log_length)

    @property
    def path(self) -> Path:
        return self.mapped.path

    @classmethod
    def create(
        cls, directory: str | os.PathLike[str], layout: CncLayout, client_liveness_timeout_ns: int, start_ms: int
    ) -> CncFile:
        path = Path(directory) / CNC_FILE
        mapped = MappedFile.create(path, layout.file_length)
        cnc = cls(mapped, layout)
        header = cnc.header
        header.put_int32(TO_DRIVER_LENGTH_OFFSET, layout.to_driver_length)
        header.put_int32(TO_CLIENTS_LENGTH_OFFSET, layout.to_clients_length)
        header.put_int32(COUNTERS_METADATA_LENGTH_OFFSET, layout.counters_metadata_length)
        header.put_int32(COUNTERS_VALUES_LENGTH_OFFSET, layout.counters_values_length)
        header.put_int32(ERROR_LOG_LENGTH_OFFSET, layout.error_log_length)
        header.put_int64(CLIENT_LIVENESS_TIMEOUT_OFFSET, client_liveness_timeout_ns)
        header.put_int64(START_TIMESTAMP_OFFSET, start_ms)
        header.put_int64(PID_OFFSET, os.getpid())
        return cnc

    def signal_ready(self) -> None:
        """Publish the version last: clients wait for it before reading anything."""
        self.header.put_int32_ordered(VERSION_OFFSET, CNC_VERSION)

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> CncFile:
        """Map an existing cnc.dat; ``CncError`` if absent, not ready or inconsistent."""
        path = Path(directory) / CNC_FILE
        try:
            mapped = MappedFile.open(path)
        except FileNotFoundError:
            raise CncError(f"no media driver in {directory}: {path} does not exist") from None
        except ValueError as exc:
            raise CncError(f"{path}: {exc}") from None
        try:
            if mapped.length < END_OF_METADATA_OFFSET:
                raise CncError(f"{path}: {mapped.length} bytes is too short for cnc.dat")
            header = mapped.buffer(0, END_OF_METADATA_OFFSET)
            version = header.get_int32_volatile(VERSION_OFFSET)
            if version == 0:
                raise CncError(f"{path}: the media driver has not finished creating it (version 0)")
            if version >> 16 != CNC_VERSION >> 16:
                raise CncError(
                    f"{path}: cnc version {version >> 16}.{(version >> 8) & 0xFF}.{version & 0xFF} "
                    f"is incompatible with {CNC_VERSION >> 16}.{(CNC_VERSION >> 8) & 0xFF}.{CNC_VERSION & 0xFF}"
                )
            layout = CncLayout(
                header.get_int32(TO_DRIVER_LENGTH_OFFSET),
                header.get_int32(TO_CLIENTS_LENGTH_OFFSET),
                header.get_int32(COUNTERS_VALUES_LENGTH_OFFSET),
                header.get_int32(ERROR_LOG_LENGTH_OFFSET),
            )
            if header.get_int32(COUNTERS_METADATA_LENGTH_OFFSET) != layout.counters_metadata_length:
                raise CncError(f"{path}: counters metadata length does not match the values length")
            if min(layout.to_driver_length, layout.to_clients_length, layout.error_log_length) <= 0 or (
                layout.file_length > mapped.length
            ):
                raise CncError(f"{path}: buffer lengths do not fit a file of {mapped.length} bytes")
            return cls(mapped, layout)
        except BaseException:
            mapped.close()
            raise

    @property
    def client_liveness_timeout_ns(self) -> int:
        return self.header.get_int64(CLIENT_LIVENESS_TIMEOUT_OFFSET)

    @property
    def start_timestamp_ms(self) -> int:
        return self.header.get_int64(START_TIMESTAMP_OFFSET)

    @property
    def pid(self) -> int:
        return self.header.get_int64(PID_OFFSET)

    def driver_doorbell(self) -> Doorbell:
        return Doorbell(self.header, DRIVER_DOORBELL_OFFSET)

    def clients_doorbell(self) -> Doorbell:
        return Doorbell(self.header, CLIENTS_DOORBELL_OFFSET)

    def data_doorbell(self) -> Doorbell:
        return Doorbell(self.header, DATA_DOORBELL_OFFSET)

    def driver_data_doorbell(self, fd: int = -1) -> Doorbell:
        """The data plane's doorbell; ``fd`` is the driver's FIFO (``open_driver_data_fifo``)."""
        return Doorbell(self.header, DRIVER_DATA_DOORBELL_OFFSET, fd)

    def open_driver_data_fifo(self) -> int:
        """The write end of the driver's data FIFO (non-blocking), or -1 when
        it cannot be opened (a driver without a data plane): the caller then
        rings the futex word, which wakes nobody but costs nothing."""
        try:
            return os.open(self.path.parent / DRIVER_DATA_FIFO, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return -1

    def close(self) -> None:
        self.mapped.close()

    def __enter__(self) -> CncFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
