"""What every harness does around its ``test_one_input``: run as a script, it
imports the code under test with atheris's coverage instrumentation and hands
``test_one_input`` to libFuzzer; imported (tests/fuzz/test_fuzz_corpus.py replays
the corpus), it needs no atheris at all."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import NoReturn


def instrumented(fuzzing: bool) -> contextlib.AbstractContextManager[object]:
    """Import what the harness tests inside this: instrumented when fuzzing."""
    if not fuzzing:
        return contextlib.nullcontext()
    import atheris

    return atheris.instrument_imports()


def fuzz(test_one_input: Callable[[bytes], None]) -> NoReturn:
    import atheris

    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
    raise SystemExit(0)  # (Fuzz does not return)
