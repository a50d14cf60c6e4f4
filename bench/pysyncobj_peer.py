"""The peer: PySyncObj (from PyPI, the optional ``bench`` extra) as a 3-node
cluster doing fulmar's echo work, side by side in the same run, in both of
its settings of ``appendEntriesUseBatch``, each under both CPU policies;
``bench.cluster3`` compares each of its figures with the peer's best.

Three node processes on 127.0.0.1 (free TCP ports), each ``python -m
bench.pysyncobj_peer node appendEntriesUseBatch=B cpu-policy=P SELF OTHER OTHER
STATUS``:
a ``SyncObj`` subclass whose one ``@replicated`` method ``append(payload)``
appends the payload to a list and returns the count (the state machine's
work for fulmar's echo: a replicated append of the same payload).  Each node
writes its Raft state to a small JSON file every 50 ms, which is how this
process sees leaders and commit indexes.

The client is a fourth process, ``python -m bench.pysyncobj_peer client
appendEntriesUseBatch=B NODE NODE NODE``: a read-only ``SyncObj``
(``selfNode=None``: PySyncObj's non-member; it votes in no election and is
in no quorum) whose calls ``append(payload, callback=...)`` are forwarded to
the leader and answered once committed and applied, like a fulmar client's
ingress -> log -> egress round trip.  (The leader also streams its log to a
read-only node: one more follower's worth of sending than fulmar's leader
has.)  It ticks PySyncObj itself (``autoTick=False``) from one thread and
takes commands from this process one JSON line at a time.

The four settings, each a cluster of its own started in turn (the setting is
on every process's command line, as above, a node's CPU policy after it):

- ``no batch``, ``appendEntriesUseBatch=False``: PySyncObj's documented
  setting for "single request speed": the leader sends each new entry at
  once (and a commit index as soon as it moves);
- ``batch``, ``appendEntriesUseBatch=True``, PySyncObj's default: the leader
  sends new entries every ``appendEntriesPeriod`` (0.1 s), many to a
  message: more calls per second when many are in flight, but a call waits
  for two of those sends (its entry, then the commit index the client, a
  read-only node, applies it by): one call at a time takes about 0.2 s;
- ``no batch, SCHED_BATCH`` and ``batch, SCHED_BATCH``: the same, with each
  node process (and PySyncObj's thread in it) under Linux's SCHED_BATCH
  policy, as fulmar's node processes run by default (``fulmar.cpu_policy``:
  no wake-up preemption).  It is not PySyncObj's setting but the machine's,
  open to any user of it, so the peer gets it too; the client process stays
  under the default policy, as fulmar's client process does.

Measurements are ``bench.cluster``'s (counts in ``bench.openloop``), in
``bench.cluster3``'s order (resources, failovers, echo), in each setting:
first each node process's CPU (cores) and RSS over a 3 s idle window and
during a 1,000/s echo run (``bench.resources``); then 32, 288 and 1344 B
payloads with 1,000 calls in flight (fulmar's window) and with
``PEER_WINDOW`` (10,000) in flight, a run of at least two windows of calls
(``max(count, 2 * window)``: quick runs' 2,000 calls would otherwise never
have 10,000 in flight); one call at a time (ping: the next call made once
the previous one's callback ran); round trips at 1,000, 10,000 and 50,000
per second open loop, each from its intended send time, in an HdrHistogram
(sent back encoded; unanswered calls counted after a bounded drain).  An
echo run that PySyncObj fails in (an exception in the client, seen with
``batch`` at 10,000 in flight) has no figure, says why, and the setting's
cluster is started again for the next run (``EchoCommands``).

Failover, in the ``no batch`` setting only (``FAILOVER_SETTING``): one call
at a time (each given ``REQUEST_TIMEOUT_S``, sent again on timeout or
error), the leader's process gets SIGKILL, and the time to the first answer
to a call sent after the kill is taken; ``FAILOVERS`` runs (quick: one), the
killed node started again (empty log: PySyncObj keeps it in memory here) and
caught up between runs.  Why one setting: the election does not depend on
``appendEntriesUseBatch`` (a follower stands after its random
``raftMinTimeout``-``raftMaxTimeout`` without the leader, asks for votes at
once, and a new leader sends its first entries at once in both settings);
what batching changes is the first call under the new leader, which waits
for the leader's sends as every call does: up to two ``appendEntriesPeriod``
(0.2 s) more.  So ``no batch`` is the setting with the shorter failover, and
a second setting would add ``FAILOVERS`` kills and restarts per repetition
only to take the lower of two draws of a 1.0-1.5 s random timer.

Rows: every figure per setting, ``pysyncobj[no batch] ...`` and
``pysyncobj[batch] ...`` (throughput also at ``window 10000``).  Then, by
``derived_rows`` (``python -m bench``'s hook, called once the medians over
the repetitions are taken), the peer's best figure under the plain name
that ``bench.cluster3.reference_name`` maps to (``pysyncobj echo 32 B,
window 1000``, ``pysyncobj echo ping 32 B p50``, ...), a copy of the
per-setting row it came from (its median and min-max) with a ``note``
naming the setting and, for throughput, the window (``batch, window
10000``):

- msgs/s (throughput, the achieved rate of an open-loop run): the highest
  median; a throughput figure for window 1,000 is the best of windows 1,000
  and 10,000 (the peer's best window for that size); the 32 B window 64 of
  full runs stays its own;
- us and ms (percentiles, the failover): the lowest median; a setting
  without a figure (nothing answered after the warm-up) is passed over;
- rows that describe the work of another row follow that row's choice, so
  that a best row never mixes runs: MB/s and a throughput run's unanswered
  calls follow its msgs/s; an open-loop run's late sends and unanswered
  calls follow its achieved rate; ping's round trips follow its p50; CPU
  and RSS (idle and loaded) follow the setting of the best p50 at
  ``resources.LOAD_RATE`` (1,000/s): the setting a user would run at that
  rate, and what it costs.

The best is chosen between medians, not within a repetition: each best row
is then exactly one setting's row, its median over the repetitions and its
min-max, rather than a median of per-repetition maxima (which would favour
whichever setting was luckier in each repetition where the two are close).

Timeouts, matched to ``bench.cluster3``'s 1 s leader heartbeat timeout:
``raftMinTimeout=1.0``, ``raftMaxTimeout=1.5`` (a follower that hears nothing
from the leader for a random 1.0-1.5 s stands for election: PySyncObj's one
timer is both the heartbeat timeout and the election timeout, and its spread
is what keeps votes from splitting); ``appendEntriesPeriod`` is left at
PySyncObj's 0.1 s default (its leader's heartbeat interval, fulmar's is
200 ms).  Everything else is PySyncObj's default.
"""

