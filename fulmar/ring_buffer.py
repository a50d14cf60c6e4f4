"""Many-to-one ring buffer: Aeron's to-driver command buffer.

Any number of producers, in any number of processes, append records; one
consumer reads them in order.  The layout is Agrona's ``ManyToOneRingBuffer``
(the C driver's ``aeron_mpsc_rb``), so a real Aeron client or driver can share
the buffer:

* the ring (``capacity`` bytes, a power of two) is followed by a 768-byte
  trailer holding, at ``capacity +`` 128 / 256 / 384 / 512 / 640, the tail,
  the head cache, the head, the correlation counter and the consumer
  heartbeat (each on its own pair of cache lines);
* a record is ``length i32 @0`` (header included), ``msg_type_id i32 @4`` and
  the body, aligned to 8 bytes; ``msg_type_id`` -1 marks padding that fills the
  end of the ring when a record does not fit there;
* producers claim space with a CAS on the tail, write the length negated,
  then the body, then the positive length with a release store; the consumer
  stops at the first length that is not positive, zeroes what it consumed and
  then moves the head.

The claim/commit/scan code is native (``_native/src/ring_buffer.c``).  The
consumer side crosses into C once per batch of records, not once per record:
``read`` gets the type ids, offsets and lengths of up to 256 records from one
native scan and calls the handler for each, then releases the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from fulmar._native import ffi, lib
from fulmar.buffers import AtomicBuffer
from fulmar.errors import FulmarError
from fulmar.errors import MessageTooLongError as _MessageTooLongError

TRAILER_LENGTH: Final = int(lib.FULMAR_RB_TRAILER_LENGTH)
TAIL_POSITION_OFFSET: Final = int(lib.FULMAR_RB_TAIL_POSITION_OFFSET)
HEAD_CACHE_POSITION_OFFSET: Final = int(lib.FULMAR_RB_HEAD_CACHE_POSITION_OFFSET)
HEAD_POSITION_OFFSET: Final = int(lib.FULMAR_RB_HEAD_POSITION_OFFSET)
CORRELATION_COUNTER_OFFSET: Final = int(lib.FULMAR_RB_CORRELATION_COUNTER_OFFSET)
CONSUMER_HEARTBEAT_OFFSET: Final = int(lib.FULMAR_RB_CONSUMER_HEARTBEAT_OFFSET)
RECORD_HEADER_LENGTH: Final = int(lib.FULMAR_RB_RECORD_HEADER_LENGTH)
ALIGNMENT: Final = int(lib.FULMAR_RB_ALIGNMENT)
PADDING_MSG_TYPE_ID: Final = int(lib.FULMAR_RB_PADDING_MSG_TYPE_ID)

# Positions and indexes are int32 in the native code (as in Aeron), so the
# largest ring is the largest power of two that fits.
MAX_CAPACITY: Final = 1 << 30

_OK: Final = int(lib.FULMAR_RB_OK)
_FULL: Final = int(lib.FULMAR_RB_FULL)
_ALREADY_RELEASED: Final = int(lib.FULMAR_RB_ALREADY_RELEASED)
_SCAN_CORRUPT: Final = int(lib.FULMAR_RB_SCAN_CORRUPT)

# Records handed to Python per native scan.  Large enough to amortise the
# call, small enough that a handler exception wastes little.
READ_BATCH: Final = 256

_INT32_MAX: Final = (1 << 31) - 1

MessageHandler = Callable[[int, memoryview], object]
"""``handler(msg_type_id, body)``; ``body`` is only valid during the call."""


class RingBufferError(FulmarError):
    """Base of the errors raised by the ring and broadcast buffers."""


class InvalidCapacityError(RingBufferError, ValueError):
    """The buffer is not a power of two plus the trailer, or is misaligned."""


class MessageTooLongError(RingBufferError, _MessageTooLongError):
    """The message is longer than the buffer's maximum message length."""


class InvalidMessageTypeError(RingBufferError, ValueError):
    """Message type ids must be >= 1 (-1 is padding, 0 is reserved)."""


class ClaimStateError(RingBufferError, RuntimeError):
    """commit/abort of space that is not an outstanding claim."""


class CorruptBufferError(RingBufferError):
    """The buffer holds a record no producer could have written."""


def _aligned(length: int) -> int:
    return (length + ALIGNMENT - 1) & ~(ALIGNMENT - 1)


