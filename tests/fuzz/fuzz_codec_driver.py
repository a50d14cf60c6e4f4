#!/usr/bin/env python3
"""Fuzz every decoder of the generated ``driver`` SBE codec (see _codec_harness.py).

Run: .venv/bin/python tests/fuzz/fuzz_codec_driver.py tests/fuzz/corpus/codec_driver -max_total_time=60
"""

from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    import atheris

    _instrumented = atheris.instrument_imports()  # coverage of everything imported below
else:
    _instrumented = contextlib.nullcontext()

with _instrumented:
    from _codec_harness import make_test_one_input

    test_one_input = make_test_one_input("driver")  # imports fulmar.codecs.generated.driver

if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
