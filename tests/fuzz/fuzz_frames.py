#!/usr/bin/env python3
"""Fuzz the wire-frame decoders of ``fulmar.frames`` (DATA header, SETUP, SM, NAK,
RTTM, ERR, RSP_SETUP, heartbeat, whole DATA datagrams).

Every decoder gets the whole input as one datagram; the only clean failure is
``fulmar.errors.CodecError`` (``CorruptFrameError`` is one).

Run: .venv/bin/python tests/fuzz/fuzz_frames.py tests/fuzz/corpus/frames -max_total_time=60
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fuzz_support import fuzz, instrumented  # noqa: E402  (the directory is on the path only now)

with instrumented(__name__ == "__main__"):  # coverage of everything imported below
    from fulmar import frames
    from fulmar.errors import CodecError

# decode_*(buffer, offset=0, length=None)
DECODERS: tuple[Callable[..., Any], ...] = (
    frames.decode_setup,
    frames.decode_status_message,
    frames.decode_nak,
    frames.decode_rttm,
    frames.decode_error,
    frames.decode_response_setup,
    frames.decode_heartbeat,
)
# f(datagram, length=None)
DATAGRAM_FUNCTIONS: tuple[Callable[..., Any], ...] = (frames.data_frames, frames.frame_type_of, frames.is_heartbeat)


def test_one_input(data: bytes) -> None:
    view = memoryview(data)
    half = len(data) // 2
    for decode in DECODERS:
        for args in ((), (0, half), (8,), (8, len(data) - 8)):
            try:
                decode(view, *args)
            except CodecError:
                pass
    for function in DATAGRAM_FUNCTIONS:
        for args in ((), (half,)):
            try:
                function(view, *args)
            except CodecError:
                pass
    for offset in (0, 1, 32):
        try:
            header = frames.decode_data_header(view, offset)
        except CodecError:
            assert len(data) - offset < frames.HEADER_LENGTH, "a whole header did not decode"
        else:
            assert len(header) == 9


if __name__ == "__main__":
    fuzz(test_one_input)
