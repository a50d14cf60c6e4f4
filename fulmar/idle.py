"""Idle strategies, and the doorbell that lets an idle agent sleep until rung.

An agent's duty cycle calls ``idle_strategy.idle(work_count)`` after every
``do_work``: with work done it returns at once, otherwise it idles (Aeron's
``IdleStrategy`` semantics).  On the machines fulmar targets (2 cores, a
dozen processes per 3-node cluster) spinning starves the process that has
the work, and sleeping adds latency, so the default for every agent is
:class:`DoorbellIdleStrategy`: a futex sleep as soon as a duty cycle finds
nothing (no empty spins by default: a Python duty cycle costs tens to
hundreds of microseconds, which a spin spends for nothing), which the writer
ends with :meth:`Doorbell.ring` the moment it publishes, bounded by the
agent's periodic-work interval.

Measured on the target VM (Linux 6.18, 2 vCPUs, 250 Hz kernel with
high-resolution timers, default 50 us timer slack), Python 3.11:

- ``time.sleep`` is not tick-bound: asking for 1 us sleeps ~75 us (p99
  ~175 us), 100 us sleeps ~185 us, 1 ms sleeps ~1.1 ms.  So a
  ``SleepingIdleStrategy`` shorter than ~100 us buys nothing but CPU burn,
  and Aeron's 1 us default becomes ~75 us of wake-up delay per park.
- ``os.sched_yield`` costs ~0.35 us when no other thread is runnable.
- Idle reader wake-up across processes, from "writer publishes" to "reader
  notices" (``bench/idle.py``): doorbell p50 ~10-25 us, p99 ~60-330 us;
  ``SleepingIdleStrategy(1 ms)`` p50 ~550 us, p99 ~1.1-1.6 ms;
  ``BackoffIdleStrategy`` with a 1 ms max park about the same as sleeping.
  The doorbell reader uses no measurable CPU while it waits.
- ``Doorbell.ring()`` with nobody waiting costs ~230 ns from Python (cffi
  call overhead around one fence and one load).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from fulmar._native import lib
from fulmar.buffers import AtomicBuffer
from fulmar.channel_uri import parse_duration_ns

DOORBELL_LENGTH = int(lib.FULMAR_DOORBELL_LENGTH)
DOORBELL_SEQUENCE_OFFSET = int(lib.FULMAR_DOORBELL_SEQUENCE_OFFSET)
DOORBELL_WAITERS_OFFSET = int(lib.FULMAR_DOORBELL_WAITERS_OFFSET)

DEFAULT_DOORBELL_MAX_WAIT_NS = 10_000_000
DEFAULT_DOORBELL_SPINS = 0
DEFAULT_SLEEP_PERIOD_NS = 1_000_000


class Doorbell:
    """A futex word in shared memory (8 bytes: sequence i32, waiters i32).

    Reader (the only side that sleeps)::

        token = bell.prepare()      # register as a waiter
        if not has_work():          # re-check after registering: no lost ring
            bell.wait(token, timeout_ns)
        else:
            bell.cancel()

    Writer, after publishing: ``bell.ring()`` — a fence and one load when
    nobody waits; a sequence bump and a ``FUTEX_WAKE`` when somebody does.

    A waiter that dies between ``prepare`` and the end of its wait leaves the
    waiter count raised: writers then pay a futex wake per ring (a wasted
    system call, never a missed wake-up).
    """

    __slots__ = ("buffer", "offset", "fd", "_address")

    def __init__(self, buffer: AtomicBuffer, offset: int = 0, fd: int = -1) -> None:
        if offset < 0 or offset + DOORBELL_LENGTH > buffer.capacity:
            raise IndexError(f"doorbell at {offset} (+{DOORBELL_LENGTH}) outside buffer of {buffer.capacity} bytes")
        if offset % 8:
            raise ValueError(f"doorbell offset {offset} is not 8-byte aligned")
        self.buffer = buffer
        self.offset = offset
        # >= 0: the sleeper waits in epoll on a FIFO (the media driver's data
        # plane), and a ring writes to it (doorbell.h's FIFO doorbells).
        self.fd = fd
        self._address = buffer.address

    @property
    def sequence(self) -> int:
        return self.buffer.get_int32_volatile(self.offset + DOORBELL_SEQUENCE_OFFSET)

    @property
    def waiters(self) -> int:
        return self.buffer.get_int32_volatile(self.offset + DOORBELL_WAITERS_OFFSET)

    def ring(self) -> bool:
        """Wake every waiter; True if there was one (False costs no system call)."""
        if self.fd >= 0:
            result = int(lib.fulmar_doorbell_ring_fifo(self._address, self.offset, self.fd))
        else:
            result = int(lib.fulmar_doorbell_ring(self._address, self.offset))
        if result < 0:
            raise OSError(-result, f"doorbell ring failed: {os.strerror(-result)}")
        return result > 0

    def prepare(self) -> int:
        """Register as a waiter; returns the token to pass to :meth:`wait`."""
        return int(lib.fulmar_doorbell_prepare(self._address, self.offset))

    def cancel(self) -> None:
        """Withdraw a :meth:`prepare` without waiting (work turned up)."""
        lib.fulmar_doorbell_cancel(self._address, self.offset)

    def wait(self, token: int, timeout_ns: int) -> bool:
        """Sleep until rung or ``timeout_ns`` passes; always ends the registration.

        True if the doorbell was rung since :meth:`prepare`.  Returns False
        early when a signal arrives, so Python can run its handlers (Ctrl-C);
        callers re-check for work anyway.  The GIL is released while asleep.
        """
        result = int(lib.fulmar_doorbell_wait(self._address, self.offset, token, timeout_ns))
        if result < 0:
            raise OSError(-result, f"futex wait failed: {os.strerror(-result)}")
        return result == lib.FULMAR_DOORBELL_RUNG


WaitListener = Callable[[int], None]


class IdleStrategy:
    """Base of the idle strategies: ``idle(work_count)`` after each duty cycle.

    ``on_wait``, if set, is told the longest a strategy is about to sleep
    (ns) just before it sleeps, so a duty cycle stall tracker does not count
    an intended idle as a stall (``fulmar.duty_cycle``).
    """

    alias = "idle"
    on_wait: WaitListener | None = None

    def idle(self, work_count: int = 0) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget any backoff state (the next idle starts from the beginning)."""

    def pause(self, duration_ns: int) -> None:
        """Wait ``duration_ns`` whatever work is waiting: after a duty cycle that
        raised, so that one failing on every cycle backs off instead of spinning
        (``idle`` returns at once while work is waiting, and the work that waits
        may be what keeps failing).  The runner's back-off, never an agent's."""
        if duration_ns > 0:
            time.sleep(duration_ns / 1e9)

    def wake(self) -> None:
        """Cut short an idle in progress on another thread, where that is possible.

        Used by ``AgentRunner.close`` so a long doorbell wait does not delay
        shutdown; sleeping strategies simply finish their (short) park.
        """


