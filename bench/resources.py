"""Resource use of a cluster's node processes over a window, with psutil:
CPU in cores (CPU seconds, user + system, consumed in the window / the
window's wall seconds) and RSS in MiB at the window's end, per process and
summed per node; the rows both cluster modules report under the same names
after their prefix (``bench.cluster3`` maps ``cluster3 ...`` to
``pysyncobj ...``, so the table's ratio is fulmar / PySyncObj).

A node's RSS is the sum of its processes' RSS, the issue's "RSS per node
(all four processes)": pages two processes share (a fulmar node's log
buffers and counters in /dev/shm, the interpreter's shared libraries) are
counted in each.  ``breakdown`` also gives PSS (shared pages split among
their mappers), which does not double-count them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

MIB = 1024 * 1024
IDLE_S = 3.0
LOAD_RATE = 1_000  # echoes per second during the load window
LOAD_S = 2.0  # plus the latency run's 1 s warm-up: a window of about 3 s


@dataclass(frozen=True)
class Usage:
    cores: float
    rss_mib: float


def measure(nodes: Mapping[str, Mapping[str, int]], work: Callable[[], Any]) -> dict[str, dict[str, Usage]]:
    """Each process's use while ``work()`` runs: ``nodes`` maps a node to its
    processes' pids by name; the answer has the same shape.  A process that
    is gone before the window ends is an error (the figures would be wrong)."""
    try:
        processes = {node: {name: psutil.Process(pid) for name, pid in pids.items()} for node, pids in nodes.items()}
        before = {
            node: {name: sum(p.cpu_times()[:2]) for name, p in named.items()} for node, named in processes.items()
        }
        began = time.perf_counter()
        work()
        wall_s = time.perf_counter() - began
        return {
            node: {
                name: Usage(
                    cores=(sum(p.cpu_times()[:2]) - before[node][name]) / wall_s, rss_mib=p.memory_info().rss / MIB
                )
                for name, p in named.items()
            }
            for node, named in processes.items()
        }
    except psutil.NoSuchProcess as error:
        raise RuntimeError(f"a node process exited during the resource-use window: {error}") from error


def idle(seconds: float = IDLE_S) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


def rows(prefix: str, label: str, usage: dict[str, dict[str, Usage]]) -> list[dict[str, Any]]:
    """Per node (its processes summed): CPU cores and RSS MiB, median and max over the nodes."""
    cores = [sum(u.cores for u in named.values()) for named in usage.values()]
    rss = [sum(u.rss_mib for u in named.values()) for named in usage.values()]
    results = []
    for what, unit, values in (("CPU", "cores", cores), ("RSS", "MiB", rss)):
        for stat, value in (("median", statistics.median(values)), ("max", max(values))):
            results.append(
                {
                    "name": f"{prefix} node {what} {unit} {label} ({stat})",
                    "value": value,
                    "unit": unit,
                    "reference": None,
                }
            )
    return results


def breakdown(usage: Mapping[str, Usage], pids: Mapping[str, int], total: str | None = "node total") -> str:
    """Processes (one node's): cores and RSS each (as measured), PSS now, and their sum as ``total``."""
    parts = []
    for name, u in usage.items():
        try:
            pss = f"{psutil.Process(pids[name]).memory_full_info().pss / MIB:.0f}"
        except (psutil.Error, AttributeError):
            pss = "?"
        parts.append(f"{name} {u.cores:.2f} cores, RSS {u.rss_mib:.0f} MiB (PSS {pss})")
    if total is not None:
        parts.append(
            f"{total} {sum(u.cores for u in usage.values()):.2f} cores, RSS "
            f"{sum(u.rss_mib for u in usage.values()):.0f} MiB"
        )
    return "; ".join(parts)
