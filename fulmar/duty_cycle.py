"""How long an agent's duty cycles take, stalls between them included
(Aeron's ``DutyCycleTracker`` / ``DutyCycleStallTracker``).

A cycle is measured from the start of one ``do_work`` to the start of the
next, so whatever keeps the agent from coming back (a slow cycle, a GC-like
pause of the process, SIGSTOP, a starved CPU) shows up in the max cycle time
counter and, over the threshold, in the threshold-exceeded counter.  That is
the stall that makes a member miss its heartbeats; a measure of ``do_work``
alone never sees it.

One difference from Aeron: Aeron's idle strategies park for microseconds, so
counting the idle between cycles costs nothing there.  fulmar's agents sleep
on a doorbell for up to their periodic-work interval (10-20 ms) when there is
nothing to do; that sleep is intended, not a stall.  The idle strategy says
when it goes to sleep and for how long at most (``on_idle_wait``), and the
next measurement leaves out the part of the gap spent inside that allowance:
a wait that ends when rung or on its timeout counts nothing, a wait that
overruns its timeout (the process was stopped or not scheduled) counts the
overrun.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class _Counter(Protocol):
    def propose_max(self, value: int) -> bool: ...

    def increment(self) -> int: ...


class DutyCycleStallTracker:
    """Reports each duty cycle's time to a max counter and counts those over ``threshold_ns``.

    ``measure_and_update(now_ns)`` at the start of every duty cycle, with the
    cycle's clock reading; ``on_idle_wait(max_wait_ns)`` from the idle
    strategy just before it sleeps.  ``clock`` (the same clock the duty cycle
    reads) stamps the start of a sleep.
    """

    def __init__(
        self,
        max_cycle_time: _Counter,
        threshold_exceeded: _Counter,
        threshold_ns: int,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if threshold_ns <= 0:
            raise ValueError(f"the cycle time threshold must be positive, not {threshold_ns} ns")
        self.max_cycle_time = max_cycle_time
        self.threshold_exceeded = threshold_exceeded
        self.threshold_ns = threshold_ns
        self._clock = clock
        self._time_of_last_update_ns: int | None = None  # None: nothing to measure from yet
        self._idle_from_ns = 0
        self._idle_allowed_ns = 0

    def update(self, now_ns: int) -> None:
        """Measure the next cycle from ``now_ns`` (after a start-up that is no duty cycle)."""
        self._time_of_last_update_ns = now_ns
        self._idle_allowed_ns = 0

    def on_idle_wait(self, max_wait_ns: int) -> None:
        """The agent is about to sleep for up to ``max_wait_ns``: an intended idle, not a stall."""
        self._idle_from_ns = self._clock()
        self._idle_allowed_ns = max(0, max_wait_ns)

    def measure_and_update(self, now_ns: int) -> int:
        """The time since the previous cycle began, less the allowed idle; reported and returned."""
        last_ns = self._time_of_last_update_ns
        self._time_of_last_update_ns = now_ns
        if last_ns is None:
            self._idle_allowed_ns = 0
            return 0
        cycle_ns = now_ns - last_ns
        if self._idle_allowed_ns:
            slept_ns = min(max(0, now_ns - self._idle_from_ns), self._idle_allowed_ns)
            cycle_ns -= slept_ns
            self._idle_allowed_ns = 0
        self.max_cycle_time.propose_max(cycle_ns)
        if cycle_ns > self.threshold_ns:
            self.threshold_exceeded.increment()
        return cycle_ns
