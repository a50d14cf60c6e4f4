"""A three-node cluster echoing: throughput with a windowed client, round-trip
percentiles at fixed rates, and the time a client is without answers when
the leader dies.

The cluster is started exactly as an operator would start one on one machine:
``cluster-node start --local 3 --service fulmar.service.samples:EchoService
--consensus-leader-heartbeat-timeout 1s`` (every other setting its default),
one supervisor running three nodes of four processes each (media driver,
archive, consensus module, service container), every endpoint a UDP port on
127.0.0.1, the log sent from the leader to the followers over UDP and
committed once a majority (the leader and one follower) has it recorded.
This process is the client, on a media driver of its own (the nodes' drivers
go away with their nodes), connecting with the cluster's ingress endpoints
(``0=127.0.0.1:p0,...``) and following the leader.

Throughput, ping and latency are ``bench.cluster``'s measurements (see
there; counts in ``bench.openloop``), against the leader of this cluster
instead of a single node.  When ``bench.pysyncobj_peer`` ran in the same
``python -m bench`` run, its best figure for the same work (same name after
the module prefix: the better of its two settings, for throughput also of
windows 1,000 and 10,000; the table's note column says which) is this
module's reference: the table's ratio is then fulmar / PySyncObj.
Otherwise, when ``bench.cluster`` ran, its figure is: the ratio is then
3-node / 1-node.

Resource use (``bench.resources``), first, then the failovers, then the
echo runs (an overloaded open-loop run may leave a backlog behind it):
each node's four
processes summed, CPU in cores and RSS in MiB, median and max over the
nodes, over a 3 s idle window (no client) and during a 1,000/s echo run;
the leader's processes one by one are printed.

Failover: one request at a time (32-byte payload: sequence number, attempt),
each given ``REQUEST_TIMEOUT_S`` to be echoed, sent again on timeout and at
once on a NewLeaderEvent (the old leader's unanswered request died with it;
PySyncObj's client is told of a lost call by an error callback).  After
``STEADY_S`` of that, the leader's consensus module gets SIGKILL (its
supervisor then stops the rest of that node, as it does for any process that
dies).  Three times are taken from the kill:

- election: until a surviving member's role counter reads LEADER (its
  consensus module's counters in its driver's cnc.dat, read by this process
  between polls, so to within about a millisecond);
- client told: until the client gets the new leader's NewLeaderEvent;
- answered: until the first echo under the new leader (received after that
  event: nothing reaches the new leader before it).

``FAILOVERS`` runs (quick: one), each a row of its own under one name, so the
table's median and min-max are over every failover of every repetition.

With ``secret`` a ``LocalCluster``'s nodes ask their clients for it and
their members authenticate each other (``bench.cluster3_secret``).

Followers notice a dead leader only after the leader heartbeat timeout, so
that timeout (printed) is the floor of every failover figure.  Between runs
the killed node is started again with ``cluster-node start --config
BASE/node<i>/node.toml`` (the file ``--local`` wrote) and the next run waits
until it has rejoined as a follower of the current term with the leader's
commit position, so that every kill leaves two live, caught-up members; the
same after the last run, so that the echo runs have three.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench import resources
from bench.cluster import (
    DISK_PARENT,
    EGRESS_CHANNEL,
    SERVICE,
    SHM_PARENT,
    NodeProcess,
    _idle_strategies,
    _wait_doorbell,
    echo_results,
    latency,
)
from bench.openloop import EchoSettings
from fulmar.aeron import Aeron
from fulmar.cli.cluster_commands import ClusterNode, ClusterReadError, ModuleCounters, cluster_member_node
from fulmar.clock import epoch_ms
from fulmar.cnc import CncError, CncFile
from fulmar.consensus import protocol as cluster_protocol
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.states import ClusterRole
from fulmar.log_writer import CLOSED, MAX_POSITION_EXCEEDED

REFERENCE_MODULES = ("pysyncobj_peer", "cluster")  # in order of preference: see reference_name
MEMBERS = 3
LEADER_HEARTBEAT_TIMEOUT = "1s"
# The canvass after a leader is lost lasts an election timeout (seed 001: a
# member that has not heard from every other waits that long); Aeron's 1 s
# default would double a 1 s heartbeat timeout.  200 ms is two election
# status intervals (100 ms): every live member canvasses at least once.
ELECTION_TIMEOUT = "200ms"
FAILOVERS = 3
REQUEST_TIMEOUT_S = 0.2
STEADY_S = 1.0
START_TIMEOUT_S = 90  # three nodes' twelve processes on a shared machine
LEADER_TIMEOUT_S = 60
FAILOVER_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60
_REQUEST = struct.Struct("<qq")  # sequence, attempt
_PADDING = b"\0" * 16
_NODE_READY = re.compile(r"node (\d+) ready: .*; pids ([^;]*);")
_announced = False


def reference_name(name: str, module: str) -> str | None:
    """``module``'s name for the work of this module's row ``name``: the
    PySyncObj peer's (``bench.pysyncobj_peer``: same prefix-less names, its
    best rows of its settings, the failover's kill to first answer
    included), else the 1-node cluster's
    (``bench.cluster``: echo rows only)."""
    if module == "pysyncobj_peer" and name.startswith("cluster3 "):
        return "pysyncobj " + name[len("cluster3 ") :]
    if module == "cluster" and name.startswith("cluster3 echo"):
        return "cluster " + name[len("cluster3 ") :]
    return None


def _wait(what: str, timeout_s: float, check: Any, interval_s: float = 0.02, details: Any = None) -> Any:
    """``check()`` until it returns something truthy (returned), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise TimeoutError(f"{what}: not within {timeout_s:g} s{extra}")
        time.sleep(interval_s)


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


