"""Many writer processes append to one concurrent log while a reader process
scans it: every message arrives exactly once, in each writer's order, with
its bytes intact, across many term rotations."""

from __future__ import annotations

import os
import random
import time
import zlib
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from conftest import FORK

from fulmar.buffers import MappedFile
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header, LogReader
from fulmar.log_writer import ADMIN_ACTION, BACK_PRESSURED, ConcurrentLogWriter
from fulmar.logbuffer import DEFAULT_MTU, LogBuffers

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

WRITERS = 4
MESSAGES_PER_WRITER = 250_000
TERM_LENGTH = 1024 * 1024
WINDOW = TERM_LENGTH // 2
MAX_SIZE = 4 * DEFAULT_MTU
POOL = random.Random(42).randbytes(1 << 20)
DEADLINE_S = 300.0

LIMIT_OFFSET = 0  # the writers' flow-control limit, advanced by the reader


def message_start(writer: int, seq: int) -> int:
    """Where in POOL the bytes of (writer, seq) come from; the reader recomputes it."""
    return (writer * 1_000_003 + seq * 7_919) % (len(POOL) - MAX_SIZE)


def message_size(rnd: random.Random) -> int:
    # Mostly messages that fit one frame, a quarter spanning up to 4 MTUs.
    if rnd.random() < 0.75:
        return rnd.randint(1, DEFAULT_MTU - 32)
    return rnd.randint(1, MAX_SIZE)


def writer_main(log_path: str, control_path: str, writer: int, result: Connection) -> None:
    log = LogBuffers.open(log_path)
    control = MappedFile.open(control_path).buffer()
    publication = ConcurrentLogWriter(log, control, LIMIT_OFFSET)
    rnd = random.Random(1000 + writer)
    crc = 0
    deadline = time.monotonic() + DEADLINE_S
    for seq in range(MESSAGES_PER_WRITER):
        size = message_size(rnd)
        start = message_start(writer, seq)
        payload = POOL[start : start + size]
        # The reserved value tells the reader who sent this and what size.
        reserved = (writer << 56) | (seq << 32) | size
        while True:
            outcome = publication.offer(payload, reserved)
            if outcome > 0:
                break
            if outcome == BACK_PRESSURED:
                if time.monotonic() > deadline:
                    result.send(("timeout", writer, seq))
                    return
                os.sched_yield()
            elif outcome != ADMIN_ACTION:
                result.send(("error", writer, outcome))
                return
        crc = zlib.crc32(payload, crc)
    result.send(("done", writer, crc))


def reader_main(log_path: str, control_path: str, result: Connection) -> None:
    log = LogBuffers.open(log_path)
    control = MappedFile.open(control_path).buffer()
    reader = LogReader(log)
    expected_seq = [0] * WRITERS
    crcs = [0] * WRITERS
    errors: list[str] = []
    received = 0

    def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        nonlocal received
        reserved = header.reserved_value
        writer, seq, size = reserved >> 56, (reserved >> 32) & 0xFFFFFF, reserved & 0xFFFFFFFF
        message = buffer[offset : offset + length]
        if writer >= WRITERS or seq != expected_seq[writer]:
            errors.append(f"writer {writer}: got seq {seq}, expected {expected_seq[min(writer, WRITERS - 1)]}")
        elif length != size:
            errors.append(f"writer {writer} seq {seq}: length {length}, sent {size}")
        else:
            start = message_start(writer, seq)
            if message != POOL[start : start + size]:
                errors.append(f"writer {writer} seq {seq}: bytes differ")
            crcs[writer] = zlib.crc32(message, crcs[writer])
            expected_seq[writer] += 1
        received += 1

    assembler = FragmentAssembler(on_message)
    control.put_int64_ordered(LIMIT_OFFSET, WINDOW)
    deadline = time.monotonic() + DEADLINE_S
    rotations_seen = 0
    while received < WRITERS * MESSAGES_PER_WRITER and not errors:
        if reader.poll(assembler, 256) == 0:
            if time.monotonic() > deadline:
                errors.append(f"timed out after {received} messages")
                break
            os.sched_yield()
        position = reader.position
        if position > log.clean_position:
            # The only reader has passed these bytes: zero them for reuse and
            # let the writers advance a window beyond.
            log.clean_to(position)
            control.put_int64_ordered(LIMIT_OFFSET, position + WINDOW)
    rotations_seen = reader.position // TERM_LENGTH
    result.send((received, errors[:10], crcs, expected_seq, rotations_seen))


def test_four_writer_processes_one_reader_process(tmp_path: Path, child_processes: list) -> None:
    log_path = str(tmp_path / "stress.logbuffer")
    control_path = str(tmp_path / "control")
    log = LogBuffers.create(log_path, TERM_LENGTH, session_id=11, stream_id=1001, initial_term_id=-7)
    log.is_connected = True
    MappedFile.create(control_path, 4096).close()

    reader_end, reader_result = FORK.Pipe(duplex=False)
    reader = FORK.Process(target=reader_main, args=(log_path, control_path, reader_result))
    child_processes.append(reader)
    reader.start()
    writer_ends = []
    for writer in range(WRITERS):
        end, result = FORK.Pipe(duplex=False)
        process = FORK.Process(target=writer_main, args=(log_path, control_path, writer, result))
        child_processes.append(process)
        process.start()
        writer_ends.append(end)

    deadline = time.monotonic() + DEADLINE_S + 30
    assert reader_end.poll(max(0.0, deadline - time.monotonic())), "reader did not report in time"
    received, errors, reader_crcs, counts, rotations = reader_end.recv()
    assert errors == []
    assert received == WRITERS * MESSAGES_PER_WRITER
    assert counts == [MESSAGES_PER_WRITER] * WRITERS
    for writer, end in enumerate(writer_ends):
        assert end.poll(max(0.0, deadline - time.monotonic())), f"writer {writer} did not report"
        status, who, crc = end.recv()
        assert (status, who) == ("done", writer)
        assert crc == reader_crcs[writer], f"checksum of writer {writer}'s stream differs"
    assert rotations > 100, f"only {rotations} term rotations: the test did not exercise rotation"
    log.close()
