"""Whether scraping a node's metrics disturbs it: the three-node windowed echo
(32 B, 1000 in flight) with and without the leader's ``/metrics`` scraped 100
times a second (and 10), and, as a control, with the same scraper asking the
same server 100 times a second for a path it answers 404 at once (the cost of
the HTTP exchange alone, on this machine, with no metrics read).

The cluster is ``bench.cluster3``'s (``cluster-node start --local 3``, the
echo service), started with ``--metrics-port 0``: each node's supervisor
serves its metrics (``cli/metrics_server.py``), as an operator's would, on
threads of the lowest CPU priority (SCHED_IDLE): on a machine the node keeps
busy, scrapes wait for a free core, so fewer than asked for are served (the
achieved rate is a row of its own).  The
scraper is a thread in a process of its own (``python -m bench.metrics
--scrape URL RATE``), as Prometheus is not part of a cluster's client: a
scraping thread in this process would take the client's own interpreter from
it, and measure that rather than the node.  It scrapes on a fixed schedule
(a late scrape is not made up for) while the bench tells it to, one request
at a time on one kept connection (HTTP/1.1 keep-alive, as Prometheus
scrapes), and reports how many scrapes it made and how long they took.

Each repetition runs ``ROUNDS`` rounds of four echo runs of ``COUNT``
messages (``CASES``): not scraped, ``/metrics`` asked for 100 times a second,
10 times a second, and the control; the order rotates from round to round,
so that a drift of the machine's load over the run falls on all alike.  A
run lasts about 4 s: with runs of 1 s the rounds' ratios spread over
0.83-1.23, too wide to tell a 3 % loss from a 6 % one.  Rows
per case: its throughput (its reference the unscraped run of the same round,
so the table's ratio is that of the medians), each round's own ratio (whose
median a drift of the machine's speed between rounds does not move), the
requests served per second, their mean response time, and the supervisor's
CPU per request (its CPU in that run less that in the unscraped one, at the
same rate per second).
"""

from __future__ import annotations

import json
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psutil

from bench.cluster import throughput
from bench.cluster3 import LocalCluster
from fulmar.aeron import Aeron

SCRAPES_PER_S = 100
SIZE = 32
WINDOW = 1000
COUNT = 400_000
ROUNDS = 8
CONTROL_PATH = "/control-no-such-path"  # answered 404 by the metrics server, nothing read
_METRICS_LINE = re.compile(r"^\[node (\d+)\] metrics of node \d+: (http://\S+)/metrics,", re.MULTILINE)


class _Client:
    """One scraper's connection, kept from request to request as Prometheus
    keeps its (HTTP/1.1 keep-alive; opened again if the server closed it).
    ``/metrics`` must answer 200, the control path 404.

    It writes one prebuilt request and reads the answer by its Content-Length
    on a plain socket: the scraper shares the node's two cores here, where a
    Prometheus would run on a host of its own, so what it costs per request
    (``http.client`` parses the headers through the email package, about
    0.2-0.4 ms a request on this machine) would be counted against the node."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.expected = 404 if parts.path == CONTROL_PATH else 200
        self.request = f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: */*\r\n\r\n".encode()
        self.sock: socket.socket | None = None
        self.pending = b""  # bytes read past the end of the last answer (none, from a server that waits)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = b""
        return sock

    def get(self) -> int:
        """One request: the bytes of the answer's body."""
        for attempt in (1, 2):
            if self.sock is None:
                self.sock = self._connect()
            try:
                self.sock.sendall(self.request)
                status, body_length = self._read_answer(self.sock)
                break
            except (ConnectionError, _ClosedByServer):
                self.close()  # the server closed a kept connection: once more, on a new one
                if attempt == 2:
                    raise
        if status != self.expected:
            raise RuntimeError(f"{self.request.split()[1].decode()} answered {status}")
        return body_length

    def _read_answer(self, sock: socket.socket) -> tuple[int, int]:
        """(status, body length) of one answer, its body read and dropped."""
        data = self.pending
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise _ClosedByServer
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        lengths = [int(line.split(b":", 1)[1]) for line in lines[1:] if line[:15].lower() == b"content-length:"]
        if not lengths:
            raise RuntimeError(f"an answer without Content-Length: {lines[0].decode(errors='replace')}")
        length = lengths[0]
        while len(data) < length:
            chunk = sock.recv(max(65536, length - len(data)))
            if not chunk:
                raise _ClosedByServer
            data += chunk
        self.pending = data[length:]
        return status, length

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class _ClosedByServer(Exception):
    """The server closed the connection before a whole answer came."""


