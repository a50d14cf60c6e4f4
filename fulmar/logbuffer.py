"""Log buffers: Aeron's three-term partitioned log in one mapped file.

The file holds three term partitions followed by a 4 KiB metadata section
(tail counters, active term count, end-of-stream position, connection state,
the default frame header, MTU, term length, page size...).  Offsets follow
Aeron's ``LogBufferDescriptor`` so Aeron's own clients can map our files.

Position arithmetic: a stream position is
``(term_id - initial_term_id) << log2(term_length) | term_offset``, computed
modulo 2**32 on term ids so a stream whose term id wraps past 2**31 - 1
keeps counting forwards.
"""

from __future__ import annotations

import os
from pathlib import Path

from fulmar._native import lib
from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.errors import InvalidLogBufferError
from fulmar.frames import DATA_HEADER, FRAME_ALIGNMENT, HEADER_LENGTH, UNFRAGMENTED, DataHeader, FrameType, align

PARTITION_COUNT = 3
LOG_META_DATA_LENGTH = 4096
TERM_MIN_LENGTH = 64 * 1024
TERM_MAX_LENGTH = 1024 * 1024 * 1024
PAGE_MIN_SIZE = 4096
PAGE_MAX_SIZE = 1024 * 1024 * 1024
MAX_UDP_PAYLOAD_LENGTH = 65504
DEFAULT_MTU = 1408
MAX_MESSAGE_LENGTH_CAP = 16 * 1024 * 1024

# Metadata offsets, relative to the start of the metadata section.
TERM_TAIL_COUNTERS_OFFSET = 0
ACTIVE_TERM_COUNT_OFFSET = 24
END_OF_STREAM_POSITION_OFFSET = 128
IS_CONNECTED_OFFSET = 136
ACTIVE_TRANSPORT_COUNT_OFFSET = 140
CORRELATION_ID_OFFSET = 256
INITIAL_TERM_ID_OFFSET = 264
DEFAULT_FRAME_HEADER_LENGTH_OFFSET = 268
MTU_LENGTH_OFFSET = 272
TERM_LENGTH_OFFSET = 276
PAGE_SIZE_OFFSET = 280
PUBLICATION_WINDOW_LENGTH_OFFSET = 284
RECEIVER_WINDOW_LENGTH_OFFSET = 288
SOCKET_SNDBUF_LENGTH_OFFSET = 292
OS_DEFAULT_SOCKET_SNDBUF_LENGTH_OFFSET = 296
OS_MAX_SOCKET_SNDBUF_LENGTH_OFFSET = 300
SOCKET_RCVBUF_LENGTH_OFFSET = 304
OS_DEFAULT_SOCKET_RCVBUF_LENGTH_OFFSET = 308
OS_MAX_SOCKET_RCVBUF_LENGTH_OFFSET = 312
DEFAULT_FRAME_HEADER_OFFSET = 320
ENTITY_TAG_OFFSET = 448
RESPONSE_CORRELATION_ID_OFFSET = 456
LINGER_TIMEOUT_NS_OFFSET = 464

_INT64_MAX = (1 << 63) - 1


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def check_term_length(term_length: int) -> None:
    if not (TERM_MIN_LENGTH <= term_length <= TERM_MAX_LENGTH) or not _is_power_of_two(term_length):
        raise InvalidLogBufferError(
            f"term length {term_length} must be a power of two from {TERM_MIN_LENGTH} (64 KiB) "
            f"to {TERM_MAX_LENGTH} (1 GiB)"
        )


def check_page_size(page_size: int) -> None:
    if not (PAGE_MIN_SIZE <= page_size <= PAGE_MAX_SIZE) or not _is_power_of_two(page_size):
        raise InvalidLogBufferError(
            f"page size {page_size} must be a power of two from {PAGE_MIN_SIZE} to {PAGE_MAX_SIZE}"
        )


def check_mtu(mtu: int, term_length: int) -> None:
    if mtu < HEADER_LENGTH + FRAME_ALIGNMENT or mtu > MAX_UDP_PAYLOAD_LENGTH or mtu % FRAME_ALIGNMENT:
        raise InvalidLogBufferError(
            f"MTU {mtu} must be a multiple of {FRAME_ALIGNMENT} from {HEADER_LENGTH + FRAME_ALIGNMENT} "
            f"to {MAX_UDP_PAYLOAD_LENGTH}"
        )
    if mtu > term_length:
        raise InvalidLogBufferError(f"MTU {mtu} is larger than the term length {term_length}")


