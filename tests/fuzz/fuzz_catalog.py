#!/usr/bin/env python3
"""Fuzz the archive catalog reader: the input becomes ``<dir>/archive.catalog``,
opened with ``Catalog.open_read_only`` (copy-on-write: the loader validates
header and entries), every entry and descriptor read, closed.

The only clean failure is ``CatalogError``.

Run: .venv/bin/python tests/fuzz/fuzz_catalog.py tests/fuzz/corpus/catalog -max_total_time=60
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fuzz_support import fuzz, instrumented  # noqa: E402  (the directory is on the path only now)

with instrumented(__name__ == "__main__"):  # coverage of everything imported below
    from fulmar.archive.catalog import CATALOG_FILE_NAME, Catalog
    from fulmar.archive.errors import CatalogError


def test_one_input(data: bytes) -> None:
    # A fresh directory per input, removed on the way out (libFuzzer ends the
    # process without running atexit handlers, so nothing may outlive an input).
    with tempfile.TemporaryDirectory(prefix="fulmar-fuzz-catalog-") as tmp:
        _one_input(Path(tmp), data)


def _one_input(directory: Path, data: bytes) -> None:
    (directory / CATALOG_FILE_NAME).write_bytes(data)
    try:
        catalog = Catalog.open_read_only(directory)
    except CatalogError:
        return
    with catalog:
        catalog.version
        catalog.next_recording_id
        catalog.alignment
        len(catalog)
        for descriptor, _recorded in catalog.entries():
            catalog.has_recording(descriptor.recording_id)
            catalog.descriptor(descriptor.recording_id)
        for descriptor in catalog.recordings():
            catalog.stop_position(descriptor.recording_id)
            catalog.recorded_position(descriptor.recording_id)
        catalog.find_by_uri(0, 100, "", 1)
        catalog.find_last_matching(0, "aeron", 1, 1)


if __name__ == "__main__":
    fuzz(test_one_input)
