"""What the echo benchmarks of the three cluster modules (``bench.cluster``,
``bench.cluster3``, ``bench.pysyncobj_peer``) share, whatever the client:
the method's constants, the open-loop schedule and its accounting, and the
rows (same names after the module's prefix, so the table's ratio column
pairs ``cluster3 X`` with ``pysyncobj X``).

Open loop: message ``i`` is due at ``start + i / rate``; its round trip is
measured from that intended time, so a send delayed by back pressure or a
busy client counts in full (no coordinated omission).  The schedule ends
after ``warmup_s + seconds``; messages still due then (a client behind its
schedule) may go out late until the drain deadline, ``drain_s`` after the
schedule's end.  Whatever is not answered by that deadline (never sent
included) is counted as unanswered, not waited for: a system that cannot
sustain the rate still gives its row, in bounded time, with the rate it
achieved.  The percentiles
are those of the answered messages after the warm-up.

Pure bookkeeping (no I/O, no clock of its own): the callers pass the time.
"""

from __future__ import annotations

from typing import Any

from hdrh.histogram import HdrHistogram

SIZES = (32, 288, 1344)  # payload bytes of the throughput runs
WINDOW = 1000  # messages in flight in the throughput runs
EXTRA_WINDOW = 64  # full runs only: 32 B with a small window too
RATES = (1_000, 10_000, 50_000)  # offered rates of the open-loop runs, msgs/s
LATENCY_SIZE = 32  # payload bytes of the latency and ping runs
PERCENTILES = (50, 90, 99, 99.9)
HISTOGRAM_RANGE = (1, 100_000_000_000, 3)  # ns: 1 ns .. 100 s, 3 significant digits


def new_histogram() -> HdrHistogram:
    return HdrHistogram(*HISTOGRAM_RANGE)


class OpenLoop:
    """The schedule and accounting of one open-loop run (times in ns, on the caller's clock)."""

    def __init__(self, rate: int, warmup_s: float, seconds: float, drain_s: float, start_ns: int) -> None:
        self.rate = rate
        self.interval_ns = 1_000_000_000 // rate
        self.warmup = int(warmup_s * rate)
        self.total = self.warmup + int(seconds * rate)
        self.start_ns = start_ns
        self.end_ns = start_ns + self.total * self.interval_ns  # the schedule's end: no send intended after it
        self.drain_deadline_ns = self.end_ns + int(drain_s * 1e9)
        self.histogram = new_histogram()
        self.sent = 0
        self.answered = 0
        self.failed = 0  # answered with an error (PySyncObj's callbacks can be)
        self.late_sends = 0  # sent more than one interval after their intended time
        self.max_send_lag_ns = 0
        self.last_answer_ns = 0
        self.closed = False  # after the drain deadline: answers no longer counted

    def intended(self, sequence: int) -> int:
        return self.start_ns + sequence * self.interval_ns

    def due(self, now_ns: int) -> int | None:
        """The sequence number to send now, if one is due (and the drain deadline not passed)."""
        if self.sent < self.total and now_ns < self.drain_deadline_ns and now_ns >= self.intended(self.sent):
            return self.sent
        return None

    def on_sent(self, sequence: int, now_ns: int) -> None:
        lag = now_ns - self.intended(sequence)
        if lag > self.interval_ns:
            self.late_sends += 1
        self.max_send_lag_ns = max(self.max_send_lag_ns, lag)
        self.sent = sequence + 1

    def on_answer(self, sequence: int, now_ns: int, ok: bool = True) -> None:
        if self.closed:
            return
        self.answered += 1
        if not ok:
            self.failed += 1
            return
        self.last_answer_ns = now_ns
        if sequence >= self.warmup:
            self.histogram.record_value(max(1, now_ns - self.intended(sequence)))

    def done(self, now_ns: int) -> bool:
        """Every message answered, or the drain deadline passed (then closed: later answers ignored)."""
        if self.answered >= self.total:
            return True
        if now_ns >= self.drain_deadline_ns:
            self.closed = True
            return True
        return False

    def wait_ns(self, now_ns: int) -> int:
        """How long the caller may wait for answers before it has something to do (at least 1)."""
        if self.sent < self.total and now_ns < self.drain_deadline_ns:
            return max(1, self.intended(self.sent) - now_ns)
        return max(1, self.drain_deadline_ns - now_ns)

    @property
    def unanswered(self) -> int:
        """Messages of the schedule without a good answer: never sent, not answered by
        the drain deadline, or answered with an error."""
        return self.total - self.answered + self.failed

    def achieved_rate(self) -> float:
        """Good answers (errors not counted) per second, from the first intended send to the last one."""
        good = self.answered - self.failed
        if not good or self.last_answer_ns <= self.start_ns:
            return 0.0
        return good / ((self.last_answer_ns - self.start_ns) / 1e9)

    def summary(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "sent": self.sent,
            "answered": self.answered,
            "failed": self.failed,
            "unanswered": self.unanswered,
            "late_sends": self.late_sends,
            "max_send_lag_us": self.max_send_lag_ns / 1000,
            "achieved_rate": self.achieved_rate(),
        }