from __future__ import annotations

import functools
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import resources
from bench.openloop import (
    PING_WARMUP,
    SETTLE_QUIET_S,
    SIZES,
    WINDOW,
    EchoSettings,
    OpenLoop,
    describe,
    latency_rows,
    new_histogram,
    ping_rows,
    throughput_rows,
)
from fulmar.cpu_policy import BATCH, CPU_POLICIES, NORMAL, apply_cpu_policy

PREFIX = "pysyncobj"
# The settings, in the order they run: a row's name is pysyncobj[SETTING] ...,
# the value is appendEntriesUseBatch and the nodes' CPU policy (module docstring).
SETTINGS = {
    "no batch": (False, NORMAL),
    "batch": (True, NORMAL),
    "no batch, SCHED_BATCH": (False, BATCH),
    "batch, SCHED_BATCH": (True, BATCH),
}
FAILOVER_SETTING = "no batch"  # the only setting whose failover is measured (module docstring)
PEER_WINDOW = 10_000  # the peer's throughput runs also have this many calls in flight
# Each setting's latency histograms in their own files and curves (``bench.report.SYSTEMS``),
# not merged into one: a histogram's key is (system, histogram id).
HISTOGRAM_SYSTEMS = {
    "no batch": "pysyncobj_peer-no-batch",
    "batch": "pysyncobj_peer-batch",
    "no batch, SCHED_BATCH": "pysyncobj_peer-no-batch-sched-batch",
    "batch, SCHED_BATCH": "pysyncobj_peer-batch-sched-batch",
}
MEMBERS = 3
WARMUP_S = 1.0  # defaults of Client.latency (the resource-use run); the echo runs use EchoSettings
DRAIN_S = 2.0
SETTLE_S = 5.0
FAILOVERS = 3
REQUEST_TIMEOUT_S = 0.2
STEADY_S = 1.0
RAFT_MIN_TIMEOUT_S = 1.0
RAFT_MAX_TIMEOUT_S = 1.5
START_TIMEOUT_S = 60
COMMAND_TIMEOUT_S = 300
STALL_S = 5.0  # a throughput run without an answer for this long is over (calls lost)
PING_TIMEOUT_S = 5.0  # a ping without an answer for this long is lost (counted, the next one sent)
FAILOVER_TIMEOUT_S = 60
STOP_TIMEOUT_S = 10
STATUS_PERIOD_S = 0.05
INSTALL_HINT = "pip install .[bench]"


def available() -> bool:
    try:
        import pysyncobj  # noqa: F401
    except ImportError:
        return False
    return True


def _conf(use_batch: bool, **extra: Any) -> Any:
    from pysyncobj import SyncObjConf

    return SyncObjConf(
        raftMinTimeout=RAFT_MIN_TIMEOUT_S, raftMaxTimeout=RAFT_MAX_TIMEOUT_S, appendEntriesUseBatch=use_batch, **extra
    )


def _batch_argument(use_batch: bool) -> str:
    """The setting on a node's or the client's command line (seen in ps, never taken from the environment)."""
    return f"appendEntriesUseBatch={use_batch}"


def _parse_batch_argument(argument: str) -> bool:
    for use_batch in (False, True):
        if argument == _batch_argument(use_batch):
            return use_batch
    raise SystemExit(f"bench.pysyncobj_peer: expected appendEntriesUseBatch=True or =False, got {argument!r}")


def _policy_argument(cpu_policy: str) -> str:
    """A node's CPU policy on its command line (``fulmar.cpu_policy``'s names)."""
    return f"cpu-policy={cpu_policy}"


def _parse_policy_argument(argument: str) -> str:
    for cpu_policy in CPU_POLICIES:
        if argument == _policy_argument(cpu_policy):
            return cpu_policy
    raise SystemExit(f"bench.pysyncobj_peer: expected cpu-policy=batch or =normal, got {argument!r}")


