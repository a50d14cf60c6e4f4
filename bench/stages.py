"""Where the time goes in the three-node cluster: a per-stage breakdown of a
one-at-a-time round trip, and the CPU each process spends per message.

Stages.  The same three-node cluster as ``bench.cluster3`` (its
``LocalCluster``).  A thread of this process samples every position counter
on the request's path, in every node's driver (cnc.dat, read-only) and in
the client's, about every 100 us, while the client sends one 32-byte request
at a time, waits for its echo, and pauses 2 ms.  For each request, a stage's
time is when its counter first moved after the send, from the send; the row
is the median over the requests.  In path order:

- client driver sent the request (snd-pos, ingress stream 101), leader
  driver received it (rcv-hwm), leader consensus module read it (sub-pos);
- leader consensus module appended it to the log (pub-pos, log stream 100),
  leader archive recorded it (rec-pos), leader driver sent the log (snd-pos);
- first follower driver received the log (rcv-hwm), its archive recorded it
  (rec-pos), its consensus module sent AppendPosition (pub-pos, consensus
  stream 108); leader driver received that (rcv-hwm);
- leader consensus module committed (commit-pos), leader service applied it
  (the log spy's sub-pos that moves after the commit), leader service sent
  the echo (pub-pos, egress stream 102), leader driver sent it (snd-pos);
- client driver received the echo (rcv-hwm), client read it.

Sampling costs this process CPU that the cluster would otherwise have (two
cores for thirteen processes), so the breakdown's round trip is printed next
to the figure without sampling; the stages are for proportions, not for the
absolute round trip (``cluster3 echo ping``).

Wake-ups per ping.  Each process's voluntary context switches (every
thread's: every sleep on a doorbell, a socket or a timer that ended) and CPU
time (its threads' schedstat, in ns) over
one-at-a-time pings without the sampler, less the same process over an idle
period of the same length: how often each process woke, and what it spent,
for each round trip, and how long its threads waited in the run queue for a
core once woken (``/proc/<pid>/task/<tid>/schedstat``): the share of a hop
that is its wait for one of the two cores rather than its own work.  A
process that wakes per ping but has no work on the ping's path (a service on
a follower, say) is woken for nothing; its wake-ups also take a core from
the process that has the work.

CPU per message.  Each process's CPU time (user + system, psutil) over a
windowed echo run (32 B, 1000 in flight), divided by the messages echoed:
microseconds of CPU per message per process, summed per role over the
nodes.  Their sum over every process, divided into the two cores, bounds
the throughput: this is the profile that says which process to make cheaper.
"""

from __future__ import annotations

import bisect
import statistics
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.cluster import _connect, _wait_doorbell, throughput
from bench.cluster3 import MEMBERS, LocalCluster
from fulmar.aeron import Aeron
from fulmar.cnc import CncFile
from fulmar.counters import CountersReader

PINGS = 400
QUICK_PINGS = 150
PAUSE_S = 0.002
SAMPLE_SLEEP_S = 0.00005
THROUGHPUT_COUNT = 60_000
QUICK_THROUGHPUT_COUNT = 40_000
WINDOW = 1000
_REQUEST = struct.Struct("<qq")
_PADDING = b"\0" * 16
# Aeron's counter type ids (driver) and fulmar's archive / cluster ones.
SENDER_POSITION, RECEIVER_HWM, SUBSCRIBER_POSITION, PUBLISHER_POSITION = 2, 3, 4, 12
RECORDING_POSITION, COMMIT_POSITION = 100, 203
LOG, INGRESS, EGRESS, CONSENSUS = 100, 101, 102, 108


@dataclass(frozen=True)
class Stage:
    name: str
    where: str  # "client", "leader" or "follower" (the first follower to move)
    type_id: int
    stream_id: int | None  # None: any (rec-pos, commit-pos)
    pick: str = "first"  # with several matching counters on a node: the "first" or "last" to move