class Supervised:
    """One ``cluster-node start`` command (the whole local cluster, or one node
    started again), its output in a log file."""

    def __init__(self, args: list[str], log_path: Path, command: str = "start") -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")
        # A session of its own: a Ctrl-C reaches only the bench, which then
        # stops the cluster with one SIGTERM (in order) rather than two (kill).
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fulmar.cli.cluster_node", command, *args],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def output(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float) -> None:
        """SIGTERM (the supervisor stops its nodes in order), SIGKILL if it
        is still there after ``timeout_s``; reaped either way."""
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


@dataclass
class Failover:
    killed: int
    new_leader: int
    new_term: int
    election_ms: float
    notified_ms: float
    answered_ms: float
    resent: int  # requests sent again (after REQUEST_TIMEOUT_S without an echo, or on a NewLeaderEvent)
    refused: int  # offers refused (not connected, back pressured) while the leader was gone


class LocalCluster:
    """``cluster-node start --local 3`` under a temporary directory, plus a
    client driver; every process reaped and every directory removed by
    ``close`` whatever state it is in."""

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        service: str = SERVICE,
        client_driver_args: Sequence[str] = (),
        secret: str | None = None,
    ) -> None:
        # With a secret the nodes ask clients for it, and their members sign
        # and check every consensus message (the node's secret is the key's).
        self.credentials = secret.encode() if secret else b""
        if secret:
            extra_args = [
                *extra_args,
                "--consensus-authenticator-secret",
                secret,
                "--archive-authenticator-secret",
                secret,
            ]
        self.base = Path(tempfile.mkdtemp(prefix="fulmar-bench-cluster3-", dir=DISK_PARENT))
        self.client_driver_dir = Path(tempfile.mkdtemp(prefix="fulmar-bench-cluster3-", dir=SHM_PARENT)) / "client"
        self.ingress_channel = "aeron:udp"
        self.ingress_endpoints: str | None = None
        self.supervisors: list[Supervised] = []
        self.restarted: dict[int, Supervised] = {}  # member -> its own ``start --config`` command
        self.pids: dict[int, dict[str, int]] = {}  # member -> process name -> pid, from the ready lines
        self.client_driver: NodeProcess | None = None
        try:
            self.local = self._supervise(
                [
                    "--local",
                    str(MEMBERS),
                    "--dir",
                    str(self.base),
                    "--service",
                    service,
                    "--consensus-leader-heartbeat-timeout",
                    LEADER_HEARTBEAT_TIMEOUT,
                    "--consensus-election-timeout",
                    ELECTION_TIMEOUT,
                    *extra_args,
                ],
                "local-cluster.log",
            )
            ready = _wait("the local cluster's ready line", START_TIMEOUT_S, self._local_ready, details=self.log_tails)
            self.ingress_endpoints = ready
            for member in range(MEMBERS):
                self._read_pids(self.local, member)
            self.client_driver = NodeProcess(
                ["driver", "--dir", str(self.client_driver_dir), *client_driver_args],
                "serving",
                self.base / "client-driver.log",
                ready=self._client_driver_ready,
            )
            self.wait_for_leader()
        except BaseException as error:
            logs = self.log_tails()
            self.close()
            if isinstance(error, Exception):
                raise RuntimeError(f"the 3-node cluster did not start: {error}\n{logs}") from error
            raise

    # ------------------------------------------------------------ processes

    def _supervise(self, args: list[str], log_name: str) -> Supervised:
        supervised = Supervised(args, self.base / log_name)
        self.supervisors.append(supervised)
        return supervised

    def _local_ready(self) -> str | None:
        if not self.local.alive:
            raise RuntimeError(f"cluster-node start --local {MEMBERS} exited with {self.local.process.returncode}")
        match = re.search(r"^local cluster ready: .*; ingress endpoints (\S+);", self.local.output(), re.MULTILINE)
        return match.group(1) if match else None

    def _client_driver_ready(self, driver: NodeProcess) -> bool:
        try:
            with CncFile.open(self.client_driver_dir) as cnc:
                return bool(cnc.pid == driver.process.pid)
        except (CncError, OSError):
            return False

    def _read_pids(self, supervised: Supervised, member: int) -> bool:
        """The pids of ``member``'s processes from the last ready line of ``supervised``; False if none yet."""
        found = [m for m in _NODE_READY.finditer(supervised.output()) if int(m.group(1)) == member]
        if not found:
            return False
        pids = {}
        for item in found[-1].group(2).split(","):
            name, _, pid = item.strip().rpartition(" ")
            pids[name] = int(pid)
        self.pids[member] = pids
        return True

    def driver_dir(self, member: int) -> Path:
        """The member's media driver directory, from the node.toml ``--local`` wrote."""
        with open(self.base / f"node{member}" / "node.toml", "rb") as config:
            return Path(tomllib.load(config)["node"]["driver_dir"])

    def node(self, member: int) -> ClusterNode:
        return ClusterNode(f"node{member}", self.base / f"node{member}" / "cluster")

    def member_states(self) -> dict[int, dict[str, Any]]:
        """``cluster-tool``'s view of each member whose consensus module runs."""
        states = {}
        for member in range(MEMBERS):
            try:
                state = cluster_member_node(self.node(member), epoch_ms())
            except ClusterReadError:
                continue
            if state["running"] and state["role"] is not None:
                states[member] = state
        return states

    def wait_for_leader(self, rejoining: int | None = None) -> dict[str, Any]:
        """The leader's state once all members run, one of them leads, and
        every follower is in its term with its commit position."""

        def settled() -> dict[str, Any] | None:
            states = self.member_states()
            leaders = [s for s in states.values() if s["role"] == ClusterRole.LEADER]
            if len(states) < MEMBERS or len(leaders) != 1:
                return None
            leader = leaders[0]
            for state in states.values():
                if state["leadership_term_id"] != leader["leadership_term_id"]:
                    return None
                if state["commit_position"] < leader["commit_position"]:
                    return None
            return leader

        what = "a leader and two followers in its term"
        if rejoining is not None:
            what += f" (node {rejoining} rejoining)"
        return dict(_wait(what, LEADER_TIMEOUT_S, settled, 0.05, self.describe))

    def kill_consensus(self, member: int) -> None:
        os.kill(self.pids[member]["consensus"], signal.SIGKILL)

    def restart(self, member: int) -> None:
        """Wait until the rest of the killed ``member`` has stopped, then start it
        again from its node.toml and wait for its processes' ready lines."""
        own = self.restarted.pop(member, None)
        if own is not None:  # its own supervisor stops the rest of the node, then exits
            try:
                own.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise TimeoutError(
                    f"node {member}'s supervisor did not exit in {STOP_TIMEOUT_S} s after its "
                    f"consensus module died:\n{own.tail()}"
                ) from None
        _wait(
            f"the rest of node {member} to stop",
            STOP_TIMEOUT_S,
            lambda: all(_gone(pid) for pid in self.pids[member].values()),
            0.05,
            self.log_tails,
        )
        config = self.base / f"node{member}" / "node.toml"
        supervised = self._supervise(["--config", str(config)], f"restart-node{member}-{len(self.supervisors)}.log")
        self.restarted[member] = supervised

        def ready() -> bool:
            if not supervised.alive:
                raise RuntimeError(
                    f"cluster-node start --config {config} exited with "
                    f"{supervised.process.returncode}:\n{supervised.tail()}"
                )
            return self._read_pids(supervised, member)

        _wait(f"node {member} to start again", START_TIMEOUT_S, ready, details=supervised.tail)

    def describe(self, lines: int = 12) -> str:
        """Each member's role, term and commit position, then the logs' last ``lines``."""
        states = []
        for member in range(MEMBERS):
            try:
                s = cluster_member_node(self.node(member), epoch_ms())
                states.append(
                    f"node {member}: running {s['running']}, role {s['role_name']}, term "
                    f"{s['leadership_term_id']}, commit {s['commit_position']}, pid {s['pid']}"
                    + (f" ({s['counters_note']})" if s["counters_note"] else "")
                )
            except ClusterReadError as error:
                states.append(f"node {member}: {error}")
        return "\n".join(states) + "\n" + self.log_tails(lines)

    def log_tails(self, lines: int = 12) -> str:
        """Supervisors' output, and the last lines of each member's process logs."""
        tails = [
            f"--- {s.log_path.name} (pid {s.process.pid}, exit {s.process.poll()}):\n{s.tail(lines)}"
            for s in self.supervisors
        ]
        for member in range(MEMBERS):
            for log in sorted((self.base / f"node{member}" / "logs").glob("*.log")):
                try:
                    text = log.read_text(errors="replace").splitlines()[-lines:]
                except OSError:
                    continue
                tails.append(f"--- node{member}/logs/{log.name}:\n" + "\n".join(text))
        return "\n".join(tails)

    def all_pids(self) -> dict[str, int]:
        pids = {f"node{m} {name}": pid for m, names in sorted(self.pids.items()) for name, pid in names.items()}
        if self.client_driver is not None:
            pids["client driver"] = self.client_driver.process.pid
        return pids

    def close(self) -> None:
        try:
            for supervised in self.supervisors:  # SIGTERM to all first: the nodes stop side by side
                if supervised.alive:
                    supervised.process.send_signal(signal.SIGTERM)
            for supervised in self.supervisors:
                supervised.stop(STOP_TIMEOUT_S)
            # A supervisor that had to be killed leaves its children a SIGTERM
            # (parent-death signal); whatever of the nodes still runs is ended here.
            for pids in self.pids.values():
                for pid in pids.values():
                    try:
                        process = psutil.Process(pid)
                        if self.base.name in " ".join(process.cmdline()):  # not a recycled pid
                            process.kill()
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
            if self.client_driver is not None:
                self.client_driver.stop()
        finally:
            self.supervisors.clear()
            self.restarted.clear()
            shutil.rmtree(self.client_driver_dir.parent, ignore_errors=True)
            for member in range(MEMBERS):  # a killed node's driver leaves its directory
                for directory in Path(SHM_PARENT).glob(f"fulmar-*-{self.base.name}-*-node{member}"):
                    shutil.rmtree(directory, ignore_errors=True)
            shutil.rmtree(self.base, ignore_errors=True)