def _appender_class() -> Any:
    """The replicated state machine (defined lazily: pysyncobj is optional)."""
    from pysyncobj import SyncObj, replicated

    class Appender(SyncObj):
        def __init__(self, self_node: str | None, others: list[str], conf: Any) -> None:
            super().__init__(self_node, others, conf)
            self.payloads: list[bytes] = []

        @replicated
        def append(self, payload: bytes) -> int:
            self.payloads.append(payload)
            return len(self.payloads)

    return Appender


# ------------------------------------------------------------------ node process


def node_main(self_node: str, others: list[str], status_path: Path, use_batch: bool, cpu_policy: str) -> None:
    """One cluster member until SIGTERM, its Raft state in ``status_path``."""
    apply_cpu_policy(cpu_policy)  # before PySyncObj starts its thread: it inherits the policy
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    node = _appender_class()(self_node, others, _conf(use_batch))
    temp = status_path.with_suffix(".tmp")
    try:
        while not stopping:
            status = node.getStatus()
            leader = status["leader"]
            temp.write_text(
                json.dumps(
                    {
                        "state": status["state"],
                        "term": status["raft_term"],
                        "commit": status["commit_idx"],
                        "applied": status["last_applied"],
                        "leader": leader.address if leader is not None else None,
                        "pid": os.getpid(),
                    }
                )
            )
            os.replace(temp, status_path)
            time.sleep(STATUS_PERIOD_S)
    finally:
        node.destroy()


# ---------------------------------------------------------------- client process