class NoOpIdleStrategy(IdleStrategy):
    """Never idles: the caller loops flat out."""

    alias = "noop"

    def idle(self, work_count: int = 0) -> None:
        pass


class BusySpinIdleStrategy(IdleStrategy):
    """Spins (Python has no pause instruction to hint with, so this is NoOp with a name)."""

    alias = "spin"

    def idle(self, work_count: int = 0) -> None:
        pass


class YieldingIdleStrategy(IdleStrategy):
    """Gives the CPU to any other runnable thread when there was no work."""

    alias = "yield"

    def __init__(self, yield_: Callable[[], None] = os.sched_yield) -> None:
        self._yield = yield_

    def idle(self, work_count: int = 0) -> None:
        if work_count <= 0:
            self._yield()


def _sleep_ns(duration_ns: int) -> None:
    time.sleep(duration_ns / 1e9)


class SleepingIdleStrategy(IdleStrategy):
    """Sleeps ``period_ns`` when there was no work.

    The default is 1 ms rather than Aeron's 1 us: a Python sleep never
    returns in under ~75 us here, so a shorter period only adds wake-ups.
    """

    alias = "sleep"

    def __init__(
        self,
        period_ns: int = DEFAULT_SLEEP_PERIOD_NS,
        sleep_ns: Callable[[int], None] = _sleep_ns,
        on_wait: WaitListener | None = None,
    ) -> None:
        if period_ns <= 0:
            raise ValueError(f"sleep period must be positive, not {period_ns} ns")
        self.period_ns = period_ns
        self._sleep_ns = sleep_ns
        self.on_wait = on_wait

    def idle(self, work_count: int = 0) -> None:
        if work_count <= 0:
            if self.on_wait is not None:
                self.on_wait(self.period_ns)
            self._sleep_ns(self.period_ns)


