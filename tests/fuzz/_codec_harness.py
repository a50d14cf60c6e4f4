"""Shared body of the fuzz_codec_<schema>.py harnesses: one generated SBE module each.

The first input byte picks a template of the schema; the rest is handed to every
decoding entry point.  ``CodecError`` is the only clean failure; a decoded
message is also turned into a dict so that every field, group and var-data
member is actually read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from _fuzz_support import fuzz, instrumented


def codec_harness(schema: str, fuzzing: bool) -> Callable[[bytes], None]:
    """One schema's ``test_one_input``; with ``fuzzing`` (run as a script), fuzz it
    with atheris instead, the codec modules imported under its instrumentation."""
    with instrumented(fuzzing):  # coverage of the codecs imported below
        test_one_input = make_test_one_input(schema)
    if fuzzing:
        fuzz(test_one_input)
    return test_one_input


def make_test_one_input(schema: str) -> Callable[[bytes], None]:
    from fulmar.codecs import CodecError

    module: Any = importlib.import_module(f"fulmar.codecs.generated.{schema}")
    ids = sorted(module.DECODERS)
    headerless = not hasattr(module, "read_header")

    def attempt(action: Callable[[], Any]) -> None:
        try:
            decoded = action()
        except CodecError:
            return
        decoded.to_dict()
        repr(decoded)

    def test_one_input(data: bytes) -> None:
        if not data:
            return
        template_id = ids[data[0] % len(ids)]
        body = memoryview(data)[1:]
        cls = module.DECODERS[template_id]
        if headerless:
            attempt(lambda: module.decode(template_id, body, 0, len(body)))
            attempt(lambda: cls().wrap_headerless(body, 0))
            return
        attempt(lambda: module.decode(body, 0, len(body)))
        attempt(lambda: cls().wrap_and_apply_header(body, 0, len(body)))
        attempt(lambda: cls().wrap_headerless(body, 0))
        try:
            module.read_header(body, 0, len(body))
        except CodecError:
            pass

    return test_one_input