class Client:
    """A read-only SyncObj ticked from this thread; every call's answer
    arrives through ``tick``."""

    def __init__(self, nodes: list[str], use_batch: bool) -> None:
        # The client's own setting matters little (it forwards each call on its next tick either
        # way), but it is a SyncObj of the same cluster: the same configuration as the nodes'.
        self.obj = _appender_class()(None, nodes, _conf(use_batch, autoTick=False))

    def tick(self, wait_s: float) -> None:
        self.obj.doTick(wait_s)

    def leader(self) -> str | None:
        leader = self.obj._getLeader()
        return str(leader.address) if leader is not None else None

    def call(self, payload: bytes, callback: Callable[[Any, Any], None]) -> None:
        try:
            self.obj.append(payload, callback=callback)
        except BlockingIOError:
            # PySyncObj queues the call, then (appendEntriesUseBatch=False only)
            # writes a wake-up byte to a non-blocking pipe that only a tick
            # drains: more than 64 KiB of
            # calls between two ticks (an open-loop client behind its
            # schedule) fill it.  The call is queued all the same and the
            # pipe already holds wake-ups to spare.
            pass

    def until(self, what: str, timeout_s: float, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout_s:g} s")
            self.tick(0.001)

    def ready(self) -> None:
        """A leader known and one call answered."""
        from pysyncobj import FAIL_REASON

        answered: list[Any] = []
        self.until("a leader", START_TIMEOUT_S, lambda: self.leader() is not None)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answered or answered[-1] != FAIL_REASON.SUCCESS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no call answered in {START_TIMEOUT_S} s: {answered[-1:]}")
            answered.clear()
            self.call(b"ready", lambda result, error: answered.append(error))
            # A call PySyncObj loses (a leader change) never gets its callback: ask again after a while.
            give_up = min(deadline, time.monotonic() + PING_TIMEOUT_S)
            while not answered and time.monotonic() < give_up:
                self.tick(0.001)
            if not answered:
                answered.append("no answer in 5 s")
            elif answered[-1] != FAIL_REASON.SUCCESS:
                time.sleep(0.05)

    def throughput(self, size: int, window: int, count: int) -> dict[str, Any]:
        """``count`` calls of ``size`` bytes, ``window`` in flight.  PySyncObj can
        lose calls when its leader changes (no callback ever); a run whose
        answers stop for ``STALL_S`` ends there: the figure is then the good
        answers over the time to the last one, and the rest are ``lost``."""
        from pysyncobj import FAIL_REASON

        filler = bytes(range(256)) * (size // 256 + 1)
        payload = filler[:size]
        state = {"answered": 0, "failed": 0, "last": time.perf_counter()}

        def done(result: Any, error: Any) -> None:
            state["answered"] += 1
            state["last"] = time.perf_counter()
            if error != FAIL_REASON.SUCCESS:
                state["failed"] += 1

        sent = 0
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        start = time.perf_counter()
        while state["answered"] < count:
            while sent < count and sent - state["answered"] < window:
                self.call(payload, done)
                sent += 1
            if time.monotonic() > deadline or time.perf_counter() - state["last"] > STALL_S:
                break
            self.tick(0.001)
        good = state["answered"] - state["failed"]
        return {"elapsed": state["last"] - start, "good": good, "lost": count - good, "failed": state["failed"]}

    def latency(
        self,
        rate: int,
        seconds: float,
        warmup_s: float = WARMUP_S,
        drain_s: float = DRAIN_S,
        settle_s: float = SETTLE_S,
    ) -> dict[str, Any]:
        """Open loop at ``rate`` (``bench.openloop``, as ``bench.cluster.latency``):
        the summary, and the histogram encoded (HdrHistogram's base64 form)."""
        from pysyncobj import FAIL_REASON

        clock = time.perf_counter_ns
        padding = b"\0" * 16
        loop = OpenLoop(rate, warmup_s, seconds, drain_s, clock() + 10_000_000)

        callbacks = [0]  # every answer, also those after the drain deadline (not counted by loop)

        def answer(sequence: int) -> Callable[[Any, Any], None]:
            def done(result: Any, error: Any) -> None:
                callbacks[0] += 1
                loop.on_answer(sequence, clock(), error == FAIL_REASON.SUCCESS)

            return done

        while not loop.done(clock()):
            sequence = loop.due(clock())
            if sequence is not None:
                self.call(
                    sequence.to_bytes(8, "little") + loop.intended(sequence).to_bytes(8, "little") + padding,
                    answer(sequence),
                )
                loop.on_sent(sequence, clock())
                continue
            self.tick(min(loop.wait_ns(clock()), 1_000_000) / 1e9)
        if loop.unanswered:
            # Unrecorded: until the answers stop (at most settle_s), so the next run starts without a backlog.
            deadline = time.monotonic() + settle_s
            quiet_since = time.monotonic()
            seen = callbacks[0]
            while time.monotonic() < deadline and time.monotonic() - quiet_since < SETTLE_QUIET_S:
                self.tick(0.01)
                if callbacks[0] != seen:
                    seen = callbacks[0]
                    quiet_since = time.monotonic()
        return {**loop.summary(), "histogram": loop.histogram.encode().decode("ascii")}

    def ping(self, count: int, max_s: float) -> dict[str, Any]:
        """One call at a time (32 B): call, tick until its callback, call the
        next; each round trip from just before the call to the callback.
        ``PING_WARMUP`` first ones not recorded; ``count`` recorded, or fewer
        when ``max_s`` is up first; a call lost (no answer in ``PING_TIMEOUT_S``,
        or an error) is counted, not recorded."""
        from pysyncobj import FAIL_REASON

        clock = time.perf_counter_ns
        histogram = new_histogram()
        answers: list[tuple[int, int, Any]] = []  # (arrival ns, sequence, error)
        lost = 0  # no answer in PING_TIMEOUT_S, or an error
        end = time.monotonic() + max_s

        def on_answer(sequence: int, result: Any, error: Any) -> None:
            answers.append((clock(), sequence, error))

        for sequence in range(PING_WARMUP + count):
            if sequence == PING_WARMUP:
                end = time.monotonic() + max_s
            elif sequence > PING_WARMUP and time.monotonic() > end:
                break
            sent_ns = clock()
            self.call(
                sequence.to_bytes(8, "little") + b"\0" * 24,
                functools.partial(on_answer, sequence),
            )
            give_up = time.monotonic() + PING_TIMEOUT_S
            while not any(answered == sequence for _, answered, _ in answers) and time.monotonic() < give_up:
                self.tick(0.001)
            mine = [(arrival_ns, error) for arrival_ns, answered, error in answers if answered == sequence]
            answers.clear()  # a late answer to a lost ping arrives with another's: ignored
            if not mine or mine[0][1] != FAIL_REASON.SUCCESS:
                lost += 1
                continue
            if sequence >= PING_WARMUP:
                histogram.record_value(max(1, mine[0][0] - sent_ns))
        return {"histogram": histogram.encode().decode("ascii"), "lost": lost}

    def failover(self, pids: dict[str, int]) -> dict[str, Any]:
        """One call at a time; SIGKILL to the leader after ``STEADY_S``;
        the time to the first answer to a call sent after the kill."""
        from pysyncobj import FAIL_REASON

        clock = time.perf_counter_ns
        old_leader = self.leader()
        if old_leader not in pids:
            raise RuntimeError(f"leader {old_leader} is none of {sorted(pids)}")
        answers: list[tuple[int, int, Any]] = []  # (arrival ns, sequence, error)

        def answer(sequence: int) -> Callable[[Any, Any], None]:
            return lambda result, error: answers.append((clock(), sequence, error))

        sequence = resent = 0
        sent_ns = 0
        kill_ns = 0
        started = clock()
        timeout_ns = int(REQUEST_TIMEOUT_S * 1e9)
        deadline = time.monotonic() + STEADY_S + FAILOVER_TIMEOUT_S
        while True:
            now = clock()
            if not kill_ns and now - started >= STEADY_S * 1e9:
                kill_ns = clock()
                os.kill(pids[old_leader], signal.SIGKILL)
            if sent_ns and now - sent_ns >= timeout_ns:
                resent += 1 if kill_ns else 0
                sequence += 1  # a late answer to the old call is ignored
                sent_ns = 0
            if not sent_ns:
                self.call(b"\0" * 32, answer(sequence))
                sent_ns = clock()
            self.tick(0.001)
            for arrival, answered, error in answers:
                if answered != sequence:
                    continue
                if error == FAIL_REASON.SUCCESS and kill_ns and sent_ns >= kill_ns:
                    return {
                        "killed": old_leader,
                        "new_leader": self.leader(),
                        "answered_ms": (arrival - kill_ns) / 1e6,
                        "resent": resent,
                    }
                if error != FAIL_REASON.SUCCESS:
                    resent += 1 if kill_ns else 0
                    time.sleep(0.001)
                sequence += 1
                sent_ns = 0
            answers.clear()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no answer from a new leader {FAILOVER_TIMEOUT_S} s after killing {old_leader} "
                    f"(client's leader now {self.leader()}, {resent} calls re-sent)"
                )


