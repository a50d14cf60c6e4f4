"""``bench.pysyncobj_peer`` without pysyncobj installed: one line saying how
to install it, no rows, no error."""

from __future__ import annotations

import sys

import pytest

from bench import pysyncobj_peer


def test_no_rows_without_pysyncobj(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pysyncobj", None)  # import pysyncobj: ImportError
    assert pysyncobj_peer.run(quick=True) == []
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "pip install .[bench]" in out