STAGES = (
    Stage("client driver sent the request", "client", SENDER_POSITION, INGRESS),
    Stage("leader driver received it", "leader", RECEIVER_HWM, INGRESS),
    Stage("leader consensus module read it", "leader", SUBSCRIBER_POSITION, INGRESS),
    Stage("leader consensus module appended it to the log", "leader", PUBLISHER_POSITION, LOG),
    Stage("leader archive recorded it", "leader", RECORDING_POSITION, None),
    Stage("leader driver sent the log", "leader", SENDER_POSITION, LOG),
    Stage("follower driver received the log", "follower", RECEIVER_HWM, LOG),
    Stage("follower archive recorded it", "follower", RECORDING_POSITION, None),
    Stage("follower consensus module sent AppendPosition", "follower", PUBLISHER_POSITION, CONSENSUS),
    Stage("leader driver received AppendPosition", "leader", RECEIVER_HWM, CONSENSUS),
    Stage("leader consensus module committed it", "leader", COMMIT_POSITION, None),
    Stage("leader service applied it", "leader", SUBSCRIBER_POSITION, LOG, pick="last"),
    Stage("leader service sent the echo", "leader", PUBLISHER_POSITION, EGRESS),
    Stage("leader driver sent the echo", "leader", SENDER_POSITION, EGRESS),
    Stage("client driver received the echo", "client", RECEIVER_HWM, EGRESS),
)


def _stream_of(label: str) -> int | None:
    """The stream id in a position counter's label (``name: reg session stream channel``)."""
    parts = label.split(" ")
    try:
        return int(parts[3])
    except (IndexError, ValueError):
        return None


def _counters(reader: CountersReader, stage: Stage) -> list[int]:
    found = []
    for counter in reader:
        if counter.type_id != stage.type_id:
            continue
        if stage.stream_id is not None and _stream_of(counter.label) != stage.stream_id:
            continue
        found.append(counter.counter_id)
    return found


def _first_move(times: list[int], values: list[list[int]], column: int, start: int, end: int) -> int | None:
    """When the column's value first differs from its value just before ``start`` (within ``end``)."""
    index = bisect.bisect_left(times, start)
    if index == 0 or index >= len(times):
        return None
    before = values[index - 1][column]
    while index < len(times) and times[index] <= end:
        if values[index][column] != before:
            return times[index]
        index += 1
    return None


def ping_stages(cluster: LocalCluster, aeron: Aeron, pings: int) -> tuple[list[dict[str, Any]], float]:
    leader = int(cluster.wait_for_leader()["member_id"])
    readers: dict[str, list[CountersReader]] = {"leader": [], "follower": [], "client": []}
    files = []
    for member in range(MEMBERS):
        cnc = CncFile.open(cluster.driver_dir(member))
        files.append(cnc)
        readers["leader" if member == leader else "follower"].append(
            CountersReader(cnc.counters_metadata, cnc.counters_values)
        )
    readers["client"].append(aeron.counters_reader)
    try:
        replies = [0]

        def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
            replies[0] += 1

        client = _connect(aeron, cluster, on_message)
        try:
            # Columns: for each stage, each node of its kind, each matching counter.
            columns: list[tuple[int, int, int]] = []  # (stage index, node index, counter id)
            for stage_index, stage in enumerate(STAGES):
                for node_index, reader in enumerate(readers[stage.where]):
                    for counter_id in _counters(reader, stage):
                        columns.append((stage_index, node_index, counter_id))
            sources = [(readers[STAGES[s].where][n], c) for s, n, c in columns]
            times: list[int] = []
            values: list[list[int]] = []
            stop = threading.Event()

            def sample() -> None:
                clock = time.perf_counter_ns
                while not stop.is_set():
                    values.append([reader.counter_value(counter_id) for reader, counter_id in sources])
                    times.append(clock())
                    time.sleep(SAMPLE_SLEEP_S)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            sent: list[tuple[int, int]] = []
            try:
                time.sleep(0.05)
                for sequence in range(pings):
                    expected = replies[0] + 1
                    started = time.perf_counter_ns()
                    deadline = time.monotonic() + 10
                    while client.offer(_REQUEST.pack(sequence, 0) + _PADDING) < 0:
                        client.poll_egress(16)
                        if time.monotonic() > deadline:
                            raise TimeoutError("the ingress took no request for 10 s")
                    while replies[0] < expected:
                        if client.poll_egress(16) == 0:
                            if time.monotonic() > deadline:
                                raise TimeoutError(f"no echo of ping {sequence} within 10 s")
                            _wait_doorbell(aeron, client, 1_000_000)
                    sent.append((started, time.perf_counter_ns()))
                    time.sleep(PAUSE_S)
            finally:
                stop.set()
                sampler.join(5)
        finally:
            client.close()
    finally:
        for cnc in files:
            cnc.close()

    count = min(len(times), len(values))
    times, values = times[:count], values[:count]
    rows = []
    for stage_index, stage in enumerate(STAGES):
        stage_columns = [i for i, (s, _, _) in enumerate(columns) if s == stage_index]
        delays = []
        for started, answered in sent:
            moves = [
                m
                for m in (_first_move(times, values, i, started, answered + 2_000_000) for i in stage_columns)
                if m is not None
            ]
            if moves:
                moved = min(moves) if stage.pick == "first" else max(moves)
                delays.append((moved - started) / 1000)
        if len(delays) >= len(sent) // 2:
            rows.append(
                {
                    "name": f"stages ping: {stage.name}",
                    "value": statistics.median(delays),
                    "unit": "us",
                    "reference": None,
                }
            )
    round_trips = [(answered - started) / 1000 for started, answered in sent]
    rows.append(
        {
            "name": "stages ping: client read the echo",
            "value": statistics.median(round_trips),
            "unit": "us",
            "reference": None,
        }
    )
    interval = (times[-1] - times[0]) / max(1, count - 1) / 1000 if count > 1 else 0.0
    return rows, interval


