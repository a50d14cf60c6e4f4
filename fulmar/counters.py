"""Counters in shared memory: Aeron's counters metadata and values buffers.

The driver allocates counters (positions, limits, error counts, states); any
process that maps cnc.dat reads them: that is how ``cluster-tool`` and
``AeronStat`` see a node without joining it.  The layout is Agrona's
``CountersManager``/``CountersReader`` (``aeron_counters_manager`` in C):

* **values**: one 128-byte record per counter id (two cache lines, so counters
  updated by different threads never share a line): ``value i64 @0``,
  ``registration_id i64 @8``, ``owner_id i64 @16``, ``reference_id i64 @24``;
* **metadata**: one 512-byte record per counter id: ``state i32 @0`` (0 unused,
  1 allocated, -1 reclaimed), ``type_id i32 @4``,
  ``free_for_reuse_deadline_ms i64 @8``, ``key[112] @16``,
  ``label_length i32 @128``, ``label[380] @132`` (UTF-8).

Every field is written before the ``state`` that publishes the record, with a
release store, and readers load ``state`` with acquire before anything else,
so a reader never sees a half-written record.  Records are used in id order, so
readers stop at the first unused one.

Everything here is a handful of atomic word accesses through
:class:`~fulmar.buffers.AtomicBuffer`, except ``CountersReader.snapshot``:
a metrics scrape reads every counter many times a second, so one native call
copies them all (``_native/src/counters.h``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final, NamedTuple

from fulmar._native import ffi, lib
from fulmar.buffers import AtomicBuffer
from fulmar.errors import FulmarError

METADATA_LENGTH: Final = 512
COUNTER_LENGTH: Final = 128

# Metadata record.
TYPE_ID_OFFSET: Final = 4
FREE_FOR_REUSE_DEADLINE_OFFSET: Final = 8
KEY_OFFSET: Final = 16
LABEL_LENGTH_OFFSET: Final = 128
LABEL_OFFSET: Final = 132
MAX_KEY_LENGTH: Final = 112
MAX_LABEL_LENGTH: Final = 380

# Values record.
REGISTRATION_ID_OFFSET: Final = 8
OWNER_ID_OFFSET: Final = 16
REFERENCE_ID_OFFSET: Final = 24
# Past Aeron's fields in a value record: fulmar's counter watchers (see
# fulmar.reader_doorbells and _native/src/doorbell.h).
COUNTER_WATCHERS_OFFSET: Final = 64

RECORD_UNUSED: Final = 0
RECORD_ALLOCATED: Final = 1
RECORD_RECLAIMED: Final = -1

NOT_FREE_TO_REUSE: Final = (1 << 63) - 1
NULL_COUNTER_ID: Final = -1
DEFAULT_TYPE_ID: Final = 0
DEFAULT_REGISTRATION_ID: Final = 0
DEFAULT_OWNER_ID: Final = 0
DEFAULT_REFERENCE_ID: Final = 0

EpochClock = Callable[[], int]
"""Returns the wall-clock time in milliseconds."""


class CountersError(FulmarError):
    """Base of the counters errors."""


class CountersFullError(CountersError):
    """Every counter id is allocated or still waiting out its reuse timeout."""


class CounterKeyTooLongError(CountersError, ValueError):
    """A key longer than the 112 bytes a metadata record holds."""


class CounterStateError(CountersError):
    """An operation on a counter id that is not allocated."""


class CounterMetadata(NamedTuple):
    counter_id: int
    type_id: int
    key: bytes
    label: str


class CountersSnapshot(NamedTuple):
    """Every counter id up to the first unused record, read in one pass:
    entry ``i`` of each list is counter id ``i``'s (a freed or reclaimed
    record's state says so; its other fields are what the record held)."""

    states: list[int]
    type_ids: list[int]
    registration_ids: list[int]
    values: list[int]


def counter_offset(counter_id: int) -> int:
    """Offset of a counter's record in the values buffer."""
    return counter_id * COUNTER_LENGTH


def metadata_offset(counter_id: int) -> int:
    """Offset of a counter's record in the metadata buffer."""
    return counter_id * METADATA_LENGTH


def _encode_label(label: str, max_length: int = MAX_LABEL_LENGTH) -> bytes:
    # Aeron truncates labels that do not fit rather than failing the
    # allocation (a label is for humans).  Cut on a character boundary so the
    # stored label is still valid UTF-8.
    encoded = label.encode("utf-8")
    if len(encoded) <= max_length:
        return encoded
    return encoded[:max_length].decode("utf-8", errors="ignore").encode("utf-8")


