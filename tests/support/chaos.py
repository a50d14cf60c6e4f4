"""Chaos: a local cluster serving the key-value sample service under a seeded
schedule of faults, while several clients record every operation; afterwards
everything is healed and the history, the logs and the service states are
checked.

What runs
---------
* A ``LocalCluster`` of 3 or 5 members (real processes on 127.0.0.1) running
  ``KeyValueService``.
* ``clients`` threads, each with its own session, issuing one request at a
  time: get, put and compare-and-set on a few keys (a fresh set of keys every
  ``key_epoch_s``, so that each key's history stays small enough to search).
  Every value written is unique.  Each operation is recorded with its
  invocation and completion times (one monotonic clock) and its outcome:
  ``ok`` (the reply), ``fail`` (never offered to the cluster, so never in the
  log) or ``unknown`` (offered, no reply in time).  A reply that arrives late
  still completes its operation.
* A nemesis that, on a schedule drawn from ``seed``, injects one fault at a
  time, holds it, heals it and lets the cluster recover:

  - ``kill``: SIGKILL one process (driver, archive, consensus module or
    service) of the leader or of a follower; on heal the processes that
    depend on it are killed too (a module without its driver, archive or
    service cannot go on) and the member is started again, as an operator or
    a supervisor would;
  - ``kill-member``: SIGKILL all four processes of a member, then restart it
    (on 5 members, ``kill-two``: two members at once);
  - ``pause`` / ``pause-module``: SIGSTOP the whole member or only its
    consensus module for longer than the leader heartbeat timeout, then
    SIGCONT: a paused leader comes back deposed;
  - ``isolate``: the member's driver drops every datagram in and out (its
    loss injection, ``cluster-tool loss``): the leader or a follower cut off,
    which is the 2/1 split of 3 members (``isolate-two`` on 5: a 3/1/1 split);
  - ``one-way``: the member's driver drops everything it sends, or everything
    it receives;
  - ``flaky``: every member's driver drops a share (10-30%) of what it sends
    and receives;
  - ``restart-all``: every node stops in order (SIGTERM to each process,
    the modules first: a member of several takes no snapshot), then
    the whole cluster starts again on its own configuration;
  - ``kill-all``: SIGKILL every process of every member at once (a power
    cut), then the whole cluster starts again.

  Each round applies every fault once, in an order drawn from the seed; a
  run lasts ``seconds`` but at least one whole round.  The schedule is a
  function of the seed; where it lands in the workload is
  not (processes and threads are scheduled by the machine), so a seed replays
  the same faults in the same order with the same durations, not the same
  interleaving.

What is checked (any failure is an anomaly)
--------------------------------------------
After healing, every member must run again and reach the leader's commit
position (convergence).  A fresh client reads every key.  Then:

(a) the history is linearizable (``linearizability.check``, per key);
(b) the log: every acknowledged put and swapped cas is in it, no request is
    in it twice, no request that was never offered is in it, and replaying it
    through the service's own ``apply`` gives exactly the reply each
    acknowledged operation received;
(c) every member holds the same log up to the commit position, and after a
    snapshot every member's service state is the same, and equal to the
    replayed log's state and to the final reads;
(d) ``cluster-tool verify-log`` finds nothing wrong in the recorded logs:
    every term's NewLeadershipTermEvent carries that term, terms rise along
    each log, the recording logs match the logs, and the members agree where
    Raft says they must (a wrong term written into a log passes (a)-(c)).

A failed run saves the history, the schedule, the report and every process's
log under ``artifacts`` and names the seed.

Run it: ``make chaos`` (3 and 5 members), ``make soak`` (longer), or
``python tests/support/chaos.py --members 3 --seconds 60 --seed 7``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

# Run by path (python tests/support/chaos.py, as make chaos does), the first entry of
# the path is this folder: tests/ must be there instead, for the support package.
if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from fulmar.aeron import Aeron  # noqa: E402
from fulmar.archive.catalog import Catalog  # noqa: E402
from fulmar.archive.segment import list_segment_files, segment_base_of_file  # noqa: E402
from fulmar.cli.aeron_stat import set_loss  # noqa: E402
from fulmar.cli.cluster_commands import cluster_operate  # noqa: E402
from fulmar.cli.verify_log_commands import verify_log  # noqa: E402
from fulmar.codecs.generated import cluster as cluster_codecs  # noqa: E402
from fulmar.consensus.backup import CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID as BACKUP_LIVE_LOG_POSITION_TYPE_ID  # noqa: E402
from fulmar.consensus.client import ClusterClient, _wait_for_data  # noqa: E402
from fulmar.consensus.member_auth import BEFORE_START_REASON  # noqa: E402
from fulmar.consensus.recording_log import RecordingLog  # noqa: E402
from fulmar.errors import FulmarError  # noqa: E402
from fulmar.fragment_assembler import FragmentAssembler  # noqa: E402
from fulmar.frames import FrameType  # noqa: E402
from fulmar.service.samples import KeyValueService  # noqa: E402
from support import linearizability  # noqa: E402
from support.backup import Backup, backup_log  # noqa: E402
from support.cluster import FAST_ELECTION_ARGS, KEY_VALUE_SERVICE, KINDS, LocalCluster  # noqa: E402
from support.driver import wait_for  # noqa: E402
from support.multi_node import LEADER, assert_same_logs, leaders, log_frames, member_view  # noqa: E402

# The leader heartbeat timeout the chaos cluster runs with: pauses last longer.
HEARTBEAT_TIMEOUT_S = 2.0
# A module whose service died stops after 3 s, so that a dead service on the
# leader fails over instead of leaving the cluster without answers.
CHAOS_CONSENSUS_ARGS = (
    *FAST_ELECTION_ARGS,
    "--leader-heartbeat-timeout",
    f"{HEARTBEAT_TIMEOUT_S:g}s",
    "--service-heartbeat-timeout",
    "3s",
)
# What a process kind cannot live without: killing the first means the others
# of the member go down with it and start again.
DEPENDENTS = {
    "driver": ("archive", "consensus", "service"),
    "archive": ("consensus", "service"),
    "consensus": ("service",),
    "service": ("consensus",),
}
NEMESES_3 = (
    "kill",
    "kill-member",
    "pause",
    "pause-module",
    "isolate",
    "one-way",
    "flaky",
    "restart-all",
    "kill-all",
)
# Every process of a node, in the order its supervisor stops them (the module
# first: its services follow it, the archive and the driver outlast both).
STOP_ORDER = ("consensus", "service", "archive", "driver")
NEMESES_5 = (*NEMESES_3, "kill-two", "isolate-two")
_SBE_HEADER_LENGTH = 8
_SESSION_HEADER_LENGTH = _SBE_HEADER_LENGTH + cluster_codecs.SessionMessageHeaderDecoder.BLOCK_LENGTH
_BEGIN_END = 0xC0


@dataclass
class ChaosConfig:
    members: int = 3
    seconds: float = 60.0
    seed: int = 0
    clients: int = 4
    keys: int = 3
    key_epoch_s: float = 10.0
    request_timeout_s: float = 1.0
    pace_s: float = 0.02  # a client's mean pause between requests
    reconnect_after_s: float = 8.0  # a client with no answer for this long opens a new session
    nemeses: tuple[str, ...] = ()  # default: every nemesis that fits the member count
    artifacts: Path = Path("chaos-artifacts")
    converge_timeout_s: float = 120.0
    keep_artifacts: bool = False  # save history, schedule and logs even when nothing is wrong
    # A cluster backup follows the log through the faults; at the end its
    # copy must equal the members' log (issue 20).
    backup: bool = True
    # The cluster's secret (None: none): clients authenticate, the members
    # sign their consensus messages and MAC the log's datagrams (issue 48).
    secret: str | None = None

    def nemesis_kinds(self) -> tuple[str, ...]:
        if self.nemeses:
            return self.nemeses
        return NEMESES_5 if self.members >= 5 else NEMESES_3


# ----------------------------------------------------------------------------- history


@dataclass
class Op:
    """One request and what came of it (times: ``time.monotonic_ns()``)."""

    id: str
    client: int
    op: str
    key: str
    invoke: int
    value: int | None = None
    expected: int | None = None
    complete: int | None = None
    outcome: str = "pending"  # then ok, fail or unknown
    reply: dict[str, Any] | None = None
    late: bool = False  # the reply came after the client had given up waiting
    source: str = ""  # the egress it came on: which member's publication, which term

    def operation(self) -> linearizability.Operation:
        """As the checker takes it."""
        if self.outcome != "ok":
            outcome = "fail" if self.outcome == "fail" else "unknown"
            return linearizability.Operation(
                self.client, self.op, self.key, self.invoke, outcome=outcome, value=self.value, expected=self.expected
            )
        reply = self.reply or {}
        if self.op == "get":
            return linearizability.Operation(
                self.client, "get", self.key, self.invoke, self.complete, output=reply.get("value")
            )
        if self.op == "put":
            return linearizability.Operation(
                self.client, "put", self.key, self.invoke, self.complete, value=self.value, output=reply.get("previous")
            )
        return linearizability.Operation(
            self.client,
            "cas",
            self.key,
            self.invoke,
            self.complete,
            value=self.value,
            expected=self.expected,
            output=reply.get("value"),
            swapped=bool(reply.get("ok")),
        )


class History:
    """Every operation of every client, and the replies matched to them by id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ops: dict[str, Op] = {}
        self.strange_replies: list[str] = []

    def invoke(self, op: Op) -> None:
        with self._lock:
            self.ops[op.id] = op

    def on_reply(self, payload: bytes, source: str = "") -> None:
        """A reply, whenever it comes: it completes the operation its id names.
        ``source`` says where it came from (which member's egress, which term)."""
        now = time.monotonic_ns()
        try:
            reply = json.loads(payload)
            op = self.ops.get(str(reply.get("id"))) if isinstance(reply, dict) else None
        except ValueError:
            reply, op = None, None
        with self._lock:
            if op is None or "error" in reply:
                self.strange_replies.append(payload.decode(errors="replace"))
            elif op.reply is not None:
                self.strange_replies.append(
                    f"a second reply to {op.id} {(now - op.invoke) / 1e9:.3f} s after it was sent (the first after "
                    f"{((op.complete or now) - op.invoke) / 1e9:.3f} s {op.source}), {source}: "
                    f"{payload.decode(errors='replace')}"
                )
            else:
                op.reply, op.complete, op.source = reply, now, source
                op.late = op.outcome == "unknown"
                op.outcome = "ok"

    def give_up(self, op: Op, outcome: str) -> None:
        with self._lock:
            if op.outcome == "pending":
                op.outcome = outcome

    def all(self) -> list[Op]:
        with self._lock:
            return sorted(self.ops.values(), key=lambda op: op.invoke)


