"""Datagrams of a publication and the frames they carry, for the tests that rebuild an image from them (in Python and in C)."""

from __future__ import annotations

import struct
from pathlib import Path

from fulmar.fragment_assembler import FragmentAssembler
from fulmar.frames import HEADER_LENGTH, FrameType, align
from fulmar.log_reader import Header, LogReader
from fulmar.log_writer import ADMIN_ACTION, ExclusiveLogWriter
from fulmar.logbuffer import LogBuffers

TERM = 64 * 1024


INITIAL_TERM_ID = 7


SESSION_ID = 11


STREAM_ID = 22


MTU = 1408


FIRST_WORD = struct.Struct("<iBBh")


def payload_for(index: int, size: int) -> bytes:
    """A message whose bytes say which message it is, so mixing is visible."""
    stamp = struct.pack("<I", index)
    return (stamp * (size // 4 + 1))[:size]


def publish_terms(directory: Path, sizes: list[int], mtu: int = MTU) -> list[bytes]:
    """The terms a publisher's log holds after appending messages of these
    sizes: a snapshot of each term, from the initial term on."""
    terms: list[bytes] = []
    with LogBuffers.create(
        directory / "source.logbuffer",
        TERM,
        mtu=mtu,
        initial_term_id=INITIAL_TERM_ID,
        session_id=SESSION_ID,
        stream_id=STREAM_ID,
    ) as log:
        writer = ExclusiveLogWriter(log)

        def snapshot(term_count: int) -> bytes:
            partition = term_count % 3
            return bytes(log.view[partition * TERM : (partition + 1) * TERM])

        for index, size in enumerate(sizes):
            if writer.offer(payload_for(index, size)) == ADMIN_ACTION:
                assert writer.offer(payload_for(index, size)) > 0
            # Keep each completed term, then clean its partition for reuse.
            while writer.position // TERM > len(terms):
                terms.append(snapshot(len(terms)))
                log.clean((len(terms) - 1) * TERM, len(terms) * TERM)
        if writer.position % TERM:
            terms.append(snapshot(len(terms)))
    return terms


def frames_of(term: bytes) -> list[tuple[int, int, int]]:
    """(offset, aligned length, type) of every frame written in a term."""
    frames = []
    offset = 0
    while offset < TERM:
        frame_length, _, _, frame_type = FIRST_WORD.unpack_from(term, offset)
        if frame_length <= 0:
            break
        frames.append((offset, align(frame_length, 32), frame_type))
        offset += align(frame_length, 32)
    return frames


def sender_datagrams(
    term: bytes, start: int = 0, end: int = TERM, mtu: int = MTU, max_count: int = TERM
) -> list[tuple[int, bytes]]:
    """Slice ``[start, end)`` of a term into datagrams the way Aeron's sender
    does: whole aligned frames up to the MTU, a padding frame sent as its
    header alone, nothing that would go past ``end``."""
    datagrams: list[tuple[int, bytes]] = []
    offset = start
    while offset < end and len(datagrams) < max_count:
        begin, size = offset, 0
        while offset < end:
            frame_length, _, _, frame_type = FIRST_WORD.unpack_from(term, offset)
            if frame_length <= 0:
                break
            aligned = align(frame_length, 32)
            on_wire = HEADER_LENGTH if frame_type == FrameType.PAD else aligned
            if (size and size + on_wire > mtu) or offset + on_wire > end:
                break
            size += on_wire
            offset += aligned
            if frame_type == FrameType.PAD:
                break
        if size == 0:
            break
        datagrams.append((begin, term[begin : begin + size]))
    return datagrams


class Collector:
    """Reads whole messages from a log; fragments of a message may arrive
    over several reads."""

    def __init__(self, log: LogBuffers, position: int = 0) -> None:
        self.reader = LogReader(log, position)
        self.messages: list[bytes] = []
        self._assembler = FragmentAssembler(self._on_message)

    def _on_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        self.messages.append(bytes(buffer[offset : offset + length]))

    def read(self) -> list[bytes]:
        # Bounded: a log that was not cleaned could hold stale frames all the
        # way round its partitions.
        for _ in range(3 * TERM // 32 // 100):
            if not self.reader.poll(self._assembler.on_fragment, 100):
                break
        return self.messages

    def in_order(self) -> bool:
        return all(message == payload_for(i, len(message)) for i, message in enumerate(self.messages))


def datagram_span(datagram: bytes) -> int:
    """How much of the term a datagram covers (padding: to its frame's end)."""
    offsets = datagram_frame_offsets(datagram)
    return offsets[-1] + align(FIRST_WORD.unpack_from(datagram, offsets[-1])[0], 32)


def datagram_frame_offsets(datagram: bytes) -> list[int]:
    """Where each frame of a datagram starts, from the datagram's start."""
    offsets = []
    offset = 0
    while offset < len(datagram):
        offsets.append(offset)
        offset += align(FIRST_WORD.unpack_from(datagram, offset)[0], 32)
    return offsets
