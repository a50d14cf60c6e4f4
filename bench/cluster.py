"""A one-node cluster echoing: throughput with a windowed client, and
round-trip percentiles at a fixed rate.

The node is real processes, each started with ``cluster-node`` exactly as an
operator would: a media driver (directory on /dev/shm), an archive (local
control only; directory on the real disk under /var/tmp), a consensus module
and a service container running ``fulmar.service.samples:EchoService``.
Each process uses its default idle strategy (printed once per run).  This
process is the client: a ``ClusterClient`` of the same driver, ingress and
egress over UDP on 127.0.0.1, so every message goes client -> driver
(receiver) -> consensus module (ingress) -> log (IPC, recorded by the
archive; committed once recorded) -> service -> egress (UDP) -> driver ->
client.  (The process-starting code is a copy of the small part of
``tests/support/cluster.py`` it needs, so the bench does not import the
tests package.)

What is run, and its counts (quick and full), is ``bench.openloop``'s
(shared with ``bench.cluster3`` and ``bench.pysyncobj_peer``).

Throughput: payloads of 32, 288 and 1344 bytes (an 8-byte sequence number,
then filler; the 32-byte session header is extra) with a window of 1000
messages outstanding (sent, not yet echoed; full runs add 32 B with a window
of 64); ``N`` messages timed from the first offer until the last echo.
Every echo is checked: byte for byte the message sent, in order.  MB/s
counts the payload bytes echoed (one direction), 10^6 bytes per MB.

Ping: one 32-byte message at a time, the next sent when its echo is back;
each round trip timed from just before the offer.

Latency: open loop at 1,000, 10,000 and 50,000 messages per second (32-byte
payload holding the sequence number and the *intended* send time); each
round trip is the time from the intended send time to the echo's arrival,
so a late send (the client stuck behind back pressure or a slow echo) counts
in full: no coordinated omission.  The first part is warm-up and not
recorded.  A rate the cluster cannot sustain still ends in bounded time: the
answers are waited for a bounded drain time after the schedule, the rest
counted as unanswered (a row), the achieved rate given.  Values go into an
HdrHistogram (1 ns .. 100 s, 3 digits), handed to ``__main__`` with the rows
(``.hgrm`` files, plots).  The client waits on the driver's data doorbell
until an echo lands or the next send is due (it does not spin: on 2 cores a
spinning client takes the CPU from the node's processes).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from hdrh.histogram import HdrHistogram

from bench.openloop import (
    PING_WARMUP,
    SETTLE_QUIET_S,
    EchoSettings,
    OpenLoop,
    describe,
    latency_rows,
    new_histogram,
    ping_rows,
    throughput_rows,
)
from fulmar.aeron import Aeron
from fulmar.cnc import CncError, CncFile
from fulmar.consensus.client import ClusterClient
from fulmar.log_writer import CLOSED, MAX_POSITION_EXCEEDED

SERVICE = "fulmar.service.samples:EchoService"
EGRESS_CHANNEL = "aeron:udp?endpoint=127.0.0.1:0"
WARMUP_S = 1.0  # defaults of latency() (the resource-use runs); the echo runs use EchoSettings
DRAIN_S = 2.0
SETTLE_S = 5.0
DISK_PARENT = "/var/tmp"
SHM_PARENT = "/dev/shm"
START_TIMEOUT_S = 60
LEADER_CHANGE_STALL_S = 5.0
_SEQUENCE = struct.Struct("<q")
_STAMP = struct.Struct("<qq")  # sequence, intended send time (perf_counter_ns)
_announced = False


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Ingress(Protocol):
    """Where a client sends its requests: a channel, and for a cluster of
    several members the ``id=host:port,...`` endpoints substituted into it
    (None for one node: the channel names the endpoint)."""

    @property
    def ingress_channel(self) -> str: ...

    @property
    def ingress_endpoints(self) -> str | None: ...


class NodeProcess:
    """One ``cluster-node`` subcommand, its output in a log file; ready once
    the log shows ``ready_text``; stopped with SIGTERM (SIGKILL after 30 s)."""

    def __init__(self, args: list[str], ready_text: str, log_path: Path, ready: Any = None) -> None:
        self.name = args[0]
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fulmar.cli.cluster_node", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not (ready_text in self.output() and (ready is None or ready(self))):
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.output()[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} did not start in {START_TIMEOUT_S} s: {self.output()[-2000:]}")
                time.sleep(0.01)
        except BaseException:
            self.stop()
            raise

    def output(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, timeout_s: float = 30) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


class Node:
    """Driver, archive, consensus module, service: started in that order,
    stopped in the reverse one (the consensus module and the service
    together, as the orderly stop needs both), every directory removed but
    ``archive_dir`` when the caller gives one (it keeps the recorded log past
    close() and removes it itself); ``archive_segment_length`` is the
    archive's ``--segment-length`` (None: its default)."""

    def __init__(
        self, service: str = SERVICE, archive_dir: Path | None = None, archive_segment_length: int | None = None
    ) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="fulmar-bench-cluster-", dir=DISK_PARENT))
        self.archive_dir = archive_dir if archive_dir is not None else self.base / "archive"
        segment_args = [] if archive_segment_length is None else ["--segment-length", str(archive_segment_length)]
        self.driver_dir = Path(tempfile.mkdtemp(prefix="fulmar-bench-cluster-", dir=SHM_PARENT)) / "driver"
        self.ingress_channel = f"aeron:udp?endpoint=127.0.0.1:{_free_udp_port()}"
        self.ingress_endpoints: str | None = None
        self.processes: list[NodeProcess] = []
        try:
            self.driver = self._start(
                ["driver", "--dir", str(self.driver_dir)], "serving", "driver.log", ready=self._driver_ready
            )
            self.archive = self._start(
                [
                    "archive",
                    "--dir",
                    str(self.archive_dir),
                    "--driver-dir",
                    str(self.driver_dir),
                    "--control-channel",
                    "none",
                    "--replication-channel",
                    "aeron:udp?endpoint=127.0.0.1:0",
                    *segment_args,
                ],
                "serving",
                "archive.log",
            )
            self.consensus = self._start(
                [
                    "consensus",
                    "--cluster-dir",
                    str(self.base / "cluster"),
                    "--driver-dir",
                    str(self.driver_dir),
                    "--ingress-channel",
                    self.ingress_channel,
                ],
                "consensus module pid",
                "consensus.log",
            )
            self.service = self._start(
                [
                    "service",
                    "--cluster-dir",
                    str(self.base / "cluster"),
                    "--driver-dir",
                    str(self.driver_dir),
                    "--service",
                    service,
                ],
                "service 0 (",
                "service.log",
            )
        except BaseException as error:
            logs = self.log_tails()
            self.close()
            if isinstance(error, Exception):
                raise RuntimeError(f"the cluster node did not start: {error}\n{logs}") from error
            raise

    def _start(self, args: list[str], ready_text: str, log_name: str, ready: Any = None) -> NodeProcess:
        process = NodeProcess(args, ready_text, self.base / log_name, ready)
        self.processes.append(process)
        return process

    def _driver_ready(self, driver: NodeProcess) -> bool:
        try:
            with CncFile.open(self.driver_dir) as cnc:
                return bool(cnc.pid == driver.process.pid)  # not a dead driver's leftover file
        except (CncError, OSError):
            return False

    def log_tails(self, lines: int = 15) -> str:
        """The last lines each process printed (for errors: close() removes the logs)."""
        tails = []
        for process in self.processes:
            tail = process.output().splitlines()[-lines:]
            tails.append(
                f"--- {process.name} (pid {process.process.pid}, exit {process.process.poll()}):\n" + "\n".join(tail)
            )
        return "\n".join(tails)

    def pids(self) -> dict[str, int]:
        return {process.name: process.process.pid for process in self.processes}

    def close(self) -> None:
        try:
            cluster = [p for p in self.processes if p.name in ("consensus", "service")]
            for process in cluster:
                process.signal(signal.SIGTERM)
            for process in cluster:
                process.stop()
            for process in reversed([p for p in self.processes if p not in cluster]):
                process.stop()
        finally:
            self.processes.clear()
            shutil.rmtree(self.driver_dir.parent, ignore_errors=True)
            shutil.rmtree(self.base, ignore_errors=True)


