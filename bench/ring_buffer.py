"""Many-to-one ring buffer throughput: the Python API next to the same loop in C.

Both loops write a batch of 32-byte messages (up to 256, or until the ring is
full), then read everything back, and repeat; one process, no contention.  The
C loop (``fulmar_rb_bench``) calls the very functions the Python API calls, so
the ratio is the cost of driving them from Python.
"""

from __future__ import annotations

import time
from typing import Any

from fulmar._native import lib
from fulmar.buffers import AtomicBuffer
from fulmar.ring_buffer import TRAILER_LENGTH, ManyToOneRingBuffer

CAPACITY = 1 << 20  # the default to-driver buffer
MESSAGE_LENGTH = 32
BATCH = 256


def _new_ring() -> ManyToOneRingBuffer:
    return ManyToOneRingBuffer(AtomicBuffer(bytearray(CAPACITY + TRAILER_LENGTH)))


def python_rate(duration_s: float) -> float:
    """Messages per second written and read through the Python API."""
    ring = _new_ring()
    payload = bytes(MESSAGE_LENGTH)
    write = ring.write
    read = ring.read
    touched = 0

    def handler(msg_type_id: int, body: memoryview) -> None:
        # The minimum a real handler does: look at the message.
        nonlocal touched
        touched += msg_type_id + len(body)

    messages = 0
    start = time.perf_counter()
    deadline = start + duration_s
    while True:
        for _ in range(BATCH):
            if not write(1, payload):
                break
        messages += read(handler)
        now = time.perf_counter()
        if now >= deadline:
            return messages / (now - start)


def c_rate(duration_s: float) -> float:
    """Messages per second for the same loop run entirely in C."""
    ring = _new_ring()
    address = ring.buffer.address
    count = 100_000
    while True:
        start = time.perf_counter()
        read = lib.fulmar_rb_bench(address, ring.capacity, count, MESSAGE_LENGTH, BATCH)
        elapsed = time.perf_counter() - start
        if read != count:
            raise RuntimeError(f"fulmar_rb_bench read {read} of {count} messages")
        if elapsed >= duration_s * 0.8:
            return count / elapsed
        # Aim the next run at the wanted duration.
        count = int(count * min(100.0, duration_s / max(elapsed, 1e-6)))


def run(quick: bool) -> list[dict[str, Any]]:
    duration_s = 0.3 if quick else 1.5
    reference = c_rate(duration_s)
    value = python_rate(duration_s)
    return [
        {
            "name": f"mpsc ring buffer {MESSAGE_LENGTH} B write+read (Python, batch)",
            "value": value,
            "unit": "msgs/s",
            "reference": reference,
        }
    ]


if __name__ == "__main__":
    import sys

    for result in run("--quick" in sys.argv):
        ratio = result["reference"] / result["value"]
        print(
            f"{result['name']}: {result['value']:,.0f} {result['unit']} "
            f"(C: {result['reference']:,.0f}, {ratio:.1f}x faster)"
        )
