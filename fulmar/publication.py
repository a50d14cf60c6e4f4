"""Client publications over a driver-managed log buffer.

``Publication`` may be shared by several threads, processes and clients
adding the same channel and stream (Aeron's concurrent publication);
``ExclusivePublication`` has one writer and adds batches.  ``offer`` returns
the new stream position, or one of the named negative codes.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fulmar.buffers import AtomicBuffer
from fulmar.counters import counter_offset
from fulmar.idle import Doorbell
from fulmar.log_writer import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    BufferClaim,
    ConcurrentLogWriter,
    ExclusiveLogWriter,
)
from fulmar.logbuffer import LogBuffers

if TYPE_CHECKING:
    from fulmar.aeron import ClientConductor

# Codes at or below this (message too long, invalid length) raise instead.
_FIRST_ERROR_CODE = -6

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "BufferClaim",
    "ExclusivePublication",
    "Publication",
]


class Publication:
    """A concurrent publication: safe to offer from several threads or processes."""

    _writer: ConcurrentLogWriter | ExclusiveLogWriter

    def __init__(
        self,
        conductor: ClientConductor,
        channel: str,
        stream_id: int,
        session_id: int,
        registration_id: int,
        original_registration_id: int,
        log: LogBuffers,
        counters_values: AtomicBuffer,
        position_limit_id: int,
        back_pressure_counter_id: int | None,
        doorbell: Doorbell | None,
        messages_counter_id: int | None = None,
        relay_doorbell: Doorbell | None = None,
    ) -> None:
        self._conductor = conductor
        self.channel = channel
        self.stream_id = stream_id
        self.session_id = session_id
        self.registration_id = registration_id
        self.original_registration_id = original_registration_id
        self.log = log
        self.position_limit_id = position_limit_id
        self._values = counters_values
        self._bpe_offset = counter_offset(back_pressure_counter_id) if back_pressure_counter_id is not None else -1
        self._closed = False
        self._messages_offset = counter_offset(messages_counter_id) if messages_counter_id is not None else None
        # Each append rings ``doorbell`` (a UDP publication's: the driver's, whose
        # sender sends it) and the log's readers (fulmar.reader_doorbells);
        # ``relay_doorbell`` (the driver's) when they are more than the log's table holds.
        self._writer = self._make_writer(
            log, counters_values, counter_offset(position_limit_id), doorbell, relay_doorbell
        )
        self._offer = self._writer.offer
        self._native_offer = self._writer.native_offer
        self._native_state = self._writer.native_state

    def _make_writer(
        self,
        log: LogBuffers,
        values: AtomicBuffer,
        limit_offset: int,
        doorbell: Doorbell | None,
        relay_doorbell: Doorbell | None,
    ) -> ConcurrentLogWriter | ExclusiveLogWriter:
        return ConcurrentLogWriter(
            log,
            values,
            limit_offset,
            doorbell,
            *self._messages_counter(values),
            readers=values,
            relay_doorbell=relay_doorbell,
        )

    def _messages_counter(self, values: AtomicBuffer) -> tuple[AtomicBuffer | None, int]:
        return (values, self._messages_offset) if self._messages_offset is not None else (None, 0)

    # ------------------------------------------------------------------ sending

    def offer(
        self,
        buffer: bytes | bytearray | memoryview,
        offset: int = 0,
        length: int | None = None,
        reserved_value: int = 0,
    ) -> int:
        """Append one message (``buffer[offset:offset+length]``).

        Returns the new position, or NOT_CONNECTED, BACK_PRESSURED,
        ADMIN_ACTION (retry now), CLOSED, MAX_POSITION_EXCEEDED.
        """
        if self._closed:
            return CLOSED
        if type(buffer) is bytes and not offset and length is None:
            # The hot path: one native call, no intermediate Python layers.
            result = self._native_offer(self._native_state, buffer, len(buffer), reserved_value)
            if result > _FIRST_ERROR_CODE:
                if result == BACK_PRESSURED and self._bpe_offset >= 0:
                    self._values.get_and_add_int64(self._bpe_offset, 1)
                return int(result)
        if offset or length is not None:
            buffer = memoryview(buffer)[offset : offset + (len(buffer) - offset if length is None else length)]
        result = self._offer(buffer, reserved_value)  # raises for a bad length
        if result == BACK_PRESSURED and self._bpe_offset >= 0:
            self._values.get_and_add_int64(self._bpe_offset, 1)
        return result

    def offer_parts(self, parts: Sequence[bytes | bytearray | memoryview], reserved_value: int = 0) -> int:
        """Append one message made of several parts (gathered into one frame)."""
        return self.offer(b"".join(parts), reserved_value=reserved_value)

    def try_claim(self, length: int, claim: BufferClaim) -> int:
        """Claim space for a message of ``length`` bytes (at most one MTU's
        payload) to write in place; then ``claim.commit()`` or ``claim.abort()``."""
        if self._closed:
            return CLOSED
        result = self._writer.try_claim(length, claim)
        if result == BACK_PRESSURED and self._bpe_offset >= 0:
            self._values.get_and_add_int64(self._bpe_offset, 1)
        return result

    def add_destination(self, channel: str) -> None:
        """Add an endpoint to a ``control-mode=manual`` UDP publication
        (multi-destination-cast), e.g. ``aeron:udp?endpoint=host:port``."""
        self._conductor.add_destination(self, channel)

    def remove_destination(self, channel: str) -> None:
        self._conductor.remove_destination(self, channel)

    # ------------------------------------------------------------------ state

    @property
    def position(self) -> int:
        return CLOSED if self._closed else self._writer.position

    @property
    def position_limit(self) -> int:
        return CLOSED if self._closed else self._writer.position_limit

    @property
    def native_writer(self) -> Any:
        """The native writer state (``fulmar_log_writer_t *``), for a native
        thread that appends to this publication's log: with a copy of it for
        a concurrent publication (other writers may share that kind); this
        one itself for an exclusive publication, and then only while its
        owner appends nothing (the leader's ingress thread, armed while its
        agent sleeps)."""
        return self._native_state

    @property
    def max_message_length(self) -> int:
        return self.log.max_message_length

    @property
    def max_payload_length(self) -> int:
        return self.log.max_payload_length

    @property
    def term_buffer_length(self) -> int:
        return self.log.term_length

    @property
    def initial_term_id(self) -> int:
        return self.log.initial_term_id

    @property
    def is_connected(self) -> bool:
        return not self._closed and self.log.is_connected

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Tell the driver this publisher is done (the stream ends once every
        publisher of it has closed)."""
        if not self._closed:
            self._conductor.release_publication(self)

    def _mark_closed(self) -> None:
        self._closed = True

    def defer_rings(self) -> None:
        """From now on an append wakes nobody until the client's
        ``ring_deferred()``: for an agent that appends a batch per duty cycle
        and rings once at its end, so that its readers (the driver's sender,
        the log's subscribers) wake once per batch rather than once per
        message.  The owner must call ``Aeron.ring_deferred()`` after every
        cycle that may have appended (``Aeron.do_work`` does too)."""
        self._conductor.defer_rings_of(self.registration_id, self._native_state)

    def __enter__(self) -> Publication:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(channel={self.channel!r}, stream_id={self.stream_id}, "
            f"session_id={self.session_id}, registration_id={self.registration_id})"
        )