class BackoffIdleStrategy(IdleStrategy):
    """Aeron's backoff: spin ``max_spins`` times, yield ``max_yields`` times, then
    park for ``min_park_ns``, doubling each time up to ``max_park_ns``.

    Any work resets it to the start.  ``sleep_ns`` and ``yield_`` are
    injectable so the progression can be tested without real time.
    """

    alias = "backoff"

    _NOT_IDLE, _SPINNING, _YIELDING, _PARKING = range(4)

    def __init__(
        self,
        max_spins: int = 10,
        max_yields: int = 5,
        min_park_ns: int = 1_000,
        max_park_ns: int = 1_000_000,
        *,
        sleep_ns: Callable[[int], None] = _sleep_ns,
        yield_: Callable[[], None] = os.sched_yield,
        on_wait: WaitListener | None = None,
    ) -> None:
        if max_spins < 0 or max_yields < 0:
            raise ValueError("max_spins and max_yields must not be negative")
        if not 0 < min_park_ns <= max_park_ns:
            raise ValueError(f"need 0 < min_park_ns <= max_park_ns, got {min_park_ns} and {max_park_ns}")
        self.max_spins = max_spins
        self.max_yields = max_yields
        self.min_park_ns = min_park_ns
        self.max_park_ns = max_park_ns
        self._sleep_ns = sleep_ns
        self._yield = yield_
        self.on_wait = on_wait
        self.reset()

    def reset(self) -> None:
        self._state = self._NOT_IDLE
        self._spins = 0
        self._yields = 0
        self.park_period_ns = self.min_park_ns

    def idle(self, work_count: int = 0) -> None:
        if work_count > 0:
            self.reset()
            return
        state = self._state
        if state == self._NOT_IDLE:
            self._state = self._SPINNING
            self._spins += 1
        elif state == self._SPINNING:
            self._spins += 1
            if self._spins > self.max_spins:
                self._state = self._YIELDING
                self._yields = 0
        elif state == self._YIELDING:
            self._yields += 1
            if self._yields > self.max_yields:
                self._state = self._PARKING
                self.park_period_ns = self.min_park_ns
            else:
                self._yield()
        else:
            if self.on_wait is not None:
                self.on_wait(self.park_period_ns)
            self._sleep_ns(self.park_period_ns)
            self.park_period_ns = min(self.park_period_ns * 2, self.max_park_ns)