def compute_log_length(term_length: int, page_size: int = PAGE_MIN_SIZE) -> int:
    return align(PARTITION_COUNT * term_length + LOG_META_DATA_LENGTH, page_size)


def compute_max_message_length(term_length: int) -> int:
    return min(term_length // 8, MAX_MESSAGE_LENGTH_CAP)


def position_bits_to_shift(term_length: int) -> int:
    check_term_length(term_length)
    return term_length.bit_length() - 1


def to_int32(value: int) -> int:
    """Wrap an integer to a signed 32-bit value, as Java's ``(int)`` cast does."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def compute_term_count(term_id: int, initial_term_id: int) -> int:
    return to_int32(term_id - initial_term_id)


def compute_term_begin_position(term_id: int, bits_to_shift: int, initial_term_id: int) -> int:
    return compute_term_count(term_id, initial_term_id) << bits_to_shift


def compute_position(term_id: int, term_offset: int, bits_to_shift: int, initial_term_id: int) -> int:
    return compute_term_begin_position(term_id, bits_to_shift, initial_term_id) + term_offset


def compute_term_id_from_position(position: int, bits_to_shift: int, initial_term_id: int) -> int:
    return to_int32((position >> bits_to_shift) + initial_term_id)


def compute_term_offset_from_position(position: int, bits_to_shift: int) -> int:
    return position & ((1 << bits_to_shift) - 1)


def index_by_term_count(term_count: int) -> int:
    return term_count % PARTITION_COUNT


def index_by_term(initial_term_id: int, active_term_id: int) -> int:
    return compute_term_count(active_term_id, initial_term_id) % PARTITION_COUNT


def index_by_position(position: int, bits_to_shift: int) -> int:
    return (position >> bits_to_shift) % PARTITION_COUNT


def pack_tail(term_id: int, term_offset: int) -> int:
    raw = ((term_id & 0xFFFFFFFF) << 32) | (term_offset & 0xFFFFFFFF)
    return raw - (1 << 64) if raw >= 1 << 63 else raw


def tail_term_id(raw_tail: int) -> int:
    return to_int32(raw_tail >> 32)


def tail_term_offset(raw_tail: int, term_length: int) -> int:
    return min(raw_tail & 0xFFFFFFFF, term_length)


class LogBuffers:
    """A mapped log buffer file: the three terms and their metadata."""

    def __init__(self, mapped: MappedFile) -> None:
        self._mapped = mapped
        length = mapped.length
        if length < PARTITION_COUNT * TERM_MIN_LENGTH + LOG_META_DATA_LENGTH:
            raise InvalidLogBufferError(f"{mapped.path}: {length} bytes is too short for a log buffer")
        whole = mapped.buffer()
        # The metadata follows the three terms, but page alignment pads the
        # file, so the term length cannot be derived from the file length
        # alone: find the power of two whose metadata slot names itself.
        term_length = self._find_term_length(whole, length, mapped.path)
        self.term_length = term_length
        self.log = whole
        self.address = whole.address
        self.metadata = mapped.buffer(PARTITION_COUNT * term_length, LOG_META_DATA_LENGTH)
        self._metadata_address = self.metadata.address
        self.page_size = self.metadata.get_int32(PAGE_SIZE_OFFSET)
        check_page_size(self.page_size)
        if compute_log_length(term_length, self.page_size) != length:
            raise InvalidLogBufferError(
                f"{mapped.path}: file is {length} bytes but term length {term_length} and page size "
                f"{self.page_size} need {compute_log_length(term_length, self.page_size)}"
            )
        self.mtu = self.metadata.get_int32(MTU_LENGTH_OFFSET)
        check_mtu(self.mtu, term_length)
        self.initial_term_id = self.metadata.get_int32(INITIAL_TERM_ID_OFFSET)
        self.position_bits_to_shift = term_length.bit_length() - 1
        self.max_payload_length = self.mtu - HEADER_LENGTH
        self.max_message_length = compute_max_message_length(term_length)
        # How far the owner (the driver) has zeroed consumed bytes; see clean_to.
        self.clean_position = 0

    @staticmethod
    def _find_term_length(whole: AtomicBuffer, length: int, path: Path) -> int:
        term_length = TERM_MIN_LENGTH
        while term_length <= TERM_MAX_LENGTH and PARTITION_COUNT * term_length + LOG_META_DATA_LENGTH <= length:
            stored = whole.get_int32(PARTITION_COUNT * term_length + TERM_LENGTH_OFFSET)
            if stored == term_length:
                return term_length
            term_length *= 2
        raise InvalidLogBufferError(f"{path}: no valid term length found in the log buffer metadata")

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        term_length: int,
        *,
        mtu: int = DEFAULT_MTU,
        initial_term_id: int = 0,
        session_id: int = 0,
        stream_id: int = 0,
        correlation_id: int = 0,
        page_size: int = PAGE_MIN_SIZE,
        term_window_length: int = 0,
    ) -> LogBuffers:
        """Create a fresh log buffer file with its metadata initialised."""
        check_term_length(term_length)
        check_page_size(page_size)
        check_mtu(mtu, term_length)
        initial_term_id = to_int32(initial_term_id)
        mapped = MappedFile.create(path, compute_log_length(term_length, page_size))
        meta = mapped.buffer(PARTITION_COUNT * term_length, LOG_META_DATA_LENGTH)
        meta.put_int64(CORRELATION_ID_OFFSET, correlation_id)
        meta.put_int32(INITIAL_TERM_ID_OFFSET, initial_term_id)
        meta.put_int32(DEFAULT_FRAME_HEADER_LENGTH_OFFSET, HEADER_LENGTH)
        meta.put_int32(MTU_LENGTH_OFFSET, mtu)
        meta.put_int32(TERM_LENGTH_OFFSET, term_length)
        meta.put_int32(PAGE_SIZE_OFFSET, page_size)
        meta.put_int32(PUBLICATION_WINDOW_LENGTH_OFFSET, term_window_length)
        default_header = DataHeader(0, 0, UNFRAGMENTED, FrameType.DATA, 0, session_id, stream_id, initial_term_id)
        meta.put_bytes(DEFAULT_FRAME_HEADER_OFFSET, default_header.encode())
        # Partition 0 starts at the initial term; the other two hold the term
        # ids they would have had before it, so rotation's CAS finds them.
        meta.put_int64(TERM_TAIL_COUNTERS_OFFSET, pack_tail(initial_term_id, 0))
        for index in (1, 2):
            meta.put_int64(
                TERM_TAIL_COUNTERS_OFFSET + 8 * index, pack_tail(initial_term_id + index - PARTITION_COUNT, 0)
            )
        meta.put_int32_ordered(ACTIVE_TERM_COUNT_OFFSET, 0)
        meta.put_int64_ordered(END_OF_STREAM_POSITION_OFFSET, _INT64_MAX)
        meta.release()
        return cls(mapped)

    def initialise_at(self, term_id: int, term_offset: int) -> None:
        """Start the stream at ``term_id``/``term_offset`` instead of its initial
        term's start (an ``init-term-id``/``term-id``/``term-offset`` channel):
        the tails are set as if the stream had got there by appending."""
        if term_offset < 0 or term_offset > self.term_length or term_offset % FRAME_ALIGNMENT:
            raise InvalidLogBufferError(f"term offset {term_offset} is not a frame-aligned offset within the term")
        term_count = compute_term_count(term_id, self.initial_term_id)
        if term_count < 0:
            raise InvalidLogBufferError(f"term id {term_id} is before the initial term id {self.initial_term_id}")
        index = term_count % PARTITION_COUNT
        meta = self.metadata
        meta.put_int64(TERM_TAIL_COUNTERS_OFFSET + 8 * index, pack_tail(term_id, term_offset))
        for step in (1, 2):
            # The next partitions hold the ids rotation expects to replace.
            other = (index + step) % PARTITION_COUNT
            meta.put_int64(TERM_TAIL_COUNTERS_OFFSET + 8 * other, pack_tail(term_id + step - PARTITION_COUNT, 0))
        meta.put_int32_ordered(ACTIVE_TERM_COUNT_OFFSET, term_count)
        self.clean_position = compute_position(term_id, term_offset, self.position_bits_to_shift, self.initial_term_id)

    def write_socket_lengths(
        self,
        receiver_window_length: int,
        socket_sndbuf: int,
        os_default_sndbuf: int,
        os_max_sndbuf: int,
        socket_rcvbuf: int,
        os_default_rcvbuf: int,
        os_max_rcvbuf: int,
    ) -> None:
        """A UDP stream's buffer lengths, where Aeron's driver puts them for
        its clients to read: the receiver window (an image's), the channel's
        so-sndbuf / so-rcvbuf (0 when it names none) and what the OS gives a
        socket by default and at most."""
        meta = self.metadata
        meta.put_int32(RECEIVER_WINDOW_LENGTH_OFFSET, receiver_window_length)
        meta.put_int32(SOCKET_SNDBUF_LENGTH_OFFSET, socket_sndbuf)
        meta.put_int32(OS_DEFAULT_SOCKET_SNDBUF_LENGTH_OFFSET, os_default_sndbuf)
        meta.put_int32(OS_MAX_SOCKET_SNDBUF_LENGTH_OFFSET, os_max_sndbuf)
        meta.put_int32(SOCKET_RCVBUF_LENGTH_OFFSET, socket_rcvbuf)
        meta.put_int32(OS_DEFAULT_SOCKET_RCVBUF_LENGTH_OFFSET, os_default_rcvbuf)
        meta.put_int32(OS_MAX_SOCKET_RCVBUF_LENGTH_OFFSET, os_max_rcvbuf)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LogBuffers:
        return cls(MappedFile.open(path))

    @property
    def path(self) -> Path:
        return self._mapped.path

    @property
    def view(self) -> memoryview:
        return self.log.view

    def default_frame_header(self) -> DataHeader:
        return DataHeader(*DATA_HEADER.unpack_from(self.metadata.view, DEFAULT_FRAME_HEADER_OFFSET))

    @property
    def session_id(self) -> int:
        return self.metadata.get_int32(DEFAULT_FRAME_HEADER_OFFSET + 12)

    @property
    def stream_id(self) -> int:
        return self.metadata.get_int32(DEFAULT_FRAME_HEADER_OFFSET + 16)

    @property
    def correlation_id(self) -> int:
        return self.metadata.get_int64(CORRELATION_ID_OFFSET)

    def active_term_count(self) -> int:
        return self.metadata.get_int32_volatile(ACTIVE_TERM_COUNT_OFFSET)

    def raw_tail(self, partition_index: int) -> int:
        return self.metadata.get_int64_volatile(TERM_TAIL_COUNTERS_OFFSET + 8 * partition_index)

    def producer_position(self) -> int:
        """Position just after the last claimed byte of the active term."""
        return int(
            lib.fulmar_log_producer_position(
                self._metadata_address, self.term_length, self.position_bits_to_shift, self.initial_term_id
            )
        )

    @property
    def is_connected(self) -> bool:
        return self.metadata.get_int32_volatile(IS_CONNECTED_OFFSET) == 1

    @is_connected.setter
    def is_connected(self, connected: bool) -> None:
        self.metadata.put_int32_ordered(IS_CONNECTED_OFFSET, 1 if connected else 0)

    @property
    def end_of_stream_position(self) -> int:
        return self.metadata.get_int64_volatile(END_OF_STREAM_POSITION_OFFSET)

    @end_of_stream_position.setter
    def end_of_stream_position(self, position: int) -> None:
        self.metadata.put_int64_ordered(END_OF_STREAM_POSITION_OFFSET, position)

    def clean_to(self, position: int) -> None:
        """Zero everything from ``clean_position`` up to ``position`` (rounded
        down to a frame) and remember it: the driver calls this with a term
        behind its slowest reader, so partitions are clean when reused."""
        position &= ~(FRAME_ALIGNMENT - 1)
        if position > self.clean_position:
            self.clean(self.clean_position, position)
            self.clean_position = position

    def clean(self, from_position: int, to_position: int) -> None:
        """Zero the log between two positions every reader has passed, so the
        partitions can be written again when they come round."""
        if from_position < 0 or (from_position | to_position) & (FRAME_ALIGNMENT - 1):
            raise ValueError(f"cannot clean [{from_position}, {to_position}): positions must be frame aligned")
        if to_position > from_position:
            lib.fulmar_log_clean(self.address, self.term_length, from_position, to_position)

    def close(self) -> None:
        self._mapped.close()

    def __enter__(self) -> LogBuffers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
