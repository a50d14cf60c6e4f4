"""The peer: PySyncObj (from PyPI, the optional ``bench`` extra) as a 3-node
cluster doing fulmar's echo work, side by side in the same run.

Three node processes on 127.0.0.1 (free TCP ports), each ``python -m
bench.pysyncobj_peer node SELF OTHER OTHER STATUS``: a ``SyncObj`` subclass
whose one ``@replicated`` method ``append(payload)`` appends the payload to
a list and returns the count (the state machine's work for fulmar's echo:
a replicated append of the same payload).  Each node writes its Raft state
to a small JSON file every 50 ms, which is how this process sees leaders and
commit indexes.

The client is a fourth process, ``python -m bench.pysyncobj_peer client
NODE NODE NODE``: a read-only ``SyncObj`` (``selfNode=None``: PySyncObj's
non-member; it votes in no election and is in no quorum) whose calls
``append(payload, callback=...)`` are forwarded to the leader and answered
once committed and applied, like a fulmar client's ingress -> log -> egress
round trip.  (The leader also streams its log to a read-only node: one more
follower's worth of sending than fulmar's leader has.)  It ticks PySyncObj
itself (``autoTick=False``) from one thread and takes commands from this
process one JSON line at a time.

Measurements are ``bench.cluster``'s (counts in ``bench.openloop``), in
``bench.cluster3``'s order (resources, failovers, echo): first each node process's CPU (cores) and RSS over a 3 s idle window and
during a 1,000/s echo run (``bench.resources``); then 32, 288 and 1344 B
payloads with 1000 calls in flight; one call at a time (ping: the next call
made once the previous one's callback ran); round trips at 1,000, 10,000 and 50,000 per
second open loop, each from its intended send time, in an HdrHistogram
(sent back encoded; unanswered calls counted after a bounded drain);
failover: one call at a time (each given ``REQUEST_TIMEOUT_S``, sent again
on timeout or error), the leader's process gets SIGKILL, and the time to
the first answer to a call sent after the kill is taken; ``FAILOVERS`` runs
(quick: one), the killed node started again (empty log: PySyncObj keeps it
in memory here) and caught up between runs.

Timeouts, matched to ``bench.cluster3``'s 1 s leader heartbeat timeout:
``raftMinTimeout=1.0``, ``raftMaxTimeout=1.5`` (a follower that hears nothing
from the leader for a random 1.0-1.5 s stands for election: PySyncObj's one
timer is both the heartbeat timeout and the election timeout, and its spread
is what keeps votes from splitting); ``appendEntriesPeriod`` is left at
PySyncObj's 0.1 s default (its leader's heartbeat interval, fulmar's is
200 ms).  ``appendEntriesUseBatch=False``: PySyncObj's documented setting for
"single request speed" (the leader sends each entry at once); with its
default (True) the leader sends new entries only every
``appendEntriesPeriod``, which on this machine gave round trips of 100-400 ms
and fewer calls per second at a window of 64 (set
``FULMAR_BENCH_PYSYNCOBJ_BATCH=1`` to measure that).  Everything else is
PySyncObj's default.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from bench import resources
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

PREFIX = "pysyncobj"
MEMBERS = 3
WARMUP_S = 1.0  # defaults of Client.latency (the resource-use run); the echo runs use EchoSettings
DRAIN_S = 2.0
SETTLE_S = 5.0
FAILOVERS = 3
REQUEST_TIMEOUT_S = 0.2
STEADY_S = 1.0
RAFT_MIN_TIMEOUT_S = 1.0
RAFT_MAX_TIMEOUT_S = 1.5
APPEND_ENTRIES_USE_BATCH = os.environ.get("FULMAR_BENCH_PYSYNCOBJ_BATCH", "0") == "1"
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


def _conf(**extra: Any) -> Any:
    from pysyncobj import SyncObjConf

    return SyncObjConf(raftMinTimeout=RAFT_MIN_TIMEOUT_S, raftMaxTimeout=RAFT_MAX_TIMEOUT_S,
                       appendEntriesUseBatch=APPEND_ENTRIES_USE_BATCH, **extra)


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


def node_main(self_node: str, others: list[str], status_path: Path) -> None:
    """One cluster member until SIGTERM, its Raft state in ``status_path``."""
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    node = _appender_class()(self_node, others, _conf())
    temp = status_path.with_suffix(".tmp")
    try:
        while not stopping:
            status = node.getStatus()
            leader = status["leader"]
            temp.write_text(json.dumps({"state": status["state"], "term": status["raft_term"],
                                        "commit": status["commit_idx"], "applied": status["last_applied"],
                                        "leader": leader.address if leader is not None else None,
                                        "pid": os.getpid()}))
            os.replace(temp, status_path)
            time.sleep(STATUS_PERIOD_S)
    finally:
        node.destroy()


# ---------------------------------------------------------------- client process


class Client:
    """A read-only SyncObj ticked from this thread; every call's answer
    arrives through ``tick``."""

    def __init__(self, nodes: list[str]) -> None:
        self.obj = _appender_class()(None, nodes, _conf(autoTick=False))

    def tick(self, wait_s: float) -> None:
        self.obj.doTick(wait_s)

    def leader(self) -> str | None:
        leader = self.obj._getLeader()
        return str(leader.address) if leader is not None else None

    def call(self, payload: bytes, callback: Callable[[Any, Any], None]) -> None:
        try:
            self.obj.append(payload, callback=callback)
        except BlockingIOError:
            # PySyncObj queues the call, then writes a wake-up byte to a
            # non-blocking pipe that only a tick drains: more than 64 KiB of
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

    def latency(self, rate: int, seconds: float, warmup_s: float = WARMUP_S, drain_s: float = DRAIN_S,
                settle_s: float = SETTLE_S) -> dict[str, Any]:
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
                self.call(sequence.to_bytes(8, "little") + loop.intended(sequence).to_bytes(8, "little") + padding,
                          answer(sequence))
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
        for sequence in range(PING_WARMUP + count):
            if sequence == PING_WARMUP:
                end = time.monotonic() + max_s
            elif sequence > PING_WARMUP and time.monotonic() > end:
                break
            sent_ns = clock()
            self.call(sequence.to_bytes(8, "little") + b"\0" * 24,
                      lambda result, error, sequence=sequence: answers.append((clock(), sequence, error)))
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
                    return {"killed": old_leader, "new_leader": self.leader(), "answered_ms": (arrival - kill_ns) / 1e6,
                            "resent": resent}
                if error != FAIL_REASON.SUCCESS:
                    resent += 1 if kill_ns else 0
                    time.sleep(0.001)
                sequence += 1
                sent_ns = 0
            answers.clear()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer from a new leader {FAILOVER_TIMEOUT_S} s after killing {old_leader} "
                                   f"(client's leader now {self.leader()}, {resent} calls re-sent)")


def client_main(nodes: list[str]) -> None:
    """Commands on stdin, one JSON object per line; one JSON answer each on stdout."""
    client = Client(nodes)
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
        self.process = subprocess.Popen([sys.executable, "-m", "bench.pysyncobj_peer", *args],
                                        stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE if pipe else self._log, stderr=self._log,
                                        text=True, start_new_session=True)

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

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="fulmar-bench-pysyncobj-"))
        self.addresses = [f"127.0.0.1:{port}" for port in _free_tcp_ports(MEMBERS)]
        self.nodes: dict[int, Process] = {}
        self.client: Process | None = None
        try:
            for member in range(MEMBERS):
                self.start_node(member)
            self.client = Process(["client", *self.addresses], self.base / "client.log", pipe=True)
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
        self.nodes[member] = Process(["node", self.addresses[member], *others, str(status)],
                                     self.base / f"node{member}.log")

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


def _rows(cluster: PeerCluster, settings: EchoSettings) -> list[dict[str, Any]]:
    """``bench.cluster.echo_results``'s work and rows, by the client process."""
    from hdrh.histogram import HdrHistogram

    results: list[dict[str, Any]] = []
    cluster.command("throughput", size=32, window=64, count=min(settings.count, 1_000))  # warm-up
    for size, window in settings.cases:
        answer = cluster.command("throughput", size=size, window=window, count=settings.count)
        results += throughput_rows(PREFIX, size, window, answer["good"], answer["elapsed"])
        if answer["lost"]:  # said, and a row of its own (fulmar's throughput fails rather than lose an echo)
            lost = answer["lost"] - answer["failed"]
            print(f"bench.{PREFIX}_peer: {size} B, window {window}: {answer['lost']:,} of {settings.count:,} calls "
                  f"without a good answer ({answer['failed']:,} answered with an error, {lost:,} never answered"
                  + (f": the run ended after {STALL_S:g} s without an answer" if lost else "")
                  + f"); msgs/s counts the {answer['good']:,} answered well", flush=True)
            results.append({"name": f"{PREFIX} echo {size} B, window {window}, unanswered", "value": answer["lost"],
                            "unit": "msgs", "reference": None})
    answer = cluster.command("ping", count=settings.pings, max_s=settings.ping_max_s)
    if answer["lost"]:
        print(f"bench.{PREFIX}_peer: {answer['lost']} pings lost (no answer in {PING_TIMEOUT_S:g} s, or an error)",
              flush=True)
    results += ping_rows(PREFIX, HdrHistogram.decode(answer["histogram"]))
    for rate in settings.rates:
        answer = cluster.command("latency", rate=rate, seconds=settings.seconds, warmup_s=settings.warmup_s,
                                 drain_s=settings.drain_s, settle_s=settings.settle_s)
        if answer["unanswered"]:
            print(describe(f"bench.{PREFIX}_peer", rate, answer), flush=True)
        results += latency_rows(PREFIX, rate, HdrHistogram.decode(answer.pop("histogram")), answer)
    return results