class DoorbellIdleStrategy(IdleStrategy):
    """Sleep on a doorbell for up to ``max_wait_ns`` after ``spins`` empty cycles (default none).

    ``max_wait_ns`` is the agent's periodic-work interval: an idle agent
    costs one wake-up per interval and no CPU in between, and a ring ends the
    sleep within microseconds.  ``has_work`` is a cheap check (the agent's
    own, or e.g. "is the ring buffer's tail ahead of my head?") made after
    registering as a waiter: with it no ring is ever missed; without it, work
    that arrives between the last ``do_work`` and the wait waits up to
    ``max_wait_ns``.
    """

    alias = "doorbell"

    def __init__(
        self,
        doorbell: Doorbell,
        max_wait_ns: int = DEFAULT_DOORBELL_MAX_WAIT_NS,
        spins: int = DEFAULT_DOORBELL_SPINS,
        has_work: Callable[[], bool] | None = None,
        on_wait: WaitListener | None = None,
    ) -> None:
        if max_wait_ns <= 0:
            raise ValueError(f"max_wait_ns must be positive, not {max_wait_ns}")
        if spins < 0:
            raise ValueError(f"spins must not be negative, not {spins}")
        self.doorbell = doorbell
        self.max_wait_ns = max_wait_ns
        self.spins = spins
        self.has_work = has_work
        self.on_wait = on_wait
        self._empty_cycles = 0

    def reset(self) -> None:
        self._empty_cycles = 0

    def idle(self, work_count: int = 0) -> None:
        if work_count > 0:
            self._empty_cycles = 0
            return
        if self._empty_cycles < self.spins:
            self._empty_cycles += 1
            return
        # Not reset after the wait: an agent woken only by its timeout goes
        # straight back to sleep instead of spinning again.
        doorbell = self.doorbell
        token = doorbell.prepare()
        if self.has_work is not None and self.has_work():
            doorbell.cancel()
            return
        if self.on_wait is not None:
            self.on_wait(self.max_wait_ns)
        doorbell.wait(token, self.max_wait_ns)

    def wake(self) -> None:
        self.doorbell.ring()


IDLE_STRATEGY_NAMES = ("doorbell[:max-wait]", "backoff", "sleep[:period]", "yield", "spin", "noop")


def idle_strategy_from_name(
    name: str,
    *,
    doorbell: Doorbell | None = None,
    max_wait_ns: int = DEFAULT_DOORBELL_MAX_WAIT_NS,
    has_work: Callable[[], bool] | None = None,
    on_wait: WaitListener | None = None,
) -> IdleStrategy:
    """Build an idle strategy from configuration text.

    ``doorbell``, ``doorbell:20ms`` (needs ``doorbell``; the suffix overrides
    ``max_wait_ns``), ``backoff``, ``sleep`` / ``sleep:1ms``, ``yield``,
    ``spin``, ``noop``.  ``on_wait`` is told of each sleep (see ``IdleStrategy``).
    """
    kind, colon, argument = name.strip().partition(":")
    kind = kind.lower()
    duration_ns = None
    if colon:
        if kind not in ("sleep", "doorbell"):
            raise ValueError(f"idle strategy {name!r}: only sleep and doorbell take a duration")
        try:
            duration_ns = parse_duration_ns(argument)
        except ValueError as exc:
            raise ValueError(f"idle strategy {name!r}: bad duration {argument!r}: {exc}") from None
        if duration_ns <= 0:
            raise ValueError(f"idle strategy {name!r}: the duration must be positive")
    if kind == "doorbell":
        if doorbell is None:
            raise ValueError(f"idle strategy {name!r} needs a doorbell to wait on")
        return DoorbellIdleStrategy(doorbell, duration_ns or max_wait_ns, has_work=has_work, on_wait=on_wait)
    if kind == "sleep":
        return SleepingIdleStrategy(duration_ns or DEFAULT_SLEEP_PERIOD_NS, on_wait=on_wait)
    if kind == "backoff":
        return BackoffIdleStrategy(on_wait=on_wait)
    if kind == "yield":
        return YieldingIdleStrategy()
    if kind in ("spin", "busy-spin"):
        return BusySpinIdleStrategy()
    if kind == "noop":
        return NoOpIdleStrategy()
    raise ValueError(f"unknown idle strategy {name!r}; expected one of {', '.join(IDLE_STRATEGY_NAMES)}")
