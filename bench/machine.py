"""How fast this machine runs Python today, so that runs on different days
(or different virtual machines of the same kind) can be compared.

The same two-core machine kind has run the same code at very different
speeds: one day's round trips took three times the CPU of another's, C code
included, with no change of code.  A bench run's figures mean little without
knowing which of those machines they came from, so ``make bench`` times a
fixed pure-Python loop before the first benchmark and after the last and
prints both (the spread shows whether the machine changed during the run).
"""

from __future__ import annotations

import statistics
import time

LOOP_ITERATIONS = 2_000_000
ROUNDS = 5


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
