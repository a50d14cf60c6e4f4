#!/usr/bin/env python3
"""Fuzz every decoder of the generated ``archive_mark`` SBE codec (see _codec_harness.py).

Run: .venv/bin/python tests/fuzz/fuzz_codec_archive_mark.py tests/fuzz/corpus/codec_archive_mark -max_total_time=60
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _codec_harness import codec_harness  # noqa: E402  (the directory is on the path only now)

test_one_input = codec_harness("archive_mark", fuzzing=__name__ == "__main__")