class _Survivors:
    """The role counters of the members that survive a kill, mapped once and
    read between polls."""

    def __init__(self, states: dict[int, dict[str, Any]]) -> None:
        self.cncs: list[CncFile] = []
        self.counters: dict[int, ModuleCounters] = {}
        try:
            for member, state in states.items():
                cnc = CncFile.open(state["aeron_directory"])
                self.cncs.append(cnc)
                counters = ModuleCounters(cnc, state["cluster_id"])
                if not counters:
                    raise CncError(f"node {member}: no consensus module counters in {cnc.path}")
                self.counters[member] = counters
        except BaseException:
            self.close()
            raise

    def leader(self) -> int | None:
        for member, counters in self.counters.items():
            if counters.value(cluster_protocol.CLUSTER_NODE_ROLE_TYPE_ID) == ClusterRole.LEADER:
                return member
        return None

    def close(self) -> None:
        for cnc in self.cncs:
            cnc.close()
        self.cncs.clear()


def failover(aeron: Aeron, cluster: LocalCluster) -> Failover:
    """One failover (see the module docstring); the killed member is not restarted here."""
    leader_state = cluster.wait_for_leader()
    leader = int(leader_state["member_id"])
    old_term = int(leader_state["leadership_term_id"])
    states = cluster.member_states()
    survivors = _Survivors({m: s for m, s in states.items() if m != leader})
    clock = time.perf_counter_ns
    answers: list[tuple[int, int, int]] = []  # (arrival ns, sequence, client's term at arrival)
    notified: list[int] = []
    client: ClusterClient | None = None

    def on_message(session_id: int, timestamp: int, payload: memoryview) -> None:
        assert client is not None
        answers.append((clock(), _REQUEST.unpack_from(payload, 0)[0], client.leadership_term_id))

    def on_new_leader(session_id: int, term: int, leader_id: int, endpoints: str) -> None:
        notified.append(clock())

    try:
        client = ClusterClient.connect(
            aeron,
            cluster.ingress_channel,
            cluster.ingress_endpoints,
            egress_channel=EGRESS_CHANNEL,
            message_timeout_ns=30_000_000_000,
            on_message=on_message,
            on_new_leader=on_new_leader,
        )
        if client.leader_member_id != leader:
            raise RuntimeError(f"the client connected to node {client.leader_member_id}, the leader is node {leader}")
        timeout_ns = int(REQUEST_TIMEOUT_S * 1e9)
        started = clock()
        kill_ns = 0
        elected_ns = 0
        new_leader = -1
        sequence = attempt = resent = refused = 0
        sent_ns = 0  # when the current attempt went out; 0: not sent yet
        seen = 0  # answers looked at
        answered_ns = 0
        handled_notices = 0
        deadline = time.monotonic() + STEADY_S + FAILOVER_TIMEOUT_S
        while not (answered_ns and elected_ns):
            now = clock()
            if len(notified) > handled_notices:
                # A new leader: what the old one had not answered is lost with
                # it (only a leader replies), so send it again now, as a client
                # would, rather than at the end of its timeout.
                handled_notices = len(notified)
                if sent_ns and not answered_ns:
                    resent += 1
                    attempt += 1
                    sent_ns = 0
            if not kill_ns and now - started >= STEADY_S * 1e9:
                kill_ns = clock()
                cluster.kill_consensus(leader)
            if kill_ns and not elected_ns:
                member = survivors.leader()
                if member is not None:
                    elected_ns, new_leader = clock(), member
            if not answered_ns:
                if sent_ns and now - sent_ns >= timeout_ns:
                    resent += 1 if kill_ns else 0
                    attempt += 1
                    sent_ns = 0
                if not sent_ns:
                    result = client.offer(_REQUEST.pack(sequence, attempt) + _PADDING)
                    if result > 0:
                        sent_ns = clock()
                    elif result in (CLOSED, MAX_POSITION_EXCEEDED):
                        raise RuntimeError(f"ingress offer failed: {result}")
                    elif kill_ns:
                        refused += 1
            client.poll_egress(16)
            while seen < len(answers):
                arrival, answered_sequence, term = answers[seen]
                seen += 1
                if answered_sequence != sequence:
                    continue  # a late echo of a request answered already (sent again on a timeout)
                sequence += 1
                attempt = 0
                sent_ns = 0
                if kill_ns and term > old_term and not answered_ns:
                    answered_ns = arrival
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"failover from node {leader} (term {old_term}) not complete in {FAILOVER_TIMEOUT_S} s: "
                    f"killed {bool(kill_ns)}, elected {new_leader if elected_ns else None}, client told "
                    f"{bool(notified)}, answered {bool(answered_ns)}; {resent} requests re-sent\n{cluster.describe()}"
                )
            if sent_ns or answered_ns:
                _wait_doorbell(aeron, client, 1_000_000)
            else:
                time.sleep(0.001)  # offer refused: the ingress is not there yet
        if not notified or notified[0] < kill_ns:
            raise RuntimeError(
                f"answers under term {client.leadership_term_id} without a NewLeaderEvent after the kill"
            )
        return Failover(
            killed=leader,
            new_leader=new_leader,
            new_term=client.leadership_term_id,
            election_ms=(elected_ns - kill_ns) / 1e6,
            notified_ms=(notified[0] - kill_ns) / 1e6,
            answered_ms=(answered_ns - kill_ns) / 1e6,
            resent=resent,
            refused=refused,
        )
    finally:
        survivors.close()
        if client is not None:
            client.close()


