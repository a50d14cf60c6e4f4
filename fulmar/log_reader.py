"""Reading a log buffer: the read side of images.

``LogReader`` follows one log from a position.  Each poll is one native scan
that returns a batch of fragments (their offsets, lengths and flags); Python
then calls the handler once per fragment with ``(buffer, offset, length,
header)`` over the mapped log itself: no copy, no per-fragment allocation.
``scan`` hands the whole batch to the caller instead, for code that
processes fragments in bulk.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from fulmar._native import ffi, lib
from fulmar.buffers import AtomicBuffer
from fulmar.errors import CorruptFrameError
from fulmar.frames import DATA_HEADER, FRAME_ALIGNMENT, HEADER_LENGTH, DataHeader
from fulmar.logbuffer import (
    LogBuffers,
    compute_position,
)

_CORRUPT = int(lib.FULMAR_SCAN_CORRUPT_FRAME)
_INT64_MAX = (1 << 63) - 1
BATCH_CAPACITY = int(lib.FULMAR_BATCH_CAPACITY)
_INT32 = struct.Struct("<i")
# frame length @0, term offset @8, term id @20: what a fragment's position needs.
_POSITION_FIELDS = struct.Struct("<i4xi8xi")
_ALIGN_MASK = ~(FRAME_ALIGNMENT - 1)


class Header:
    """The header of the fragment being handled, read from the log in place.

    One instance is reused for every fragment of a poll: copy what you need
    (or call :meth:`snapshot`) rather than keeping the object.
    """

    __slots__ = ("_view", "offset", "_initial_term_id", "_bits")

    def __init__(self, log: LogBuffers) -> None:
        self._view = log.view
        self.offset = 0
        self._initial_term_id = log.initial_term_id
        self._bits = log.position_bits_to_shift

    def snapshot(self) -> DataHeader:
        return DataHeader(*DATA_HEADER.unpack_from(self._view, self.offset))

    def _int32(self, field_offset: int) -> int:
        return int(_INT32.unpack_from(self._view, self.offset + field_offset)[0])

    @property
    def frame_length(self) -> int:
        return self._int32(0)

    @property
    def flags(self) -> int:
        return int(self._view[self.offset + 5])

    @property
    def type(self) -> int:
        return int.from_bytes(self._view[self.offset + 6 : self.offset + 8], "little", signed=True)

    @property
    def term_offset(self) -> int:
        return self._int32(8)

    @property
    def session_id(self) -> int:
        return self._int32(12)

    @property
    def stream_id(self) -> int:
        return self._int32(16)

    @property
    def term_id(self) -> int:
        return self._int32(20)

    @property
    def term_length(self) -> int:
        """The term length of the image the fragment is in."""
        return 1 << self._bits

    @property
    def reserved_value(self) -> int:
        return int.from_bytes(self._view[self.offset + 24 : self.offset + 32], "little", signed=True)

    @property
    def position(self) -> int:
        """The stream position just after this fragment (Aeron's meaning)."""
        # Read per message by services (the log position of each): one unpack.
        frame_length, term_offset, term_id = _POSITION_FIELDS.unpack_from(self._view, self.offset)
        aligned = (frame_length + FRAME_ALIGNMENT - 1) & _ALIGN_MASK
        return compute_position(term_id, term_offset + aligned, self._bits, self._initial_term_id)


FragmentHandler = Callable[[memoryview, int, int, Header], None]

SESSION_HEADER_LENGTH = int(lib.FULMAR_SESSION_HEADER_LENGTH)


class SessionMessages:
    """A run of whole cluster client messages in a row, as parallel lists
    (``LogReader.bounded_poll_session_runs``): each message's leadership
    term id, cluster session id and timestamp from its session header, the
    stream position after its frame, and where the message (session header
    first, ``SESSION_HEADER_LENGTH`` bytes, then the application's) lies in
    ``view``.  One per reader, refilled for every run: keep none of it."""

    __slots__ = (
        "view",
        "found",
        "count",
        "leadership_term_ids",
        "session_ids",
        "timestamps",
        "end_positions",
        "message_offsets",
        "message_lengths",
    )

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.found = ffi.new("fulmar_session_messages_t *")
        self.count = 0
        self.leadership_term_ids: list[int] = []
        self.session_ids: list[int] = []
        self.timestamps: list[int] = []
        self.end_positions: list[int] = []
        self.message_offsets: list[int] = []
        self.message_lengths: list[int] = []

    def unpack(self, count: int) -> None:
        found = self.found
        self.count = count
        self.leadership_term_ids = ffi.unpack(found.leadership_term_ids, count)
        self.session_ids = ffi.unpack(found.session_ids, count)
        self.timestamps = ffi.unpack(found.timestamps, count)
        self.end_positions = ffi.unpack(found.end_positions, count)
        self.message_offsets = ffi.unpack(found.message_offsets, count)
        self.message_lengths = ffi.unpack(found.message_lengths, count)


SessionMessagesHandler = Callable[[SessionMessages], None]


class FragmentBatch:
    """The fragments one scan found: parallel lists of frame offsets (from the
    start of the log file), frame lengths (header included) and flags."""

    __slots__ = ("count", "frame_offsets", "frame_lengths", "flags", "next_position")

    def __init__(self) -> None:
        self.count = 0
        self.frame_offsets: list[int] = []
        self.frame_lengths: list[int] = []
        self.flags: list[int] = []
        self.next_position = 0


class LogReader:
    """Reads one log buffer from a position, publishing its position.

    ``position_counter`` (an ``AtomicBuffer`` and offset) receives the
    reader's position after every poll with a release store, so the writer
    side can compute its flow-control limit from it.
    """

    def __init__(
        self,
        log: LogBuffers,
        position: int = 0,
        position_counter: AtomicBuffer | None = None,
        position_counter_offset: int = 0,
    ) -> None:
        self.log = log
        self.view = log.view
        self._address = log.address
        self._term_length = log.term_length
        self._initial_term_id = log.initial_term_id
        self._batch = ffi.new("fulmar_fragment_batch_t *")
        self._header = Header(log)
        self._session_messages: SessionMessages | None = None  # made by the first bounded_poll_session_runs
        self._counter = position_counter
        self._counter_offset = position_counter_offset
        self._position = 0
        self.position = position

    @property
    def position(self) -> int:
        return self._position

    @position.setter
    def position(self, position: int) -> None:
        if position < 0 or position & (FRAME_ALIGNMENT - 1):
            raise ValueError(f"position {position} is not a frame-aligned stream position")
        self._set_position(position)

    def adopt_position(self, position: int) -> None:
        """Another reader of this log (the archive's recorder thread) moved the
        position and published it: take it as ours without publishing it again
        (a store of an older value would move the counter back)."""
        self._position = position

    def _set_position(self, position: int) -> None:
        self._position = position
        if self._counter is not None:
            self._counter.put_int64_ordered(self._counter_offset, position)

    def _scan(self, fragment_limit: int, limit_position: int) -> int:
        count = int(
            lib.fulmar_log_scan(
                self._address,
                self._term_length,
                self._initial_term_id,
                self._position,
                limit_position,
                fragment_limit,
                self._batch,
            )
        )
        if count == _CORRUPT:
            position = self._position
            term_offset = position & (self._term_length - 1)
            raise CorruptFrameError(
                f"{self.log.path}: corrupt frame header at position {position} (term offset {term_offset})"
            )
        return count

    def poll(self, handler: FragmentHandler, fragment_limit: int = 10) -> int:
        """Deliver up to ``fragment_limit`` fragments to ``handler``."""
        return self.bounded_poll(handler, _INT64_MAX, fragment_limit)

    def bounded_poll(self, handler: FragmentHandler, limit_position: int, fragment_limit: int = 10) -> int:
        """Like :meth:`poll`, never reading a frame that ends past ``limit_position``."""
        count = self._scan(fragment_limit, limit_position)
        batch = self._batch
        next_position = int(batch.next_position)
        if count:
            header = self._header
            view = self.view
            offsets = ffi.unpack(batch.frame_offsets, count)
            lengths = ffi.unpack(batch.frame_lengths, count)
            for i in range(count):
                offset = offsets[i]
                header.offset = offset
                try:
                    handler(view, offset + HEADER_LENGTH, lengths[i] - HEADER_LENGTH, header)
                except BaseException:
                    self._consume_through(offset, lengths[i])
                    raise
        if next_position != self._position:
            self._set_position(next_position)
        return count

    def bounded_poll_session_runs(
        self,
        handler: FragmentHandler,
        on_session_messages: SessionMessagesHandler,
        limit_position: int,
        fragment_limit: int = 10,
    ) -> int:
        """Like :meth:`bounded_poll`, but each run of whole cluster client
        messages in a row (``fulmar_batch_session_messages``) goes to
        ``on_session_messages`` in one call, in log order, as one
        :class:`SessionMessages`; every other fragment goes to ``handler``."""
        start_position = self._position
        count = self._scan(fragment_limit, limit_position)
        batch = self._batch
        next_position = int(batch.next_position)
        if count:
            messages = self._session_messages
            if messages is None:
                messages = self._session_messages = SessionMessages(self.view)
            found = messages.found
            header = self._header
            view = self.view
            address = self._address
            term_length = self._term_length
            frame_offsets = batch.frame_offsets
            frame_lengths = batch.frame_lengths
            i = 0
            while i < count:
                run = int(lib.fulmar_batch_session_messages(address, batch, i, start_position, term_length, found))
                last = i + run - 1 if run else i
                try:
                    if run:
                        messages.unpack(run)
                        on_session_messages(messages)
                    else:
                        offset = frame_offsets[i]
                        header.offset = offset
                        handler(view, offset + HEADER_LENGTH, frame_lengths[i] - HEADER_LENGTH, header)
                except BaseException:
                    self._consume_through(frame_offsets[last], frame_lengths[last])
                    raise
                i = last + 1
        if next_position != self._position:
            self._set_position(next_position)
        return count

    def _consume_through(self, frame_offset: int, frame_length: int) -> None:
        """A handler failed on the frame at ``frame_offset``: as in Aeron, the
        fragments handled so far and the failed ones are consumed; the rest are not."""
        end = frame_offset + ((frame_length + FRAME_ALIGNMENT - 1) & ~(FRAME_ALIGNMENT - 1))
        self._set_position(self._position_of(end))

    def _position_of(self, end_offset: int) -> int:
        """Position of an offset (from the log's start) within the term being read."""
        term_start = self._position - (self._position & (self._term_length - 1))
        return term_start + end_offset - (self._position_index() * self._term_length)

    def _position_index(self) -> int:
        return (self._position >> self.log.position_bits_to_shift) % 3

    def is_data_available(self) -> bool:
        """Whether a frame is complete at the read position: one atomic load,
        cheap enough for an idle strategy's last check before sleeping."""
        position = self._position
        term_length = self._term_length
        offset = (position >> self.log.position_bits_to_shift) % 3 * term_length + (position & (term_length - 1))
        return bool(self.log.log.get_int32_volatile(offset) > 0)

    @property
    def header(self) -> Header:
        """The flyweight handed to handlers (for callers that dispatch a batch themselves)."""
        return self._header

    def peek(self, fragment_limit: int = BATCH_CAPACITY, limit_position: int = _INT64_MAX) -> FragmentBatch:
        """The next batch of fragments, without consuming them."""
        count = self._scan(fragment_limit, limit_position)
        batch = self._batch
        result = FragmentBatch()
        result.count = count
        if count:
            result.frame_offsets = ffi.unpack(batch.frame_offsets, count)
            result.frame_lengths = ffi.unpack(batch.frame_lengths, count)
            result.flags = list(ffi.unpack(ffi.cast("uint8_t *", batch.flags), count))
        result.next_position = int(batch.next_position)
        return result

    def scan(self, fragment_limit: int = BATCH_CAPACITY, limit_position: int = _INT64_MAX) -> FragmentBatch:
        """Consume up to ``fragment_limit`` fragments and return them as one batch."""
        result = self.peek(fragment_limit, limit_position)
        if result.next_position != self._position:
            self._set_position(result.next_position)
        return result
