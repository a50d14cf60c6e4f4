"""Distinct error log: the error buffer at the end of cnc.dat.

A process records each *distinct* error once and afterwards only bumps its
observation count and last-seen time, so a storm of identical errors costs no
space.  Because the log is shared memory, ``cluster-tool`` (or Aeron's
``ErrorStat``) can read it from outside, even after the writer has died.  The
layout is Agrona's ``DistinctErrorLog`` (``aeron_distinct_error_log`` in C);
records are aligned to 8 bytes:

* ``length i32 @0`` (header included; 0 = end of log),
  ``observation_count i32 @4``, ``last_observation_timestamp i64 @8``,
  ``first_observation_timestamp i64 @16``, then the UTF-8 error text @24.

Write order, as in Aeron: a new record gets its text and first timestamp,
then its length with a release store (which publishes it); every observation,
the first included, then does a get-and-add on the count and a release store
of the last timestamp.  A reader can therefore briefly see a new record with
a count of 0.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

from fulmar._native import ffi
from fulmar.buffers import AtomicBuffer

LENGTH_OFFSET: Final = 0
OBSERVATION_COUNT_OFFSET: Final = 4
LAST_OBSERVATION_TIMESTAMP_OFFSET: Final = 8
FIRST_OBSERVATION_TIMESTAMP_OFFSET: Final = 16
ENCODED_ERROR_OFFSET: Final = 24
RECORD_ALIGNMENT: Final = 8

EpochClock = Callable[[], int]
"""Returns the wall-clock time in milliseconds."""


class CorruptErrorLogError(ValueError):
    """The log holds a record length no writer produces."""


class ErrorObservation(NamedTuple):
    observation_count: int
    first_observation_timestamp: int
    last_observation_timestamp: int
    text: str


def _align(value: int) -> int:
    return (value + RECORD_ALIGNMENT - 1) & ~(RECORD_ALIGNMENT - 1)


class DistinctErrorLog:
    """The writer side; safe to share between the threads of one process.

    One process writes a given log (Aeron's driver writes cnc.dat's), since
    which texts already have a record is only known in this object.
    """

    def __init__(self, buffer: AtomicBuffer, clock: EpochClock) -> None:
        if int(ffi.cast("uintptr_t", buffer.address)) % RECORD_ALIGNMENT:
            raise ValueError("error log buffer must start on an 8-byte boundary (its words are atomic)")
        self._buffer = buffer
        self._clock = clock
        self._next_offset = 0
        self._offsets: dict[str, int] = {}
        # Guards the search-or-append of a record, as Aeron's mutex does; the
        # count and timestamp updates after it are atomic on their own.
        self._lock = threading.Lock()

    @property
    def buffer(self) -> AtomicBuffer:
        return self._buffer

    def record(self, text: str) -> bool:
        """Record one observation of ``text``; False if the log has no room."""
        timestamp_ms = self._clock()
        with self._lock:
            offset = self._offsets.get(text)
            if offset is None:
                offset = self._new_observation(timestamp_ms, text)
                if offset is None:
                    return False

        self._buffer.get_and_add_int32(offset + OBSERVATION_COUNT_OFFSET, 1)
        self._buffer.put_int64_ordered(offset + LAST_OBSERVATION_TIMESTAMP_OFFSET, timestamp_ms)
        return True

    def _new_observation(self, timestamp_ms: int, text: str) -> int | None:
        encoded = text.encode("utf-8")
        offset = self._next_offset
        length = ENCODED_ERROR_OFFSET + len(encoded)
        if offset + length > self._buffer.capacity:
            return None

        self._buffer.put_bytes(offset + ENCODED_ERROR_OFFSET, encoded)
        self._buffer.put_int64(offset + FIRST_OBSERVATION_TIMESTAMP_OFFSET, timestamp_ms)
        self._next_offset = _align(offset + length)
        self._offsets[text] = offset
        # Publishes the record: readers stop at the first zero length.
        self._buffer.put_int32_ordered(offset + LENGTH_OFFSET, length)
        return offset


def error_log_exists(buffer: AtomicBuffer) -> bool:
    """True if at least one error has been recorded."""
    return buffer.capacity >= ENCODED_ERROR_OFFSET and buffer.get_int32_volatile(LENGTH_OFFSET) != 0


def read_error_log(buffer: AtomicBuffer, since_timestamp: int = 0) -> Iterator[ErrorObservation]:
    """Every distinct error last observed at or after ``since_timestamp`` (ms)."""
    offset = 0
    capacity = buffer.capacity
    while offset + ENCODED_ERROR_OFFSET <= capacity:
        length = buffer.get_int32_volatile(offset + LENGTH_OFFSET)
        if length == 0:
            return
        if length < ENCODED_ERROR_OFFSET or offset + length > capacity:
            raise CorruptErrorLogError(f"error log record at {offset} has impossible length {length}")

        last_timestamp = buffer.get_int64_volatile(offset + LAST_OBSERVATION_TIMESTAMP_OFFSET)
        if last_timestamp >= since_timestamp:
            yield ErrorObservation(
                buffer.get_int32_volatile(offset + OBSERVATION_COUNT_OFFSET),
                buffer.get_int64(offset + FIRST_OBSERVATION_TIMESTAMP_OFFSET),
                last_timestamp,
                buffer.get_bytes(offset + ENCODED_ERROR_OFFSET, length - ENCODED_ERROR_OFFSET).decode(
                    "utf-8", errors="replace"
                ),
            )
        offset += _align(length)
