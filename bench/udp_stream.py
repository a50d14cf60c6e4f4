"""Two media drivers over UDP loopback, 32-byte messages: a stream's
throughput (publisher on one driver, subscriber on the other) and ping-pong
round trips (each side through its own driver), with the default idle
strategy (doorbell), with busy-spinning clients, and with the drivers' data
planes spinning after work (``--data-plane-spin``, not a default: on two
cores under load it takes the cores from the processes it would serve)."""

from __future__ import annotations

import socket
from typing import Any

from bench.ipc import Driver, ping_pong, throughput

# The spinning drivers' window: longer than a round trip's other hops, so the
# reply finds its driver polling.
DATA_PLANE_SPIN_NS = 100_000


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(quick: bool) -> list[dict[str, Any]]:
    count = 200_000 if quick else 1_000_000
    samples = 1_000 if quick else 10_000
    a, b = Driver(), Driver()
    results: list[dict[str, Any]] = []
    try:
        channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}"
        rate = throughput(str(a.directory), str(b.directory), channel, count, False)
        results.append({"name": "udp 2 drivers 32 B, message API", "value": rate, "unit": "msgs/s", "reference": None})
        results.append({"name": "udp MB/s message API", "value": rate * 32 / 1e6, "unit": "MB/s", "reference": None})
        ping_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}"
        pong_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}"
        for spin in (False, True):
            histogram = ping_pong(str(a.directory), str(b.directory), ping_channel, pong_channel, samples, spin)
            results.extend(_percentiles("busy-spin" if spin else "doorbell (default)", histogram))
    finally:
        a.close()
        b.close()
    a, b = Driver(DATA_PLANE_SPIN_NS), Driver(DATA_PLANE_SPIN_NS)
    try:
        ping_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}"
        pong_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}"
        histogram = ping_pong(str(a.directory), str(b.directory), ping_channel, pong_channel, samples, False)
        mode = f"doorbell clients, drivers spinning {DATA_PLANE_SPIN_NS // 1000} us"
        results.extend(_percentiles(mode, histogram))
    finally:
        a.close()
        b.close()
    return results


def _percentiles(mode: str, histogram: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": f"udp ping-pong RTT {mode} p{percentile}",
            "value": histogram.get_value_at_percentile(percentile) / 1000,
            "unit": "us",
            "reference": None,
        }
        for percentile in (50, 90, 99, 99.9)
    ]
