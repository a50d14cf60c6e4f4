#!/usr/bin/env python3
"""Fuzz the log-buffer frame scanner (``LogReader.poll`` / ``LogReader.scan``,
the C ``fulmar_log_scan``) over a log buffer whose first term holds the input.

The only clean failure is ``CorruptFrameError`` (a ``CodecError``); the reader
must stay inside the log, advance by at most a term per call and stop.

Run: .venv/bin/python tests/fuzz/fuzz_log_scanner.py tests/fuzz/corpus/log_scanner -max_total_time=60
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fuzz_support import fuzz, instrumented  # noqa: E402  (the directory is on the path only now)

with instrumented(__name__ == "__main__"):  # coverage of everything imported below
    from fulmar.errors import CodecError
    from fulmar.log_reader import LogReader
    from fulmar.logbuffer import LogBuffers

TERM = 64 * 1024
LOG_BYTES = 3 * TERM
MAX_INPUT = 2 * TERM  # inputs may span the first two terms

_log: LogBuffers | None = None


def _buffers() -> LogBuffers:
    global _log
    if _log is None:
        directory = Path(tempfile.mkdtemp(prefix="fulmar-fuzz-log-"))
        try:
            _log = LogBuffers.create(directory / "fuzz.logbuffer", TERM, session_id=1, stream_id=2)
        finally:
            # The mapping outlives its file: nothing is left behind even when
            # libFuzzer ends the process without running atexit handlers.
            shutil.rmtree(directory, ignore_errors=True)
        atexit.register(_log.close)
    return _log


def _handler(buffer: Any, offset: int, length: int, header: Any) -> None:
    assert 0 <= offset and offset + length <= LOG_BYTES, (offset, length)
    header.position  # reads the header fields


def test_one_input(data: bytes) -> None:
    log = _buffers()
    data = data[:MAX_INPUT]
    view = log.view
    view[:LOG_BYTES] = bytes(LOG_BYTES)
    view[: len(data)] = data
    for use_scan in (False, True):
        reader = LogReader(log)
        for _ in range(LOG_BYTES // 32 + 3):
            before = reader.position
            try:
                if use_scan:
                    batch = reader.scan()
                    for offset, length in zip(batch.frame_offsets, batch.frame_lengths):
                        assert 0 <= offset and offset + length <= LOG_BYTES, (offset, length)
                else:
                    reader.poll(_handler, 4096)
            except CodecError:
                break
            assert before <= reader.position <= before + TERM, (before, reader.position)
            if reader.position == before:
                break


if __name__ == "__main__":
    fuzz(test_one_input)
