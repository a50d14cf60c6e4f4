"""How fast this machine is today, so that runs on different days (or
different virtual machines of the same kind) can be compared.

The same two-core machine kind has run the same code at very different
speeds: one day's round trips took three times the CPU of another's, C code
included, with no change of code, and an idle process woke from a futex in
68 us at the median where another day's took 5-19.  A cluster's round trip is
a chain of such wake-ups, so a bench run's figures mean little without
knowing which of those machines they came from.  ``make bench`` measures two
things before the first benchmark and after the last and prints both (the
spread shows whether the machine changed during the run): a fixed
pure-Python loop, and an idle process's wake-up on a doorbell
(``bench.idle``'s measurement, fewer samples).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench import idle

LOOP_ITERATIONS = 2_000_000
ROUNDS = 5
WAKE_UP_SAMPLES = 300


def _loop(iterations: int) -> int:
    total = 0
    for index in range(iterations):
        total += index & 7
    return total


def python_loop_ns() -> float:
    """Nanoseconds per iteration of a fixed pure-Python loop, the median of a few rounds."""
    rounds = []
    for _ in range(ROUNDS):
        began = time.perf_counter_ns()
        _loop(LOOP_ITERATIONS)
        rounds.append((time.perf_counter_ns() - began) / LOOP_ITERATIONS)
    return statistics.median(rounds)


def wake_up_us() -> float:
    """Median microseconds from a doorbell's ring to an idle process noticing it."""
    with tempfile.TemporaryDirectory(prefix="fulmar-bench-machine-") as directory:
        latencies = idle.wake_latencies_ns("doorbell", WAKE_UP_SAMPLES, Path(directory))
    return statistics.median(latencies) / 1000


def describe() -> tuple[dict[str, float], str]:
    """Both figures, as JSON fields and as text."""
    figures = {"python_loop_ns": python_loop_ns(), "wake_up_us": wake_up_us()}
    return figures, (
        f"a pure-Python loop {figures['python_loop_ns']:.1f} ns per iteration, "
        f"an idle process's doorbell wake-up {figures['wake_up_us']:.1f} us (p50)"
    )