def resource_use(aeron: Aeron, cluster: LocalCluster) -> list[dict[str, Any]]:
    """Each node's processes summed (``bench.resources``): a window of
    ``IDLE_S`` with the cluster up and no client, then one during an echo
    run at ``LOAD_RATE``/s (``LOAD_S`` after its 1 s warm-up: the client
    connects and sends in the window); the leader's processes one by one
    under load printed."""
    leader = int(cluster.wait_for_leader()["member_id"])
    nodes = {f"node{member}": dict(pids) for member, pids in sorted(cluster.pids.items())}
    idle = resources.measure(nodes, resources.idle())
    achieved: list[float] = []
    load = resources.measure(
        nodes,
        lambda: achieved.append(latency(aeron, cluster, resources.LOAD_RATE, resources.LOAD_S)[1]["achieved_rate"]),
    )
    print(
        f"bench.cluster3: resource use, leader node {leader} during the {resources.LOAD_RATE:,}/s echo run "
        f"(achieved {achieved[0]:,.0f}/s): {resources.breakdown(load[f'node{leader}'], nodes[f'node{leader}'])}",
        flush=True,
    )
    label = f"during {resources.LOAD_RATE:,}/s echo"
    return resources.rows("cluster3", "idle", idle) + resources.rows("cluster3", label, load)