class KvClient(threading.Thread):
    """One client: one request at a time, a new session when the old one is closed
    or silent for several requests in a row."""

    def __init__(
        self,
        index: int,
        cluster: LocalCluster,
        history: History,
        config: ChaosConfig,
        started_ns: int,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"kv-client-{index}", daemon=True)
        self.index = index
        self.cluster = cluster
        self.history = history
        self.config = config
        self.started_ns = started_ns
        self.stop_event = stop
        self.random = random.Random(f"{config.seed}/client/{index}")
        self.sequence = 0
        self.seen: dict[str, int | None] = {}
        self.aeron: Aeron | None = None
        self.client: ClusterClient | None = None
        self.sessions = 0
        self.connect_failures: list[str] = []
        self.crash: BaseException | None = None
        self._source = ""  # where the egress fragment being handled came from

    def run(self) -> None:
        try:
            self._run()
        except BaseException as error:  # noqa: BLE001 - reported by the harness as an anomaly
            self.crash = error

    def _run(self) -> None:
        answered = time.monotonic()
        while not self.stop_event.is_set():
            if self.client is None or self.client.is_closed:
                self._connect()
                answered = time.monotonic()
                continue
            op = self._next_op()
            if self._perform(op) == "ok":
                answered = time.monotonic()
            elif time.monotonic() - answered > self.config.reconnect_after_s:
                # A leader change keeps the session (NewLeaderEvent), but the
                # cluster may have closed it meanwhile without the client
                # hearing: after a long silence, start a new one.
                self._close()
            self.stop_event.wait(self.random.expovariate(1 / self.config.pace_s) if self.config.pace_s else 0)
        self._close()

    def _connect(self) -> None:
        try:
            if self.aeron is None:
                self.aeron = self.cluster.connect()  # one Aeron client for all this client's sessions
            self.client = ClusterClient.connect(
                self.aeron,
                "aeron:udp",
                self.cluster.ingress_endpoints,
                egress_channel="aeron:udp?endpoint=127.0.0.1:0",
                message_timeout_ns=int(5e9),
                on_message=lambda _session, _timestamp, payload: self.history.on_reply(bytes(payload), self._source),
                credentials=self.cluster.secret.encode() if self.cluster.secret is not None else b"",
            )
            _note_reply_sources(self.client, self)
            self.sessions += 1
        except FulmarError as error:
            self.connect_failures.append(f"{type(error).__name__}: {error}")
            self.stop_event.wait(0.2)

    def _close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                client.close()
            except FulmarError:
                pass

    def _next_op(self) -> Op:
        now = time.monotonic_ns()
        epoch = int((now - self.started_ns) / 1e9 // self.config.key_epoch_s)
        key = f"k{epoch}-{self.random.randrange(self.config.keys)}"
        self.sequence += 1
        op_id = f"{self.index}-{self.sequence}"
        value = self.index * 1_000_000_000 + self.sequence
        roll = self.random.random()
        if roll < 0.4:
            return Op(op_id, self.index, "get", key, now)
        if roll < 0.7:
            return Op(op_id, self.index, "put", key, now, value=value)
        expected = self.seen.get(key) if self.random.random() < 0.8 else self.random.choice([None, -1])
        return Op(op_id, self.index, "cas", key, now, value=value, expected=expected)

    def _perform(self, op: Op) -> str:
        client = self.client
        assert client is not None
        request: dict[str, Any] = {"op": op.op, "key": op.key, "id": op.id}
        if op.op != "get":
            request["value"] = op.value
        if op.op == "cas":
            request["expected"] = op.expected
        payload = json.dumps(request, separators=(",", ":")).encode()
        deadline = time.monotonic_ns() + int(self.config.request_timeout_s * 1e9)
        self.history.invoke(op)
        try:
            while client.offer(payload) <= 0:
                client.poll_egress()
                if time.monotonic_ns() >= deadline:
                    self.history.give_up(op, "fail")  # never offered: it cannot be in the log
                    return "fail"
                time.sleep(0.001)
            while op.reply is None and time.monotonic_ns() < deadline:
                if not client.poll_egress():
                    _wait_for_egress(client, min(deadline - time.monotonic_ns(), 5_000_000))
        except FulmarError:
            pass  # the session closed: the request may still have been committed
        if op.reply is None:
            self.history.give_up(op, "unknown")
            return "unknown"
        self._remember(op)
        return "ok"

    def _remember(self, op: Op) -> None:
        """The last value this client saw under the key (what its next cas expects)."""
        reply = op.reply or {}
        if op.op == "get" or op.op == "cas":
            self.seen[op.key] = reply.get("value")
        else:
            self.seen[op.key] = op.value


def _note_reply_sources(client: ClusterClient, owner: KvClient) -> None:
    """Before the client handles an egress fragment, note which member's
    publication (its source address and session) and which leadership term
    it came from, so that a duplicate reply says who sent it."""
    handle = client._on_fragment

    def noting(buffer: memoryview, offset: int, length: int, header: Any) -> None:
        term = int.from_bytes(buffer[offset + 8 : offset + 16], "little", signed=True) if length >= 16 else None
        image = client.subscription.image_by_session_id(header.session_id)
        where = image.source_identity if image is not None else "?"
        owner._source = f"from {where} (publication session {header.session_id}, leadership term {term})"
        handle(buffer, offset, length, header)

    client._assembler = FragmentAssembler(noting)


def _wait_for_egress(client: ClusterClient, timeout_ns: int) -> None:
    """Sleep on the client driver's data doorbell until egress may have arrived."""
    if timeout_ns > 0:
        _wait_for_data(client.aeron, client.subscription.is_data_available, timeout_ns)


# ----------------------------------------------------------------------------- nemesis


@dataclass
class FaultEvent:
    kind: str
    members: list[int]
    detail: str
    start_s: float  # since the workload started
    healed_s: float | None = None
    recovered_s: float | None = None  # a leader again after healing
    longest_wait_s: float | None = None  # the longest time without an answer, from the fault to 3 s after heal


class Nemesis:
    """Injects one fault at a time on the seeded schedule; always leaves the
    cluster healed (``heal_all``), whatever happened."""

    def __init__(self, cluster: LocalCluster, config: ChaosConfig, started: float) -> None:
        self.cluster = cluster
        self.config = config
        self.started = started
        self.random = random.Random(f"{config.seed}/nemesis")
        self.events: list[FaultEvent] = []
        self.problems: list[str] = []
        self.paused: set[int] = set()  # pids under SIGSTOP
        self.lossy: set[int] = set()  # members whose driver drops datagrams
        self.ended = 0.0  # when the last fault was healed (seconds since the start)

    def now(self) -> float:
        return time.monotonic() - self.started

    def run(self, until: float, stop: threading.Event) -> None:
        """Rounds of every fault once, each round in a seeded order, until
        ``until`` seconds have passed, but at least one whole round."""
        kinds = list(self.config.nemesis_kinds())
        round_left: list[str] = []
        while not stop.is_set() and (self.now() < until - 1 or len(self.events) < len(kinds)):
            if stop.wait(self.random.uniform(1.0, 3.0)):
                break
            if not round_left:
                round_left = self.random.sample(kinds, len(kinds))
            kind = round_left.pop()
            hold = self.random.uniform(HEARTBEAT_TIMEOUT_S + 1.0, HEARTBEAT_TIMEOUT_S + 4.0)
            event = self._inject(kind)
            self.events.append(event)
            stop.wait(hold)
            self._heal(event)
            event.healed_s = self.now()
            if self._wait_for_a_leader(30):
                event.recovered_s = self.now()
            else:
                self.problems.append(f"no leader within 30 s of healing {kind} on {event.members}")
        self.ended = self.now()

    # -- choosing targets

    def _leader(self) -> int | None:
        found = leaders(self.cluster)
        return found[0].member if len(found) == 1 else None

    def _pick(self, count: int = 1) -> list[int]:
        """``count`` members: the leader first when the coin says so."""
        members = list(range(self.cluster.size))
        leader = self._leader()
        chosen: list[int] = []
        if leader is not None and self.random.random() < 0.5:
            chosen.append(leader)
        rest = [m for m in members if m not in chosen]
        self.random.shuffle(rest)
        return chosen + rest[: count - len(chosen)]

    def _role(self, member: int) -> str:
        return "leader" if member == self._leader() else "follower"

    # -- faults

    def _inject(self, kind: str) -> FaultEvent:
        if kind == "kill":
            [member] = self._pick()
            victim = self.random.choice(KINDS)
            detail = f"SIGKILL the {victim} of member {member} ({self._role(member)})"
            self.cluster.kill_process(member, victim)
            return FaultEvent(kind, [member], detail, self.now())
        if kind in ("kill-member", "kill-two"):
            members = self._pick(2 if kind == "kill-two" else 1)
            roles = ", ".join(f"{m} ({self._role(m)})" for m in members)
            for member in members:
                self.cluster.kill_member(member)
            return FaultEvent(kind, members, f"SIGKILL every process of member {roles}", self.now())
        if kind in ("pause", "pause-module"):
            [member] = self._pick()
            kinds = ("consensus",) if kind == "pause-module" else KINDS
            detail = (
                f"SIGSTOP the {'consensus module' if kind == 'pause-module' else 'processes'} of member "
                f"{member} ({self._role(member)})"
            )
            for process_kind in kinds:
                process = self.cluster.process(member, process_kind)
                if process is not None and process.alive:
                    process.process.send_signal(signal.SIGSTOP)
                    self.paused.add(process.process.pid)
            return FaultEvent(kind, [member], detail, self.now())
        if kind in ("isolate", "isolate-two"):
            members = self._pick(2 if kind == "isolate-two" else 1)
            roles = ", ".join(f"{m} ({self._role(m)})" for m in members)
            for member in members:
                self._set_loss(member, 1_000_000, 1_000_000)
            return FaultEvent(kind, members, f"cut off member {roles}: every datagram in and out dropped", self.now())
        if kind == "one-way":
            [member] = self._pick()
            sending = self.random.random() < 0.5
            self._set_loss(member, 0 if sending else 1_000_000, 1_000_000 if sending else 0)
            way = "sends" if sending else "receives"
            return FaultEvent(kind, [member], f"member {member} ({self._role(member)}) loses all it {way}", self.now())
        if kind == "flaky":
            rate = self.random.randint(100_000, 300_000)
            members = list(range(self.cluster.size))
            for member in members:
                self._set_loss(member, rate, rate)
            return FaultEvent(
                kind, members, f"every member drops {rate / 10_000:g}% of what it sends and receives", self.now()
            )
        if kind == "restart-all":
            for process_kind in STOP_ORDER:
                for member in range(self.cluster.size):
                    if self.cluster.is_running(member, process_kind):
                        self.cluster.stop_process(member, process_kind)
            members = list(range(self.cluster.size))
            return FaultEvent(kind, members, "SIGTERM every process of every member in order (no snapshot)", self.now())
        if kind == "kill-all":
            running = [
                process
                for member in range(self.cluster.size)
                for process in self.cluster.processes[member].values()
                if process.alive
            ]
            for process in running:
                process.process.send_signal(signal.SIGKILL)
            for process in running:
                process.kill()
            members = list(range(self.cluster.size))
            return FaultEvent(kind, members, "SIGKILL every process of every member at once", self.now())
        raise ValueError(f"no nemesis {kind!r} (nemeses: {', '.join(NEMESES_5)})")

    def _set_loss(self, member: int, receive_ppm: int, send_ppm: int) -> None:
        if not self.cluster.is_running(member, "driver"):
            return
        try:
            set_loss(self.cluster.driver_dir(member), receive_ppm, send_ppm, ())
        except FulmarError as error:
            self.problems.append(f"could not set member {member}'s loss: {error}")
            return
        if receive_ppm or send_ppm:
            self.lossy.add(member)
        else:
            self.lossy.discard(member)

    def _heal(self, event: FaultEvent) -> None:
        if event.kind in ("restart-all", "kill-all"):
            # Every member at once, one process kind at a time across them (a
            # module waits for the others before it says it is ready).
            try:
                self.cluster.start()
            except AssertionError as error:
                self.problems.append(f"the cluster did not start again: {error}")
        if event.kind in ("pause", "pause-module"):
            self._resume_all()
        elif event.kind in ("isolate", "isolate-two", "one-way", "flaky"):
            for member in list(self.lossy):
                self._set_loss(member, 0, 0)
        self._restart_dead()

    def _resume_all(self) -> None:
        for pid in list(self.paused):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.paused.discard(pid)

    def _restart_dead(self) -> None:
        """Every member with a dead process: its dependents go too, then it starts again."""
        for member in range(self.cluster.size):
            dead = [kind for kind in KINDS if not self.cluster.is_running(member, kind)]
            if not dead:
                continue
            for kind in dead:
                for dependent in DEPENDENTS[kind]:
                    if self.cluster.is_running(member, dependent):
                        self.cluster.kill_process(member, dependent)
            try:
                self.cluster.start_member(member)
            except AssertionError as error:
                self.problems.append(f"member {member} did not start again: {error}")

    def heal_all(self) -> None:
        self._resume_all()
        for member in range(self.cluster.size):
            if self.cluster.is_running(member, "driver"):
                self._set_loss(member, 0, 0)
        self._restart_dead()

    def _wait_for_a_leader(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._leader() is not None:
                return True
            time.sleep(0.1)
        return False


# ----------------------------------------------------------------------------- checks


@dataclass
class LogRequest:
    position_index: int  # the n-th request in the log
    request: dict[str, Any]
    raw: bytes


def log_requests(frames: Iterable[tuple[int, int, bytes]]) -> tuple[list[LogRequest], list[str]]:
    """The key-value requests in a log, in order (reassembling fragments), and
    anything in it that is not what the chaos clients send."""
    requests: list[LogRequest] = []
    problems: list[str] = []
    pending = b""
    for frame_type, flags, payload in frames:
        if frame_type != FrameType.DATA:
            continue
        if flags & _BEGIN_END != _BEGIN_END:
            pending = payload if flags & 0x80 else pending + payload
            if not flags & 0x40:
                continue
            payload, pending = pending, b""
        if len(payload) < _SBE_HEADER_LENGTH:
            problems.append(f"a {len(payload)}-byte message in the log")
            continue
        template_id = int.from_bytes(payload[2:4], "little")
        if template_id != cluster_codecs.SessionMessageHeaderDecoder.TEMPLATE_ID:
            continue  # session open/close, new leadership term, timers...
        body = payload[_SESSION_HEADER_LENGTH:]
        try:
            request = json.loads(body)
            assert isinstance(request, dict) and "id" in request
        except (ValueError, AssertionError):
            problems.append(f"a session message in the log that no chaos client sent: {body[:80]!r}")
            continue
        requests.append(LogRequest(len(requests), request, bytes(body)))
    return requests, problems


def check_log_against_history(requests: list[LogRequest], ops: dict[str, Op]) -> tuple[list[str], dict[str, Any]]:
    """Check (b): the log holds every acknowledged write once, nothing twice and
    nothing never offered, and replaying it answers each acknowledged
    operation exactly as the cluster did.  Returns the anomalies and the
    state the log leads to."""
    anomalies: list[str] = []
    model = KeyValueService()
    seen: set[str] = set()
    for entry in requests:
        op_id = entry.request["id"]
        reply = model.apply(entry.raw)
        if op_id in seen:
            anomalies.append(f"request {op_id} is in the log twice (applied twice), again at #{entry.position_index}")
            continue
        seen.add(op_id)
        op = ops.get(op_id)
        if op is None:
            anomalies.append(f"request {op_id} is in the log but no client sent it")
        elif op.outcome == "fail":
            anomalies.append(f"request {op_id} is in the log but was never offered")
        elif op.outcome == "ok" and op.reply != reply:
            anomalies.append(f"request {op_id} was answered {op.reply} but the log's replay answers {reply}")
    for op in ops.values():
        if (
            op.outcome == "ok"
            and op.id not in seen
            and (op.op == "put" or (op.op == "cas" and op.reply and op.reply.get("ok")))
        ):
            anomalies.append(f"acknowledged write {op.id} ({op.op} {op.key}={op.value}) is not in the log: lost")
    return anomalies, dict(model.data)


def read_recording(archive_dir: Path, recording_id: int) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload) of every frame of a stopped recording, from its
    segment files (start to stop position, as the catalog says)."""
    catalog = Catalog.open_read_only(archive_dir)
    try:
        descriptor = catalog.descriptor(recording_id)
    finally:
        catalog.close()
    assert descriptor is not None, f"recording {recording_id} is not in {archive_dir}'s catalog"
    names = sorted(list_segment_files(archive_dir, recording_id), key=segment_base_of_file)
    assert names, f"recording {recording_id} has no segment files in {archive_dir}"
    base = segment_base_of_file(names[0])
    data = b"".join((archive_dir / name).read_bytes() for name in names)
    frames = []
    position = descriptor.start_position
    while position < descriptor.stop_position:
        offset = position - base
        length = int.from_bytes(data[offset : offset + 4], "little", signed=True)
        assert length > 0, f"recording {recording_id}: no frame at {position} (stop {descriptor.stop_position})"
        frames.append((data[offset + 6] | data[offset + 7] << 8, data[offset + 5], data[offset + 32 : offset + length]))
        position += (length + 31) & ~31
    return frames


def snapshot_state(cluster: LocalCluster, member: int, min_position: int) -> dict[str, Any]:
    """The key-value state in the member's latest service snapshot (taken at
    ``min_position`` or later): the service's own ``[key, value]`` messages
    between the cluster's snapshot markers."""
    log = RecordingLog.open(cluster.cluster_dir(member), create=False)
    try:
        entry = log.get_latest_snapshot(0)
    finally:
        log.close()
    assert entry is not None and entry.log_position >= min_position, (
        f"member {member} has no service snapshot at or after {min_position}: {entry}"
    )
    state: dict[str, Any] = {}
    for frame_type, _flags, payload in read_recording(cluster.archive_dir(member), entry.recording_id):
        if frame_type != FrameType.DATA or len(payload) < _SBE_HEADER_LENGTH:
            continue
        if int.from_bytes(payload[4:6], "little") == cluster_codecs.SCHEMA_ID:
            continue  # the snapshot markers and the container's own records
        key, value = json.loads(payload)
        state[key] = value
    return state


