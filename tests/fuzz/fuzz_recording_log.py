#!/usr/bin/env python3
"""Fuzz the recording-log reader: the input becomes ``<dir>/recording.log``,
opened with ``RecordingLog.open(create=False)``, every entry and query read.

Clean failures: ``RecordingLogError`` (``CorruptRecordingLogError`` is one).
Opening may repair (truncate) a torn tail; the file is rewritten per input.

Run: .venv/bin/python tests/fuzz/fuzz_recording_log.py tests/fuzz/corpus/recording_log -max_total_time=60
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fuzz_support import fuzz, instrumented  # noqa: E402  (the directory is on the path only now)

with instrumented(__name__ == "__main__"):  # coverage of everything imported below
    from fulmar.consensus.recording_log import (
        NULL_VALUE,
        RECORDING_LOG_FILE_NAME,
        RecordingExtent,
        RecordingLog,
        RecordingLogError,
    )


def _extent(recording_id: int) -> RecordingExtent | None:
    return None  # the archive knows no recording: plans fail cleanly or have no replay


def test_one_input(data: bytes) -> None:
    # A fresh directory per input, removed on the way out (libFuzzer ends the
    # process without running atexit handlers, so nothing may outlive an input).
    with tempfile.TemporaryDirectory(prefix="fulmar-fuzz-recording-log-") as tmp:
        _one_input(Path(tmp), data)


def _one_input(directory: Path, data: bytes) -> None:
    (directory / RECORDING_LOG_FILE_NAME).write_bytes(data)
    try:
        log = RecordingLog.open(directory, create=False, fsync=False)
    except RecordingLogError:
        return
    with log:
        entries = log.entries
        log.sorted_entries
        log.next_entry_index
        for entry in entries:
            entry.length
            entry.type_name
            entry.is_valid_term
            entry.is_valid_snapshot
            log.is_unknown(entry.leadership_term_id)
            log.find_term_entry(entry.leadership_term_id)
        log.find_last_term()
        log.find_last_term_recording_id()
        for service_id in (-1, 0, 1):
            log.get_latest_snapshot(service_id)
        for service_count in (0, 1, 2):
            try:
                log.create_recovery_plan(service_count, _extent, NULL_VALUE)
            except RecordingLogError:
                pass
        # open() accepted the file (repairing a torn tail if it had one):
        # reading the file it left behind must accept it too.
        try:
            log.reload()
        except RecordingLogError as ex:
            raise AssertionError(
                f"open() accepted the log (repaired={log.repaired!r}) but reload() rejects it: {ex}"
            ) from ex


if __name__ == "__main__":
    logging.disable(logging.WARNING)  # "recording log repaired" for every torn input
    fuzz(test_one_input)