def _election_settings() -> str:
    context = ConsensusModuleContext

    def ms(ns: int) -> str:
        return f"{ns / 1e6:g} ms"

    return (
        f"leader heartbeat timeout {LEADER_HEARTBEAT_TIMEOUT} (--consensus-leader-heartbeat-timeout; default "
        f"{ms(context.leader_heartbeat_timeout_ns)}), election timeout {ELECTION_TIMEOUT} "
        f"(--consensus-election-timeout; default {ms(context.election_timeout_ns)}), heartbeat interval "
        f"{ms(context.leader_heartbeat_interval_ns)}, election status interval "
        f"{ms(context.election_status_interval_ns)} (defaults)"
    )


def run(quick: bool) -> list[dict[str, Any]]:
    global _announced
    settings = EchoSettings(quick, 2_000 if quick else 20_000)
    failovers = 1 if quick else FAILOVERS
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    cluster = LocalCluster()
    try:
        if not _announced:
            _announced = True
            print(
                f"bench.cluster3: 3-node local cluster (cluster-node start --local 3, {SERVICE}), processes "
                f"{cluster.all_pids()} + this client, {os.cpu_count()} cores (all share them, and other jobs "
                f"share the machine); {_election_settings()}; idle strategies (defaults): {_idle_strategies()}; "
                f"base {cluster.base}; {settings.describe()}; {failovers} failover(s), request timeout "
                f"{REQUEST_TIMEOUT_S * 1000:g} ms",
                flush=True,
            )
        assert cluster.client_driver is not None
        with Aeron.connect(cluster.client_driver_dir) as aeron:
            # Resource use and failovers before the echo runs: an overloaded
            # open-loop run may leave a backlog behind it, which would be
            # measured as idle use or slow a failover.
            results += resource_use(aeron, cluster)
            samples: list[Failover] = []
            for index in range(failovers):
                if index:
                    cluster.restart(samples[-1].killed)
                    cluster.wait_for_leader(rejoining=samples[-1].killed)
                sample = failover(aeron, cluster)
                samples.append(sample)
                print(
                    f"bench.cluster3: failover {index + 1}: SIGKILL to node {sample.killed}'s consensus module; "
                    f"node {sample.new_leader} LEADER after {sample.election_ms:,.0f} ms, client told (term "
                    f"{sample.new_term}) after {sample.notified_ms:,.0f} ms, first answer after "
                    f"{sample.answered_ms:,.0f} ms; {sample.resent} requests re-sent (after "
                    f"{REQUEST_TIMEOUT_S * 1000:g} ms without an echo, or on the NewLeaderEvent), "
                    f"{sample.refused} offers refused",
                    flush=True,
                )
            # One row per failover under one name: the table's median and
            # min-max are then those of every failover of every repetition.
            for sample in samples:
                for label, value in (
                    ("to LEADER role", sample.election_ms),
                    ("to NewLeaderEvent", sample.notified_ms),
                    ("to first answer", sample.answered_ms),
                ):
                    results.append(
                        {"name": f"cluster3 failover, kill {label}", "value": value, "unit": "ms", "reference": None}
                    )
            if samples:  # the echo runs are a three-member cluster's: the last killed node back and caught up
                cluster.restart(samples[-1].killed)
                cluster.wait_for_leader(rejoining=samples[-1].killed)
            first_term = cluster.wait_for_leader()["leadership_term_id"]
            results += echo_results(aeron, cluster, "cluster3", settings)
            term = cluster.wait_for_leader()["leadership_term_id"]
            if term != first_term:  # said, not hidden: the figures above went through elections
                print(
                    f"bench.cluster3: {term - first_term} election(s) nobody asked for during the throughput and "
                    f"latency runs (term {first_term} -> {term})",
                    flush=True,
                )
    except Exception as error:
        raise RuntimeError(f"bench.cluster3 failed: {error}\n{cluster.describe(30)}") from error
    finally:
        cluster.close()
    print(
        f"bench.cluster3: run of {time.monotonic() - began:.0f} s, 1-minute load average "
        f"{load_before:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (shared machine: noisy figures)",
        flush=True,
    )
    return results


if __name__ == "__main__":
    for row in run("--quick" in sys.argv):
        print(f"{row['name']}: {'n/a' if row['value'] is None else format(row['value'], ',.2f')} {row['unit']}")
