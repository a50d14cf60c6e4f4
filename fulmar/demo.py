"""``make run``: a three-member cluster serving a replicated key-value store, and a failover.

1. ``cluster-node start --local 3`` starts three nodes (each a media driver,
   an archive, a consensus module and a clustered service container running
   ``fulmar.service.samples:KeyValueService``, every one a process of its
   own) under a temporary directory; the members elect a leader.
2. A ``ClusterClient``, on a media driver of its own, opens a session over UDP
   on loopback (given every member's ingress endpoint, it finds the leader)
   and sends a workload of puts and gets, a window of requests in flight;
   every reply is checked against a local model of the store.
3. Failover: the leader's consensus module is killed (SIGKILL).  The
   followers hear no heartbeat for the leader heartbeat timeout (10 s by
   default), elect a new leader, and it tells the client (NewLeaderEvent).
   Meanwhile the client sends one request at a time; one without an answer
   within a second (or sent to the old leader) is sent again until it is
   answered (a put of the same key and value is idempotent).  The supervisor
   stops the rest of the killed node and says how to start it again.
4. The node is started again on its own (``cluster-node start --config``): it
   replays its log, catches up from the leader and rejoins as a follower.
   Every key is read back and checked against the model.
5. SIGTERM stops every node in order; ``cluster-tool verify-log`` checks the
   three members' recorded logs (each term's NewLeadershipTermEvent carries
   that term, terms rise along the log, the recording logs match, the members
   agree on the committed prefix).
6. Spark (local mode) reads the three members' recorded logs through the
   ``fulmar-log`` data source: the ``cluster-tool analyze`` report (messages
   per leadership term, per session, per second...), and member 0's log
   replayed through KeyValueService's own apply must give the model's store.
   The temporary directories are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fulmar.aeron import Aeron
from fulmar.cli.cluster_commands import ClusterNode, ClusterReadError, cluster_member_node
from fulmar.clock import epoch_ms
from fulmar.consensus.agent import ClusterRole
from fulmar.consensus.client import ClusterClient
from fulmar.errors import FulmarError

SERVICE = "fulmar.service.samples:KeyValueService"
MEMBERS = 3
START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 60
REPLY_TIMEOUT_S = 30
ATTEMPT_TIMEOUT_S = 1.0  # during the failover: a request unanswered this long is sent again
FAILOVER_TIMEOUT_S = 45
CATCHUP_TIMEOUT_S = 60
_print_lock = threading.Lock()


def say(text: str) -> None:
    with _print_lock:
        print(text, flush=True)


class Child:
    """A ``cluster-node`` command as a child process; its output echoed, indented, as it comes."""

    def __init__(self, tag: str, *args: str) -> None:
        self.tag = tag
        self.output: list[str] = []
        self.ended = False
        self.changed = threading.Condition()
        self.signalled = False
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fulmar.cli.cluster_node", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            say(f"  {self.tag} | {line.rstrip()}")
            with self.changed:
                self.output.append(line.rstrip())
                self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def await_line(
        self, pattern: str, what: str, timeout_s: float = START_TIMEOUT_S, client: ClusterClient | None = None
    ) -> re.Match[str]:
        """The first line of its output matching ``pattern``, waiting at most
        ``timeout_s`` (polling ``client``'s egress meanwhile: its keepalives)."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                match = next((m for m in map(re.compile(pattern).search, self.output) if m), None)
                if match is not None:
                    return match
                if self.ended:
                    raise SystemExit(f"{self.tag}: exited ({self.process.wait(10)}) before {what}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SystemExit(f"{self.tag}: no {what} within {timeout_s:g} s")
                self.changed.wait(min(remaining, 0.05))
                if client is not None:
                    client.poll_egress()

    def terminate(self) -> None:
        """SIGTERM, once (a second signal would make a supervisor kill what is left)."""
        if not self.signalled and self.process.poll() is None:
            self.signalled = True
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        """SIGTERM (an orderly stop); its exit code, its output read to the end."""
        self.terminate()
        try:
            code = self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{self.tag}: still running {STOP_TIMEOUT_S} s after SIGTERM") from None
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()  # its children get SIGTERM from the kernel (parent-death signal)
                self.process.wait(10)
        self._reader.join(10)


def member_state(base: Path, member: int) -> dict[str, Any] | None:
    """cluster-tool's view of a member: running, role, leadership_term_id, commit_position, pid."""
    try:
        return cluster_member_node(ClusterNode(f"node{member}", base / f"node{member}" / "cluster"), epoch_ms())
    except ClusterReadError:
        return None


def pause(client: ClusterClient | None, seconds: float) -> None:
    """Sleep, polling the client's egress meanwhile: that sends its keepalives (a session
    without any for the session timeout, 10 s, is closed by the cluster)."""
    end = time.monotonic() + seconds
    while client is not None and time.monotonic() < end:
        if not client.poll_egress():
            time.sleep(0.01)
    time.sleep(max(0.0, end - time.monotonic()))


def await_leader(
    base: Path, timeout_s: float, not_member: int | None = None, client: ClusterClient | None = None
) -> tuple[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = [member_state(base, i) for i in range(MEMBERS)]
        leaders = [
            (i, s)
            for i, s in enumerate(states)
            if s and s["running"] and s["role"] == ClusterRole.LEADER and i != not_member
        ]
        if len(leaders) == 1:
            return leaders[0]
        pause(client, 0.1)
    raise SystemExit(f"no leader within {timeout_s:g} s")


class Workload:
    """Pipelined requests over one session; each reply checked against the model."""

    def __init__(self, model: dict[str, Any]) -> None:
        self.client: ClusterClient | None = None
        self.model = model
        self.pending: list[tuple[int, dict[str, Any]]] = []  # (id, expected reply), in send order
        self.head = 0
        self.replies = 0
        self.next_id = 1
        self.by_id: dict[int, dict[str, Any]] | None = None  # one at a time (failover): replies kept by id

    def on_message(self, session_id: int, timestamp: int, payload: memoryview) -> None:
        reply = json.loads(bytes(payload))
        if self.by_id is not None:
            self.by_id[reply["id"]] = reply
            return
        if self.head >= len(self.pending):
            raise SystemExit(f"an unexpected reply: {reply}")
        request_id, expected = self.pending[self.head]
        self.head += 1
        if reply != expected:
            raise SystemExit(f"request {request_id}: expected {expected}, got {reply}")
        self.replies += 1

    def request_for(self, op: str, key: str, value: Any = None) -> tuple[bytes, dict[str, Any]]:
        request_id = self.next_id
        self.next_id += 1
        if op == "put":
            request = {"op": "put", "key": key, "value": value, "id": request_id}
            expected = {"id": request_id, "ok": True, "previous": self.model.get(key)}
            self.model[key] = value
        else:
            request = {"op": "get", "key": key, "id": request_id}
            expected = {"id": request_id, "ok": True, "value": self.model.get(key)}
        return json.dumps(request, separators=(",", ":")).encode(), expected

    def run(self, operations: list[tuple[str, str, Any]], window: int) -> float:
        """Send every operation, at most ``window`` unanswered; the elapsed seconds."""
        client = self.client
        assert client is not None
        started = time.perf_counter()
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        sent = 0
        prepared: tuple[bytes, dict[str, Any]] | None = None
        target = self.replies + len(operations)
        while self.replies < target:
            while sent < len(operations) and len(self.pending) - self.head < window:
                if prepared is None:
                    prepared = self.request_for(*operations[sent])
                if client.offer(prepared[0]) > 0:
                    self.pending.append((self.next_id - 1, prepared[1]))
                    prepared = None
                    sent += 1
                    deadline = time.monotonic() + REPLY_TIMEOUT_S
                else:
                    break
            if client.poll_egress(window):
                deadline = time.monotonic() + REPLY_TIMEOUT_S
            elif client.is_closed:
                raise SystemExit(f"the cluster closed the session: {self.replies:,} of {target:,} replies")
            elif time.monotonic() > deadline:
                raise SystemExit(f"no reply for {REPLY_TIMEOUT_S} s: {self.replies:,} of {target:,} replies")
            else:
                time.sleep(0)  # let the nodes' processes run (2 cores)
        return time.perf_counter() - started

    def until_answered(self, op: str, key: str, value: Any, deadline: float) -> int:
        """One request, sent again (a fresh id) each time ``ATTEMPT_TIMEOUT_S``
        passes without its answer, or at once when a new leader is announced;
        checked against the model; the attempts."""
        client = self.client
        assert client is not None and self.by_id is not None
        before = self.model.get(key)
        for attempt in range(1, 1_000_000):
            payload, expected = self.request_for(op, key, value)
            request_id = expected["id"]
            attempt_end = time.monotonic() + ATTEMPT_TIMEOUT_S
            sent, leader = False, client.leader_member_id
            while time.monotonic() < attempt_end and request_id not in self.by_id and client.leader_member_id == leader:
                sent = sent or client.offer(payload) > 0  # NOT_CONNECTED while the leader is gone
                if not client.poll_egress():
                    time.sleep(0.0005)
                if client.is_closed:
                    raise SystemExit("the cluster closed the client's session during the failover")
            reply = self.by_id.pop(request_id, None)
            if reply is not None:
                accepted = [expected]
                if op == "put":  # sent again after an earlier attempt was applied (its answer lost): its own value
                    accepted = [{**expected, "previous": previous} for previous in (before, value)[:attempt]]
                if reply not in accepted:
                    raise SystemExit(f"{op} {key} (attempt {attempt}): expected {expected}, got {reply}")
                return attempt
            if time.monotonic() > deadline:
                raise SystemExit(f"{op} {key}: unanswered for {FAILOVER_TIMEOUT_S} s (client: {client})")
        raise AssertionError("unreachable")


def verify_logs(base: Path) -> None:
    """``cluster-tool verify-log`` over the stopped cluster: what it checked,
    and the demo fails on any violation."""
    say(f"the recorded logs: cluster-tool verify-log --dir {base}")
    result = subprocess.run(
        [sys.executable, "-m", "fulmar.cli.cluster_tool", "verify-log", "--dir", str(base)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    for line in (result.stdout + result.stderr).splitlines():
        say(f"  verify-log | {line}")
    if result.returncode != 0:
        raise SystemExit(f"verify-log found the recorded logs wrong (exit {result.returncode})")


def analyse_logs(base: Path, model: dict[str, Any]) -> None:
    """Step 6: the members' recorded logs in Spark (local mode): the analysis
    ``cluster-tool analyze`` runs, and the log replayed through the service's
    own apply, which must give the store the model holds."""
    try:
        from fulmar.analytics.analyze import analyze
        from fulmar.analytics.replay import replay_state
        from fulmar.analytics.session import spark_session, stop_spark
        from fulmar.service.samples import key_value_apply, key_value_initial
    except ImportError as error:
        say(f"step 6 skipped: the Spark analysis needs the spark extra (pip install 'fulmar[spark]'): {error}")
        return
    archives = [str(base / f"node{member}" / "archive") for member in range(MEMBERS)]
    say(
        f"step 6: Spark over the recorded logs: cluster-tool analyze --archive-dir {archives[0]} ... "
        f"(the same job, in this process, local[*])"
    )
    started = time.monotonic()
    spark = spark_session(app_name="fulmar demo")
    try:
        report = analyze(spark, archives, base / "analysis")
        for line in report.text().splitlines():
            say(f"    {line}")
        replayed = replay_state(spark, archives[0], key_value_apply, key_value_initial())
    finally:
        stop_spark(spark)
    if replayed.state["data"] != model:
        differing = sorted(
            k for k in set(model) | set(replayed.state["data"]) if model.get(k) != replayed.state["data"].get(k)
        )
        raise SystemExit(f"the log's replay differs from the model at {len(differing)} keys: {differing[:5]}")
    say(
        f"replayed member 0's log ({replayed.messages:,} messages, to position {replayed.position:,}) through "
        f"KeyValueService's apply in Spark: {len(model):,} keys, every value as the model says "
        f"({time.monotonic() - started:.1f} s with Spark's start)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m fulmar.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="puts and gets in the workload")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct keys")
    parser.add_argument("--window", type=int, default=64, help="requests in flight")
    parser.add_argument(
        "--after-failover",
        type=int,
        default=100,
        help="requests answered by the new leader before the killed node is restarted",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        default="10s",
        help="the members' leader heartbeat timeout: a "
        "follower that hears nothing from the leader this long starts an election",
    )
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="fulmar-demo-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    shm = Path("/dev/shm") if os.path.isdir("/dev/shm") else base
    client_driver_dir = shm / f"fulmar-{base.name}-client"
    driver_dirs: list[Path] = [client_driver_dir]
    children: list[Child] = []
    aeron: Aeron | None = None
    client: ClusterClient | None = None
    model: dict[str, Any] = {}
    try:
        say(
            f"step 1: starting a {MEMBERS}-member cluster under {base} (leader heartbeat timeout "
            f"{args.heartbeat_timeout})"
        )
        cluster = Child(
            "cluster",
            "start",
            "--local",
            str(MEMBERS),
            "--dir",
            str(base),
            "--service",
            SERVICE,
            "--consensus-leader-heartbeat-timeout",
            args.heartbeat_timeout,
        )
        children.append(cluster)
        endpoints = cluster.await_line(r"^ingress endpoints: (\S+)", "ingress endpoints line").group(1)
        driver_dirs += [
            Path(cluster.await_line(rf"^member {i}: .*driver directory (\S+)", "member line").group(1))
            for i in range(MEMBERS)
        ]
        cluster.await_line(r"^local cluster ready", '"local cluster ready"')
        leader, state = await_leader(base, START_TIMEOUT_S)
        say(f"cluster ready: member {leader} leads (term {state['leadership_term_id']}), the others follow")

        say("step 2: a client on a media driver of its own, a session, a windowed workload")
        client_driver = Child("client driver", "driver", "--dir", str(client_driver_dir))
        children.append(client_driver)
        client_driver.await_line(r"media driver pid \d+ serving", "media driver readiness line")
        workload = Workload(model)
        new_leader_at: list[float] = []
        aeron = Aeron.connect(client_driver_dir)
        client = workload.client = ClusterClient.connect(
            aeron,
            "aeron:udp",
            endpoints,
            egress_channel="aeron:udp?endpoint=127.0.0.1:0",
            on_message=workload.on_message,
            message_timeout_ns=REPLY_TIMEOUT_S * 1_000_000_000,
            on_new_leader=lambda session, term, member, _endpoints: new_leader_at.append(time.monotonic()),
        )
        say(
            f"session {client.cluster_session_id} open with leader member {client.leader_member_id} "
            f"(ingress endpoints {endpoints})"
        )
        keys = [f"key-{k:05d}" for k in range(args.keys)]
        operations: list[tuple[str, str, Any]] = []
        for i in range(args.requests):  # every key written, reads of written and unwritten keys
            if i % 2 == 0:
                operations.append(("put", keys[(i // 2 * 7919) % len(keys)], i))
            else:
                operations.append(("get", keys[(i * 104729) % len(keys)], None))
        elapsed = workload.run(operations, args.window)
        puts = sum(1 for op in operations if op[0] == "put")
        say(
            f"workload: {args.requests:,} requests ({puts:,} puts, {args.requests - puts:,} gets over {len(keys):,} "
            f"keys, {args.window} in flight) -> {workload.replies:,} replies in {elapsed:.2f} s: "
            f"{workload.replies / elapsed:,.0f} requests/s, every reply verified against the model"
        )

        old_leader, state = await_leader(base, 10, client=client)
        pid = state["pid"]
        say(
            f"step 3: failover: SIGKILL to the leader's consensus module (member {old_leader}, pid {pid}, "
            f"term {state['leadership_term_id']})"
        )
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        workload.by_id = {}
        deadline = killed_at + FAILOVER_TIMEOUT_S
        first_answer: float | None = None
        answered_after = sent_again = n = 0
        while answered_after < args.after_failover:  # one at a time: put a key, read it back
            key = keys[n // 2 % len(keys)]
            attempts = workload.until_answered("put" if n % 2 == 0 else "get", key, f"v{n // 2}", deadline)
            sent_again += attempts - 1
            n += 1
            if client.leader_member_id != old_leader:
                first_answer = first_answer or time.monotonic()
                answered_after += 1
        late, workload.by_id = len(workload.by_id), None
        new_leader, state = await_leader(base, 10, not_member=old_leader, client=client)
        if new_leader != client.leader_member_id:
            raise SystemExit(f"the client follows member {client.leader_member_id}, the leader is {new_leader}")
        assert first_answer is not None
        event = f"NewLeaderEvent {new_leader_at[-1] - killed_at:.1f} s after the kill, " if new_leader_at else ""
        say(
            f"new leader: member {new_leader} (term {state['leadership_term_id']}); {event}first answer from it "
            f"{first_answer - killed_at:.1f} s after the kill"
        )
        say(
            f"from the kill on: {n:,} requests one at a time; {sent_again} attempt(s) unanswered within "
            f"{ATTEMPT_TIMEOUT_S:g} s (or by the old leader) sent again (a put of the same key and value is "
            f"idempotent); {late} late answer(s) to abandoned attempts; every answer verified against the model"
        )
        restart = cluster.await_line(
            rf"node {old_leader} stopped;.*start it again on its own with: "
            r"cluster-node (start --config (\S+))\)",
            "restart command",
            30,
            client,
        )
        say(f"the supervisor stopped the rest of node {old_leader} and printed how to restart it")

        say(f"step 4: restarting node {old_leader}: cluster-node {restart.group(1)}")
        started = time.monotonic()
        again = Child(f"node {old_leader}", "start", "--config", restart.group(2))
        children.append(again)
        again.await_line(rf"node {old_leader} ready", "readiness line", client=client)
        deadline = time.monotonic() + CATCHUP_TIMEOUT_S
        while True:
            view, lead = member_state(base, old_leader), member_state(base, new_leader)
            if (
                view
                and lead
                and view["running"]
                and view["role"] == ClusterRole.FOLLOWER
                and (view["leadership_term_id"], view["commit_position"])
                == (lead["leadership_term_id"], lead["commit_position"])
            ):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"member {old_leader} did not catch up within {CATCHUP_TIMEOUT_S} s: {view}")
            pause(client, 0.1)
        assert view is not None
        log = (base / f"node{old_leader}" / "logs" / "consensus.log").read_text()
        steps = [
            state
            for pair in re.findall(r"election (\w+) -> (\w+)", log[log.rfind("consensus module pid") :])
            for state in pair
        ]
        path = " -> ".join(state for i, state in enumerate(steps) if i == 0 or state != steps[i - 1])
        how = "a catch-up from the leader" if "FOLLOWER_CATCHUP" in path else "no catch-up needed"
        say(
            f"member {old_leader} rejoined as a follower of term {view['leadership_term_id']} ({how}; its election: "
            f"{path}): commit position {view['commit_position']:,}, the leader's, "
            f"{time.monotonic() - started:.1f} s after the restart"
        )
        elapsed = workload.run([("get", key, None) for key in sorted(model)], args.window)
        say(f"final read: {len(model):,} keys, every value as the model says ({elapsed:.2f} s)")

        say("step 5: SIGTERM to the cluster and the restarted node: each node stops in order")
        client.close()
        aeron.close()
        client = aeron = None
        cluster.terminate()
        again.terminate()
        codes = (cluster.stop(), again.stop(), client_driver.stop())
        # The local cluster's supervisor exits 1: one of its nodes had failed (the kill).
        if codes != (1, 0, 0) or not any("local cluster stopped; node(s)" in line for line in cluster.output):
            raise SystemExit(f"an unclean stop: exit codes {codes} (cluster, node {old_leader}, client driver)")
        say(
            f"stopped: exit codes {codes[0]} (the cluster supervisor: a node had failed), {codes[1]} (node "
            f"{old_leader}), {codes[2]} (client driver)"
        )
        verify_logs(base)
        analyse_logs(base, model)
    except BaseException as error:
        for log_path in sorted(base.glob("node*/logs/consensus.log")):  # before they are removed
            say(f"the demo failed; the last lines of {log_path}:")
            for line in log_path.read_text(errors="replace").splitlines()[-6:]:
                say(f"    {line}")
        if isinstance(error, (FulmarError, OSError)):
            raise SystemExit(f"the demo failed: {type(error).__name__}: {error}") from error
        raise
    finally:
        if client is not None:
            client.close()
        if aeron is not None:
            aeron.close()
        for child in reversed(children):
            child.kill()
        shutil.rmtree(base, ignore_errors=True)
        for directory in driver_dirs:
            if directory.exists():
                say(f"the driver directory {directory} was left behind: removing it")
                shutil.rmtree(directory, ignore_errors=True)
    left = [str(path) for path in (base, *driver_dirs) if path.exists()]
    if left:
        raise SystemExit(f"left behind: {', '.join(left)}")
    say(f"nothing left behind: {base} and {len(driver_dirs)} driver directories removed")


if __name__ == "__main__":
    main()