# ----------------------------------------------------------------------------- the run


@dataclass
class ChaosReport:
    config: dict[str, Any]
    operations: dict[str, int] = field(default_factory=dict)
    by_op: dict[str, dict[str, int]] = field(default_factory=dict)
    late_replies: int = 0
    sessions: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    linearizable: bool | None = None
    keys_checked: int = 0
    log_requests: int = 0
    commit_position: int = 0
    availability: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    artifacts: str | None = None
    # Whether the healed cluster converged (one leader, every member running and
    # at its commit position); None when the run ended before the wait.
    converged: bool | None = None
    # Whether the backup's log equals the members' up to the commit position
    # (None: no backup in this run, or the run ended before the check).
    backup_matches: bool | None = None
    # What verify-log found in the members' recorded logs (None: not checked).
    log_violations: int | None = None
    # Member messages a member dropped as not a member's (None: not checked):
    # no stranger speaks in a chaos run, so any is a member's own message
    # its peer refused (a trailer or replay window gone wrong).
    refused_member_messages: int | None = None

    def summary(self) -> str:
        c = self.config
        lines = [f"chaos: {c['members']} members, {c['clients']} clients, {c['seconds']:g} s, seed {c['seed']}"]
        ops = self.operations
        lines.append(
            f"  operations      {sum(ops.values())}: "
            + ", ".join(f"{n} {k}" for k, n in sorted(ops.items()))
            + f" ({self.late_replies} answered late); {self.sessions} client sessions"
        )
        for name, counts in sorted(self.by_op.items()):
            lines.append(f"    {name:<5} " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
        kinds = Counter(e["kind"] for e in self.events)
        lines.append(
            f"  nemesis events  {len(self.events)}: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        )
        for event in self.events[:40]:
            healed = event["healed_s"]
            held = f"{healed - event['start_s']:.1f} s" if healed is not None else "not healed"
            gap = event.get("longest_wait_s")
            waited = f"; no answer for {gap:.1f} s at most" if gap is not None else ""
            lines.append(f"    {event['start_s']:6.1f} s  {event['detail']} (held {held}{waited})")
        if len(self.events) > 40:
            lines.append(f"    ... and {len(self.events) - 40} more")
        a = self.availability
        if a:
            lines.append(
                f"  availability    {a['ok_per_s_healthy']:.0f} ok ops/s healthy, {a['ok_per_s_faulted']:.0f} "
                f"during faults; {a['seconds_with_ok_faulted']:.0%} of faulted seconds and "
                f"{a['seconds_with_ok_healthy']:.0%} of healthy seconds answered at least one request; "
                f"longest gap {a['longest_gap_s']:.1f} s; recovery after heal median "
                f"{a['recovery_median_s']:.2f} s, max {a['recovery_max_s']:.2f} s"
            )
        verdict = {True: "yes", False: "NO", None: "undecided (search budget)"}[self.linearizable]
        lines.append(
            f"  linearizable    {verdict} ({self.keys_checked} keys); log {self.log_requests} requests "
            f"up to position {self.commit_position}, identical on every member"
        )
        if self.backup_matches is not None:
            lines.append(f"  backup          {'log identical to the members' if self.backup_matches else 'DIFFERS'}")
        if self.log_violations is not None:
            lines.append(f"  verify-log      {self.log_violations} violations")
        if self.refused_member_messages is not None:
            lines.append(f"  refused         {self.refused_member_messages} member messages dropped as not a member's")
        lines.append(f"  anomalies       {len(self.anomalies)}")
        lines.extend(f"    - {a}" for a in self.anomalies[:20])
        if len(self.anomalies) > 20:
            lines.append(f"    ... and {len(self.anomalies) - 20} more")
        if self.artifacts:
            lines.append(f"  artifacts       {self.artifacts}")
            lines.append(
                f"  reproduce with  python tests/support/chaos.py --members {c['members']} --seconds {c['seconds']:g} "
                f"--clients {c['clients']} --seed {c['seed']}"
            )
        lines.append(f"  took            {self.elapsed_s:.0f} s")
        return "\n".join(lines)


def _availability(ops: list[Op], events: list[FaultEvent], started_ns: int, seconds: float) -> dict[str, Any]:
    """Answered requests per second with and without a fault in force, the
    share of one-second buckets that answered anything, the longest time
    without an answer, and how long the cluster took to have a leader again."""
    completions = sorted((op.complete - started_ns) / 1e9 for op in ops if op.outcome == "ok" and op.complete)
    buckets = Counter(int(t) for t in completions if t < seconds)
    faulted: set[int] = set()
    for event in events:
        end = event.recovered_s if event.recovered_s is not None else event.healed_s or seconds
        faulted.update(range(int(event.start_s), int(end) + 1))
    all_seconds = range(int(seconds))
    faulted_seconds = [s for s in all_seconds if s in faulted]
    healthy_seconds = [s for s in all_seconds if s not in faulted]

    def rate(span: list[int]) -> float:
        return sum(buckets[s] for s in span) / len(span) if span else 0.0

    def answered(span: list[int]) -> float:
        return sum(1 for s in span if buckets[s]) / len(span) if span else 1.0

    for event in events:
        # The longest time without an answer from the fault until 3 s after it healed.
        end = (event.healed_s if event.healed_s is not None else seconds) + 3.0
        inside = [t for t in completions if event.start_s < t < end]
        points = [event.start_s, *inside, end]
        event.longest_wait_s = max(b - a for a, b in zip(points, points[1:]))
    edges = [0.0, *completions, seconds]
    recoveries = sorted(e.recovered_s - e.healed_s for e in events if e.recovered_s is not None and e.healed_s)
    return {
        "ok_per_s_healthy": rate(healthy_seconds),
        "ok_per_s_faulted": rate(faulted_seconds),
        "seconds_with_ok_healthy": answered(healthy_seconds),
        "seconds_with_ok_faulted": answered(faulted_seconds),
        "longest_gap_s": max(b - a for a, b in zip(edges, edges[1:])),
        "recovery_median_s": recoveries[len(recoveries) // 2] if recoveries else 0.0,
        "recovery_max_s": recoveries[-1] if recoveries else 0.0,
    }


class NotConvergedError(AssertionError):
    """The healed cluster did not reach one leader with every member running
    and committed to its position in time (a liveness failure, told apart from
    the safety anomalies)."""


def _converge(cluster: LocalCluster, timeout_s: float) -> int:
    """Wait until one leader leads and every member runs and has committed
    what the leader has, with the leader's commit position standing still;
    that position (NotConvergedError if not within ``timeout_s``)."""
    found: list[int] = []
    last: list[int] = []

    def converged() -> bool:
        views = [member_view(cluster, m) for m in range(cluster.size)]
        leading = [v for v in views if v.running and v.role == LEADER]
        if len(leading) != 1 or not all(v.running for v in views):
            return False
        position = leading[0].commit_position or 0
        if all(v.commit_position == position for v in views) and last == [position]:
            found[:] = [position]
            return True
        last[:] = [position]
        return False

    try:
        wait_for(converged, timeout_s, "every member to run and commit what the leader committed", poll_s=0.5)
    except AssertionError as error:
        raise NotConvergedError(str(error)) from None
    return found[0]


def _final_reads(cluster: LocalCluster, history: History, keys: list[str]) -> list[str]:
    """Read every key once more, through a fresh session, into the history."""
    problems: list[str] = []
    client = cluster.connect_client(
        on_message=lambda _s, _t, payload: history.on_reply(bytes(payload)), message_timeout_ns=int(30e9)
    )
    try:
        for index, key in enumerate(keys):
            op = Op(f"final-{index}", -1, "get", key, time.monotonic_ns())
            history.invoke(op)
            payload = json.dumps({"op": "get", "key": key, "id": op.id}, separators=(",", ":")).encode()
            deadline = time.monotonic() + 30
            while client.offer(payload) <= 0 and time.monotonic() < deadline:
                client.poll_egress()
                time.sleep(0.001)
            while op.reply is None and time.monotonic() < deadline:
                if not client.poll_egress():
                    _wait_for_egress(client, 5_000_000)
            if op.reply is None:
                history.give_up(op, "unknown")
                problems.append(f"the final read of {key} got no answer from the healed cluster")
    finally:
        client.close()
    return problems


def run_chaos(config: ChaosConfig, *, progress: Callable[[str], None] = lambda _: None) -> ChaosReport:
    began = time.monotonic()
    report = ChaosReport(
        config={**asdict(config), "artifacts": str(config.artifacts), "nemeses": list(config.nemesis_kinds())}
    )
    history = History()
    cluster = LocalCluster(
        config.members, KEY_VALUE_SERVICE, extra_consensus_args=CHAOS_CONSENSUS_ARGS, secret=config.secret
    )
    nemesis: Nemesis | None = None
    backup: Backup | None = None
    stop = threading.Event()
    clients: list[KvClient] = []
    try:
        cluster.start()
        wait_for(lambda: len(leaders(cluster)) == 1, 60, "a first leader")
        if config.backup:
            backup = Backup(cluster, credentials=config.secret)
        progress(f"cluster of {config.members} up; workload and nemesis for {config.seconds:g} s (seed {config.seed})")
        started_ns = time.monotonic_ns()
        nemesis = Nemesis(cluster, config, time.monotonic())
        clients = [KvClient(i, cluster, history, config, started_ns, stop) for i in range(config.clients)]
        for client in clients:
            client.start()
        try:
            nemesis.run(config.seconds, stop)
        finally:
            stop.set()
            nemesis.heal_all()
            for client in clients:
                client.join(30)
        report.events = [asdict(e) for e in nemesis.events]
        report.anomalies += nemesis.problems
        report.anomalies += [f"client {c.index} crashed: {c.crash!r}" for c in clients if c.crash]
        report.anomalies += [f"client thread {c.index} did not stop" for c in clients if c.is_alive()]
        progress(f"{len(nemesis.events)} faults injected and healed; waiting for convergence")
        _converge(cluster, config.converge_timeout_s)
        keys = sorted({op.key for op in history.all() if op.client >= 0})
        report.anomalies += _final_reads(cluster, history, keys)
        # A snapshot: every member's service writes its state into its own archive.
        before_snapshot = _converge(cluster, config.converge_timeout_s)
        cluster_operate(cluster.base, "snapshot", 60)
        wait_for(
            lambda: all(_has_snapshot_after(cluster, m, before_snapshot) for m in range(cluster.size)),
            60,
            f"every member's snapshot after position {before_snapshot}",
            poll_s=0.2,
        )
        position = _converge(cluster, config.converge_timeout_s)
        report.converged = True
        report.commit_position = position
        progress("checking the history, the logs and the service states")
        _check(cluster, history, report, position, before_snapshot)
        if backup is not None:
            _check_backup(cluster, backup, report, position, config.converge_timeout_s)
        _verify_logs(cluster, report)
        _check_member_refusals(cluster, report)
        report.availability = _availability(history.all(), nemesis.events, started_ns, nemesis.ended)
        report.events = [asdict(e) for e in nemesis.events]
        report.sessions = sum(c.sessions for c in clients)
    except BaseException as error:
        if isinstance(error, NotConvergedError):
            report.converged = False
        report.anomalies.append(f"the run failed: {type(error).__name__}: {error}")
        if not isinstance(error, Exception):
            raise
    finally:
        stop.set()
        if nemesis is not None:
            nemesis._resume_all()
        ops = history.all()
        report.operations = dict(Counter(op.outcome for op in ops))
        report.by_op = {
            name: dict(Counter(op.outcome for op in ops if op.op == name)) for name in ("get", "put", "cas")
        }
        report.late_replies = sum(1 for op in ops if op.late)
        report.anomalies += [f"a reply nobody asked for: {r[:120]}" for r in history.strange_replies]
        report.elapsed_s = time.monotonic() - began
        if report.anomalies or config.keep_artifacts:
            report.artifacts = str(_save_artifacts(config, cluster, history, report, backup))
        if backup is not None:
            backup.close()
        cluster.close()
    return report


def _check_backup(cluster: LocalCluster, backup: Backup, report: ChaosReport, position: int, timeout_s: float) -> None:
    """The backup followed the log through every fault: its copy reaches the
    converged commit position and holds the members' log, frame for frame."""
    try:
        wait_for(
            lambda: backup.counter(BACKUP_LIVE_LOG_POSITION_TYPE_ID) >= position,
            timeout_s,
            f"the backup's live log to reach {position}",
            poll_s=0.2,
        )
        theirs = log_frames(cluster, 0, position)
        mine = backup_log(backup, position)
    except AssertionError as error:
        report.backup_matches = False
        report.anomalies.append(f"the backup did not keep up: {error}")
        return
    report.backup_matches = mine == theirs
    if mine != theirs:
        differing = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        report.anomalies.append(
            f"the backup's log differs from the members' at frame {differing} "
            f"({len(mine)} frames against {len(theirs)})"
        )


def _verify_logs(cluster: LocalCluster, report: ChaosReport) -> None:
    """(d): ``cluster-tool verify-log`` over every member's recorded log."""
    verification = verify_log(cluster.base)
    report.log_violations = len(verification.violations)
    report.anomalies += [f"verify-log: {violation.text()}" for violation in verification.violations]
    report.anomalies += [f"verify-log could not read {u.member}: {u.reason}" for u in verification.unreadable]


# What a consensus module logs (at most once a second) when it drops a
# member message: "... (N more dropped since the last line)" counts the rest.
_REFUSAL_LINE = re.compile(r"consensus stream: dropped a message.*?(?:\((\d+) more dropped since the last line\))?$")


def _check_member_refusals(cluster: LocalCluster, report: ChaosReport) -> None:
    """No member message was refused: every member's consensus log, across its
    restarts, holds no line of a dropped member message, but for those signed
    before a restarted module began (addressed to its previous run)."""
    refused = 0
    for member in range(cluster.size):
        path = cluster.log_path(member, "consensus")
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            found = _REFUSAL_LINE.search(line)
            # What a restarted module's driver held for its previous run is
            # dropped as signed before it began: messages to a process gone.
            if found is not None and BEFORE_START_REASON not in line:
                refused += 1 + int(found.group(1) or 0)
                report.anomalies.append(f"member {member} refused a member message: {line[-200:]}")
    report.refused_member_messages = refused


def _has_snapshot_after(cluster: LocalCluster, member: int, position: int) -> bool:
    log = RecordingLog.open(cluster.cluster_dir(member), create=False)
    try:
        entry = log.get_latest_snapshot(0)
    finally:
        log.close()
    return entry is not None and entry.log_position >= position


def _check(cluster: LocalCluster, history: History, report: ChaosReport, position: int, snapshot_after: int) -> None:
    ops = {op.id: op for op in history.all()}
    # (a) linearizability, per key
    result = linearizability.check([op.operation() for op in ops.values()], timeout=120)
    report.linearizable = result.ok
    report.keys_checked = len(result.keys)
    if result.ok is False:
        report.anomalies.append("the history is not linearizable:\n" + result.explain())
    elif result.ok is None:
        report.anomalies.append("the linearizability search ran out of budget: " + result.explain())
    # (c) the logs: the same on every member
    members = list(range(cluster.size))
    try:
        assert_same_logs(cluster, members, position)
    except AssertionError as error:
        report.anomalies.append(f"the members' logs differ: {error}")
    # (b) the log against the history
    requests, problems = log_requests(log_frames(cluster, members[0], position))
    report.log_requests = len(requests)
    report.anomalies += problems
    anomalies, log_state = check_log_against_history(requests, ops)
    report.anomalies += anomalies
    # (c) the service states: every member's snapshot, the log's replay, the final reads
    for member in members:
        state = snapshot_state(cluster, member, snapshot_after)
        if state != log_state:
            differing = sorted(k for k in set(state) | set(log_state) if state.get(k) != log_state.get(k))
            report.anomalies.append(
                f"member {member}'s service state differs from the log's replay at keys {differing[:10]}"
            )
    for op in ops.values():
        if op.client == -1 and op.outcome == "ok" and (op.reply or {}).get("value") != log_state.get(op.key):
            report.anomalies.append(
                f"final read of {op.key} answered {(op.reply or {}).get('value')}, the log says {log_state.get(op.key)}"
            )


def _save_artifacts(
    config: ChaosConfig, cluster: LocalCluster, history: History, report: ChaosReport, backup: Backup | None = None
) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    directory = config.artifacts / f"{stamp}-{config.members}members-seed{config.seed}"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "history.jsonl", "w") as out:
        for op in history.all():
            out.write(json.dumps(asdict(op)) + "\n")
    (directory / "schedule.json").write_text(json.dumps(report.events, indent=1))
    for member in range(cluster.size):
        logs = cluster.member_dir(member) / "logs"
        if logs.exists():
            shutil.copytree(logs, directory / f"node{member}-logs", dirs_exist_ok=True)
    client_log = cluster.base / "client-driver.log"
    if client_log.exists():
        shutil.copy(client_log, directory / "client-driver.log")
    if backup is not None:
        for name in ("driver.log", "archive.log", "backup.log"):
            if (backup.base / name).exists():
                shutil.copy(backup.base / name, directory / f"backup-{name}")
    report.artifacts = str(directory)
    (directory / "report.txt").write_text(report.summary() + "\n")
    return directory


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--members", type=click.IntRange(3, 7), default=3)
@click.option("--seconds", type=click.FloatRange(min=5), default=60.0, help="How long the faults go on.")
@click.option("--seed", type=int, default=None, help="The schedule's seed (default: a random one, printed).")
@click.option("--clients", type=click.IntRange(1, 32), default=4)
@click.option(
    "--nemesis",
    "nemeses",
    multiple=True,
    type=click.Choice(NEMESES_5),
    help="Only these faults (repeatable); default every fault that fits the member count.",
)
@click.option(
    "--artifacts",
    type=click.Path(path_type=Path),
    default=Path("chaos-artifacts"),
    help="Where a failed run leaves its history, schedule and logs.",
)
@click.option("--keep", is_flag=True, help="Leave the history, schedule and logs there even if nothing is wrong.")
@click.option(
    "--reconnect-after",
    type=click.FloatRange(min=0.5),
    default=ChaosConfig.reconnect_after_s,
    help="Seconds without an answer before a client opens a new session.",
)
@click.option(
    "--report-json",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the whole report there as JSON (what make chaos's campaign reads).",
)
@click.option(
    "--secret",
    default=None,
    help="Run the cluster with this secret: clients and the backup authenticate, the members sign their "
    "consensus messages and MAC the datagrams between them.",
)
def main(
    members: int,
    seconds: float,
    seed: int | None,
    clients: int,
    nemeses: tuple[str, ...],
    artifacts: Path,
    keep: bool,
    reconnect_after: float,
    report_json: Path | None,
    secret: str | None,
) -> None:
    """Run the chaos workload once and print its summary; exit 1 on any anomaly."""
    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    config = ChaosConfig(
        members=members,
        seconds=seconds,
        seed=seed,
        clients=clients,
        nemeses=nemeses,
        artifacts=artifacts,
        keep_artifacts=keep,
        reconnect_after_s=reconnect_after,
        secret=secret,
    )
    report = run_chaos(config, progress=lambda text: click.echo(f"[chaos] {text}", err=True))
    click.echo(report.summary())
    if report_json is not None:
        report_json.write_text(json.dumps(asdict(report), default=str))
    sys.exit(1 if report.anomalies else 0)


if __name__ == "__main__":
    main()