def append_to_label(metadata: AtomicBuffer, counter_id: int, suffix: str) -> None:
    """Append to a counter's label, keeping what fits in 380 bytes (Aeron's
    ``AeronCounters.appendToLabel``): how a client adds what it knows about
    itself to the heartbeat counter the driver allocated for it.  The bytes go
    in before the length that publishes them."""
    offset = metadata_offset(counter_id)
    existing = max(0, min(metadata.get_int32_volatile(offset + LABEL_LENGTH_OFFSET), MAX_LABEL_LENGTH))
    suffix_bytes = _encode_label(suffix, MAX_LABEL_LENGTH - existing)
    metadata.put_bytes(offset + LABEL_OFFSET + existing, suffix_bytes)
    metadata.put_int32_ordered(offset + LABEL_LENGTH_OFFSET, existing + len(suffix_bytes))


class CountersReader:
    """Reads counters written by a :class:`CountersManager`, from any process."""

    def __init__(self, metadata: AtomicBuffer, values: AtomicBuffer) -> None:
        for buffer in (metadata, values):
            # Values and states are accessed atomically: natural alignment of
            # every record needs an aligned start.
            if int(ffi.cast("uintptr_t", buffer.address)) % 8:
                raise ValueError("counters buffers must start on an 8-byte boundary")
        self._metadata = metadata
        self._values = values
        # Aeron derives the id range from the values buffer; bounding it by the
        # metadata buffer too means a short metadata buffer cannot be overrun.
        self._max_counter_id = min(values.capacity // COUNTER_LENGTH, metadata.capacity // METADATA_LENGTH) - 1

    @property
    def metadata_buffer(self) -> AtomicBuffer:
        return self._metadata

    @property
    def values_buffer(self) -> AtomicBuffer:
        return self._values

    @property
    def max_counter_id(self) -> int:
        return self._max_counter_id

    def _check_id(self, counter_id: int) -> None:
        if counter_id < 0 or counter_id > self._max_counter_id:
            raise IndexError(f"counter id {counter_id} outside 0..{self._max_counter_id}")

    def counters(self) -> Iterator[CounterMetadata]:
        """Every allocated counter, in id order."""
        metadata = self._metadata
        for counter_id in range(self._max_counter_id + 1):
            offset = metadata_offset(counter_id)
            state = metadata.get_int32_volatile(offset)
            if state == RECORD_UNUSED:
                return
            if state == RECORD_ALLOCATED:
                record = CounterMetadata(
                    counter_id,
                    metadata.get_int32(offset + TYPE_ID_OFFSET),
                    metadata.get_bytes(offset + KEY_OFFSET, MAX_KEY_LENGTH),
                    self._label_at(offset),
                )
                # free() unpublishes the record before it clears the key: a
                # counter freed while we copied it is dropped, not reported
                # half-cleared.  (Reuse of the id waits out the reuse timeout.)
                if metadata.get_int32_volatile(offset) == RECORD_ALLOCATED:
                    yield record

    def __iter__(self) -> Iterator[CounterMetadata]:
        return self.counters()

    def snapshot(self) -> CountersSnapshot:
        """State, type id, registration id and value of every id in use, in
        one native pass (each word loaded atomically, the state first).  Not
        one instant's picture: a counter allocated or freed meanwhile may or
        may not be in it, as with any reader."""
        capacity = self._max_counter_id + 1
        states = ffi.new("int32_t[]", capacity)
        type_ids = ffi.new("int32_t[]", capacity)
        registration_ids = ffi.new("int64_t[]", capacity)
        values = ffi.new("int64_t[]", capacity)
        count = lib.fulmar_counters_snapshot(
            self._metadata.address, self._values.address, capacity, states, type_ids, registration_ids, values
        )
        return CountersSnapshot(
            ffi.unpack(states, count),
            ffi.unpack(type_ids, count),
            ffi.unpack(registration_ids, count),
            ffi.unpack(values, count),
        )

    def _label_at(self, offset: int) -> str:
        length = self._metadata.get_int32_volatile(offset + LABEL_LENGTH_OFFSET)
        # A length that no manager writes is clamped rather than trusted.
        length = max(0, min(length, MAX_LABEL_LENGTH))
        return self._metadata.get_bytes(offset + LABEL_OFFSET, length).decode("utf-8", errors="replace")

    def counter_value(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._values.get_int64_volatile(counter_offset(counter_id))

    def counter_state(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._metadata.get_int32_volatile(metadata_offset(counter_id))

    def counter_type_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._metadata.get_int32_volatile(metadata_offset(counter_id) + TYPE_ID_OFFSET)

    def counter_label(self, counter_id: int) -> str:
        self._check_id(counter_id)
        return self._label_at(metadata_offset(counter_id))

    def counter_key(self, counter_id: int) -> bytes:
        self._check_id(counter_id)
        return self._metadata.get_bytes(metadata_offset(counter_id) + KEY_OFFSET, MAX_KEY_LENGTH)

    def free_for_reuse_deadline_ms(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._metadata.get_int64_volatile(metadata_offset(counter_id) + FREE_FOR_REUSE_DEADLINE_OFFSET)

    def counter_registration_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._values.get_int64_volatile(counter_offset(counter_id) + REGISTRATION_ID_OFFSET)

    def counter_owner_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._values.get_int64_volatile(counter_offset(counter_id) + OWNER_ID_OFFSET)

    def counter_reference_id(self, counter_id: int) -> int:
        self._check_id(counter_id)
        return self._values.get_int64_volatile(counter_offset(counter_id) + REFERENCE_ID_OFFSET)

    def find_by_registration_id(self, registration_id: int) -> int:
        """First allocated counter with this registration id, or NULL_COUNTER_ID."""
        for counter_id in self._allocated_ids():
            if self.counter_registration_id(counter_id) == registration_id:
                return counter_id
        return NULL_COUNTER_ID

    def find_by_type_and_registration(self, type_id: int, registration_id: int) -> int:
        """First allocated counter of this type and registration id, or NULL_COUNTER_ID
        (one native pass: a client adding a thousand publications looks up each
        one's counters among thousands)."""
        capacity = self._max_counter_id + 1
        return int(
            lib.fulmar_counters_find(
                self._metadata.address, self._values.address, capacity, type_id, registration_id, 0
            )
        )

    def ids_of_type(self, type_id: int) -> Iterator[int]:
        """The allocated counters of this type, in id order (each found natively:
        a reader after its few counters does not walk every record from Python)."""
        capacity = self._max_counter_id + 1
        counter_id = -1
        while True:
            counter_id = int(
                lib.fulmar_counters_find(
                    self._metadata.address,
                    self._values.address,
                    capacity,
                    type_id,
                    lib.FULMAR_COUNTERS_ANY_REGISTRATION,
                    counter_id + 1,
                )
            )
            if counter_id < 0:
                return
            yield counter_id

    def _allocated_ids(self) -> Iterator[int]:
        metadata = self._metadata
        for counter_id in range(self._max_counter_id + 1):
            state = metadata.get_int32_volatile(metadata_offset(counter_id))
            if state == RECORD_UNUSED:
                return
            if state == RECORD_ALLOCATED:
                yield counter_id


class CountersManager(CountersReader):
    """Allocates and frees counters; one manager per pair of buffers.

    Not thread-safe (Aeron's driver conductor is its only user).  Freed ids
    are reused only after ``reuse_timeout_ms``, so a slow reader that still
    holds the old id does not start reading someone else's counter at once.
    """

    def __init__(self, metadata: AtomicBuffer, values: AtomicBuffer, reuse_timeout_ms: int, clock: EpochClock) -> None:
        if metadata.capacity < values.capacity * (METADATA_LENGTH // COUNTER_LENGTH):
            raise ValueError(
                f"metadata buffer of {metadata.capacity} bytes is too small for a values buffer of "
                f"{values.capacity} bytes (needs {METADATA_LENGTH // COUNTER_LENGTH}x)"
            )
        super().__init__(metadata, values)
        self._reuse_timeout_ms = reuse_timeout_ms
        self._clock = clock
        self._high_water_mark_id = -1
        self._free_list: list[int] = []

    @property
    def capacity(self) -> int:
        """How many counters the buffers hold."""
        return self._max_counter_id + 1

    def available(self) -> int:
        """How many counters could be allocated now."""
        now_ms = self._clock()
        reusable = sum(1 for counter_id in self._free_list if now_ms >= self._reuse_deadline(counter_id))
        return self.capacity - self._high_water_mark_id - 1 + reusable

    def allocate(
        self,
        label: str,
        type_id: int = DEFAULT_TYPE_ID,
        key: bytes | bytearray | memoryview = b"",
        registration_id: int = DEFAULT_REGISTRATION_ID,
        owner_id: int = DEFAULT_OWNER_ID,
        reference_id: int = DEFAULT_REFERENCE_ID,
    ) -> int:
        """Allocate a counter (value 0) and return its id.

        Labels longer than 380 bytes of UTF-8 are truncated, as Aeron does.
        A key longer than 112 bytes raises :class:`CounterKeyTooLongError`:
        keys are structured data that readers match on, and Aeron's own
        ``setCounterKey`` refuses them too.
        """
        key_bytes = bytes(key)
        if len(key_bytes) > MAX_KEY_LENGTH:
            raise CounterKeyTooLongError(f"key of {len(key_bytes)} bytes exceeds {MAX_KEY_LENGTH}")
        label_bytes = _encode_label(label)

        counter_id = self._next_counter_id()
        values = self._values
        metadata = self._metadata
        value_offset = counter_offset(counter_id)
        record_offset = metadata_offset(counter_id)

        # The ids go in before the record is published so that a reader that
        # finds the counter by registration id never sees the previous owner's.
        values.put_int64_ordered(value_offset + REGISTRATION_ID_OFFSET, registration_id)
        values.put_int64_ordered(value_offset + OWNER_ID_OFFSET, owner_id)
        values.put_int64_ordered(value_offset + REFERENCE_ID_OFFSET, reference_id)

        metadata.put_int32(record_offset + TYPE_ID_OFFSET, type_id)
        metadata.put_int64(record_offset + FREE_FOR_REUSE_DEADLINE_OFFSET, NOT_FREE_TO_REUSE)
        if key_bytes:
            # A reclaimed record's key was zeroed by free(); a fresh one is zero.
            metadata.put_bytes(record_offset + KEY_OFFSET, key_bytes)
        metadata.put_bytes(record_offset + LABEL_OFFSET, label_bytes)
        metadata.put_int32_ordered(record_offset + LABEL_LENGTH_OFFSET, len(label_bytes))
        # Published last, with a release store: readers load it with acquire.
        metadata.put_int32_ordered(record_offset, RECORD_ALLOCATED)
        return counter_id

    def new_counter(
        self,
        label: str,
        type_id: int = DEFAULT_TYPE_ID,
        key: bytes | bytearray | memoryview = b"",
        registration_id: int = DEFAULT_REGISTRATION_ID,
        owner_id: int = DEFAULT_OWNER_ID,
        reference_id: int = DEFAULT_REFERENCE_ID,
    ) -> AtomicCounter:
        """Allocate a counter and wrap it; closing the wrapper frees it."""
        counter_id = self.allocate(label, type_id, key, registration_id, owner_id, reference_id)
        return AtomicCounter(self._values, counter_id, self)

    def free(self, counter_id: int) -> None:
        """Reclaim a counter; its id becomes reusable after the reuse timeout."""
        self._check_id(counter_id)
        offset = metadata_offset(counter_id)
        metadata = self._metadata
        if metadata.get_int32_volatile(offset) != RECORD_ALLOCATED:
            raise CounterStateError(f"counter {counter_id} is not allocated")

        # Unpublish first so readers stop reporting the counter, then clear it.
        metadata.put_int32_ordered(offset, RECORD_RECLAIMED)
        metadata.set_memory(offset + KEY_OFFSET, MAX_KEY_LENGTH, 0)
        metadata.put_int64_ordered(offset + FREE_FOR_REUSE_DEADLINE_OFFSET, self._clock() + self._reuse_timeout_ms)
        self._free_list.append(counter_id)

    def _reuse_deadline(self, counter_id: int) -> int:
        return self._metadata.get_int64(metadata_offset(counter_id) + FREE_FOR_REUSE_DEADLINE_OFFSET)

    def _next_counter_id(self) -> int:
        if self._free_list:
            now_ms = self._clock()
            for index, counter_id in enumerate(self._free_list):
                if now_ms >= self._reuse_deadline(counter_id):
                    del self._free_list[index]
                    # Reset the values record as Aeron does; the value last,
                    # with a release store.
                    offset = counter_offset(counter_id)
                    self._values.put_int64_ordered(offset + REGISTRATION_ID_OFFSET, DEFAULT_REGISTRATION_ID)
                    self._values.put_int64(offset + OWNER_ID_OFFSET, DEFAULT_OWNER_ID)
                    self._values.put_int64(offset + REFERENCE_ID_OFFSET, DEFAULT_REFERENCE_ID)
                    # fulmar's watcher slots (fulmar.reader_doorbells): the
                    # previous counter's watchers are not this one's.
                    self._values.set_memory(
                        offset + COUNTER_WATCHERS_OFFSET, COUNTER_LENGTH - COUNTER_WATCHERS_OFFSET, 0
                    )
                    self._values.put_int64_ordered(offset, 0)
                    return counter_id

        if self._high_water_mark_id + 1 > self._max_counter_id:
            raise CountersFullError(
                f"unable to allocate counter, buffer is full: max counter id {self._max_counter_id}"
            )
        self._high_water_mark_id += 1
        return self._high_water_mark_id

    def _check_allocated(self, counter_id: int) -> None:
        self._check_id(counter_id)
        if self._metadata.get_int32_volatile(metadata_offset(counter_id)) != RECORD_ALLOCATED:
            raise CounterStateError(f"counter {counter_id} is not allocated")

    def set_counter_value(self, counter_id: int, value: int) -> None:
        self._check_id(counter_id)
        self._values.put_int64_ordered(counter_offset(counter_id), value)

    def set_counter_registration_id(self, counter_id: int, registration_id: int) -> None:
        self._check_id(counter_id)
        self._values.put_int64_ordered(counter_offset(counter_id) + REGISTRATION_ID_OFFSET, registration_id)

    def set_counter_owner_id(self, counter_id: int, owner_id: int) -> None:
        self._check_id(counter_id)
        self._values.put_int64_ordered(counter_offset(counter_id) + OWNER_ID_OFFSET, owner_id)

    def set_counter_reference_id(self, counter_id: int, reference_id: int) -> None:
        self._check_id(counter_id)
        self._values.put_int64_ordered(counter_offset(counter_id) + REFERENCE_ID_OFFSET, reference_id)

    def set_counter_label(self, counter_id: int, label: str) -> None:
        """Replace the label (truncated to 380 bytes like Aeron)."""
        self._check_allocated(counter_id)
        offset = metadata_offset(counter_id)
        label_bytes = _encode_label(label)
        self._metadata.put_bytes(offset + LABEL_OFFSET, label_bytes)
        self._metadata.put_int32_ordered(offset + LABEL_LENGTH_OFFSET, len(label_bytes))

    def append_to_label(self, counter_id: int, suffix: str) -> None:
        """Append to the label, keeping what fits in 380 bytes."""
        self._check_allocated(counter_id)
        append_to_label(self._metadata, counter_id, suffix)

    def set_counter_key(self, counter_id: int, key: bytes | bytearray | memoryview) -> None:
        self._check_allocated(counter_id)
        key_bytes = bytes(key)
        if len(key_bytes) > MAX_KEY_LENGTH:
            raise CounterKeyTooLongError(f"key of {len(key_bytes)} bytes exceeds {MAX_KEY_LENGTH}")
        offset = metadata_offset(counter_id) + KEY_OFFSET
        self._metadata.set_memory(offset, MAX_KEY_LENGTH, 0)
        self._metadata.put_bytes(offset, key_bytes)


class AtomicCounter:
    """One counter's value, for the process that updates it.

    Updates are atomic across processes.  ``close`` frees the counter when it
    came from :meth:`CountersManager.new_counter`.
    """

    __slots__ = ("_values", "_offset", "_counter_id", "_manager", "_closed")

    def __init__(self, values: AtomicBuffer, counter_id: int, manager: CountersManager | None = None) -> None:
        if counter_id < 0 or counter_offset(counter_id) + COUNTER_LENGTH > values.capacity:
            raise IndexError(f"counter id {counter_id} outside a values buffer of {values.capacity} bytes")
        self._values = values
        self._offset = counter_offset(counter_id)
        self._counter_id = counter_id
        self._manager = manager
        self._closed = False

    @property
    def id(self) -> int:
        return self._counter_id

    @property
    def is_closed(self) -> bool:
        return self._closed

    def get(self) -> int:
        """The value, with acquire semantics."""
        return self._values.get_int64_volatile(self._offset)

    def set(self, value: int) -> None:
        """Set the value with a release (ordered) store."""
        self._values.put_int64_ordered(self._offset, value)

    def increment(self) -> int:
        """Add one atomically; returns the previous value."""
        return self._values.get_and_add_int64(self._offset, 1)

    def get_and_add(self, delta: int) -> int:
        """Add ``delta`` atomically; returns the previous value."""
        return self._values.get_and_add_int64(self._offset, delta)

    def compare_and_set(self, expected: int, value: int) -> bool:
        return self._values.compare_and_set_int64(self._offset, expected, value)

    def propose_max(self, value: int) -> bool:
        """Set ``value`` if it is larger than the current one (single writer)."""
        if value > self._values.get_int64_volatile(self._offset):
            self._values.put_int64_ordered(self._offset, value)
            return True
        return False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._manager is not None:
                self._manager.free(self._counter_id)

    def __enter__(self) -> AtomicCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AtomicCounter(id={self._counter_id}, value={self.get()}, closed={self._closed})"