def resource_use(cluster: PeerCluster) -> list[dict[str, Any]]:
    """Each node process (``bench.resources``): a window of ``IDLE_S`` with
    the client connected and sending nothing, then one during an echo run at
    ``LOAD_RATE``/s (``LOAD_S`` after its 1 s warm-up), as ``bench.cluster3``
    measures fulmar's nodes."""
    cluster.wait_settled("a leader and two followers")
    nodes = {f"node{member}": {"node": node.process.pid} for member, node in sorted(cluster.nodes.items())}
    idle = resources.measure(nodes, resources.idle())
    answers: list[dict[str, Any]] = []
    load = resources.measure(nodes, lambda: answers.append(
        cluster.command("latency", rate=resources.LOAD_RATE, seconds=resources.LOAD_S)))
    total = {name: resources.Usage(sum(u.cores for u in named.values()), sum(u.rss_mib for u in named.values()))
             for name, named in load.items()}
    each = resources.breakdown(total, {name: pids["node"] for name, pids in nodes.items()}, total=None)
    print(f"bench.pysyncobj_peer: resource use during the {resources.LOAD_RATE:,}/s echo run (achieved "
          f"{answers[0]['achieved_rate']:,.0f}/s): {each}", flush=True)
    label = f"during {resources.LOAD_RATE:,}/s echo"
    return resources.rows(PREFIX, "idle", idle) + resources.rows(PREFIX, label, load)


