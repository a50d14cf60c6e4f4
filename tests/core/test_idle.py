"""Idle strategies and the futex doorbell, in one process and across processes."""

from __future__ import annotations

import multiprocessing.process
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from conftest import FORK

from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.idle import (
    DOORBELL_LENGTH,
    BackoffIdleStrategy,
    BusySpinIdleStrategy,
    Doorbell,
    DoorbellIdleStrategy,
    NoOpIdleStrategy,
    SleepingIdleStrategy,
    YieldingIdleStrategy,
    idle_strategy_from_name,
)

MS = 1_000_000

# Layout of the file shared with waiter processes.
BELL = 0
WAKE_TIME = 8  # i64: monotonic ns when the waiter returned
RESULT = 16  # i64: 1 rung, 0 timed out, set last (the "done" flag is DONE)
ELAPSED = 24  # i64: ns the waiter spent in wait()
DONE = 32  # i64: 1 once the fields above are written
FILE_LENGTH = 64


def poll(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Wait for ``condition`` with a deadline, yielding the CPU between checks."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.0005)


@pytest.fixture
def bell() -> Doorbell:
    return Doorbell(AtomicBuffer(bytearray(64)), 8)


# --- idle strategies ----------------------------------------------------------------


def test_backoff_spins_then_yields_then_parks_with_doubling_sleeps() -> None:
    events: list[str] = []
    strategy = BackoffIdleStrategy(
        max_spins=3,
        max_yields=2,
        min_park_ns=1_000,
        max_park_ns=8_000,
        sleep_ns=lambda ns: events.append(f"sleep {ns}"),
        yield_=lambda: events.append("yield"),
    )
    for _ in range(12):
        events.append("|")
        strategy.idle(0)
    # Four idles spin (the first leaves NOT_IDLE), two yield, one enters
    # PARKING, then the parks double up to the cap.
    assert "".join(e if e == "|" else f"[{e}]" for e in events) == (
        "|||||[yield]|[yield]||[sleep 1000]|[sleep 2000]|[sleep 4000]|[sleep 8000]|[sleep 8000]"
    )

    # Work resets it to spinning; so does reset().
    events.clear()
    strategy.idle(1)
    for _ in range(4):
        strategy.idle(0)
    assert events == []
    strategy.idle(0)
    assert events == ["yield"]
    strategy.reset()
    events.clear()
    for _ in range(4):
        strategy.idle()
    assert events == []


def test_backoff_validates_its_parameters() -> None:
    with pytest.raises(ValueError, match="min_park_ns <= max_park_ns"):
        BackoffIdleStrategy(min_park_ns=10, max_park_ns=5)
    with pytest.raises(ValueError, match="must not be negative"):
        BackoffIdleStrategy(max_spins=-1)


def test_sleeping_and_yielding_idle_only_without_work() -> None:
    sleeps: list[int] = []
    sleeping = SleepingIdleStrategy(250_000, sleep_ns=sleeps.append)
    sleeping.idle(3)
    sleeping.idle(0)
    sleeping.idle()
    assert sleeps == [250_000, 250_000]
    with pytest.raises(ValueError):
        SleepingIdleStrategy(0)

    yields: list[None] = []
    yielding = YieldingIdleStrategy(yield_=lambda: yields.append(None))
    yielding.idle(1)
    yielding.idle(0)
    assert len(yields) == 1


def test_idle_strategy_from_name(bell: Doorbell) -> None:
    assert isinstance(idle_strategy_from_name("spin"), BusySpinIdleStrategy)
    assert isinstance(idle_strategy_from_name("noop"), NoOpIdleStrategy)
    assert isinstance(idle_strategy_from_name("yield"), YieldingIdleStrategy)
    assert isinstance(idle_strategy_from_name(" Backoff "), BackoffIdleStrategy)
    sleeping = idle_strategy_from_name("sleep:250us")
    assert isinstance(sleeping, SleepingIdleStrategy) and sleeping.period_ns == 250_000
    assert isinstance(idle_strategy_from_name("sleep"), SleepingIdleStrategy)
    doorbell = idle_strategy_from_name("doorbell:20ms", doorbell=bell, max_wait_ns=5 * MS)
    assert isinstance(doorbell, DoorbellIdleStrategy) and doorbell.max_wait_ns == 20 * MS
    doorbell = idle_strategy_from_name("doorbell", doorbell=bell, max_wait_ns=5 * MS)
    assert isinstance(doorbell, DoorbellIdleStrategy) and doorbell.max_wait_ns == 5 * MS

    with pytest.raises(ValueError, match="needs a doorbell"):
        idle_strategy_from_name("doorbell")
    with pytest.raises(ValueError, match="unknown idle strategy 'busy'"):
        idle_strategy_from_name("busy")
    with pytest.raises(ValueError, match="bad duration '1 ms'"):
        idle_strategy_from_name("sleep:1 ms")
    with pytest.raises(ValueError, match="must be positive"):
        idle_strategy_from_name("sleep:0ms")
    with pytest.raises(ValueError, match="only sleep and doorbell take a duration"):
        idle_strategy_from_name("yield:1ms")


# --- doorbell in one process ------------------------------------------------------------


def test_doorbell_placement_is_checked() -> None:
    buffer = AtomicBuffer(bytearray(16))
    with pytest.raises(ValueError, match="not 8-byte aligned"):
        Doorbell(buffer, 4)
    with pytest.raises(IndexError):
        Doorbell(buffer, 16 - DOORBELL_LENGTH + 8)  # past the end


def test_ring_without_waiters_leaves_the_sequence_alone(bell: Doorbell) -> None:
    for _ in range(3):
        assert bell.ring() is False
    assert (bell.sequence, bell.waiters) == (0, 0)


def test_prepare_ring_wait_and_cancel(bell: Doorbell) -> None:
    token = bell.prepare()
    assert (token, bell.waiters) == (0, 1)
    assert bell.ring() is True
    assert bell.sequence == 1
    # Rung between prepare and wait: returns at once, registration ended.
    started = time.monotonic()
    assert bell.wait(token, 5_000 * MS) is True
    assert time.monotonic() - started < 1.0
    assert bell.waiters == 0

    token = bell.prepare()
    bell.cancel()
    assert bell.waiters == 0 and bell.ring() is False and bell.sequence == 1


def test_unrung_wait_returns_at_its_timeout(bell: Doorbell) -> None:
    token = bell.prepare()
    started = time.monotonic_ns()
    assert bell.wait(token, 30 * MS) is False
    elapsed = time.monotonic_ns() - started
    assert 30 * MS <= elapsed < 500 * MS
    assert bell.waiters == 0
    token = bell.prepare()
    assert bell.wait(token, 0) is False and bell.waiters == 0


def test_wait_releases_the_gil(bell: Doorbell) -> None:
    outcome: list[bool] = []
    waiter = threading.Thread(target=lambda: outcome.append(bell.wait(bell.prepare(), 10_000 * MS)))
    waiter.start()
    try:
        poll(lambda: bell.waiters == 1, what="the waiter thread to register")
        # This thread keeps running Python while the other one sits in the
        # native wait: with the GIL held we would get here only after its
        # 10 s timeout, and it would then report "not rung".
        counted = sum(range(100_000))
        assert counted > 0 and waiter.is_alive()
        assert bell.ring() is True
        waiter.join(5.0)
        assert not waiter.is_alive()
        assert outcome == [True]
    finally:
        bell.ring()
        waiter.join(5.0)


def test_a_signal_cuts_a_wait_short_so_handlers_run(bell: Doorbell) -> None:
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    main = threading.get_ident()
    returned = threading.Event()

    def interrupt_main_until_it_returns() -> None:
        poll(lambda: bell.waiters == 1, what="the main thread to wait")
        # Repeated: a signal that lands between prepare and the futex sleep
        # only sets Python's flag; a later one interrupts the sleep.
        while not returned.wait(0.05):
            signal.pthread_kill(main, signal.SIGUSR1)

    interrupter = threading.Thread(target=interrupt_main_until_it_returns)
    interrupter.start()
    try:
        started = time.monotonic()
        assert bell.wait(bell.prepare(), 10_000 * MS) is False
        assert time.monotonic() - started < 5.0
        assert received and bell.waiters == 0
    finally:
        returned.set()
        interrupter.join(10.0)
        signal.signal(signal.SIGUSR1, previous)


def test_doorbell_idle_strategy_spins_then_checks_for_work_then_waits(bell: Doorbell) -> None:
    checks: list[int] = []

    def has_work() -> bool:
        checks.append(bell.waiters)  # registered before it looks
        return True

    strategy = DoorbellIdleStrategy(bell, max_wait_ns=10_000 * MS, spins=3, has_work=has_work)
    for _ in range(3):
        strategy.idle(0)
    assert checks == []  # still spinning
    strategy.idle(0)
    assert checks == [1] and bell.waiters == 0  # work found: cancelled, no wait
    strategy.idle(5)  # work resets the spins
    strategy.idle(0)
    assert checks == [1]


def test_doorbell_idle_strategy_times_out_and_wakes(bell: Doorbell) -> None:
    strategy = DoorbellIdleStrategy(bell, max_wait_ns=20 * MS, spins=0)
    started = time.monotonic_ns()
    strategy.idle(0)
    assert time.monotonic_ns() - started >= 20 * MS

    # wake() from another thread ends a long wait (what AgentRunner.close uses).
    long_wait = DoorbellIdleStrategy(bell, max_wait_ns=10_000 * MS, spins=0)
    idler = threading.Thread(target=long_wait.idle)
    idler.start()
    try:
        poll(lambda: bell.waiters == 1, what="the idler to wait")
        long_wait.wake()
        idler.join(5.0)
        assert not idler.is_alive()
    finally:
        bell.ring()
        idler.join(5.0)


# --- doorbell across processes ------------------------------------------------------------


def _waiter(path: str, timeout_ns: int) -> None:
    with MappedFile.open(path) as mapped:
        buffer = mapped.buffer()
        bell = Doorbell(buffer, BELL)
        token = bell.prepare()
        started = time.monotonic_ns()
        rung = bell.wait(token, timeout_ns)
        woke = time.monotonic_ns()
        buffer.put_int64(WAKE_TIME, woke)
        buffer.put_int64(ELAPSED, woke - started)
        buffer.put_int64(RESULT, int(rung))
        buffer.put_int64_ordered(DONE, 1)


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[MappedFile]:
    mapped = MappedFile.create(tmp_path / "doorbell.dat", FILE_LENGTH)
    try:
        yield mapped
    finally:
        mapped.close()
        mapped.path.unlink(missing_ok=True)


def _start_waiter(
    shared: MappedFile, timeout_ns: int, processes: list[multiprocessing.process.BaseProcess]
) -> multiprocessing.process.BaseProcess:
    waiter = FORK.Process(target=_waiter, args=(str(shared.path), timeout_ns), daemon=True)
    processes.append(waiter)
    waiter.start()
    return waiter


@pytest.mark.system
@pytest.mark.system
def test_cross_process_ring_wakes_an_idle_waiter_that_burns_no_cpu(
    shared: MappedFile, child_processes: list[multiprocessing.process.BaseProcess]
) -> None:
    buffer = shared.buffer()
    bell = Doorbell(buffer, BELL)
    waiter = _start_waiter(shared, 10_000 * MS, child_processes)
    poll(lambda: bell.waiters == 1, what="the waiter process to register")

    # CPU the waiter uses while blocked: sampled over a fixed window (a
    # measurement, not synchronisation).
    process = psutil.Process(waiter.pid)
    before = process.cpu_times()
    time.sleep(0.3)
    after = process.cpu_times()
    busy_s = (after.user - before.user) + (after.system - before.system)
    assert busy_s < 0.03, f"waiter used {busy_s:.3f} s of CPU in 0.3 s while idle"
    assert buffer.get_int64_volatile(DONE) == 0

    rung_at = time.monotonic_ns()
    assert bell.ring() is True
    poll(lambda: buffer.get_int64_volatile(DONE) == 1, what="the waiter to report")
    wake_latency_ns = buffer.get_int64(WAKE_TIME) - rung_at
    assert buffer.get_int64(RESULT) == 1
    # Far below the 10 s timeout: woken by the ring, not by the clock.
    assert 0 < wake_latency_ns < 200 * MS, f"woke {wake_latency_ns / 1e3:.0f} us after the ring"
    waiter.join(5.0)
    assert waiter.exitcode == 0
    assert bell.waiters == 0


@pytest.mark.system
@pytest.mark.system
def test_cross_process_unrung_wait_returns_at_its_timeout(
    shared: MappedFile, child_processes: list[multiprocessing.process.BaseProcess]
) -> None:
    buffer = shared.buffer()
    waiter = _start_waiter(shared, 100 * MS, child_processes)
    poll(lambda: buffer.get_int64_volatile(DONE) == 1, what="the waiter to time out")
    assert buffer.get_int64(RESULT) == 0
    assert 100 * MS <= buffer.get_int64(ELAPSED) < 1_000 * MS
    waiter.join(5.0)
    assert waiter.exitcode == 0
    assert Doorbell(buffer, BELL).waiters == 0
