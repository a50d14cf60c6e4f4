"""One-to-many broadcast buffer: Aeron's to-clients response buffer.

One transmitter (the driver) writes records into a ring without ever waiting;
any number of receivers (clients, in other processes) follow at their own pace,
each with a private cursor.  A receiver that falls a whole ring behind is
*lapped*: it counts the lap and skips to the latest record.  The layout is
Agrona's ``BroadcastTransmitter``/``BroadcastReceiver`` (``aeron_broadcast_*``
in the C driver):

* the ring (a power of two) is followed by a 128-byte trailer with the tail
  intent @0, the tail @8 and the position of the latest record @16;
* a record is ``length i32 @0`` (header included), ``msg_type_id i32 @4`` and
  the body, aligned to 8; ``msg_type_id`` -1 is padding up to the ring's end.

The transmitter raises the tail intent before it overwrites anything and the
tail after it is done, so a receiver can tell, after reading a record, whether
the transmitter may have been writing over it: a seqlock.
:class:`CopyBroadcastReceiver` copies records out and checks that before the
handler sees them, so a handler never sees a torn record.
"""

from __future__ import annotations

from typing import Final

from fulmar._native import ffi, lib
from fulmar.buffers import AtomicBuffer
from fulmar.ring_buffer import (
    CorruptBufferError,
    MessageHandler,
    RingBufferError,
    check_alignment,
    check_capacity,
    check_message,
)

TRAILER_LENGTH: Final = int(lib.FULMAR_BROADCAST_TRAILER_LENGTH)
TAIL_INTENT_COUNTER_OFFSET: Final = int(lib.FULMAR_BROADCAST_TAIL_INTENT_COUNTER_OFFSET)
TAIL_COUNTER_OFFSET: Final = int(lib.FULMAR_BROADCAST_TAIL_COUNTER_OFFSET)
LATEST_COUNTER_OFFSET: Final = int(lib.FULMAR_BROADCAST_LATEST_COUNTER_OFFSET)
RECORD_HEADER_LENGTH: Final = int(lib.FULMAR_BROADCAST_RECORD_HEADER_LENGTH)
RECORD_ALIGNMENT: Final = int(lib.FULMAR_BROADCAST_RECORD_ALIGNMENT)
PADDING_MSG_TYPE_ID: Final = int(lib.FULMAR_BROADCAST_PADDING_MSG_TYPE_ID)

SCRATCH_BUFFER_LENGTH: Final = 4096
"""Aeron's default scratch length for copy receivers."""

_OK: Final = int(lib.FULMAR_BROADCAST_OK)
_RECEIVE_OK: Final = int(lib.FULMAR_BROADCAST_RECEIVE_OK)
_RECEIVE_LAPPED: Final = int(lib.FULMAR_BROADCAST_RECEIVE_LAPPED)
_RECEIVE_TOO_LONG: Final = int(lib.FULMAR_BROADCAST_RECEIVE_TOO_LONG)


class UnableToKeepUpError(RingBufferError):
    """The transmitter overwrote records this receiver had not read yet."""


class ScratchBufferTooSmallError(RingBufferError):
    """A record is longer than the copy receiver's scratch buffer; it was skipped."""


class BroadcastTransmitter:
    """The single writer of a broadcast buffer (one per buffer, one thread)."""

    __slots__ = ("_buffer", "_address", "_capacity", "_max_message_length")

    def __init__(self, buffer: AtomicBuffer) -> None:
        self._capacity = check_capacity(buffer.capacity, TRAILER_LENGTH)
        check_alignment(buffer)
        self._buffer = buffer
        self._address = buffer.address
        self._max_message_length = int(lib.fulmar_broadcast_max_message_length(self._capacity))

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_message_length(self) -> int:
        return self._max_message_length

    def transmit(self, msg_type_id: int, payload: bytes | bytearray | memoryview) -> None:
        """Write one message; never blocks, overwriting the oldest records."""
        if type(payload) is bytes:
            data: object = payload
            length = len(payload)
        else:
            cdata = ffi.from_buffer(payload)
            data = cdata
            length = len(cdata)
        result = lib.fulmar_broadcast_transmit(self._address, self._capacity, msg_type_id, data, length)
        if result != _OK:
            check_message(msg_type_id, length, self._max_message_length)
            raise RingBufferError(f"transmit refused (code {result})")


