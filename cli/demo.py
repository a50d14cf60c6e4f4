"""``make run``: a three-member cluster serving a replicated key-value store, and a failover.

1. ``cluster-node start --local 3`` starts three nodes (each a media driver,
   an archive, a consensus module and a clustered service container running
   ``fulmar.service.samples:KeyValueStore``, a ``StateMachine`` whose
   ``@command`` methods are ``put``, ``get`` and ``delete``; every one a
   process of its own) under a temporary directory; the members elect a leader.
2. ``fulmar.connect(endpoints)``: a client with a media driver of its own
   (embedded: a child process it stops on close) opens a session over UDP on
   loopback, finds the leader and calls ``put`` and ``get``, a window of calls
   in flight (``call_async``); every result is checked against a local model
   of the store.
3. Failover: the leader's consensus module is killed (SIGKILL) with calls in
   flight.  The followers hear no heartbeat for the leader heartbeat timeout
   (10 s by default) and elect a new leader, which tells the client
   (NewLeaderEvent); the client sends its unanswered calls again on its own.
   Each is applied once: a put returns the value before it, so one applied
   twice would return its own.  The supervisor stops the rest of the killed
   node and says how to start it again.
4. The node is started again on its own (``cluster-node start --config``): it
   replays its log, catches up from the leader and rejoins as a follower.
   Every key is read back and checked against the model.
5. ``client.close()`` stops the client's driver; SIGTERM stops every node in
   order; ``cluster-tool verify-log`` checks the three members' recorded logs
   (each term's NewLeadershipTermEvent carries that term, terms rise along
   the log, the recording logs match, the members agree on the committed
   prefix).
6. Spark (local mode) reads the three members' recorded logs through the
   ``fulmar-log`` data source: the ``cluster-tool analyze`` report (messages
   per leadership term, per session, per second...), and member 0's log
   replayed into a new ``KeyValueStore`` (``replay_state_machine``) must give
   the model's store.  The temporary directories are removed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import fulmar
from fulmar.cli.cluster_commands import ClusterNode, ClusterReadError, cluster_member_node
from fulmar.clock import epoch_ms
from fulmar.consensus.states import ClusterRole
from fulmar.errors import FulmarError

SERVICE = "fulmar.service.samples:KeyValueStore"
MEMBERS = 3
START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 60
REPLY_TIMEOUT_S = 30
FAILOVER_WINDOW = 8  # calls in flight through the failover
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

    def await_line(self, pattern: str, what: str, timeout_s: float = START_TIMEOUT_S) -> re.Match[str]:
        """The first line of its output matching ``pattern``, waiting at most ``timeout_s``."""
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


def await_leader(base: Path, timeout_s: float, not_member: int | None = None) -> tuple[int, dict[str, Any]]:
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
        time.sleep(0.1)
    raise SystemExit(f"no leader within {timeout_s:g} s")


class Calls:
    """Calls of the KeyValueStore's commands over one ``fulmar.Client``, up to a
    window of them in flight, each result checked against a model of the store."""

    def __init__(self, client: fulmar.Client, model: dict[str, Any]) -> None:
        self.client = client
        self.model = model
        self.in_flight: deque[tuple[str, str, Any, Future[Any]]] = deque()  # (command, key, expected, future)
        self.answered = 0

    def send(self, command: str, key: str, value: Any = None) -> None:
        # The model changes as the call is sent: one client's calls are applied in the order it sent them.
        expected = self.model.get(key)
        if command == "put":
            self.model[key] = value
            future = self.client.call_async("put", key, value)
        else:
            future = self.client.call_async("get", key)
        self.in_flight.append((command, key, expected, future))

    def check_oldest(self, timeout_s: float) -> None:
        """Wait for the oldest call's result; exactly as the model says, or the demo fails.  A put
        returns the value before it: one applied twice (its resend after a failover) would return
        its own value instead."""
        command, key, expected, future = self.in_flight.popleft()
        try:
            result = future.result(timeout_s)
        except TimeoutError:
            raise SystemExit(f"{command} {key}: no result within {timeout_s:g} s") from None
        if result != expected:
            raise SystemExit(f"{command} {key}: expected {expected!r}, got {result!r}")
        self.answered += 1

    def run(self, operations: list[tuple[str, str, Any]], window: int) -> float:
        """Every operation, at most ``window`` unanswered; the elapsed seconds."""
        started = time.perf_counter()
        for operation in operations:
            if len(self.in_flight) >= window:
                self.check_oldest(REPLY_TIMEOUT_S)
            self.send(*operation)
        while self.in_flight:
            self.check_oldest(REPLY_TIMEOUT_S)
        return time.perf_counter() - started


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
        from fulmar.analytics.replay import replay_state_machine
        from fulmar.analytics.session import spark_session, stop_spark
        from fulmar.service.samples import KeyValueStore
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
        replayed = replay_state_machine(spark, archives[0], KeyValueStore)
    finally:
        stop_spark(spark)
    data = replayed.state.data
    if data != model:
        differing = sorted(k for k in set(model) | set(data) if model.get(k) != data.get(k))
        raise SystemExit(f"the log's replay differs from the model at {len(differing)} keys: {differing[:5]}")
    say(
        f"replayed member 0's log ({replayed.messages:,} messages, to position {replayed.position:,}) into a new "
        f"KeyValueStore in Spark (replay_state_machine): {len(model):,} keys, every value as the model says "
        f"({time.monotonic() - started:.1f} s with Spark's start)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m fulmar.cli.demo", description=__doc__.split("\n\n")[0])
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
    driver_dirs: list[Path] = []
    children: list[Child] = []
    client: fulmar.Client | None = None
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

        say("step 2: fulmar.connect(endpoints): a client with a media driver of its own, calls in flight")
        client = fulmar.connect(endpoints, timeout=REPLY_TIMEOUT_S)
        assert client.driver is not None
        driver_dirs.append(client.driver.base)
        say(
            f"client connected: session {client.cluster_session_id} with leader member {client.leader_member_id}, "
            f"its driver pid {client.driver.pid} in {client.driver.directory}"
        )
        calls = Calls(client, model)
        keys = [f"key-{k:05d}" for k in range(args.keys)]
        operations: list[tuple[str, str, Any]] = []
        for i in range(args.requests):  # every key written, reads of written and unwritten keys
            if i % 2 == 0:
                operations.append(("put", keys[(i // 2 * 7919) % len(keys)], i))
            else:
                operations.append(("get", keys[(i * 104729) % len(keys)], None))
        elapsed = calls.run(operations, args.window)
        puts = sum(1 for op in operations if op[0] == "put")
        say(
            f"workload: {args.requests:,} calls ({puts:,} puts, {args.requests - puts:,} gets over {len(keys):,} "
            f"keys, {args.window} in flight) -> {calls.answered:,} results in {elapsed:.2f} s: "
            f"{calls.answered / elapsed:,.0f} calls/s, every result as the model says"
        )

        old_leader, state = await_leader(base, 10)
        pid = state["pid"]
        say(
            f"step 3: failover: SIGKILL to the leader's consensus module (member {old_leader}, pid {pid}, "
            f"term {state['leadership_term_id']}), {FAILOVER_WINDOW} calls kept in flight"
        )
        resent_before = client.calls_resent
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        first_answer: float | None = None
        answered_after = n = 0
        while answered_after < args.after_failover:  # put a key, read it back, a window in flight
            key = keys[n // 2 % len(keys)]
            calls.send(*(("put", key, f"v{n // 2}") if n % 2 == 0 else ("get", key, None)))
            n += 1
            if len(calls.in_flight) >= FAILOVER_WINDOW:
                calls.check_oldest(FAILOVER_TIMEOUT_S)
                if client.leader_member_id not in (None, old_leader):
                    first_answer = first_answer or time.monotonic()
                    answered_after += 1
        while calls.in_flight:
            calls.check_oldest(FAILOVER_TIMEOUT_S)
        new_leader, state = await_leader(base, 10, not_member=old_leader)
        if new_leader != client.leader_member_id:
            raise SystemExit(f"the client follows member {client.leader_member_id}, the leader is {new_leader}")
        assert first_answer is not None
        say(
            f"new leader: member {new_leader} (term {state['leadership_term_id']}); first result from it "
            f"{first_answer - killed_at:.1f} s after the kill"
        )
        say(
            f"from the kill on: {n:,} calls, each answered once and applied once (every put returned "
            f"the value before it, as the model says); the client sent {client.calls_resent - resent_before} "
            "unanswered call(s) again to the new leader on its own"
        )
        restart = cluster.await_line(
            rf"node {old_leader} stopped;.*start it again on its own with: "
            r"cluster-node (start --config (\S+))\)",
            "restart command",
            30,
        )
        say(f"the supervisor stopped the rest of node {old_leader} and printed how to restart it")

        say(f"step 4: restarting node {old_leader}: cluster-node {restart.group(1)}")
        started = time.monotonic()
        again = Child(f"node {old_leader}", "start", "--config", restart.group(2))
        children.append(again)
        again.await_line(rf"node {old_leader} ready", "readiness line")
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
            time.sleep(0.1)  # the client keeps its session alive on its own meanwhile
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
        elapsed = calls.run([("get", key, None) for key in sorted(model)], args.window)
        say(f"final read: {len(model):,} keys, every value as the model says ({elapsed:.2f} s)")

        say("step 5: client.close() (its driver stops), SIGTERM to the cluster and the restarted node")
        client.close()
        client = None
        cluster.terminate()
        again.terminate()
        codes = (cluster.stop(), again.stop())
        # The local cluster's supervisor exits 1: one of its nodes had failed (the kill).
        if codes != (1, 0) or not any("local cluster stopped; node(s)" in line for line in cluster.output):
            raise SystemExit(f"an unclean stop: exit codes {codes} (cluster, node {old_leader})")
        say(
            f"stopped: exit codes {codes[0]} (the cluster supervisor: a node had failed), {codes[1]} (node {old_leader})"
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
