"""The consensus module's timer service: what fires when, and the next deadline
its idle strategy sleeps towards."""

from __future__ import annotations

from fulmar.consensus.timer_service import TimerService


def test_next_deadline_is_the_earliest_live_timer() -> None:
    timers = TimerService()
    assert timers.next_deadline() is None
    timers.schedule(1, 500)
    timers.schedule(2, 300)
    timers.schedule(3, 900)
    assert timers.next_deadline() == 300
    timers.cancel(2)
    assert timers.next_deadline() == 500  # the cancelled one no longer counts
    timers.schedule(1, 1_000)  # moved later: its old entry is stale
    assert timers.next_deadline() == 900
    timers.schedule(3, 100)  # moved earlier
    assert timers.next_deadline() == 100


def test_poll_fires_due_timers_in_deadline_order_and_keeps_a_refused_one() -> None:
    timers = TimerService()
    for correlation_id, deadline in ((7, 30), (8, 10), (9, 20)):
        timers.schedule(correlation_id, deadline)
    fired: list[int] = []

    def fire(correlation_id: int) -> bool:
        fired.append(correlation_id)
        return True

    assert timers.poll(25, fire) == 2
    assert fired == [8, 9]
    assert timers.poll(40, lambda cid: False) == 0  # back pressure: it stays
    assert 7 in timers and timers.next_deadline() == 30
    assert timers.poll(40, fire) == 1
    assert fired == [8, 9, 7] and len(timers) == 0 and timers.next_deadline() is None