def scraper_main() -> None:
    """The scraper process: on each ``start RATE URL`` line of stdin a thread
    asks for URL RATE times a second until the next ``stop`` line, then one
    JSON line reports it (requests, seconds, mean and max response time, bytes)."""
    for line in sys.stdin:
        command, rate_text, url = (line.strip().split(" ", 2) + ["", ""])[:3]
        if command != "start":
            continue
        rate = float(rate_text)
        stop = threading.Event()
        times: list[float] = []
        sizes: list[int] = []

        def scrape() -> None:
            interval = 1.0 / rate
            next_at = time.monotonic()
            client = _Client(url)
            try:
                while not stop.is_set():
                    began = time.monotonic()
                    sizes.append(client.get())
                    times.append(time.monotonic() - began)
                    next_at = max(next_at + interval, time.monotonic() - interval)  # no burst to catch up
                    stop.wait(max(0.0, next_at - time.monotonic()))
            finally:
                client.close()

        began = time.monotonic()
        thread = threading.Thread(target=scrape, name="scraper")
        thread.start()
        for command in sys.stdin:
            if command.strip() == "stop":
                break
        stop.set()
        thread.join()
        seconds = time.monotonic() - began
        print(
            json.dumps(
                {
                    "requests": len(times),
                    "seconds": seconds,
                    "mean_ms": statistics.fmean(times) * 1e3,
                    "max_ms": max(times) * 1e3,
                    "bytes": statistics.fmean(sizes),
                }
            ),
            flush=True,
        )


