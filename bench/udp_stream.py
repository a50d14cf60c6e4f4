"""Two media drivers over UDP loopback, 32-byte messages: a stream's
throughput (publisher on one driver, subscriber on the other) and ping-pong
round trips (each side through its own driver), with the default idle
strategy (doorbell) and with busy-spin."""

from __future__ import annotations

import socket
from typing import Any

from bench.ipc import Driver, ping_pong, throughput


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
            mode = "busy-spin" if spin else "doorbell (default)"
            for percentile in (50, 90, 99, 99.9):
                results.append(
                    {
                        "name": f"udp ping-pong RTT {mode} p{percentile}",
                        "value": histogram.get_value_at_percentile(percentile) / 1000,
                        "unit": "us",
                        "reference": None,
                    }
                )
    finally:
        a.close()
        b.close()
    return results
