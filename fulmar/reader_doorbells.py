"""Reader doorbells: a writer wakes the processes that read what it wrote, not
every process of the node.

Every fulmar client sleeps on a doorbell of its own (``fulmar.idle.Doorbell``):
the value slot of a counter of type ``CLIENT_DOORBELL_TYPE_ID`` that the client
adds when it connects.  Two tables name doorbells by their counter ids (the
layouts are in ``_native/src/doorbell.h``):

- **A log's readers**, in the log buffer's metadata past Aeron's fields, kept by
  the media driver from the subscriptions it links to the log.  A publisher's
  append rings them (``fulmar.log_writer``); the driver's receiver rings an
  image's readers when data lands in it.
- **A counter's watchers**, in the counter's value record past Aeron's fields,
  added and removed by the watchers themselves: the consensus module watches
  the archive's rec-pos, a service the module's commit-pos.  Whoever moves the
  counter rings them (``ring_counter_watchers``).

A ring costs a fence and one load per doorbell nobody sleeps on, and a
``FUTEX_WAKE`` per doorbell somebody does.  With one shared doorbell every
append woke every sleeping process of the node, most of them for nothing, and
on two cores the one that had the work then waited for a core.
"""

from __future__ import annotations

from collections.abc import Sequence

from fulmar._native import ffi, lib
from fulmar.buffers import AtomicBuffer
from fulmar.counters import COUNTER_LENGTH, COUNTER_WATCHERS_OFFSET
from fulmar.idle import Doorbell
from fulmar.logbuffer import LogBuffers

CLIENT_DOORBELL_TYPE_ID = int(lib.FULMAR_CLIENT_DOORBELL_TYPE_ID)
THREAD_DOORBELL_TYPE_ID = int(lib.FULMAR_THREAD_DOORBELL_TYPE_ID)
LOG_READERS_OFFSET = int(lib.FULMAR_LOG_READERS_OFFSET)
LOG_READERS_CAPACITY = int(lib.FULMAR_LOG_READERS_CAPACITY)
_COUNT = LOG_READERS_OFFSET + int(lib.FULMAR_LOG_READERS_COUNT_OFFSET)
_RELAY = LOG_READERS_OFFSET + int(lib.FULMAR_LOG_READERS_RELAY_OFFSET)
_IDS = LOG_READERS_OFFSET + int(lib.FULMAR_LOG_READERS_IDS_OFFSET)
COUNTER_WATCHERS_CAPACITY = int(lib.FULMAR_COUNTER_WATCHERS_CAPACITY)

assert (COUNTER_LENGTH, COUNTER_WATCHERS_OFFSET) == (lib.FULMAR_COUNTER_LENGTH, lib.FULMAR_COUNTER_WATCHERS_OFFSET)


def client_doorbell(values: AtomicBuffer, counter_id: int) -> Doorbell:
    """The doorbell that is the value slot of counter ``counter_id``."""
    return Doorbell(values, counter_id * COUNTER_LENGTH)


def ring_doorbells(values: AtomicBuffer, ids: object, count: int) -> int:
    """Ring ``count`` doorbells named in ``ids`` (an ``int32_t[]``); how many had a sleeper."""
    return int(lib.fulmar_doorbell_ring_ids(values.address, values.capacity, ids, count))


def ring_log_readers(log: LogBuffers, values: AtomicBuffer) -> bool:
    """Ring the readers the log's table names; True if the driver relays to more."""
    return bool(lib.fulmar_log_ring_readers(log.metadata.address, values.address, values.capacity))


def ring_counter_watchers(values: AtomicBuffer, counter_id: int) -> int:
    """Ring the doorbells watching counter ``counter_id``; how many had a sleeper."""
    return int(lib.fulmar_counter_ring_watchers(values.address, values.capacity, counter_id))


class LogReaders:
    """The media driver's record of one log's reader doorbells.

    ``update`` writes the table in the log's metadata (the first
    ``LOG_READERS_CAPACITY``; with more, the relay flag tells writers to ring
    the driver too) and keeps every id for the driver's own rings: an image's
    readers when data lands in it, a publication's beyond the table when its
    producer position moves.
    """

    __slots__ = ("_log", "_values", "_ids", "count", "relay")

    def __init__(self, log: LogBuffers, values: AtomicBuffer) -> None:
        self._log = log
        self._values = values
        self._ids = ffi.new("int32_t[]", 0)
        self.count = 0
        self.relay = False

    def update(self, ids: Sequence[int]) -> None:
        unique = list(dict.fromkeys(ids))
        self._ids = ffi.new("int32_t[]", unique)
        self.count = len(unique)
        self.relay = self.count > LOG_READERS_CAPACITY
        metadata = self._log.metadata
        shown = unique[:LOG_READERS_CAPACITY]
        # A writer reading the table while it changes rings some old and some
        # new ids: a stray ring wakes a reader that finds nothing; a missed one
        # is a reader the driver has just linked, which looks for data itself.
        for index, doorbell_id in enumerate(shown):
            metadata.put_int32_ordered(_IDS + 4 * index, doorbell_id)
        metadata.put_int32_ordered(_RELAY, 1 if self.relay else 0)
        metadata.put_int32_ordered(_COUNT, len(shown))

    @property
    def beyond_table(self) -> list[int]:
        """The readers the table has no room for: the driver's data plane rings
        them (``fulmar_dp_set_readers``), as writers ring the table's."""
        return [int(self._ids[index]) for index in range(LOG_READERS_CAPACITY, self.count)]


def log_readers_in_table(log: LogBuffers) -> tuple[list[int], bool]:
    """The doorbell ids a log's table names, and its relay flag (for tools and tests)."""
    metadata = log.metadata
    count = min(metadata.get_int32_volatile(_COUNT), LOG_READERS_CAPACITY)
    return (
        [metadata.get_int32_volatile(_IDS + 4 * index) for index in range(count)],
        bool(metadata.get_int32_volatile(_RELAY)),
    )


class CounterWatch:
    """One client's watch on counters: its doorbell rings when they move.

    ``watch`` returns False when the counter's slots are all taken: the
    watcher then wakes only on its idle timeout, as before doorbells had
    watchers, so the caller may say so but need not fail.
    """

    __slots__ = ("_values", "doorbell_id")

    def __init__(self, values: AtomicBuffer, doorbell_id: int) -> None:
        self._values = values
        self.doorbell_id = doorbell_id

    def watch(self, counter_id: int) -> bool:
        values = self._values
        return int(lib.fulmar_counter_watch(values.address, values.capacity, counter_id, self.doorbell_id)) == 0

    def unwatch(self, counter_id: int) -> None:
        values = self._values
        lib.fulmar_counter_unwatch(values.address, values.capacity, counter_id, self.doorbell_id)

    def watchers(self, counter_id: int) -> list[int]:
        """The doorbell ids watching the counter (for tools and tests)."""
        base = counter_id * COUNTER_LENGTH + COUNTER_WATCHERS_OFFSET
        slots = [self._values.get_int32_volatile(base + 4 * index) for index in range(COUNTER_WATCHERS_CAPACITY)]
        return [slot - 1 for slot in slots if slot > 0]