def run(quick: bool) -> list[dict[str, Any]]:
    if not available():
        print(f"bench.pysyncobj_peer: pysyncobj is not installed, no PySyncObj figures (install the bench extra: "
              f"{INSTALL_HINT})", flush=True)
        return []
    from pysyncobj.version import VERSION

    settings = EchoSettings(quick, 2_000 if quick else 20_000)
    failovers = 1 if quick else FAILOVERS
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    cluster = PeerCluster()
    try:
        print(f"bench.pysyncobj_peer: PySyncObj {VERSION}, 3 node processes {cluster.pids()} + a client process "
              f"(pid {cluster.client.process.pid if cluster.client else '-'}) that is a read-only SyncObj "
              f"(PySyncObj's non-member: calls forwarded to the leader, answered once applied; a client hop "
              f"like fulmar's); raftMinTimeout {RAFT_MIN_TIMEOUT_S:g} s, raftMaxTimeout {RAFT_MAX_TIMEOUT_S:g} s "
              f"(election after 1.0-1.5 s without the leader, vs fulmar's 1 s heartbeat timeout), "
              f"appendEntriesPeriod 0.1 s (default), appendEntriesUseBatch {APPEND_ENTRIES_USE_BATCH} "
              f"(FULMAR_BENCH_PYSYNCOBJ_BATCH=1 for True, PySyncObj's default); {settings.describe()}; "
              f"{failovers} failover(s)", flush=True)
        cluster.wait_settled("a leader and two followers")
        # Resource use and failovers first, as bench.cluster3: the overloaded open-loop runs may leave a backlog.
        results = resource_use(cluster)
        for index in range(failovers):
            if index:
                cluster.wait_settled("the killed node caught up")
                cluster.command("ready", timeout_s=START_TIMEOUT_S + 10)
            sample = cluster.command("failover", timeout_s=STEADY_S + FAILOVER_TIMEOUT_S + 10, pids=cluster.pids())
            member = cluster.reap_killed(sample["killed"])
            print(f"bench.pysyncobj_peer: failover {index + 1}: SIGKILL to node {member} (the leader); first answer "
                  f"after {sample['answered_ms']:,.0f} ms from {sample['new_leader']}; {sample['resent']} calls "
                  f"re-sent", flush=True)
            results.append({"name": f"{PREFIX} failover, kill to first answer", "value": sample["answered_ms"],
                            "unit": "ms", "reference": None})
            cluster.start_node(member)
        if failovers:  # the echo runs are a three-member cluster's: the last killed node caught up
            cluster.wait_settled("the killed node caught up")
            cluster.command("ready", timeout_s=START_TIMEOUT_S + 10)
        results += _rows(cluster, settings)
    except Exception as error:
        raise RuntimeError(f"bench.pysyncobj_peer failed: {error}\n{cluster.log_tails()}") from error
    finally:
        cluster.close()
    print(f"bench.pysyncobj_peer: run of {time.monotonic() - began:.0f} s, 1-minute load average "
          f"{load_before:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    return results


def main(argv: list[str]) -> None:
    if argv[:1] == ["node"]:
        node_main(argv[1], argv[2:-1], Path(argv[-1]))
    elif argv[:1] == ["client"]:
        client_main(argv[1:])
    else:
        for row in run("--quick" in argv):
            print(f"{row['name']}: {'n/a' if row['value'] is None else format(row['value'], ',.2f')} {row['unit']}")


if __name__ == "__main__":
    main(sys.argv[1:])
