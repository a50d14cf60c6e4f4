#!/usr/bin/env python3
"""Fuzz the analytics' log decoder (``fulmar_log_decode`` in C, through
``fulmar.analytics.log_decoder.decode_segment``): the input is a segment
file of 64 KiB terms, decoded to its end as a stopped recording (FAILFAST,
then PERMISSIVE) and as an active one; every batch goes to Arrow.

Clean failures: ``LogCorruptError`` in FAILFAST mode only.  PERMISSIVE mode
must never raise, and every row must lie within the data.

Run: .venv/bin/python tests/fuzz/fuzz_log_decode.py tests/fuzz/corpus/log_decode -max_total_time=60
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fuzz_support import fuzz, instrumented  # noqa: E402  (the directory is on the path only now)

with instrumented(__name__ == "__main__"):  # coverage of everything imported below
    from fulmar.analytics.log_decoder import LogCorruptError, LogSegment, decode_segment, to_record_batch

TERM_LENGTH = 64 * 1024


def test_one_input(data: bytes) -> None:
    # A fresh directory per input, removed on the way out (libFuzzer ends the
    # process without running atexit handlers, so nothing may outlive an input).
    with tempfile.TemporaryDirectory(prefix="fulmar-fuzz-log-decode-") as tmp:
        with open(os.path.join(tmp, "0-0.rec"), "wb") as file:
            file.write(data)
        for end_known in (True, False):
            segment = LogSegment(
                archive_dir=tmp,
                recording_id=0,
                file_name="0-0.rec",
                segment_base=0,
                start_offset=0,
                end_offset=max(len(data), 1),
                term_length=TERM_LENGTH,
                end_known=end_known,
                last=True,
            )
            try:
                for batch in decode_segment(segment, batch_rows=7, payload_capacity=256):
                    to_record_batch(batch)
            except LogCorruptError:
                pass
            for batch in decode_segment(segment, permissive=True, batch_rows=7, payload_capacity=256):
                rows = to_record_batch(batch)
                for start, end in zip(
                    rows.column("log_position").to_pylist(), rows.column("next_position").to_pylist()
                ):
                    if not 0 <= start < end <= max(len(data), 1):
                        raise AssertionError(f"a row from {start} to {end} in {len(data)} bytes of data")


if __name__ == "__main__":
    fuzz(test_one_input)