def _node_processes(cluster: LocalCluster) -> dict[str, psutil.Process]:
    """Every process of the cluster and of the client side, by role (``leader consensus#1``)."""
    leader = int(cluster.wait_for_leader()["member_id"])
    processes: dict[str, psutil.Process] = {}
    for member, pids in cluster.pids.items():
        role = "leader" if member == leader else "follower"
        for name, pid in pids.items():
            processes[f"{role} {name}#{member}"] = psutil.Process(pid)
    assert cluster.client_driver is not None
    processes["client driver"] = psutil.Process(cluster.client_driver.process.pid)
    processes["client (this process)"] = psutil.Process()
    return processes


def _thread_figures(pid: int) -> tuple[int, int, int]:
    """(voluntary context switches, CPU time in ns, run-queue wait in ns)
    summed over every thread of the process (psutil's switch count is the main
    thread's alone, and a driver waits on sockets in a thread of its own).
    The times are the first two fields of each thread's
    ``/proc/<pid>/task/<tid>/schedstat``: the time it ran, and the time it
    was runnable but waited for a core (in ns, where psutil's CPU times
    count clock ticks of 10 ms)."""
    switches = cpu_ns = run_delay_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
            schedstat = (task / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that ended meanwhile
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                switches += int(line.split()[1])
        cpu_ns += int(schedstat[0])
        run_delay_ns += int(schedstat[1])
    return switches, cpu_ns, run_delay_ns


# The figures ``_usage`` reads, in its order: their row label, their unit per
# ping, and the scale from its units (a count, seconds, seconds) to that.
PER_PING = (("wake-ups", "wake-ups", 1.0), ("cpu", "us", 1e6), ("run-queue wait", "us", 1e6))


def _usage(processes: dict[str, psutil.Process]) -> dict[str, tuple[float, float, float]]:
    """Per process: voluntary context switches, CPU seconds and run-queue
    wait in seconds so far, over all its threads."""
    usage = {}
    for key, process in processes.items():
        switches, cpu_ns, run_delay_ns = _thread_figures(process.pid)
        usage[key] = (float(switches), cpu_ns / 1e9, run_delay_ns / 1e9)
    return usage


def _per_role(per_process: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
    """Sums by role (``leader consensus#1`` -> ``leader consensus``); a follower role is the mean of the followers."""
    per_role: dict[str, tuple[float, ...]] = {}
    for key, figures in per_process.items():
        role = key.split("#")[0]
        share = 1 / (MEMBERS - 1) if role.startswith("follower") else 1
        summed = per_role.get(role, (0.0,) * len(figures))
        per_role[role] = tuple(total + figure * share for total, figure in zip(summed, figures))
    return per_role


def wakeups_per_ping(cluster: LocalCluster, aeron: Aeron, pings: int) -> list[dict[str, Any]]:
    processes = _node_processes(cluster)
    replies = [0]

    def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
        replies[0] += 1

    client = _connect(aeron, cluster, on_message)
    try:
        for sequence in range(20):  # warm-up
            _ping_once(aeron, client, replies, sequence)
        start = _usage(processes)
        started = time.monotonic()
        for sequence in range(pings):
            _ping_once(aeron, client, replies, sequence)
            time.sleep(PAUSE_S)
        elapsed = time.monotonic() - started
        pinged = _usage(processes)
        time.sleep(elapsed)  # the same processes with nothing to do for as long: their timers
        idle = _usage(processes)
    finally:
        client.close()
    # Per process and ping: what the pings cost beyond the idle period.
    per_process = {
        key: tuple(
            (pinged[key][index] - start[key][index] - (idle[key][index] - pinged[key][index])) / pings * scale
            for index, (_, _, scale) in enumerate(PER_PING)
        )
        for key in processes
    }
    rows = []
    for role, figures in sorted(_per_role(per_process).items(), key=lambda item: -item[1][0]):
        suffix = " (each follower)" if role.startswith("follower") else ""
        rows += [
            {"name": f"stages {label} per ping: {role}{suffix}", "value": value, "unit": unit, "reference": None}
            for (label, unit, _), value in zip(PER_PING, figures)
        ]
    rows += [
        {
            "name": f"stages {label} per ping: all processes",
            "value": sum(figures[index] for figures in per_process.values()),
            "unit": unit,
            "reference": None,
        }
        for index, (label, unit, _) in enumerate(PER_PING)
    ]
    return rows


def _ping_once(aeron: Aeron, client: Any, replies: list[int], sequence: int) -> None:
    expected = replies[0] + 1
    deadline = time.monotonic() + 10
    while client.offer(_REQUEST.pack(sequence, 0) + _PADDING) < 0:
        client.poll_egress(16)
        if time.monotonic() > deadline:
            raise TimeoutError("the ingress took no request for 10 s")
    while replies[0] < expected:
        if client.poll_egress(16) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no echo of ping {sequence} within 10 s")
            _wait_doorbell(aeron, client, 1_000_000)


def cpu_per_message(cluster: LocalCluster, aeron: Aeron, count: int) -> list[dict[str, Any]]:
    processes = _node_processes(cluster)
    throughput(aeron, cluster, 32, WINDOW, count // 10)  # warm-up

    def cpu() -> dict[str, float]:
        return {key: sum(process.cpu_times()[:2]) for key, process in processes.items()}

    before = cpu()
    elapsed = throughput(aeron, cluster, 32, WINDOW, count)
    after = cpu()
    per_role: dict[str, float] = {}
    for key in processes:
        role = key.split("#")[0]
        if role.startswith("follower"):
            per_role[role] = per_role.get(role, 0.0) + (after[key] - before[key]) / (MEMBERS - 1)
        else:
            per_role[role] = per_role.get(role, 0.0) + (after[key] - before[key])
    rows = [
        {
            "name": f"stages cpu per message: {role}" + (" (each follower)" if role.startswith("follower") else ""),
            "value": seconds / count * 1e6,
            "unit": "us",
            "reference": None,
        }
        for role, seconds in sorted(per_role.items(), key=lambda item: -item[1])
    ]
    total = sum(after[key] - before[key] for key in processes)
    rows.append(
        {"name": "stages cpu per message: all processes", "value": total / count * 1e6, "unit": "us", "reference": None}
    )
    rows.append(
        {
            "name": "stages cpu per message: echo rate during it",
            "value": count / elapsed,
            "unit": "msgs/s",
            "reference": None,
        }
    )
    rows.append(
        {
            "name": "stages cpu per message: cores busy during it",
            "value": total / elapsed,
            "unit": "cores",
            "reference": None,
        }
    )
    return rows


def run(quick: bool) -> list[dict[str, Any]]:
    cluster = LocalCluster()
    try:
        assert cluster.client_driver is not None
        with Aeron.connect(cluster.client_driver_dir) as aeron:
            rows, interval = ping_stages(cluster, aeron, QUICK_PINGS if quick else PINGS)
            print(
                f"bench.stages: counters sampled every {interval:.0f} us on average by a thread of this process "
                f"(it shares the two cores: the stages show proportions; cluster3's ping is the round trip)",
                flush=True,
            )
            rows += wakeups_per_ping(cluster, aeron, QUICK_PINGS if quick else PINGS)
            rows += cpu_per_message(cluster, aeron, QUICK_THROUGHPUT_COUNT if quick else THROUGHPUT_COUNT)
        return rows
    finally:
        cluster.close()
