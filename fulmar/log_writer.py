"""Appending to a log buffer: the write side of publications.

``ConcurrentLogWriter`` lets any number of writers, in any processes, append
to one log (Aeron's concurrent publication: space is claimed with an atomic
get-and-add on the term's tail).  ``ExclusiveLogWriter`` is for a single
writer that keeps its own tail (Aeron's exclusive publication), and adds a
batch append.  Each append is one native call; the results are Aeron's
publication codes.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from fulmar._native import ffi, lib
from fulmar.buffers import AtomicBuffer
from fulmar.errors import InvalidFrameBlockError, MessageTooLongError
from fulmar.frames import HEADER_LENGTH
from fulmar.idle import Doorbell
from fulmar.logbuffer import LogBuffers

NOT_CONNECTED = int(lib.FULMAR_NOT_CONNECTED)
BACK_PRESSURED = int(lib.FULMAR_BACK_PRESSURED)
ADMIN_ACTION = int(lib.FULMAR_ADMIN_ACTION)
CLOSED = int(lib.FULMAR_CLOSED)
MAX_POSITION_EXCEEDED = int(lib.FULMAR_MAX_POSITION_EXCEEDED)
_MESSAGE_TOO_LONG = int(lib.FULMAR_MESSAGE_TOO_LONG)
_INVALID_LENGTH = int(lib.FULMAR_INVALID_LENGTH)
_INVALID_BLOCK = int(lib.FULMAR_INVALID_BLOCK)

RESULT_NAMES = {
    NOT_CONNECTED: "NOT_CONNECTED",
    BACK_PRESSURED: "BACK_PRESSURED",
    ADMIN_ACTION: "ADMIN_ACTION",
    CLOSED: "CLOSED",
    MAX_POSITION_EXCEEDED: "MAX_POSITION_EXCEEDED",
}


def _address(doorbell: Doorbell | None) -> object:
    return doorbell.buffer.address + doorbell.offset if doorbell is not None else ffi.NULL


# Rings for a writer's deferred appends (Publication.defer_rings); 1 if it had any.
ring_log_writer = lib.fulmar_log_writer_ring


class BufferClaim:
    """Space claimed in the log for one frame, written in place.

    Write the payload into :attr:`buffer` and then :meth:`commit` (publish
    it) or :meth:`abort` (turn it into padding that readers skip).
    """

    __slots__ = ("_log", "_claim", "_writer", "buffer", "position")

    def __init__(self, log: LogBuffers) -> None:
        self._log = log
        self._claim = ffi.new("fulmar_claim_t *")
        self._writer = ffi.NULL  # set by the writer that made the claim: its commit rings what it rings
        self.buffer = memoryview(b"")
        self.position = 0

    def _wrap(self) -> None:
        start = self._claim.frame_offset + HEADER_LENGTH
        self.buffer = self._log.view[start : start + self._claim.frame_length - HEADER_LENGTH]
        self.position = int(self._claim.position)

    def commit(self) -> None:
        lib.fulmar_claim_commit(self._writer, self._claim)
        self.buffer = memoryview(b"")

    def abort(self) -> None:
        lib.fulmar_claim_abort(self._log.address, self._claim)
        self.buffer = memoryview(b"")


class _LogWriter:
    def __init__(
        self,
        log: LogBuffers,
        position_limit: AtomicBuffer | None = None,
        position_limit_offset: int = 0,
        doorbell: Doorbell | None = None,
        messages_counter: AtomicBuffer | None = None,
        messages_counter_offset: int = 0,
        readers: AtomicBuffer | None = None,
        relay_doorbell: Doorbell | None = None,
    ) -> None:
        self.log = log
        self._writer = ffi.new("fulmar_log_writer_t *")
        if position_limit is not None:
            if position_limit_offset % 8 or position_limit_offset + 8 > position_limit.capacity:
                raise ValueError(f"position limit offset {position_limit_offset} is not an aligned int64")
            limit_address = position_limit.address + position_limit_offset
        else:
            limit_address = ffi.NULL
        self._limit_owner = position_limit  # keeps the limit's mapping alive
        header = log.default_frame_header()
        lib.fulmar_log_writer_init(
            self._writer,
            log.address,
            log.term_length,
            log.mtu,
            log.initial_term_id,
            limit_address,
            header.session_id,
            header.stream_id,
        )
        # After each append: what sleeps on ``doorbell`` is woken (a media
        # driver's sender), and with ``readers`` (cnc.dat's counters values)
        # the doorbells the log's reader table names (fulmar.reader_doorbells),
        # and ``relay_doorbell`` when the table says the driver relays to more.
        self._doorbells = (doorbell, readers, relay_doorbell)  # keep their mappings alive
        self._writer.doorbell = _address(doorbell)
        if readers is not None:
            self._writer.counters_values = readers.address
            self._writer.counters_values_length = readers.capacity
        self._writer.relay_doorbell = _address(relay_doorbell)
        # A doorbell with a FIFO (the media driver's data plane, which sleeps in epoll) is rung through it.
        self._writer.doorbell_fd = doorbell.fd if doorbell is not None else -1
        self._writer.relay_doorbell_fd = relay_doorbell.fd if relay_doorbell is not None else -1
        # Messages appended are counted in shared memory when a counter is given.
        self._messages_owner = messages_counter
        if messages_counter is not None:
            if messages_counter_offset % 8 or messages_counter_offset + 8 > messages_counter.capacity:
                raise ValueError(f"messages counter offset {messages_counter_offset} is not an aligned int64")
            self._writer.messages_counter = messages_counter.address + messages_counter_offset
        self.max_message_length = log.max_message_length
        self.max_payload_length = log.max_payload_length

    def _result(self, result: int, length: int) -> int:
        if result == _MESSAGE_TOO_LONG:
            raise MessageTooLongError(
                f"message of {length} bytes exceeds the max message length {self.max_message_length}"
            )
        if result == _INVALID_LENGTH:
            raise ValueError(f"invalid message length {length}")
        return result

    def _claim_result(self, result: int, length: int) -> int:
        if result == _MESSAGE_TOO_LONG:
            raise MessageTooLongError(
                f"claim of {length} bytes exceeds the max payload length {self.max_payload_length}"
            )
        return self._result(result, length)

    @property
    def native_state(self) -> object:
        """The native writer state, for callers that append with ``native_offer`` directly."""
        return self._writer

    @property
    def position_limit(self) -> int:
        if self._writer.position_limit == ffi.NULL:
            return (1 << 63) - 1
        return int(lib.fulmar_get_int64_volatile(self._writer.position_limit, 0))


class ConcurrentLogWriter(_LogWriter):
    """A writer that may share the log with other writers in any process."""

    native_offer = lib.fulmar_concurrent_offer

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        """Append one message; returns the new position, or a negative code
        (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION, MAX_POSITION_EXCEEDED)."""
        if type(payload) is not bytes:
            payload = ffi.from_buffer(payload)
        length = len(payload)
        result = lib.fulmar_concurrent_offer(self._writer, payload, length, reserved_value)
        return result if result > _MESSAGE_TOO_LONG else self._result(result, length)

    def try_claim(self, length: int, claim: BufferClaim) -> int:
        result = lib.fulmar_concurrent_claim(self._writer, length, claim._claim)
        if result > 0:
            claim._writer = self._writer
            claim._wrap()
            return int(result)
        return self._claim_result(result, length)

    @property
    def position(self) -> int:
        return self.log.producer_position()


class ExclusiveLogWriter(_LogWriter):
    """The log's only writer: cheaper appends and batches in one call."""

    native_offer = lib.fulmar_exclusive_offer

    def offer(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        if type(payload) is not bytes:
            payload = ffi.from_buffer(payload)
        length = len(payload)
        result = lib.fulmar_exclusive_offer(self._writer, payload, length, reserved_value)
        return result if result > _MESSAGE_TOO_LONG else self._result(result, length)

    def offer_batch(self, payloads: Sequence[bytes], reserved_value: int = 0) -> tuple[int, int]:
        """Append messages in order, each its own frame, in one native call.

        Returns ``(appended, result)``: how many were appended (a prefix of
        ``payloads``) and the new position, or the code that stopped the
        batch when none were.
        """
        lengths = array("i", map(len, payloads))
        return self.offer_block(b"".join(payloads), lengths, reserved_value)

    def offer_block(self, data: bytes, lengths: array, reserved_value: int = 0) -> tuple[int, int]:
        """Like :meth:`offer_batch` for messages already laid end to end in
        ``data`` with their lengths in ``lengths`` (an ``array('i')``)."""
        appended = ffi.new("int32_t *")
        count = len(lengths)
        result = lib.fulmar_exclusive_offer_batch(
            self._writer, data, ffi.from_buffer("int32_t[]", lengths), count, reserved_value, appended
        )
        done = int(appended[0])
        if done < count and result in (_MESSAGE_TOO_LONG, _INVALID_LENGTH):
            self._result(result, lengths[done])
        return done, int(result)

    def offer_frames(self, block: bytes | bytearray | memoryview) -> int:
        """Append whole frames laid out as in a term (an archive replays a
        recording this way): see ``ExclusivePublication.offer_frames``."""
        data = block if type(block) is bytes else ffi.from_buffer(block)
        length = len(block)
        result = int(lib.fulmar_exclusive_append_block(self._writer, data, length))
        if result == _INVALID_BLOCK:
            raise InvalidFrameBlockError(
                f"a block of {length} bytes at position {self.position} is not whole frames for this term "
                "(each frame's term offset and term id must match where it lands, within one term)"
            )
        return result

    def try_claim(self, length: int, claim: BufferClaim) -> int:
        result = lib.fulmar_exclusive_claim(self._writer, length, claim._claim)
        if result > 0:
            claim._writer = self._writer
            claim._wrap()
            return int(result)
        return self._claim_result(result, length)

    @property
    def position(self) -> int:
        return int(self._writer.term_begin_position + self._writer.term_offset)
