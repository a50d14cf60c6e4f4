"""Wall-clock time as Aeron's components record it: epoch milliseconds (mark
file activity, catalog timestamps, error log times, cluster time).  Agents
take ``now_ns`` from a monotonic clock for their own timing; this is for what
is written down or compared across processes."""

from __future__ import annotations

import time


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000
