"""Two media drivers over UDP loopback, 32-byte messages: a stream's
throughput (publisher on one driver, subscriber on the other) and ping-pong
round trips (each side through its own driver), with the default idle
strategy (doorbell), with busy-spinning clients, and with the drivers' data
planes spinning after work (``--data-plane-spin``, not a default: on two
cores under load it takes the cores from the processes it would serve).

The stream and the default round trip run again on a ``datagram-mac=true``
channel between the same two drivers (given a member secret): the cost of
a MAC on every datagram, each row's reference the same figure without it
from this run."""

from __future__ import annotations

import socket
import statistics
from typing import Any

from hdrh.histogram import HdrHistogram

from bench.ipc import Driver, ping_pong, throughput

# The spinning drivers' window: longer than a round trip's other hops, so the
# reply finds its driver polling.
DATA_PLANE_SPIN_NS = 100_000
MEMBER_SECRET = b"the bench's member secret"
DATAGRAM_MAC = "|datagram-mac=true"
MAC_SUFFIX = ", datagram-mac"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(quick: bool) -> list[dict[str, Any]]:
    count = 200_000 if quick else 1_000_000
    samples = 1_000 if quick else 10_000
    # Without and with the MAC in turn, this many times each, between the
    # same two drivers: a machine whose load drifts during the run (other
    # processes on its cores) weighs on both alike.  Each figure is the
    # median of its rounds (the round trips' histograms merged).
    rounds = 1 if quick else 3
    a, b = Driver(member_secret=MEMBER_SECRET), Driver(member_secret=MEMBER_SECRET)
    results: list[dict[str, Any]] = []
    try:
        rates: dict[str, list[float]] = {"": [], DATAGRAM_MAC: []}
        round_trips: dict[str, HdrHistogram] = {}
        for _ in range(rounds):
            for mac in rates:
                channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}{mac}"
                rates[mac].append(throughput(str(a.directory), str(b.directory), channel, count, False))
                ping_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}{mac}"
                pong_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}{mac}"
                histogram = ping_pong(str(a.directory), str(b.directory), ping_channel, pong_channel, samples, False)
                if mac in round_trips:
                    round_trips[mac].add(histogram)
                else:
                    round_trips[mac] = histogram
        plain_rate = statistics.median(rates[""])
        for mac, measured in rates.items():
            rate = statistics.median(measured)
            suffix, reference = (MAC_SUFFIX, plain_rate) if mac else ("", None)
            results.append(_row(f"udp 2 drivers 32 B, message API{suffix}", rate, "msgs/s", reference))
            results.append(
                _row(f"udp MB/s message API{suffix}", rate * 32 / 1e6, "MB/s", reference and reference * 32 / 1e6)
            )
        plain_rows = _percentiles("doorbell (default)", round_trips[""])
        results.extend(plain_rows)
        for row, plain in zip(_percentiles("doorbell (default)" + MAC_SUFFIX, round_trips[DATAGRAM_MAC]), plain_rows):
            row["reference"], row["reference_kind"] = plain["value"], "no_mac"
            results.append(row)
        ping_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}"
        pong_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_port()}"
        histogram = ping_pong(str(a.directory), str(b.directory), ping_channel, pong_channel, samples, True)
        results.extend(_percentiles("busy-spin", histogram))
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


def _row(name: str, value: float, unit: str, reference: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "value": value, "unit": unit, "reference": reference}
    if reference is not None:
        row["reference_kind"] = "no_mac"
    return row


PERCENTILES = (50, 90, 99, 99.9)


def _percentiles(mode: str, histogram: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": f"udp ping-pong RTT {mode} p{percentile}",
            "value": histogram.get_value_at_percentile(percentile) / 1000,
            "unit": "us",
            "reference": None,
        }
        for percentile in PERCENTILES
    ]
