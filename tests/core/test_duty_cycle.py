"""Duty cycle stall tracking (seed 000): the max cycle time counters measure
from one duty cycle to the next, so a stall between cycles shows up, while an
idle strategy's intended sleep does not count as one."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar.buffers import AtomicBuffer
from fulmar.consensus import protocol as cluster_protocol
from fulmar.counters import AtomicCounter
from fulmar.driver.counters import SystemCounter
from fulmar.duty_cycle import DutyCycleStallTracker
from fulmar.idle import BackoffIdleStrategy, Doorbell, DoorbellIdleStrategy, SleepingIdleStrategy
from support.cluster import SingleNodeCluster
from support.driver import wait_for

MS = 1_000_000


class FakeClock:
    def __init__(self, now_ns: int = 1_000 * MS) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, delta_ns: int) -> int:
        self.now_ns += delta_ns
        return self.now_ns


def tracker_with(
    clock: FakeClock, threshold_ns: int = 100 * MS
) -> tuple[DutyCycleStallTracker, AtomicCounter, AtomicCounter]:
    values = AtomicBuffer(bytearray(256))
    max_cycle, exceeded = AtomicCounter(values, 0), AtomicCounter(values, 1)
    return DutyCycleStallTracker(max_cycle, exceeded, threshold_ns, clock), max_cycle, exceeded


def test_a_stall_between_cycles_counts_as_cycle_time() -> None:
    clock = FakeClock()
    tracker, max_cycle, exceeded = tracker_with(clock)
    assert tracker.measure_and_update(clock()) == 0  # the first cycle: nothing to measure from
    clock.advance(2 * MS)  # the cycle's work
    assert tracker.measure_and_update(clock()) == 2 * MS
    assert (max_cycle.get(), exceeded.get()) == (2 * MS, 0)
    clock.advance(300 * MS)  # the process stood still between two cycles (no idle wait)
    assert tracker.measure_and_update(clock()) == 300 * MS
    assert (max_cycle.get(), exceeded.get()) == (300 * MS, 1)
    clock.advance(1 * MS)
    tracker.measure_and_update(clock())
    assert (max_cycle.get(), exceeded.get()) == (300 * MS, 1)  # the max stays, one stall counted


def test_an_idle_wait_that_times_out_is_no_stall() -> None:
    clock = FakeClock()
    tracker, max_cycle, exceeded = tracker_with(clock, threshold_ns=5 * MS)
    tracker.update(clock())
    for _ in range(5):
        clock.advance(1 * MS)  # work
        tracker.on_idle_wait(10 * MS)
        clock.advance(10 * MS)  # the doorbell wait runs to its timeout
        assert tracker.measure_and_update(clock()) == 1 * MS
    clock.advance(1 * MS)
    tracker.on_idle_wait(10 * MS)
    clock.advance(3 * MS)  # rung early: the gap is work and a short sleep
    assert tracker.measure_and_update(clock()) == 1 * MS
    assert (max_cycle.get(), exceeded.get()) == (1 * MS, 0)


def test_a_stall_during_an_idle_wait_counts_what_overran_it() -> None:
    clock = FakeClock()
    tracker, max_cycle, exceeded = tracker_with(clock)
    tracker.update(clock())
    clock.advance(1 * MS)
    tracker.on_idle_wait(10 * MS)
    clock.advance(300 * MS)  # stopped while asleep: woke 290 ms after its timeout
    assert tracker.measure_and_update(clock()) == 291 * MS
    assert (max_cycle.get(), exceeded.get()) == (291 * MS, 1)
    # The allowance is for one wait: the next gap without a wait counts whole.
    clock.advance(20 * MS)
    assert tracker.measure_and_update(clock()) == 20 * MS


def test_the_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threshold"):
        tracker_with(FakeClock(), threshold_ns=0)


def test_idle_strategies_report_only_the_sleeps_they_take() -> None:
    bell = Doorbell(AtomicBuffer(bytearray(64)), 8)
    waits: list[int] = []
    work = [True]
    doorbell = DoorbellIdleStrategy(bell, 1 * MS, spins=1, has_work=lambda: work[0], on_wait=waits.append)
    doorbell.idle(1)  # work done: no idle
    doorbell.idle(0)  # the spin
    doorbell.idle(0)  # work turned up after registering: no sleep
    assert waits == []
    work[0] = False
    doorbell.idle(0)  # sleeps up to 1 ms
    assert waits == [1 * MS]

    slept: list[int] = []
    sleeping = SleepingIdleStrategy(2 * MS, sleep_ns=slept.append, on_wait=waits.append)
    sleeping.idle(1)
    sleeping.idle(0)
    assert waits[-1:] == [2 * MS] and slept == [2 * MS]

    waits.clear()
    backoff = BackoffIdleStrategy(
        max_spins=0,
        max_yields=0,
        min_park_ns=1_000,
        max_park_ns=4_000,
        sleep_ns=lambda ns: None,
        yield_=lambda: None,
        on_wait=waits.append,
    )
    for _ in range(6):
        backoff.idle(0)
    assert waits == [1_000, 2_000, 4_000]  # the three parks, not the spin and yield states before them


# --- real processes ----------------------------------------------------------------

# Over the 1 s default thresholds; idle waits (10-20 ms) and this machine's
# scheduling delays stay well under them.
STALL_S = 1.3


def stop_for(process: Any, seconds: float) -> None:
    """SIGSTOP ``process`` for ``seconds`` (an idle agent: between its duty cycles)."""
    process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        process.send_signal(signal.SIGCONT)


@pytest.mark.system
@pytest.mark.system
def test_a_stopped_media_driver_shows_the_stall_in_its_max_cycle_time(start_driver: Any) -> None:
    driver = start_driver()
    with driver.connect() as aeron:
        reader = aeron.counters_reader
        max_cycle = int(SystemCounter.CONDUCTOR_MAX_CYCLE_TIME)
        exceeded = int(SystemCounter.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED)
        before = reader.counter_value(exceeded)
        time.sleep(0.3)  # idle: its doorbell waits time out, which is no stall
        assert reader.counter_value(exceeded) == before, reader.counter_value(max_cycle)
        stop_for(driver.process, STALL_S)
        wait_for(lambda: reader.counter_value(exceeded) > before, 5, "the driver to count the stall")
        assert reader.counter_value(max_cycle) >= (STALL_S - 0.1) * 1_000_000_000


@pytest.fixture
def single_node() -> Iterator[SingleNodeCluster]:
    cluster = SingleNodeCluster("fulmar.service.samples:EchoService")
    try:
        yield cluster.start()
    finally:
        cluster.close()


def _cluster_counter(aeron: Any, type_id: int) -> int:
    for counter in aeron.counters_reader:
        if counter.type_id == type_id:
            return int(counter.counter_id)
    raise AssertionError(f"no counter of type {type_id}")


@pytest.mark.system
@pytest.mark.system
def test_a_stopped_consensus_module_shows_the_stall_in_its_max_cycle_time(single_node: SingleNodeCluster) -> None:
    aeron = single_node.connect()
    reader = aeron.counters_reader
    max_cycle = _cluster_counter(aeron, cluster_protocol.CLUSTER_MAX_CYCLE_TIME_TYPE_ID)
    exceeded = _cluster_counter(aeron, cluster_protocol.CLUSTER_CYCLE_TIME_THRESHOLD_EXCEEDED_TYPE_ID)
    state = _cluster_counter(aeron, cluster_protocol.CONSENSUS_MODULE_STATE_TYPE_ID)
    wait_for(lambda: reader.counter_value(state) == 1, 20, "the module to be ACTIVE")
    before = reader.counter_value(exceeded)
    time.sleep(0.3)  # idle: its doorbell waits time out, which is no stall
    assert reader.counter_value(exceeded) == before, reader.counter_value(max_cycle)
    assert single_node.consensus is not None
    stop_for(single_node.consensus.process, STALL_S)
    wait_for(lambda: reader.counter_value(exceeded) > before, 5, "the module to count the stall")
    assert reader.counter_value(max_cycle) >= (STALL_S - 0.1) * 1_000_000_000