def client_main(nodes: list[str], use_batch: bool) -> None:
    """Commands on stdin, one JSON object per line; one JSON answer each on stdout."""
    client = Client(nodes, use_batch)
    client.ready()
    print(json.dumps({"ready": True, "leader": client.leader()}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            kind = command.pop("cmd")
            if kind == "ready":
                client.ready()
                answer: dict[str, Any] = {"leader": client.leader()}
            else:
                answer = getattr(client, kind)(**command)
        except Exception as error:  # told to the bench, which raises it
            traceback.print_exc()  # into client.log: where in PySyncObj, which the one line does not say
            answer = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps(answer), flush=True)
    client.obj.destroy()


# ------------------------------------------------------------------ the bench side


def _free_tcp_ports(count: int) -> list[int]:
    probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


class Process:
    """One child (``python -m bench.pysyncobj_peer ...``), output in a log file."""

    def __init__(self, args: list[str], log_path: Path, pipe: bool = False) -> None:
        self.log_path = log_path
        self._log = open(log_path, "a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.pysyncobj_peer", *args],
            stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe else self._log,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )

    def tail(self, lines: int = 10) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- {self.log_path.name} (pid {self.process.pid}, exit {self.process.poll()}):\n" + "\n".join(text)

    def stop(self) -> None:
        """SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``; reaped either way."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self._log.close()


class PeerCluster:
    """Three nodes and the client, under a temporary directory; ``close``
    reaps every process and removes the directory whatever state it is in."""

    def __init__(self, use_batch: bool, cpu_policy: str = NORMAL) -> None:
        self.use_batch = use_batch
        self.cpu_policy = cpu_policy
        self.base = Path(tempfile.mkdtemp(prefix="fulmar-bench-pysyncobj-"))
        self.addresses = [f"127.0.0.1:{port}" for port in _free_tcp_ports(MEMBERS)]
        self.nodes: dict[int, Process] = {}
        self.client: Process | None = None
        try:
            for member in range(MEMBERS):
                self.start_node(member)
            self.client = Process(
                ["client", _batch_argument(use_batch), *self.addresses], self.base / "client.log", pipe=True
            )
            self._read_answer(START_TIMEOUT_S)
        except BaseException as error:
            logs = self.log_tails()
            self.close()
            if isinstance(error, Exception):
                raise RuntimeError(f"the PySyncObj cluster did not start: {error}\n{logs}") from error
            raise

    def start_node(self, member: int) -> None:
        others = [a for i, a in enumerate(self.addresses) if i != member]
        status = self.base / f"node{member}.json"
        status.unlink(missing_ok=True)
        self.nodes[member] = Process(
            [
                "node",
                _batch_argument(self.use_batch),
                _policy_argument(self.cpu_policy),
                self.addresses[member],
                *others,
                str(status),
            ],
            self.base / f"node{member}.log",
        )

    def statuses(self) -> dict[int, dict[str, Any]]:
        found = {}
        for member, node in self.nodes.items():
            if node.process.poll() is not None:
                continue
            try:
                found[member] = json.loads((self.base / f"node{member}.json").read_text())
            except (OSError, ValueError):
                continue
        return found

    def settled(self) -> bool:
        """All members run, one leads, every one has its commit index applied."""
        statuses = self.statuses()
        if len(statuses) < MEMBERS:
            return False
        leader_names = {s["leader"] for s in statuses.values()}
        if len(leader_names) != 1 or None in leader_names:
            return False
        leader = statuses[self.addresses.index(next(iter(leader_names)))]
        return all(s["term"] == leader["term"] and s["applied"] >= leader["commit"] for s in statuses.values())

    def wait_settled(self, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.settled():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {START_TIMEOUT_S} s: {self.statuses()}")
            time.sleep(0.05)

    def _read_answer(self, timeout_s: float) -> dict[str, Any]:
        assert self.client is not None and self.client.process.stdout is not None
        stdout = self.client.process.stdout
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        if not ready:
            raise TimeoutError(f"the client did not answer in {timeout_s:g} s")
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the client exited ({self.client.process.wait(STOP_TIMEOUT_S)})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the client: {answer['error']}")
        return answer

    def command(self, cmd: str, timeout_s: float = COMMAND_TIMEOUT_S + 30, **args: Any) -> dict[str, Any]:
        assert self.client is not None and self.client.process.stdin is not None
        self.client.process.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.client.process.stdin.flush()
        return self._read_answer(timeout_s)

    def pids(self) -> dict[str, int]:
        return {self.addresses[m]: node.process.pid for m, node in self.nodes.items()}

    def reap_killed(self, address: str) -> int:
        member = self.addresses.index(address)
        self.nodes.pop(member).stop()
        return member

    def log_tails(self) -> str:
        processes = [*self.nodes.values()] + ([self.client] if self.client is not None else [])
        return "\n".join(p.tail() for p in processes)

    def close(self) -> None:
        try:
            if self.client is not None:
                self.client.stop()
            for node in self.nodes.values():
                if node.process.poll() is None:
                    node.process.send_signal(signal.SIGTERM)
            for node in self.nodes.values():
                node.stop()
        finally:
            self.nodes.clear()
            self.client = None
            shutil.rmtree(self.base, ignore_errors=True)


def _throughput_cases(settings: EchoSettings) -> list[tuple[int, int, int]]:
    """(size, window, calls) of each throughput run: ``settings.cases`` (fulmar's), then
    every size at ``PEER_WINDOW``; at least two windows of calls, so that a window is full
    for half the run or more (the quick runs' 2,000 calls would never have 10,000 in flight)."""
    cases = [*settings.cases, *((size, PEER_WINDOW) for size in SIZES)]
    return [(size, window, max(settings.count, 2 * window)) for size, window in cases]


class EchoCommands:
    """The echo runs' commands to one setting's cluster.  PySyncObj can fail
    in a run: seen with ``batch`` and 10,000 calls in flight, the client's
    IndexError in ``__getEntries`` (a read-only node far behind the leader,
    sent snapshots, then entries its emptied journal does not reach), the
    nodes' logs saying "state machine may have diverged".  That run then has
    no figure (None: n/a, passed over by ``derived_rows``), which is said
    with the processes' logs, and the setting's cluster is started again,
    empty, for the next run, rather than the whole ``python -m bench`` failing."""

    def __init__(self, cluster: PeerCluster, tag: str) -> None:
        self.cluster = cluster
        self.tag = tag

    def __call__(self, what: str, cmd: str, **args: Any) -> dict[str, Any] | None:
        try:
            return self.cluster.command(cmd, **args)
        except (RuntimeError, TimeoutError) as error:
            print(
                f"{self.tag}: {what}: no figure, the run failed: {error}\n{self.cluster.log_tails()}\n"
                f"{self.tag}: the cluster is started again (an empty log) for the next run",
                flush=True,
            )
            self.cluster.close()
            self.cluster = PeerCluster(self.cluster.use_batch, self.cluster.cpu_policy)
            self.cluster.wait_settled("a leader and two followers (started again)")
            return None


def _rows(command: EchoCommands, settings: EchoSettings, setting: str) -> list[dict[str, Any]]:
    """``bench.cluster.echo_results``'s work and rows, by the client process, named ``pysyncobj[setting] ...``."""
    from hdrh.histogram import HdrHistogram

    prefix = f"{PREFIX}[{setting}]"
    tag = f"bench.{PREFIX}_peer[{setting}]"
    results: list[dict[str, Any]] = []
    command("the warm-up", "throughput", size=32, window=64, count=min(settings.count, 1_000))
    for size, window, count in _throughput_cases(settings):
        answer = command(f"{size} B, window {window}", "throughput", size=size, window=window, count=count)
        good, elapsed = (answer["good"], answer["elapsed"]) if answer else (0, 0.0)  # 0: no figure (None)
        for row in throughput_rows(prefix, size, window, good, elapsed):
            row["throughput_plot"] = None  # the throughput bars are the best rows' (derived_rows)
            results.append(row)
        if answer and answer["lost"]:  # said, and a row of its own (fulmar's throughput fails rather than lose an echo)
            lost = answer["lost"] - answer["failed"]
            print(
                f"{tag}: {size} B, window {window}: {answer['lost']:,} of {count:,} calls "
                f"without a good answer ({answer['failed']:,} answered with an error, {lost:,} never answered"
                + (f": the run ended after {STALL_S:g} s without an answer" if lost else "")
                + f"); msgs/s counts the {answer['good']:,} answered well",
                flush=True,
            )
            results.append(
                {
                    "name": f"{prefix} echo {size} B, window {window}, unanswered",
                    "value": answer["lost"],
                    "unit": "msgs",
                    "reference": None,
                }
            )
    answer = command("ping", "ping", count=settings.pings, max_s=settings.ping_max_s)
    if answer and answer["lost"]:
        print(f"{tag}: {answer['lost']} pings lost (no answer in {PING_TIMEOUT_S:g} s, or an error)", flush=True)
    # An empty histogram: no figure (None) for the percentiles of a failed run.
    echo = ping_rows(prefix, HdrHistogram.decode(answer["histogram"]) if answer else new_histogram())
    for rate in settings.rates:
        answer = command(
            f"{rate:,}/s open loop",
            "latency",
            rate=rate,
            seconds=settings.seconds,
            warmup_s=settings.warmup_s,
            drain_s=settings.drain_s,
            settle_s=settings.settle_s,
        )
        if answer is None:
            echo += latency_rows(
                prefix, rate, new_histogram(), {"achieved_rate": None, "late_sends": None, "unanswered": None}
            )
            continue
        if answer["unanswered"]:
            print(describe(tag, rate, answer), flush=True)
        echo += latency_rows(prefix, rate, HdrHistogram.decode(answer.pop("histogram")), answer)
    for row in echo:
        if "histogram" in row:
            row["histogram_system"] = HISTOGRAM_SYSTEMS[setting]
    return results + echo


def resource_use(cluster: PeerCluster, setting: str) -> list[dict[str, Any]]:
    """Each node process (``bench.resources``): a window of ``IDLE_S`` with
    the client connected and sending nothing, then one during an echo run at
    ``LOAD_RATE``/s (``LOAD_S`` after its 1 s warm-up), as ``bench.cluster3``
    measures fulmar's nodes."""
    cluster.wait_settled("a leader and two followers")
    nodes = {f"node{member}": {"node": node.process.pid} for member, node in sorted(cluster.nodes.items())}
    idle = resources.measure(nodes, resources.idle())
    answers: list[dict[str, Any]] = []
    load = resources.measure(
        nodes, lambda: answers.append(cluster.command("latency", rate=resources.LOAD_RATE, seconds=resources.LOAD_S))
    )
    total = {
        name: resources.Usage(sum(u.cores for u in named.values()), sum(u.rss_mib for u in named.values()))
        for name, named in load.items()
    }
    each = resources.breakdown(total, {name: pids["node"] for name, pids in nodes.items()}, total=None)
    print(
        f"bench.{PREFIX}_peer[{setting}]: resource use during the {resources.LOAD_RATE:,}/s echo run (achieved "
        f"{answers[0]['achieved_rate']:,.0f}/s): {each}",
        flush=True,
    )
    label = f"during {resources.LOAD_RATE:,}/s echo"
    prefix = f"{PREFIX}[{setting}]"
    return resources.rows(prefix, "idle", idle) + resources.rows(prefix, label, load)


def run_setting(setting: str, settings: EchoSettings, failovers: int) -> list[dict[str, Any]]:
    """One setting's cluster, from start to close: resource use, ``failovers`` failovers, the echo runs."""
    tag = f"bench.{PREFIX}_peer[{setting}]"
    began = time.monotonic()
    use_batch, cpu_policy = SETTINGS[setting]
    cluster = PeerCluster(use_batch, cpu_policy)
    try:
        print(
            f"{tag}: appendEntriesUseBatch {use_batch}, nodes' CPU policy {cpu_policy}; 3 node processes "
            f"{cluster.pids()} + a client "
            f"process (pid {cluster.client.process.pid if cluster.client else '-'}); {failovers} failover(s)",
            flush=True,
        )
        cluster.wait_settled("a leader and two followers")
        # Resource use and failovers first, as bench.cluster3: the overloaded open-loop runs may leave a backlog.
        results = resource_use(cluster, setting)
        for index in range(failovers):
            if index:
                cluster.wait_settled("the killed node caught up")
                cluster.command("ready", timeout_s=START_TIMEOUT_S + 10)
            sample = cluster.command("failover", timeout_s=STEADY_S + FAILOVER_TIMEOUT_S + 10, pids=cluster.pids())
            member = cluster.reap_killed(sample["killed"])
            print(
                f"{tag}: failover {index + 1}: SIGKILL to node {member} (the leader); first answer "
                f"after {sample['answered_ms']:,.0f} ms from {sample['new_leader']}; {sample['resent']} calls "
                f"re-sent",
                flush=True,
            )
            results.append(
                {
                    "name": f"{PREFIX}[{setting}] failover, kill to first answer",
                    "value": sample["answered_ms"],
                    "unit": "ms",
                    "reference": None,
                }
            )
            cluster.start_node(member)
        if failovers:  # the echo runs are a three-member cluster's: the last killed node caught up
            cluster.wait_settled("the killed node caught up")
            cluster.command("ready", timeout_s=START_TIMEOUT_S + 10)
        command = EchoCommands(cluster, tag)
        try:
            results += _rows(command, settings, setting)
        finally:
            cluster = command.cluster  # the one to close: started again after a failed run
    except Exception as error:
        raise RuntimeError(f"{tag} failed: {error}\n{cluster.log_tails()}") from error
    finally:
        cluster.close()
    print(f"{tag}: {time.monotonic() - began:.0f} s", flush=True)
    return results


def run(quick: bool) -> list[dict[str, Any]]:
    if not available():
        print(
            f"bench.pysyncobj_peer: pysyncobj is not installed, no PySyncObj figures (install the bench extra: "
            f"{INSTALL_HINT})",
            flush=True,
        )
        return []
    from pysyncobj.version import VERSION

    settings = EchoSettings(quick, 2_000 if quick else 20_000)
    failovers = 1 if quick else FAILOVERS
    print(
        f"bench.pysyncobj_peer: PySyncObj {VERSION}, in each setting of appendEntriesUseBatch in turn "
        f"({', '.join(f'{name}: {batch}, CPU policy {policy}' for name, (batch, policy) in SETTINGS.items())}) "
        f"3 node processes + a "
        f"client process that is a read-only SyncObj (PySyncObj's non-member: calls forwarded to the leader, "
        f"answered once applied; a client hop like fulmar's); raftMinTimeout {RAFT_MIN_TIMEOUT_S:g} s, "
        f"raftMaxTimeout {RAFT_MAX_TIMEOUT_S:g} s (election after 1.0-1.5 s without the leader, vs fulmar's 1 s "
        f"heartbeat timeout), appendEntriesPeriod 0.1 s (default); {settings.describe()}; throughput also at "
        f"window {PEER_WINDOW:,} for each size ({_throughput_cases(settings)[-1][2]:,} calls each); "
        f"{failovers} failover(s) in the {FAILOVER_SETTING} setting only",
        flush=True,
    )
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    results: list[dict[str, Any]] = []
    for setting in SETTINGS:
        results += run_setting(setting, settings, failovers if setting == FAILOVER_SETTING else 0)
    print(
        f"bench.pysyncobj_peer: run of {time.monotonic() - began:.0f} s, 1-minute load average "
        f"{load_before:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    return results


# ------------------------------------------------------------------ the best of the settings

_THROUGHPUT_NAME = re.compile(r"(echo (\d+) B), window (\d+)(.*)")  # the label, size, window, what follows


def _candidate(name: str) -> tuple[str, str, int | None] | None:
    """A per-setting row's name -> (its setting, the plain name of the figure it
    may be the best of, its window for a throughput row, else None); None for
    any other name.  A throughput row at ``PEER_WINDOW`` is a candidate for the
    same size's ``WINDOW`` figure: the peer's best window for that size."""
    for setting in SETTINGS:
        head = f"{PREFIX}[{setting}] "
        if not name.startswith(head):
            continue
        rest = name[len(head) :]
        throughput = _THROUGHPUT_NAME.fullmatch(rest)
        if throughput is None:
            return setting, f"{PREFIX} {rest}", None
        label, _, window, tail = throughput.groups()
        plain_window = WINDOW if int(window) == PEER_WINDOW else int(window)
        return setting, f"{PREFIX} {label}, window {plain_window}{tail}", int(window)
    return None


def _lead(plain: str) -> str | None:
    """The figure whose choice of setting (and window) the row ``plain`` follows,
    because it describes that figure's run or what it cost; None for a figure
    chosen by its own value."""
    if plain.startswith(f"{PREFIX} node "):  # CPU and RSS: what the setting a user runs at LOAD_RATE costs
        return f"{PREFIX} echo RTT at {resources.LOAD_RATE:,}/s p50"
    if plain.endswith(" MB/s"):  # msgs/s times the size: the same run
        return plain[: -len(" MB/s")]
    label, _, what = plain.rpartition(", ")
    if " RTT at " in label and what in ("sends >1 interval late", "unanswered"):
        return f"{label}, achieved"
    if " ping " in label and what == "round trips":
        return f"{label} p50"
    if ", window " in label and what == "unanswered":
        return label
    return None


# The better of two medians of a figure chosen by its own value, by unit; a
# figure of another unit is reported per setting only.
_BEST = {"msgs/s": max, "us": min, "ms": min}


def derived_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``python -m bench``'s hook, given this module's rows once the medians over
    the repetitions are taken (``median``, ``min``, ``max``, ...): the best
    rows (module docstring), each a copy of the per-setting row it came from
    under the plain name, with a ``note`` saying which setting and window."""
    candidates: dict[str, dict[tuple[str, int | None], dict[str, Any]]] = {}  # plain name -> (setting, window) -> row
    # The best rows in the order of the per-setting rows: a plain name's place is its earliest
    # among its setting's rows (a row only the second setting has then follows its neighbours).
    place: dict[str, int] = {}
    counted = {setting: 0 for setting in SETTINGS}
    for row in rows:
        found = _candidate(row["name"])
        if found is not None:
            setting, plain, window = found
            candidates.setdefault(plain, {})[(setting, window)] = row
            place[plain] = min(place.get(plain, counted[setting]), counted[setting])
            counted[setting] += 1
    chosen: dict[str, tuple[str, int | None] | None] = {}  # figures chosen by their own value
    for plain, options in candidates.items():
        better = _BEST.get(next(iter(options.values()))["unit"])
        if _lead(plain) is None and better is not None:
            # A setting without a figure (None: nothing answered after the warm-up) is passed over.
            measured = [key for key, row in options.items() if row["median"] is not None]
            chosen[plain] = better(measured, key=lambda key: options[key]["median"]) if measured else None
    best = []
    for plain, options in candidates.items():
        lead = _lead(plain)
        if (plain if lead is None else lead) not in chosen:
            continue  # no rule for its unit: per setting only
        key = chosen[plain if lead is None else lead]
        if key is None:
            source = next(iter(options.values()))
            note = "no figure in any setting" if lead is None else f"no figure in any setting for {lead}"
            best.append({**source, "name": plain, "median": None, "min": None, "max": None, "runs": 0, "note": note})
            continue
        if key not in options:
            continue  # e.g. no unanswered calls in the run its msgs/s came from
        setting, window = key
        note = setting if window is None else f"{setting}, window {window}"
        if lead is None and len({s for s, _ in options}) == 1:
            note += " (the only setting measured)"  # the failover
        row = {**options[key], "name": plain, "note": note}
        throughput = _THROUGHPUT_NAME.fullmatch(plain[len(PREFIX) + 1 :])
        if throughput is not None and int(throughput[3]) == WINDOW and not throughput[4]:
            row["throughput_plot"] = {"size": int(throughput[2])}  # the peer's bar: its best at each size
        best.append(row)
    return sorted(best, key=lambda row: place[row["name"]])


def main(argv: list[str]) -> None:
    if argv[:1] == ["node"]:
        node_main(argv[3], argv[4:-1], Path(argv[-1]), _parse_batch_argument(argv[1]), _parse_policy_argument(argv[2]))
    elif argv[:1] == ["client"]:
        client_main(argv[2:], _parse_batch_argument(argv[1]))
    else:
        # Per setting only: the best rows are python -m bench's (derived_rows, over the repetitions' medians).
        for row in run("--quick" in argv):
            print(f"{row['name']}: {'n/a' if row['value'] is None else format(row['value'], ',.2f')} {row['unit']}")


if __name__ == "__main__":
    main(sys.argv[1:])
