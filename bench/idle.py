"""Wake-up latency of an idle reader: how long from "writer publishes" to "reader notices".

A reader process runs a duty cycle (check a shared sequence, record the
latency, idle) under one idle strategy; this process publishes a timestamp
and the next sequence, rings the doorbell, and waits for the reader's
acknowledgement.  Before each publication the writer lets the reader go idle:
for the doorbell it waits until the reader has registered as a waiter and a
little longer, so it is asleep in the kernel rather than still re-checking
(timing that would measure a busy reader); for the sleeping and
backoff strategies it waits long enough for the reader to reach its longest
park, plus a random fraction of a park so the publication lands at a random
phase of the reader's sleep.  Both processes read CLOCK_MONOTONIC, which is
system-wide, so the reader computes the latency itself.

Also measured: the writer's cost of ``ring()`` when nobody waits (the price a
busy writer pays on every append).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from fulmar.buffers import AtomicBuffer, MappedFile
from fulmar.idle import BackoffIdleStrategy, Doorbell, DoorbellIdleStrategy, IdleStrategy, SleepingIdleStrategy

BELL = 0
SEQUENCE = 8  # i64: last published sequence (1, 2, ...); -1 tells the reader to stop
PUBLISHED_AT = 16  # i64: monotonic ns of the publication
ACK = 24  # i64: last sequence the reader saw
LATENCIES = 64  # i64[n]: the reader's measured latency per sequence

PARK_NS = 1_000_000
FORK = multiprocessing.get_context("fork")


def _strategy(name: str, bell: Doorbell, has_work: Any) -> IdleStrategy:
    if name == "doorbell":
        return DoorbellIdleStrategy(bell, max_wait_ns=100_000_000, has_work=has_work)
    if name == "sleep":
        return SleepingIdleStrategy(PARK_NS)
    return BackoffIdleStrategy(max_park_ns=PARK_NS)


def _reader(path: str, strategy_name: str) -> None:
    with MappedFile.open(path) as mapped:
        buffer = mapped.buffer()
        last = 0

        def has_work() -> bool:
            return buffer.get_int64_volatile(SEQUENCE) != last

        idle = _strategy(strategy_name, Doorbell(buffer, BELL), has_work)
        while True:
            sequence = buffer.get_int64_volatile(SEQUENCE)
            if sequence == last:
                idle.idle(0)
                continue
            if sequence < 0:
                return
            noticed = time.monotonic_ns()
            buffer.put_int64(LATENCIES + 8 * (sequence - 1), noticed - buffer.get_int64(PUBLISHED_AT))
            last = sequence
            buffer.put_int64_ordered(ACK, sequence)
            idle.idle(1)


def _wait_for(condition: Any, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench: timed out waiting for {what}")
        os.sched_yield()


def _percentile(sorted_values: list[int], fraction: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def wake_latencies_ns(strategy_name: str, samples: int, directory: Path) -> list[int]:
    path = directory / f"idle-{strategy_name}.dat"
    mapped = MappedFile.create(path, LATENCIES + 8 * samples)
    reader = FORK.Process(target=_reader, args=(str(path), strategy_name), daemon=True)
    try:
        buffer = mapped.buffer()
        bell = Doorbell(buffer, BELL)
        reader.start()
        rng = random.Random(42)
        for sequence in range(1, samples + 1):
            if strategy_name == "doorbell":
                _wait_for(lambda: bell.waiters > 0, "the reader to register on the doorbell")
                # Registered is not yet asleep: give it time to enter the
                # futex wait, or the publication is caught by its re-check
                # and we would time a busy reader.
                time.sleep(0.0001 + rng.random() * 0.0002)
            else:
                # Backoff reaches its 1 ms park ~1.5 ms after its last work.
                settle_s = 0.002 if strategy_name == "backoff" else 0.0
                time.sleep(settle_s + rng.random() * PARK_NS / 1e9)
            buffer.put_int64(PUBLISHED_AT, time.monotonic_ns())
            buffer.put_int64_ordered(SEQUENCE, sequence)
            bell.ring()
            _wait_for(lambda: buffer.get_int64_volatile(ACK) == sequence, "the reader's acknowledgement")
        buffer.put_int64_ordered(SEQUENCE, -1)
        bell.ring()
        reader.join(5.0)
        return [buffer.get_int64(LATENCIES + 8 * i) for i in range(samples)]
    finally:
        if reader.is_alive():
            reader.kill()
        reader.join(5.0)
        mapped.close()
        path.unlink(missing_ok=True)


def ring_cost_ns(rings: int) -> float:
    """Nanoseconds per ``ring()`` with no waiter, called from Python."""
    bell = Doorbell(AtomicBuffer(bytearray(8)))
    ring = bell.ring
    start = time.perf_counter_ns()
    for _ in range(rings):
        ring()
    return (time.perf_counter_ns() - start) / rings


def run(quick: bool) -> list[dict[str, Any]]:
    samples = (
        {"doorbell": 300, "sleep": 150, "backoff": 150} if quick else {"doorbell": 2000, "sleep": 600, "backoff": 600}
    )
    labels = {
        "doorbell": "doorbell (futex, rung on publish)",
        "sleep": "SleepingIdleStrategy(1 ms)",
        "backoff": "BackoffIdleStrategy(max park 1 ms)",
    }
    shm = Path("/dev/shm")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fulmar-bench-idle-", dir=shm if shm.is_dir() else None) as directory:
        for name, count in samples.items():
            latencies = sorted(wake_latencies_ns(name, count, Path(directory)))
            for label, fraction in (("p50", 0.50), ("p99", 0.99)):
                results.append(
                    {
                        "name": f"idle reader wake-up {label}: {labels[name]}",
                        "value": _percentile(latencies, fraction) / 1e3,
                        "unit": "us",
                        "reference": None,
                    }
                )
    results.append(
        {
            "name": "doorbell ring() with no waiter (writer's cost)",
            "value": ring_cost_ns(20_000 if quick else 200_000),
            "unit": "ns",
            "reference": None,
        }
    )
    return results


if __name__ == "__main__":
    for row in run(quick=False):
        print(f"{row['name']:<70} {row['value']:>10.1f} {row['unit']}")