class ExclusivePublication(Publication):
    """A publication with a single writer: cheaper appends and batches."""

    _writer: ExclusiveLogWriter

    def _make_writer(
        self,
        log: LogBuffers,
        values: AtomicBuffer,
        limit_offset: int,
        doorbell: Doorbell | None,
        relay_doorbell: Doorbell | None,
    ) -> ExclusiveLogWriter:
        return ExclusiveLogWriter(
            log,
            values,
            limit_offset,
            doorbell,
            *self._messages_counter(values),
            readers=values,
            relay_doorbell=relay_doorbell,
        )

    def offer_block(self, data: bytes, lengths: array[int], reserved_value: int = 0) -> tuple[int, int]:
        """Like :meth:`offer_batch` for messages already laid end to end in
        ``data``, their lengths in an ``array('i')``: no joining per call."""
        if self._closed:
            return 0, CLOSED
        appended, result = self._writer.offer_block(data, lengths, reserved_value)
        if appended < len(lengths) and self._bpe_offset >= 0:
            self._values.get_and_add_int64(self._bpe_offset, 1)
        return appended, result

    def offer_frames(self, block: bytes | bytearray | memoryview) -> int:
        """Append frames that are already laid out as in a term (Aeron's
        ``offerBlock``; the archive replays recordings this way).

        The block must start at this publication's position and hold whole
        frames (data or padding) whose term offsets and term ids are those of
        the positions they land at, all within one term; their session and
        stream ids are replaced by this publication's.  Returns the new
        position, or BACK_PRESSURED / NOT_CONNECTED / ADMIN_ACTION (moved to
        the next term: offer again) / CLOSED.  Raises InvalidFrameBlockError
        for a block that is not such frames.
        """
        if self._closed:
            return CLOSED
        result = self._writer.offer_frames(block)
        if result == BACK_PRESSURED and self._bpe_offset >= 0:
            self._values.get_and_add_int64(self._bpe_offset, 1)
        return result

    def offer_batch(self, payloads: Sequence[bytes], reserved_value: int = 0) -> tuple[int, int]:
        """Append messages in order, each its own frame, in one native call.

        Returns ``(appended, result)``: how many were appended (a prefix) and
        the new position, or the code that stopped the batch when none were.
        """
        return self.offer_block(b"".join(payloads), array("i", map(len, payloads)), reserved_value)