# ------------------------------------------------------------------ rows


def _row(name: str, value: float | None, unit: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "reference": None, **extra}


def percentile_rows(label: str, histogram: HdrHistogram, histogram_id: str) -> list[dict[str, Any]]:
    """p50 .. p99.9 and max in us (None when the histogram is empty); the p50
    row carries the histogram and its id (``__main__`` writes it out and plots it)."""
    rows = []
    empty = not histogram.get_total_count()  # nothing answered after the warm-up: no figure (None), not 0
    for percentile in PERCENTILES:
        value = None if empty else histogram.get_value_at_percentile(percentile) / 1000
        rows.append(_row(f"{label} p{percentile}", value, "us"))
    rows.append(_row(f"{label} max", None if empty else histogram.get_max_value() / 1000, "us"))
    rows[0]["histogram"] = histogram
    rows[0]["histogram_id"] = histogram_id
    return rows


def throughput_rows(prefix: str, size: int, window: int, count: int, elapsed_s: float) -> list[dict[str, Any]]:
    label = f"{prefix} echo {size} B, window {window}"
    plot = {"size": size} if window == WINDOW else {}  # the throughput bars: the main window only
    if count <= 0 or elapsed_s <= 0:  # nothing answered (PySyncObj's calls can be lost): no figure
        return [_row(label, None, "msgs/s", throughput_plot=plot or None), _row(f"{label} MB/s", None, "MB/s")]
    return [
        _row(label, count / elapsed_s, "msgs/s", throughput_plot=plot or None),
        _row(f"{label} MB/s", count * size / elapsed_s / 1e6, "MB/s"),
    ]


def latency_rows(prefix: str, rate: int, histogram: HdrHistogram, summary: dict[str, Any]) -> list[dict[str, Any]]:
    label = f"{prefix} echo RTT at {rate:,}/s"
    return percentile_rows(label, histogram, f"rtt-{rate}") + [
        _row(f"{label}, achieved", summary["achieved_rate"], "msgs/s"),
        _row(f"{label}, sends >1 interval late", summary["late_sends"], "msgs"),
        _row(f"{label}, unanswered", summary["unanswered"], "msgs"),
    ]


def ping_rows(prefix: str, histogram: HdrHistogram) -> list[dict[str, Any]]:
    label = f"{prefix} echo ping {LATENCY_SIZE} B"
    return percentile_rows(label, histogram, "ping") + [
        _row(f"{label}, round trips", histogram.get_total_count(), "msgs")
    ]


def describe(prefix: str, rate: int, summary: dict[str, Any]) -> str:
    """One line for the log when a run did not get every answer."""
    return (
        f"{prefix}: at {rate:,}/s offered, {summary['sent']:,} of {summary['total']:,} sent by the deadline, "
        f"{summary['answered']:,} answered ({summary['failed']:,} with an error), {summary['unanswered']:,} "
        f"unanswered at the drain deadline; achieved {summary['achieved_rate']:,.0f}/s, max send lag "
        f"{summary['max_send_lag_us'] / 1000:,.1f} ms"
    )


class EchoSettings:
    """Counts and durations of one module's echo runs (quick or full)."""

    def __init__(self, quick: bool, count: int) -> None:
        self.count = count  # messages per throughput case
        # (size, window) throughput cases: window 1000 for every size, plus 32 B at 64 in full runs
        self.cases = tuple((size, WINDOW) for size in SIZES)
        if not quick:
            self.cases = ((SIZES[0], EXTRA_WINDOW),) + self.cases
        self.rates = RATES
        self.warmup_s = 0.25 if quick else 1.0  # each open-loop run's first messages, not recorded
        self.seconds = 0.5 if quick else 3.0  # recorded part of each open-loop run
        self.drain_s = 0.5 if quick else 2.0  # answers waited for after the schedule's end
        self.settle_s = 1.0 if quick else 5.0  # then, not recorded: until 0.2 s without an answer, at most this
        self.pings = 200 if quick else 2_000  # one-at-a-time round trips (after PING_WARMUP)
        self.ping_max_s = 1.0 if quick else 10.0  # or fewer, when they take longer than this

    def describe(self) -> str:
        return (
            f"{self.count:,} msgs per throughput case ({', '.join(f'{s} B window {w}' for s, w in self.cases)}); "
            f"open loop at {', '.join(f'{r:,}' for r in self.rates)}/s, {LATENCY_SIZE} B, {self.warmup_s:g} s "
            f"warm-up + {self.seconds:g} s recorded + up to {self.drain_s:g} s drain; {self.pings:,} pings "
            f"(at most {self.ping_max_s:g} s)"
        )


PING_WARMUP = 20
SETTLE_QUIET_S = 0.2