def check_capacity(capacity: int, trailer_length: int) -> int:
    """Return the ring capacity of a buffer of ``capacity`` bytes or raise.

    Shared with the broadcast buffer, which has the same rule with a smaller
    trailer.
    """
    ring = capacity - trailer_length
    if ring < RECORD_HEADER_LENGTH or ring & (ring - 1) or ring > MAX_CAPACITY:
        raise InvalidCapacityError(
            f"buffer of {capacity} bytes: capacity must be a power of two between "
            f"{RECORD_HEADER_LENGTH} and {MAX_CAPACITY} plus the {trailer_length}-byte trailer"
        )
    return ring


def check_alignment(buffer: AtomicBuffer) -> None:
    # Lengths and positions are accessed atomically, which needs natural
    # alignment of the whole ring, not only of offsets within it.
    if int(ffi.cast("uintptr_t", buffer.address)) % 8:
        raise InvalidCapacityError("buffer must start on an 8-byte boundary")


def check_message(msg_type_id: int, length: int, max_message_length: int) -> None:
    """Raise the specific error for a message the native code refused."""
    if msg_type_id < 1:
        raise InvalidMessageTypeError(f"message type id must be >= 1: {msg_type_id}")
    if length > max_message_length:
        raise MessageTooLongError(f"message of {length} bytes exceeds the maximum of {max_message_length}")
    if length < 0:
        raise ValueError(f"invalid message length {length}")


