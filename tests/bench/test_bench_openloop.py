"""``bench.openloop``: the open-loop schedule and its accounting of late,
unanswered and failed messages, driven with a synthetic clock."""

from __future__ import annotations

import pytest

from bench import openloop
from bench.openloop import OpenLoop

MS = 1_000_000


def test_all_answered_on_time() -> None:
    loop = OpenLoop(rate=1_000, warmup_s=0.01, seconds=0.09, drain_s=0.5, start_ns=0)
    assert loop.total == 100 and loop.warmup == 10
    assert loop.due(-1) is None
    for sequence in range(100):
        now = sequence * MS
        assert loop.due(now) == sequence
        loop.on_sent(sequence, now)
        assert loop.due(now) is None
        loop.on_answer(sequence, now + 2 * MS)  # 2 ms round trip each
    assert loop.done(100 * MS)
    summary = loop.summary()
    assert summary["unanswered"] == 0 and summary["late_sends"] == 0 and summary["answered"] == 100
    assert loop.histogram.get_total_count() == 90  # the warm-up is not recorded
    assert loop.histogram.get_value_at_percentile(50) == pytest.approx(2 * MS, rel=1e-3)
    assert summary["achieved_rate"] == pytest.approx(100 / 0.101, rel=1e-6)


def test_overload_counts_unanswered_and_measures_from_intended_time() -> None:
    loop = OpenLoop(rate=1_000, warmup_s=0, seconds=0.1, drain_s=0.05, start_ns=0)
    # The client is stuck 30 ms, then sends everything due at once: each is late.
    now = 30 * MS
    while (sequence := loop.due(now)) is not None:
        loop.on_sent(sequence, now)
    assert loop.sent == 31 and loop.late_sends == 29  # 0..30 due; 0..28 more than one interval (1 ms) late
    loop.on_answer(0, 31 * MS)
    assert loop.histogram.get_max_value() == pytest.approx(31 * MS, rel=1e-3)  # from intended time 0, not 30 ms
    loop.on_answer(1, 40 * MS, ok=False)  # an error: answered, not recorded, still not a good answer
    assert not loop.done(149 * MS)
    assert loop.wait_ns(149 * MS) == 1  # message 31 is overdue
    assert loop.done(150 * MS) and loop.closed  # drain deadline: 100 ms schedule + 50 ms
    loop.on_answer(2, 151 * MS)  # after the deadline: ignored
    summary = loop.summary()
    assert summary["answered"] == 2 and summary["failed"] == 1
    assert summary["unanswered"] == 100 - 2 + 1
    assert summary["achieved_rate"] == pytest.approx(1 / 0.031)  # one good answer by 31 ms; the error not counted
    assert loop.due(151 * MS) is None  # nothing sent after the deadline
    assert loop.histogram.get_total_count() == 1


def test_late_sends_allowed_until_drain_deadline() -> None:
    loop = OpenLoop(rate=100, warmup_s=0, seconds=0.02, drain_s=0.1, start_ns=0)
    assert loop.total == 2 and loop.end_ns == 20 * MS
    loop.on_sent(0, 0)
    assert loop.due(50 * MS) == 1  # overdue after the schedule's end, before the deadline
    assert loop.due(120 * MS) is None


def test_rows_named_alike() -> None:
    histogram = openloop.new_histogram()
    for value in (1_000, 2_000, 3_000):
        histogram.record_value(value)
    summary = {"achieved_rate": 10.0, "late_sends": 1, "unanswered": 2}
    rows = openloop.latency_rows("cluster3", 10_000, histogram, summary)
    names = [row["name"] for row in rows]
    assert names[0] == "cluster3 echo RTT at 10,000/s p50" and rows[0]["histogram"] is histogram
    assert rows[0]["histogram_id"] == "rtt-10000" and rows[4]["value"] == pytest.approx(3.0, rel=1e-2)
    assert names[-1] == "cluster3 echo RTT at 10,000/s, unanswered" and rows[-1]["value"] == 2
    empty = openloop.latency_rows("pysyncobj", 50_000, openloop.new_histogram(), summary)
    assert [row["value"] for row in empty[:5]] == [None] * 5  # no figure, rather than 0
    ping = openloop.ping_rows("pysyncobj", histogram)
    assert ping[0]["name"] == "pysyncobj echo ping 32 B p50" and ping[-1]["value"] == 3
    assert openloop.throughput_rows("cluster", 288, 1000, 2000, 2.0)[0]["throughput_plot"] == {"size": 288}