def _idle_strategies() -> str:
    from fulmar.archive.context import ArchiveContext
    from fulmar.consensus.context import ConsensusModuleContext
    from fulmar.driver.context import DriverContext
    from fulmar.service.context import ServiceContext

    def ms(ns: int) -> str:
        return f"{ns / 1e6:g} ms"

    return (
        f"driver {DriverContext.idle_strategy} (max wait {ms(DriverContext.timer_interval_ns)} while data is in "
        f"flight, {ms(DriverContext.idle_max_wait_ns)} otherwise), "
        f"archive doorbell (max wait {ms(ArchiveContext.idle_max_wait_ns)}, "
        f"{ms(ArchiveContext.busy_idle_max_wait_ns)} while busy), "
        f"consensus module doorbell (max wait {ms(ConsensusModuleContext.idle_max_wait_ns)}), "
        f"service doorbell (max wait {ms(ServiceContext.idle_max_wait_ns)}), "
        f"client doorbell (until an echo or the next send)"
    )


def _connect(aeron: Aeron, node: Ingress, on_message: Any) -> ClusterClient:
    return ClusterClient.connect(
        aeron,
        node.ingress_channel,
        node.ingress_endpoints,
        egress_channel=EGRESS_CHANNEL,
        message_timeout_ns=30_000_000_000,
        on_message=on_message,
        # A cluster started with a secret (bench.cluster3's secret runs) asks its clients for it.
        credentials=getattr(node, "credentials", b""),
    )