class ManyToOneRingBuffer:
    """Many producers, one consumer, over an :class:`AtomicBuffer`.

    Producer methods (``write``, ``try_claim``/``commit``/``abort``,
    ``next_correlation_id``) may run in any number of processes at once.
    ``read`` and ``unblock`` belong to the single consumer.
    """

    __slots__ = (
        "_buffer",
        "_address",
        "_view",
        "_capacity",
        "_max_message_length",
        "_records",
        "_records_view",
        "_out",
    )

    def __init__(self, buffer: AtomicBuffer) -> None:
        self._capacity = check_capacity(buffer.capacity, TRAILER_LENGTH)
        check_alignment(buffer)
        self._buffer = buffer
        self._address = buffer.address
        self._view = buffer.view
        self._max_message_length = int(lib.fulmar_rb_max_message_length(self._capacity))
        # Scan results land here; read as one list per batch (tolist), which is
        # far cheaper than indexing cdata element by element.
        self._records = ffi.new("int32_t[]", 3 * READ_BATCH)
        self._records_view = memoryview(ffi.buffer(self._records)).cast("i")
        self._out = ffi.new("int32_t[2]")

    @property
    def buffer(self) -> AtomicBuffer:
        return self._buffer

    @property
    def capacity(self) -> int:
        """Bytes available for records (the buffer minus its trailer)."""
        return self._capacity

    @property
    def max_message_length(self) -> int:
        return self._max_message_length

    # Producers.

    def write(self, msg_type_id: int, payload: bytes | bytearray | memoryview) -> bool:
        """Append one message; False when there is no room for it right now."""
        if type(payload) is bytes:
            # cffi passes bytes to a const char* without a copy.
            data: object = payload
            length = len(payload)
        else:
            cdata = ffi.from_buffer(payload)
            data = cdata
            length = len(cdata)
        result = lib.fulmar_rb_write(self._address, self._capacity, msg_type_id, data, length)
        if result == _OK:
            return True
        if result == _FULL:
            return False
        check_message(msg_type_id, length, self._max_message_length)
        raise RingBufferError(f"write refused (code {result})")

    def try_claim(self, msg_type_id: int, length: int) -> int | None:
        """Claim ``length`` bytes to fill in place; None when full.

        Returns the offset of the body in :attr:`buffer`.  Write the body
        there, then :meth:`commit` (or :meth:`abort`) with the same offset.
        Until then the consumer waits at this record, so keep it short.
        """
        index = int(lib.fulmar_rb_try_claim(self._address, self._capacity, msg_type_id, length))
        if index >= 0:
            return index
        if index == _FULL:
            return None
        check_message(msg_type_id, length, self._max_message_length)
        raise RingBufferError(f"claim refused (code {index})")

    def commit(self, index: int) -> None:
        """Publish a claimed record to the consumer."""
        self._check_claim_result(int(lib.fulmar_rb_commit(self._address, self._capacity, index)), index)

    def abort(self, index: int) -> None:
        """Give a claimed record up; the consumer skips it as padding."""
        self._check_claim_result(int(lib.fulmar_rb_abort(self._address, self._capacity, index)), index)

    def _check_claim_result(self, result: int, index: int) -> None:
        if result == _OK:
            return
        if result == _ALREADY_RELEASED:
            raise ClaimStateError(f"claim at {index} was already committed or aborted")
        raise IndexError(f"{index} is not the body offset of a record in a ring of {self._capacity} bytes")

    def next_correlation_id(self) -> int:
        """A process-wide unique id from the shared counter (get-and-add)."""
        return self._buffer.get_and_add_int64(self._capacity + CORRELATION_COUNTER_OFFSET, 1)

    # Consumer.

    def read(self, handler: MessageHandler, limit: int = _INT32_MAX) -> int:
        """Deliver up to ``limit`` messages to ``handler``; returns how many.

        One call consumes at most one ring's worth of bytes.  ``body`` views
        point into the ring and are zeroed once the batch is released: copy
        what you keep.  If the handler raises, the messages before it and the
        one it raised on are consumed (as in Aeron) and the exception
        propagates.
        """
        address = self._address
        capacity = self._capacity
        view = self._view
        records_view = self._records_view
        out = self._out
        delivered = 0
        bytes_consumed = 0

        while delivered < limit and bytes_consumed < capacity:
            batch = min(limit - delivered, READ_BATCH)
            count = lib.fulmar_rb_scan(address, capacity, batch, self._records, out)
            scanned = out[0]
            status = out[1]
            if scanned == 0:
                if status == _SCAN_CORRUPT:
                    raise CorruptBufferError(self._corrupt_message())
                break

            meta = records_view[: 3 * count].tolist()
            i = 0
            try:
                for i in range(0, 3 * count, 3):
                    offset = meta[i + 1]
                    handler(meta[i], view[offset : offset + meta[i + 2]])
            except BaseException:
                self._consume_through(meta[i + 1], meta[i + 2])
                raise
            lib.fulmar_rb_consume(address, capacity, scanned)
            delivered += count
            bytes_consumed += scanned

            if status == _SCAN_CORRUPT:
                raise CorruptBufferError(self._corrupt_message())

        return delivered

    def _consume_through(self, body_offset: int, body_length: int) -> None:
        # Release the batch up to the end of the record whose handler raised.
        head = self._buffer.get_int64_volatile(self._capacity + HEAD_POSITION_OFFSET)
        head_index = head & (self._capacity - 1)
        record_end = body_offset - RECORD_HEADER_LENGTH + _aligned(body_length + RECORD_HEADER_LENGTH)
        lib.fulmar_rb_consume(self._address, self._capacity, record_end - head_index)

    def _corrupt_message(self) -> str:
        head = self.consumer_position
        index = head & (self._capacity - 1)
        length = self._buffer.get_int32_volatile(index)
        return f"record at position {head} (index {index}) has impossible length {length}"

    def unblock(self) -> bool:
        """Skip a record whose producer died between claiming and committing.

        Aeron's recovery: a negative length at the head becomes padding; a zero
        length at the head with a committed record further on (and only zeros in
        between) becomes padding up to that record.  Call only when the head has
        not moved for longer than any live producer takes to commit (the driver
        uses the client liveness timeout).  True if something was unblocked.
        """
        return bool(lib.fulmar_rb_unblock(self._address, self._capacity))

    # Positions and status.

    @property
    def producer_position(self) -> int:
        return self._buffer.get_int64_volatile(self._capacity + TAIL_POSITION_OFFSET)

    @property
    def consumer_position(self) -> int:
        return self._buffer.get_int64_volatile(self._capacity + HEAD_POSITION_OFFSET)

    def size(self) -> int:
        """Bytes claimed and not yet consumed (a snapshot under concurrency)."""
        buffer = self._buffer
        head_offset = self._capacity + HEAD_POSITION_OFFSET
        tail_offset = self._capacity + TAIL_POSITION_OFFSET
        # Read the head on both sides of the tail so the pair is consistent.
        head_after = buffer.get_int64_volatile(head_offset)
        while True:
            head_before = head_after
            tail = buffer.get_int64_volatile(tail_offset)
            head_after = buffer.get_int64_volatile(head_offset)
            if head_after == head_before:
                break
        return max(0, min(tail - head_after, self._capacity))

    @property
    def consumer_heartbeat_time(self) -> int:
        """The consumer's liveness timestamp (ms), read by producers."""
        return self._buffer.get_int64_volatile(self._capacity + CONSUMER_HEARTBEAT_OFFSET)

    @consumer_heartbeat_time.setter
    def consumer_heartbeat_time(self, time_ms: int) -> None:
        self._buffer.put_int64_ordered(self._capacity + CONSUMER_HEARTBEAT_OFFSET, time_ms)