class BroadcastReceiver:
    """One reader's cursor over a broadcast buffer (Aeron's low-level API).

    Starts at the latest record already transmitted.  After
    :meth:`receive_next`, the record is at :attr:`offset` / :attr:`length` in
    :attr:`buffer` and may be overwritten while it is read: read it, then call
    :meth:`validate` and discard what was read if that returns False.  As in
    Aeron, the position of the *next* record comes from the current record's
    header, so after a failed validation it is not reliable either.
    :class:`CopyBroadcastReceiver` handles all of that; prefer it.
    """

    __slots__ = ("_buffer", "_address", "_capacity", "_state")

    def __init__(self, buffer: AtomicBuffer) -> None:
        self._capacity = check_capacity(buffer.capacity, TRAILER_LENGTH)
        check_alignment(buffer)
        self._buffer = buffer
        self._address = buffer.address
        # The cursor is private to this receiver; it lives in native memory so
        # the C receive loop updates it in place.
        self._state = ffi.new("fulmar_broadcast_receiver_t *")
        lib.fulmar_broadcast_receiver_init(self._state, self._address, self._capacity)

    @property
    def buffer(self) -> AtomicBuffer:
        return self._buffer

    @property
    def capacity(self) -> int:
        return self._capacity

    def has_news(self) -> bool:
        """Whether the transmitter has published past this receiver's cursor:
        one load, for an agent's check before it sleeps."""
        tail = self._buffer.get_int64_volatile(self._capacity + TAIL_COUNTER_OFFSET)
        return bool(tail > self._state.next_record)

    @property
    def lapped_count(self) -> int:
        """How many times the transmitter overran this receiver."""
        return int(self._state.lapped_count)

    def receive_next(self) -> bool:
        """Advance to the next record; False if nothing new was transmitted."""
        return bool(lib.fulmar_broadcast_receive_next(self._state, self._address, self._capacity))

    @property
    def type_id(self) -> int:
        return self._buffer.get_int32(int(self._state.record_offset) + 4)

    @property
    def offset(self) -> int:
        """Offset of the current record's body in :attr:`buffer`."""
        return int(self._state.record_offset) + RECORD_HEADER_LENGTH

    @property
    def length(self) -> int:
        return self._buffer.get_int32(int(self._state.record_offset)) - RECORD_HEADER_LENGTH

    def validate(self) -> bool:
        """True if the current record was intact when this was called."""
        return bool(lib.fulmar_broadcast_validate(self._state, self._address, self._capacity))


class CopyBroadcastReceiver:
    """Receives whole, validated messages: copy out, check, then deliver.

    Aeron's copy receiver delivers one message per ``receive``; ``limit``
    lets a caller take a batch in one native call (all copied into the
    scratch buffer and validated before the first handler call).
    """

    __slots__ = (
        "_receiver",
        "_scratch",
        "_scratch_view",
        "_scratch_length",
        "_records",
        "_records_view",
        "_next",
        "_count",
    )

    def __init__(
        self, receiver: BroadcastReceiver, scratch_length: int = SCRATCH_BUFFER_LENGTH, max_batch: int = 64
    ) -> None:
        if scratch_length <= 0 or max_batch <= 0:
            raise ValueError("scratch_length and max_batch must be positive")
        self._receiver = receiver
        self._scratch_length = scratch_length
        self._scratch = ffi.new("char[]", scratch_length)
        self._scratch_view = memoryview(ffi.buffer(self._scratch)).cast("B")
        self._records = ffi.new("int32_t[]", 3 * max_batch)
        self._records_view = memoryview(ffi.buffer(self._records)).cast("i")
        self._next = ffi.new("int64_t[]", max_batch)
        self._count = ffi.new("int32_t *")

    @property
    def receiver(self) -> BroadcastReceiver:
        return self._receiver

    def receive(self, handler: MessageHandler, limit: int = 1) -> int:
        """Deliver up to ``limit`` messages; returns how many were delivered.

        Raises :class:`UnableToKeepUpError` when the receiver was lapped: the
        overwritten messages are lost and the next call resumes at the latest
        message transmitted.  Raises :class:`ScratchBufferTooSmallError` for a
        message longer than the scratch buffer (that message is skipped).
        Messages validated before the problem are delivered first.  ``body`` views point into the scratch buffer and are
        only valid during the handler call.  If the handler raises, the
        messages after the one it raised on are received again next time.
        """
        receiver = self._receiver
        limit = min(limit, len(self._next))
        result = lib.fulmar_broadcast_copy_receive(
            receiver._state,
            receiver._address,
            receiver._capacity,
            self._scratch,
            self._scratch_length,
            limit,
            self._records,
            self._next,
            self._count,
        )
        count = int(self._count[0])
        if count:
            meta = self._records_view[: 3 * count].tolist()
            scratch = self._scratch_view
            i = 0
            try:
                for i in range(0, 3 * count, 3):
                    offset = meta[i + 1]
                    handler(meta[i], scratch[offset : offset + meta[i + 2]])
            except BaseException:
                # Resume right after the message the handler failed on.
                receiver._state.next_record = self._next[i // 3]
                raise

        if result != _RECEIVE_OK:
            if result == _RECEIVE_LAPPED:
                raise UnableToKeepUpError(
                    f"unable to keep up with broadcast buffer (lapped {receiver.lapped_count} times)"
                )
            if result == _RECEIVE_TOO_LONG:
                raise ScratchBufferTooSmallError(
                    f"a message does not fit the {self._scratch_length}-byte scratch buffer"
                )
            raise CorruptBufferError(f"broadcast buffer holds an impossible record (code {result})")
        return count