def _wait_doorbell(aeron: Aeron, client: ClusterClient, timeout_ns: int) -> None:
    """Sleep on the data doorbell for at most ``timeout_ns`` unless an echo is already there."""
    doorbell = aeron.conductor.data_doorbell
    token = doorbell.prepare()
    if client.subscription.is_data_available():
        doorbell.cancel()
        return
    doorbell.wait(token, max(1, timeout_ns))


def _check_leader(client: ClusterClient, term: int, last_progress: float) -> None:
    """Fail at once, not at the deadline, when the echoes stopped after a leader
    change (several members: requests in flight at an election may get no answer)."""
    if client.leadership_term_id != term and time.monotonic() - last_progress > LEADER_CHANGE_STALL_S:
        raise RuntimeError(
            f"the leader changed during the measurement (term {term} -> {client.leadership_term_id}, "
            f"now member {client.leader_member_id}) and no echo came for {LEADER_CHANGE_STALL_S:g} s"
        )


def _check_offer(result: int) -> None:
    if result in (CLOSED, MAX_POSITION_EXCEEDED):
        raise RuntimeError(f"ingress offer failed: {result}")


def throughput(aeron: Aeron, node: Ingress, size: int, window: int, count: int) -> float:
    """Seconds to echo ``count`` messages of ``size`` bytes with ``window`` outstanding; every echo verified."""
    filler = bytes(range(256)) * (size // 256 + 1)
    messages = [_SEQUENCE.pack(seq) + filler[: size - 8] for seq in range(count)]
    received = [0]
    errors: list[str] = []

    def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
        seq = received[0]
        if seq < count and payload == messages[seq]:
            received[0] = seq + 1
        elif not errors:
            errors.append(
                f"echo {seq}: got {bytes(payload[:16]).hex()}.. ({len(payload)} B), "
                f"expected {messages[seq][:16].hex() if seq < count else 'nothing'}"
            )
            received[0] = seq + 1

    client = _connect(aeron, node, on_message)
    try:
        offer = client.offer
        poll = client.poll_egress
        sent = 0
        deadline = time.monotonic() + 300
        term = client.leadership_term_id
        last_progress = time.monotonic()
        start = time.perf_counter()
        while received[0] < count:
            progress = 0
            while sent < count and sent - received[0] < window:
                result = offer(messages[sent])
                if result > 0:
                    sent += 1
                    progress += 1
                else:
                    _check_offer(result)
                    break
            progress += poll(256)
            if progress:
                last_progress = time.monotonic()
            else:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{received[0]} of {count} echoes after 300 s (window {window}, {size} B)")
                _check_leader(client, term, last_progress)
                _wait_doorbell(aeron, client, 1_000_000)
        elapsed = time.perf_counter() - start
        if errors:
            raise AssertionError(f"echoes out of order or corrupt: {errors[0]}")
    finally:
        client.close()
    return elapsed


def latency(
    aeron: Aeron,
    node: Ingress,
    rate: int,
    seconds: float,
    warmup_s: float = WARMUP_S,
    drain_s: float = DRAIN_S,
    settle_s: float = SETTLE_S,
) -> tuple[HdrHistogram, dict[str, Any]]:
    """Round trips at ``rate`` messages per second, open loop (``bench.openloop``):
    ``warmup_s`` not recorded, then ``seconds`` recorded, each from its
    intended send time; answers waited for ``drain_s`` after the schedule,
    the rest counted unanswered.  Then, unrecorded, the client stays until
    the echoes stop (at most ``settle_s``), so that the next run does not
    start behind this one's backlog."""
    clock = time.perf_counter_ns
    state = {"expected": 0, "bad": 0}
    padding = b"\0" * 16
    loop: OpenLoop | None = None

    def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
        now = clock()
        seq = _STAMP.unpack_from(payload, 0)[0]
        if seq != state["expected"]:
            state["bad"] += 1
        state["expected"] = seq + 1
        assert loop is not None
        loop.on_answer(seq, now)

    client = _connect(aeron, node, on_message)
    try:
        poll = client.poll_egress
        offer = client.offer
        loop = OpenLoop(rate, warmup_s, seconds, drain_s, clock() + 10_000_000)
        term = client.leadership_term_id
        last_progress = time.monotonic()
        while not loop.done(clock()):
            seq = loop.due(clock())
            refused = False
            if seq is not None:
                result = offer(_STAMP.pack(seq, loop.intended(seq)) + padding)
                if result > 0:
                    loop.on_sent(seq, clock())
                    continue
                _check_offer(result)
                refused = True  # back pressure: wait a little for the echoes rather than spin
            if poll(256):
                last_progress = time.monotonic()
                continue
            _check_leader(client, term, last_progress)
            _wait_doorbell(aeron, client, 100_000 if refused else min(loop.wait_ns(clock()), 1_000_000))
        if loop.unanswered:
            _settle(aeron, client, settle_s)
        if state["bad"]:
            raise AssertionError(f"{state['bad']} echoes out of order at {rate}/s")
    finally:
        client.close()
    return loop.histogram, loop.summary()


def _settle(aeron: Aeron, client: ClusterClient, settle_s: float) -> None:
    """Poll (answers no longer counted) until none came for ``SETTLE_QUIET_S``, at most ``settle_s``."""
    deadline = time.monotonic() + settle_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < SETTLE_QUIET_S:
        if client.poll_egress(256):
            quiet_since = time.monotonic()
        else:
            _wait_doorbell(aeron, client, 1_000_000)


def ping(aeron: Aeron, node: Ingress, count: int, max_s: float) -> HdrHistogram:
    """One message at a time (32 B): send, wait for its echo, send the next;
    each round trip from just before the offer to the echo's arrival.
    ``PING_WARMUP`` first ones not recorded; ``count`` recorded, or fewer
    when ``max_s`` is up first."""
    histogram = new_histogram()
    clock = time.perf_counter_ns
    arrivals: list[tuple[int, int]] = []  # (sequence, arrival ns)
    padding = b"\0" * 16

    def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
        arrivals.append((_STAMP.unpack_from(payload, 0)[0], clock()))

    client = _connect(aeron, node, on_message)
    try:
        term = client.leadership_term_id
        end = time.monotonic() + max_s
        for seq in range(PING_WARMUP + count):
            if seq == PING_WARMUP:
                end = time.monotonic() + max_s
            elif seq > PING_WARMUP and time.monotonic() > end:
                break
            message = _STAMP.pack(seq, 0) + padding
            deadline = time.monotonic() + 60
            sent_ns = clock()
            while (result := client.offer(message)) <= 0:
                _check_offer(result)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ping {seq}: offer refused for 60 s ({result})")
                client.poll_egress(16)
                _wait_doorbell(aeron, client, 100_000)
            last_progress = time.monotonic()
            while not arrivals:
                if client.poll_egress(16):
                    continue
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ping {seq}: no echo in 60 s")
                _check_leader(client, term, last_progress)
                _wait_doorbell(aeron, client, 1_000_000)
            answered, arrival_ns = arrivals.pop(0)
            if answered != seq or arrivals:
                raise AssertionError(f"ping {seq}: echo of {answered}, {len(arrivals)} more")
            if seq >= PING_WARMUP:
                histogram.record_value(max(1, arrival_ns - sent_ns))
    finally:
        client.close()
    return histogram


def echo_results(aeron: Aeron, target: Any, prefix: str, settings: EchoSettings) -> list[dict[str, Any]]:
    """Windowed echo throughput for each (size, window) case, one-at-a-time
    pings, then round-trip percentiles at each offered rate (lowest first:
    the overloaded runs last): the rows both fulmar cluster modules report."""
    results: list[dict[str, Any]] = []
    throughput(aeron, target, 32, 64, min(settings.count, 2_000))  # warm-up: imports, first log terms, caches
    for size, window in settings.cases:
        elapsed = throughput(aeron, target, size, window, settings.count)
        results += throughput_rows(prefix, size, window, settings.count, elapsed)
    results += ping_rows(prefix, ping(aeron, target, settings.pings, settings.ping_max_s))
    for rate in settings.rates:
        histogram, summary = latency(
            aeron, target, rate, settings.seconds, settings.warmup_s, settings.drain_s, settings.settle_s
        )
        if summary["unanswered"]:
            print(describe(f"bench.{prefix}", rate, summary), flush=True)
        results += latency_rows(prefix, rate, histogram, summary)
    return results


def run(quick: bool) -> list[dict[str, Any]]:
    global _announced
    settings = EchoSettings(quick, 3_000 if quick else 50_000)
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    node = Node()
    try:
        if not _announced:
            _announced = True
            print(
                f"bench.cluster: 1-node cluster, processes {node.pids()} + this client, {os.cpu_count()} cores "
                f"(all share them); idle strategies (defaults): {_idle_strategies()}; cluster dir {node.base}, "
                f"driver {node.driver_dir}; {settings.describe()}",
                flush=True,
            )
        with Aeron.connect(node.driver_dir) as aeron:
            results += echo_results(aeron, node, "cluster", settings)
    except Exception as error:
        raise RuntimeError(f"bench.cluster failed: {error}\n{node.log_tails()}") from error
    finally:
        node.close()
    # The machine is shared: a busy one shows in the figures (tails above all).
    print(
        f"bench.cluster: run of {time.monotonic() - began:.0f} s, 1-minute load average "
        f"{load_before:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    return results


if __name__ == "__main__":
    for row in run("--quick" in sys.argv):
        print(f"{row['name']}: {'n/a' if row['value'] is None else format(row['value'], ',.2f')} {row['unit']}")