class Scraper:
    """The scraper process, driven through its stdin."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.metrics", "--scrape"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def start(self, rate: float, url: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"start {rate:g} {url}\n")
        self.process.stdin.flush()

    def stop(self) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("stop\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the scraper exited with {self.process.wait(10)}")
        return dict(json.loads(line))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _metrics_urls(cluster: LocalCluster) -> dict[int, str]:
    return {int(member): url for member, url in _METRICS_LINE.findall(cluster.local.output())}


def _echo(aeron: Aeron, cluster: LocalCluster, count: int, supervisor: psutil.Process) -> tuple[float, float]:
    """(msgs/s, CPU seconds of the supervisor during the run)."""
    before = supervisor.cpu_times()
    elapsed = throughput(aeron, cluster, SIZE, WINDOW, count)
    after = supervisor.cpu_times()
    return count / elapsed, (after.user + after.system) - (before.user + before.system)


@dataclass(frozen=True)
class Case:
    """One echo run of a round: what the scraper asks for meanwhile (nothing: ``rate`` 0)."""

    label: str
    rate: float = 0
    path: str = ""


CASES = (
    Case("not scraped"),
    Case(f"/metrics asked for {SCRAPES_PER_S}/s", SCRAPES_PER_S, "/metrics"),
    Case(f"/metrics asked for {SCRAPES_PER_S // 10}/s", SCRAPES_PER_S // 10, "/metrics"),
    Case(f"control: a 404 asked for {SCRAPES_PER_S}/s", SCRAPES_PER_S, CONTROL_PATH),
)


def run(quick: bool) -> list[dict[str, Any]]:
    count = 50_000 if quick else COUNT
    rounds = 1 if quick else ROUNDS
    cluster = LocalCluster(["--metrics-port", "0"])
    scraper: Scraper | None = None
    results: list[dict[str, Any]] = []
    name = f"metrics echo, {SIZE} B, {WINDOW} in flight"
    try:
        leader = int(cluster.wait_for_leader()["member_id"])
        base_url = _metrics_urls(cluster)[leader]
        supervisor = psutil.Process(cluster.local.process.pid)
        scraper = Scraper()
        assert cluster.client_driver is not None
        with Aeron.connect(cluster.client_driver_dir) as aeron:
            throughput(aeron, cluster, SIZE, WINDOW, count // 5)  # warm-up, not recorded
            for round_index in range(rounds):
                shift = round_index % len(CASES)
                order = CASES[shift:] + CASES[:shift]
                figures: dict[Case, tuple[float, float]] = {}
                stats: dict[Case, dict[str, Any]] = {}
                for case in order:
                    if case.rate:
                        scraper.start(case.rate, base_url + case.path)
                    figures[case] = _echo(aeron, cluster, count, supervisor)
                    if case.rate:
                        stats[case] = scraper.stop()
                plain, plain_cpu = figures[CASES[0]]
                notes = [f"not scraped {plain:,.0f} msgs/s"]
                results.append({"name": f"{name}, not scraped", "value": plain, "unit": "msgs/s", "reference": None})
                for case in CASES[1:]:
                    loaded, loaded_cpu = figures[case]
                    asked = stats[case]
                    rate = asked["requests"] / asked["seconds"]
                    # The supervisor's own CPU (its polls) over this run's duration, at the unscraped rate.
                    baseline_cpu = plain_cpu / (count / plain) * (count / loaded)
                    cpu_per_request_ms = max(0.0, loaded_cpu - baseline_cpu) / max(1, asked["requests"]) * 1e3
                    notes.append(
                        f"{case.label}: {loaded:,.0f} msgs/s (ratio {loaded / plain:.3f}), {rate:.1f}/s "
                        f"served, {asked['bytes'] / 1024:.1f} KiB each, mean {asked['mean_ms']:.1f} ms, "
                        f"server CPU {cpu_per_request_ms:.2f} ms each"
                    )
                    results += [
                        {
                            "name": f"{name}, {case.label}",
                            "value": loaded,
                            "unit": "msgs/s",
                            "reference": plain,
                            "reference_kind": "unscraped",
                        },
                        # This round's own ratio: a drift of the machine's speed between rounds
                        # cancels out of it (the median of these, not the ratio of medians).
                        {
                            "name": f"metrics throughput ratio, {case.label} / not scraped, per round",
                            "value": loaded / plain,
                            "unit": "ratio",
                            "reference": None,
                        },
                        {"name": f"metrics {case.label}: achieved", "value": rate, "unit": "/s", "reference": None},
                        {
                            "name": f"metrics {case.label}: response time, mean",
                            "value": asked["mean_ms"],
                            "unit": "ms",
                            "reference": None,
                        },
                        {
                            "name": f"metrics {case.label}: supervisor CPU each",
                            "value": cpu_per_request_ms,
                            "unit": "ms",
                            "reference": None,
                        },
                    ]
                print(
                    f"bench.metrics: round {round_index + 1} (node {leader}'s metrics; "
                    f"{', '.join(case.label for case in order)}): {'; '.join(notes)}",
                    flush=True,
                )
    except Exception as error:
        raise RuntimeError(f"bench.metrics failed: {error}\n{cluster.describe(30)}") from error
    finally:
        try:
            if scraper is not None:
                scraper.close()
        finally:
            cluster.close()
    return results


if __name__ == "__main__":
    if sys.argv[1:2] == ["--scrape"]:
        scraper_main()
    else:
        for row in run("--quick" in sys.argv):
            ratio = f" (ratio {row['value'] / row['reference']:.3f})" if row.get("reference") else ""
            print(f"{row['name']}: {row['value']:,.2f} {row['unit']}{ratio}")
