"""Exclusive-publication append + scan of 32-byte messages in one process:
through the per-message Python API, through the batch API, and the same loop
written in C inside the extension (the physical reference)."""

from __future__ import annotations

import shutil
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from fulmar._native import ffi, lib
from fulmar.buffers import MappedFile
from fulmar.log_reader import Header, LogReader
from fulmar.log_writer import ADMIN_ACTION, ExclusiveLogWriter
from fulmar.logbuffer import LogBuffers

MESSAGE_LENGTH = 32
TERM_LENGTH = 1024 * 1024
WINDOW = TERM_LENGTH // 2
BATCH = 1024


class _Setup:
    def __init__(self, directory: Path) -> None:
        self.log = LogBuffers.create(directory / "bench.logbuffer", TERM_LENGTH, session_id=1, stream_id=1)
        self.log.is_connected = True
        self.control = MappedFile.create(directory / "limit", 4096)
        self.limit = self.control.buffer()
        self.limit.put_int64_ordered(0, WINDOW)
        self.writer = ExclusiveLogWriter(self.log, self.limit, 0)
        self.reader = LogReader(self.log)

    def release_space(self) -> None:
        """What the driver does for a publication: clean what the reader
        passed and move the writer's limit a window beyond it."""
        position = self.reader.position
        self.log.clean_to(position)
        self.limit.put_int64_ordered(0, position + WINDOW)

    def close(self) -> None:
        self.log.close()
        self.control.close()


class _Counter:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def on_fragment(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        self.count += 1


def python_api(setup: _Setup, messages: int) -> float:
    writer, reader = setup.writer, setup.reader
    payload = b"x" * MESSAGE_LENGTH
    counter = _Counter()
    handler = counter.on_fragment
    offer = writer.offer
    start = time.perf_counter()
    sent = 0
    while sent < messages:
        result = offer(payload)
        if result > 0:
            sent += 1
        elif result != ADMIN_ACTION:
            while reader.position < writer.position:
                reader.poll(handler, 4096)
            setup.release_space()
    while reader.position < writer.position:
        reader.poll(handler, 4096)
    elapsed = time.perf_counter() - start
    assert counter.count == messages, (counter.count, messages)
    return messages / elapsed


def batch_api(setup: _Setup, messages: int) -> float:
    writer, reader = setup.writer, setup.reader
    data = b"x" * (MESSAGE_LENGTH * BATCH)
    lengths = array("i", [MESSAGE_LENGTH] * BATCH)
    received = 0
    start = time.perf_counter()
    sent = 0
    while sent < messages:
        appended, _ = writer.offer_block(data, lengths)
        sent += appended
        if appended < BATCH:
            while reader.position < writer.position:
                received += reader.scan().count
            setup.release_space()
    while reader.position < writer.position:
        received += reader.scan().count
    elapsed = time.perf_counter() - start
    assert received == sent, (received, sent)
    return sent / elapsed


def c_reference(setup: _Setup, messages: int) -> float:
    batch = ffi.new("fulmar_fragment_batch_t *")
    start = time.perf_counter()
    received = lib.fulmar_bench_exclusive_append_scan(setup.writer.native_state, MESSAGE_LENGTH, messages, batch)
    elapsed = time.perf_counter() - start
    assert received == messages, (received, messages)
    return messages / elapsed


def run(quick: bool) -> list[dict[str, Any]]:
    scale = 1 if quick else 5
    directory = Path(tempfile.mkdtemp(prefix="fulmar-bench-", dir="/dev/shm"))
    try:
        figures = {}
        for name, function, messages in (
            ("python", python_api, 200_000 * scale),
            ("batch", batch_api, 2_000_000 * scale),
            ("c", c_reference, 10_000_000 * scale),
        ):
            setup = _Setup(directory)
            try:
                figures[name] = function(setup, messages)
            finally:
                setup.close()
        return [
            {
                "name": "log buffer append+scan 32 B, Python API",
                "value": figures["python"],
                "unit": "msgs/s",
                "reference": figures["c"],
            },
            {
                "name": "log buffer append+scan 32 B, batch API",
                "value": figures["batch"],
                "unit": "msgs/s",
                "reference": figures["c"],
            },
            {"name": "log buffer append+scan 32 B, C loop", "value": figures["c"], "unit": "msgs/s", "reference": None},
        ]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
