"""``bench.resources``: a window measured on this process, rows named alike
in both cluster modules so that the table gives fulmar / PySyncObj."""

from __future__ import annotations

import os
import time

from bench import cluster3, resources


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_measure_and_rows() -> None:
    pid = os.getpid()
    usage = resources.measure({"a": {"x": pid}, "b": {"x": pid, "y": pid}}, lambda: _spin(0.2))
    assert set(usage) == {"a", "b"} and set(usage["b"]) == {"x", "y"}
    assert 0 < usage["a"]["x"].cores < 1.5 and usage["a"]["x"].rss_mib > 1
    rows = {row["name"]: row for row in resources.rows("cluster3", "idle", usage)}
    a, b = usage["a"]["x"], usage["b"]["x"].rss_mib + usage["b"]["y"].rss_mib
    assert rows["cluster3 node RSS MiB idle (max)"]["value"] == max(a.rss_mib, b)
    assert rows["cluster3 node RSS MiB idle (median)"]["unit"] == "MiB"
    assert rows["cluster3 node CPU cores idle (median)"]["unit"] == "cores"
    assert "node total" in resources.breakdown(usage["b"], {"x": pid, "y": pid})
    peer = [row["name"] for row in resources.rows("pysyncobj", "idle", usage)]
    assert [cluster3.reference_name(name, "pysyncobj_peer") for name in rows] == peer
