"""A suspension outlives a failover, a restart and a snapshot (issue 18, seed 004).

Seed 004: a follower's module applies a ClusterActionRequest SUSPEND or
RESUME from the log (Aeron's ``onReplayClusterAction``) so that its state
matches the leader's; a member replaying its own log does the same; an
election changes who leads, not whether the cluster is suspended.

The unit cases drive a ``ConsensusModuleAgent`` over fake streams and
counters (no processes): log messages go straight into its log handler.
The system cases run real processes: three members failing over while
suspended, and one node restarted (SIGKILL, and a SIGTERM snapshot)
while suspended, operated with the real ``cluster-tool``.
"""

from __future__ import annotations

import json
import signal
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from fulmar.cli import cluster_tool
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import consensus_module, snapshot
from fulmar.consensus.agent import (
    ClusterRole,
    ConsensusModuleState,
    ControlToggle,
)
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.cluster_session import ClusterSession, ClusterSessionState
from fulmar.consensus.recording_log import RecordingLog
from support.agents import MEMBERS, FakePublication, apply_log, complete_election, log_of, new_agent, state_counter
from support.cluster import LocalCluster, SingleNodeCluster
from support.driver import wait_for
from support.multi_node import COUNTER_SERVICE, log_frames, member_view, next_term, wait_for_leader

# ------------------------------------------------------------------ unit: fakes


# ------------------------------------------------------------------ unit cases


def test_a_follower_takes_the_state_of_each_committed_suspend_and_resume() -> None:
    agent = new_agent(MEMBERS, member_id=1)
    complete_election(agent, ClusterRole.FOLLOWER, leader=0, term=0)
    assert agent.state is ConsensusModuleState.ACTIVE
    apply_log(agent, codecs.ClusterAction.SUSPEND)
    assert agent.state is ConsensusModuleState.SUSPENDED
    assert state_counter(agent) is ConsensusModuleState.SUSPENDED  # what cluster-tool reads
    apply_log(agent, codecs.ClusterAction.RESUME)
    assert state_counter(agent) is ConsensusModuleState.ACTIVE
    apply_log(agent, codecs.ClusterAction.SUSPEND, codecs.ClusterAction.RESUME, codecs.ClusterAction.SUSPEND)
    assert state_counter(agent) is ConsensusModuleState.SUSPENDED


def test_a_suspended_follower_elected_leader_stays_suspended_until_resume() -> None:
    agent = new_agent(MEMBERS, member_id=1)
    complete_election(agent, ClusterRole.FOLLOWER, leader=0, term=0)
    apply_log(agent, codecs.ClusterAction.SUSPEND)
    # The leader dies; this member wins the next election.
    complete_election(agent, ClusterRole.LEADER, leader=1, term=1)
    assert agent.role is ClusterRole.LEADER
    assert state_counter(agent) is ConsensusModuleState.SUSPENDED
    assert agent.control_toggle.get() == ControlToggle.NEUTRAL  # cluster-tool resume can set RESUME
    agent.control_toggle.set(ControlToggle.RESUME)
    agent._check_control_toggle(0)
    assert state_counter(agent) is ConsensusModuleState.ACTIVE
    assert agent.control_toggle.get() == ControlToggle.NEUTRAL
    [resume] = log_of(agent)
    assert isinstance(resume, codecs.ClusterActionRequestDecoder)
    assert (resume.action_raw, resume.leadership_term_id) == (codecs.ClusterAction.RESUME, 1)


def test_a_restarted_single_node_replaying_a_suspend_completes_its_election_suspended() -> None:
    agent = new_agent()
    assert agent.state is ConsensusModuleState.INIT
    apply_log(agent, codecs.ClusterAction.SUSPEND)  # the start-up replay (LogReplay -> poll_log)
    assert agent.state is ConsensusModuleState.INIT  # the state comes with the election's end
    agent.role = ClusterRole.LEADER
    publication = FakePublication()
    agent._log_publication = publication  # type: ignore[assignment]
    agent.log_publisher.publication = publication  # type: ignore[assignment]
    agent.on_election_complete()
    assert state_counter(agent) is ConsensusModuleState.SUSPENDED

    # Suspended: an overdue timer neither fires nor shortens the idle wait.
    agent.timers.schedule(5, 0)
    agent._leader_work(1)
    assert publication.messages == []
    assert agent.idle_wait_ns(10_000_000) == 10_000_000
    agent.control_toggle.set(ControlToggle.RESUME)
    agent._check_control_toggle(2)
    agent._leader_work(3)
    resume, timer = publication.decoded()
    assert resume.action_raw == codecs.ClusterAction.RESUME
    assert isinstance(timer, codecs.TimerEventDecoder) and timer.correlation_id == 5

    # The last action replayed wins: one resumed before the restart stays ACTIVE.
    agent = new_agent()
    apply_log(agent, codecs.ClusterAction.SUSPEND, codecs.ClusterAction.SNAPSHOT, codecs.ClusterAction.RESUME)
    agent.on_election_complete()
    assert state_counter(agent) is ConsensusModuleState.ACTIVE


def test_a_leader_stepping_down_forgets_its_uncommitted_suspend_until_the_log_replays_it() -> None:
    agent = new_agent(MEMBERS, member_id=0)
    complete_election(agent, ClusterRole.LEADER, leader=0, term=0)
    agent.control_toggle.set(ControlToggle.SUSPEND)
    agent._check_control_toggle(0)
    assert state_counter(agent) is ConsensusModuleState.SUSPENDED
    # No quorum has the SUSPEND (commit position 0): stepping down, the state
    # is the committed log's, ACTIVE ...
    agent.append_position = agent.log_publisher.position  # its own archive has what it published
    agent.step_down()
    assert state_counter(agent) is ConsensusModuleState.ACTIVE
    # ... until the election replays its log and finds the SUSPEND still there.
    apply_log(agent, codecs.ClusterAction.SUSPEND)
    assert state_counter(agent) is ConsensusModuleState.SUSPENDED


def test_no_session_times_out_while_suspended_and_each_gets_a_full_timeout_after_resume() -> None:
    agent = new_agent()
    agent.role = ClusterRole.LEADER
    agent._log_publication = agent.log_publisher.publication = FakePublication()  # type: ignore[assignment]
    agent.on_election_complete()
    session = ClusterSession(1, 102, "aeron:udp?endpoint=127.0.0.1:1", now_ns=0)
    session.state = ClusterSessionState.OPEN
    agent.sessions[session.id] = session
    timeout_ns = agent.context.session_timeout_ns
    agent.control_toggle.set(ControlToggle.SUSPEND)
    agent._check_control_toggle(0)
    # A held message stops the ingress: the session's keepalives wait behind it.
    resumed_ns = 3 * timeout_ns
    agent._check_sessions(resumed_ns)
    assert session.state is ClusterSessionState.OPEN
    agent.control_toggle.set(ControlToggle.RESUME)
    agent._check_control_toggle(resumed_ns)
    agent._check_sessions(resumed_ns + 1)  # the same slow tick, before the ingress is read
    assert session.state is ClusterSessionState.OPEN
    agent._check_sessions(resumed_ns + timeout_ns + 1)  # silent for a whole timeout since the resume
    assert session.state is ClusterSessionState.CLOSED
    suspend, resume, close = log_of(agent)
    assert (suspend.action_raw, resume.action_raw) == (codecs.ClusterAction.SUSPEND, codecs.ClusterAction.RESUME)
    assert isinstance(close, codecs.SessionCloseEventDecoder) and close.cluster_session_id == 1


class CapturingWriter(snapshot.SnapshotWriter):
    """A snapshot writer that keeps the messages instead of recording them."""

    written: list[bytes] = []

    def __init__(self, aeron: Any, archive: Any, channel: str = "", stream_id: int = 0) -> None:
        self._buffer = bytearray(64 * 1024)
        self.publication = FakePublication()  # type: ignore[assignment]
        CapturingWriter.written = []

    def offer(self, message: bytes | bytearray | memoryview) -> None:
        CapturingWriter.written.append(bytes(message))

    def close(self) -> int:
        return 1


def snapshot_and_reload(monkeypatch: pytest.MonkeyPatch, suspended: bool) -> tuple[list[str], ConsensusModuleState]:
    """A single node's module snapshot (suspended or not) and the state a restart loads from it."""
    monkeypatch.setattr(snapshot, "SnapshotWriter", CapturingWriter)
    monkeypatch.setattr(consensus_module, "read_snapshot", lambda *args: CapturingWriter.written)
    agent = new_agent()
    agent.role = ClusterRole.LEADER
    agent._log_publication = agent.log_publisher.publication = FakePublication()  # type: ignore[assignment]
    agent.on_election_complete()
    if suspended:
        agent.control_toggle.set(ControlToggle.SUSPEND)
        agent._check_control_toggle(0)
    agent.control_toggle.set(ControlToggle.SNAPSHOT)  # what a SIGTERM does (SHUTDOWN: the same snapshot)
    agent._check_control_toggle(1)
    assert agent.state is ConsensusModuleState.SNAPSHOT
    snapshot.take_consensus_module_snapshot(agent, 4096)
    records = [type(codecs.decode(message)).__name__ for message in CapturingWriter.written]
    restarted = new_agent()
    consensus_module.load_snapshot(restarted, 1)
    assert restarted.state is ConsensusModuleState.INIT
    restarted.on_election_complete()
    return records, state_counter(restarted)


def test_the_module_snapshot_keeps_a_suspension(monkeypatch: pytest.MonkeyPatch) -> None:
    # Aeron's layout: BEGIN, ConsensusModule, sessions, timers, END; a suspension
    # adds one ClusterActionRequest SUSPEND, a message Aeron's snapshot loader skips.
    records, state = snapshot_and_reload(monkeypatch, suspended=True)
    assert records == [
        "SnapshotMarkerDecoder",
        "ConsensusModuleDecoder",
        "ClusterActionRequestDecoder",
        "SnapshotMarkerDecoder",
    ]
    assert state is ConsensusModuleState.SUSPENDED
    # An active module's snapshot is Aeron's layout unchanged, and loads ACTIVE.
    records, state = snapshot_and_reload(monkeypatch, suspended=False)
    assert records == ["SnapshotMarkerDecoder", "ConsensusModuleDecoder", "SnapshotMarkerDecoder"]
    assert state is ConsensusModuleState.ACTIVE


# ------------------------------------------------------------------ system: helpers

TIMEOUT_S = 30.0
FAILOVER_BOUND_S = 3.0 + 7.0  # the heartbeat timeout plus an election (as test_cluster_multi_node)
# How long "not applied" is watched: longer than the CounterService's 1 s timer
# period, so that a timer due while suspended would have fired.
HOLD_S = 1.5


def tool(*args: str) -> Result:
    return CliRunner().invoke(cluster_tool.main, ["cluster", *args])


def counters_of(directory: Path) -> dict[str, Any]:
    """The consensus module counters cluster-tool describes for one node ({} if not running)."""
    result = tool("describe", "--dir", str(directory), "--json")
    assert "Traceback" not in result.output, result.output
    return json.loads(result.stdout)["nodes"][0].get("counters") or {}


def module_state(directory: Path) -> str | None:
    return counters_of(directory).get("module_state_name")


class Replies:
    """A CounterService client whose replies (value, ticks) are collected as they come."""

    def __init__(self, connect: Any) -> None:
        self.values: list[tuple[int, int]] = []
        self.client: ClusterClient = connect(on_message=self._on_message)

    def _on_message(self, session_id: int, timestamp: int, payload: memoryview) -> None:
        self.values.append(struct.unpack_from("<qq", payload))

    def send(self, payload: bytes) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while self.client.offer(payload) <= 0:
            self.client.poll_egress()
            assert time.monotonic() < deadline, "ingress back pressured for 30 s"
            time.sleep(0.001)

    def poll_for(self, seconds: float, until: int | None = None) -> None:
        """Poll the egress for ``seconds``, or until ``until`` replies arrived."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and (until is None or len(self.values) < until):
            if not self.client.poll_egress():
                time.sleep(0.002)

    def request(self, payload: bytes) -> tuple[int, int]:
        count = len(self.values)
        self.send(payload)
        self.poll_for(TIMEOUT_S, until=count + 1)
        assert len(self.values) > count, f"no reply to {payload!r} in {TIMEOUT_S} s"
        return self.values[count]

    def wait_for_ticks(self, ticks: int) -> tuple[int, int]:
        """Ask (b"?") until the CounterService's timer ticked ``ticks`` times."""
        deadline = time.monotonic() + 15
        while True:
            value = self.request(b"?")
            if value[1] >= ticks:
                return value
            assert time.monotonic() < deadline, f"the timer did not tick {ticks} times in 15 s: {value}"
            time.sleep(0.05)  # paces the polling of a 1 s timer; not a synchronisation

    def assert_held(self) -> None:
        """What was sent is not applied (no reply) while the cluster is suspended."""
        count = len(self.values)
        self.poll_for(HOLD_S)
        assert self.values[count:] == [], f"applied while suspended: {self.values[count:]}"


def templates_between_suspend_and_resume(frames: list[tuple[int, int, bytes]]) -> list[int]:
    """The template ids of the log messages after the last SUSPEND and before the RESUME after it."""
    templates: list[tuple[int, Any]] = []
    for frame_type, _flags, payload in frames:
        if frame_type != 1:  # DATA (padding is not a message)
            continue
        header = codecs.read_header(payload, 0, len(payload))
        action = None
        if header.template_id == codecs.ClusterActionRequestEncoder.TEMPLATE_ID:
            request = codecs.decode(payload)
            assert isinstance(request, codecs.ClusterActionRequestDecoder)
            action = request.action_raw
        templates.append((header.template_id, action))
    suspend = max(i for i, (_, action) in enumerate(templates) if action == codecs.ClusterAction.SUSPEND)
    resume = next(i for i, (_, action) in enumerate(templates) if i > suspend and action == codecs.ClusterAction.RESUME)
    return [template for template, _ in templates[suspend + 1 : resume]]


# ------------------------------------------------------------------ system: three members


@pytest.fixture
def three() -> Iterator[LocalCluster]:
    with LocalCluster(3, COUNTER_SERVICE, extra_driver_args=("--client-liveness-timeout", "5s")) as local:
        yield local


@pytest.mark.system
@pytest.mark.system
def test_a_suspended_cluster_stays_suspended_after_its_leader_dies(three: LocalCluster) -> None:
    cluster = three
    cluster.start()
    old = wait_for_leader(cluster, 30)
    replies = Replies(cluster.connect_client)
    assert replies.request(b"+")[0] == 1
    replies.wait_for_ticks(1)  # the timer runs (a session is open)

    result = tool("suspend", "--dir", str(cluster.base))
    assert result.exit_code == 0, result.output
    # Every member's module says SUSPENDED once it has applied the SUSPEND
    # (a follower when it is committed).
    wait_for(
        lambda: all(module_state(cluster.cluster_dir(m)) == "SUSPENDED" for m in range(3)),
        10,
        "every member SUSPENDED",
        poll_s=0.05,
    )
    replies.send(b"+")  # held by this leader, and lost with it
    replies.assert_held()

    cluster.kill_member(old.member)  # SIGKILL: the leader's machine is gone
    new = wait_for_leader(cluster, FAILOVER_BOUND_S, not_member=old.member, min_term=next_term(old))
    new_dir = cluster.cluster_dir(new.member)
    survivors = [m for m in range(3) if m != old.member]
    wait_for(lambda: counters_of(new_dir).get("election_state_name") == "CLOSED", 10, "the election's end", poll_s=0.05)
    assert [module_state(cluster.cluster_dir(m)) for m in survivors] == ["SUSPENDED", "SUSPENDED"]
    # The client follows the new leader (NewLeaderEvent); its increment waits there.
    wait_for(
        lambda: replies.client.poll_egress() >= 0 and replies.client.leader_member_id == new.member,
        10,
        "the client to follow the new leader",
        poll_s=0.01,
    )
    replies.send(b"+")
    replies.assert_held()

    result = tool("resume", "--dir", str(cluster.base))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("resumed "), result.stdout
    wait_for(
        lambda: all(module_state(cluster.cluster_dir(m)) == "ACTIVE" for m in survivors),
        10,
        "the survivors ACTIVE",
        poll_s=0.05,
    )
    count = len(replies.values)
    replies.poll_for(10, until=count + 1)
    assert [value for value, _ in replies.values[count:]] == [2], "the held increment, applied after the resume"
    _, ticks = replies.request(b"?")
    replies.wait_for_ticks(ticks + 1)  # the timer fires again
    # While suspended (under both leaders) nothing went into the log but the
    # new term: no client message, no timer.
    position = member_view(cluster, new.member).commit_position
    assert position is not None
    between = templates_between_suspend_and_resume(log_frames(cluster, new.member, position))
    assert between and set(between) == {codecs.NewLeadershipTermEventEncoder.TEMPLATE_ID}, between


# ------------------------------------------------------------------ system: one node


@pytest.fixture
def single_of() -> Iterator[Any]:
    clusters: list[SingleNodeCluster] = []

    def start(*consensus_args: str) -> SingleNodeCluster:
        cluster = SingleNodeCluster(COUNTER_SERVICE, extra_consensus_args=consensus_args)
        clusters.append(cluster)
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.close()


@pytest.fixture
def single(single_of: Any) -> SingleNodeCluster:
    return single_of()


def wait_for_election(cluster: SingleNodeCluster) -> dict[str, Any]:
    """The node's counters once its election completed (it leads)."""
    found: list[dict[str, Any]] = []

    def done() -> bool:
        counters = counters_of(cluster.base)
        found[:] = [counters]
        return counters.get("election_state_name") == "CLOSED" and counters.get("role_name") == "LEADER"

    wait_for(done, TIMEOUT_S, "the node to lead", poll_s=0.05)
    return found[0]


def connect_single(cluster: SingleNodeCluster, **defaults: Any) -> Any:
    def connect(**options: Any) -> ClusterClient:
        return ClusterClient.connect(
            cluster.connect(),
            cluster.ingress_channel,
            egress_channel="aeron:udp?endpoint=127.0.0.1:0",
            message_timeout_ns=20_000_000_000,
            **defaults,
            **options,
        )

    return connect


def suspend_with_a_held_increment(cluster: SingleNodeCluster) -> Replies:
    wait_for_election(cluster)
    replies = Replies(connect_single(cluster))
    assert replies.request(b"+")[0] == 1
    result = tool("suspend", "--dir", str(cluster.base))
    assert result.exit_code == 0, result.output
    replies.send(b"+")
    replies.assert_held()
    replies.client.close()
    return replies


def resume_and_check(cluster: SingleNodeCluster) -> None:
    """Still SUSPENDED after the restart, input waits until ``cluster-tool
    resume``: a client's connect too (a suspended leader leaves its ingress
    unread, as Aeron's does), so the session opens only after the resume."""
    counters = wait_for_election(cluster)
    assert counters["module_state_name"] == "SUSPENDED", counters
    sessions = counters["sessions"]  # (the log's: a close held before the restart never reached it)
    connected: list[Replies] = []
    failed: list[BaseException] = []

    def connect() -> None:
        try:
            connected.append(Replies(connect_single(cluster)))
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            failed.append(error)

    connector = threading.Thread(target=connect, daemon=True)
    connector.start()
    try:
        connector.join(HOLD_S)
        assert connector.is_alive() and not connected, f"a session opened while suspended: {connected or failed}"
        assert counters_of(cluster.base)["sessions"] == sessions
        result = tool("resume", "--dir", str(cluster.base))
        assert result.exit_code == 0, result.output
    finally:
        # (Its client must be done with the driver before the cluster closes it.)
        connector.join(TIMEOUT_S)
    assert connected, f"no session after the resume: {failed}"
    replies = connected[0]
    replies.send(b"+")
    replies.poll_for(10, until=1)
    # The increment held before the restart died with the process that held it.
    assert [value for value, _ in replies.values] == [2]
    replies.client.close()


@pytest.mark.system
@pytest.mark.system
def test_a_suspended_node_killed_and_restarted_replays_its_log_into_suspension(single: SingleNodeCluster) -> None:
    suspend_with_a_held_increment(single)
    single.kill_all()  # SIGKILL: no snapshot; the restart replays the whole log
    single.start()
    resume_and_check(single)


@pytest.mark.system
@pytest.mark.system
def test_a_suspended_node_stopped_with_a_snapshot_restarts_suspended(single: SingleNodeCluster) -> None:
    suspend_with_a_held_increment(single)
    consensus, service = single.consensus, single.service
    assert consensus is not None and service is not None
    # SIGTERM to the module: it snapshots at the log's end and stops its
    # service there; the restart loads that snapshot and replays nothing.
    consensus.process.send_signal(signal.SIGTERM)
    rc = consensus.stop(TIMEOUT_S)
    print("DBG consensus", rc, consensus.output()[-3000:])
    rc2 = service.stop(TIMEOUT_S)
    print("DBG service", rc2, service.output()[-3000:])
    assert rc == 0 and rc2 == 0
    assert "consensus module stopped: SHUTDOWN at log position" in consensus.output(), consensus.output()[-1500:]
    with RecordingLog.open(single.cluster_dir, create=False) as recording_log:
        module_snapshot = recording_log.get_latest_snapshot(-1)
    assert module_snapshot is not None
    single.start_consensus()
    single.start_service()
    resume_and_check(single)


@pytest.mark.system
@pytest.mark.system
def test_a_message_held_longer_than_the_session_timeout_is_applied_after_resume(single_of: Any) -> None:
    """The held message stops the ingress, the client's keepalives behind it:
    its session must not time out while the cluster is suspended."""
    cluster = single_of("--session-timeout", "1s")
    wait_for_election(cluster)
    replies = Replies(connect_single(cluster, keepalive_interval_ns=200_000_000))
    assert replies.request(b"+")[0] == 1
    result = tool("suspend", "--dir", str(cluster.base))
    assert result.exit_code == 0, result.output
    replies.send(b"+")
    replies.poll_for(3.0)  # three session timeouts, keepalives sent (and held) all along
    assert len(replies.values) == 1 and not replies.client.is_closed
    assert counters_of(cluster.base)["sessions"] == 1
    result = tool("resume", "--dir", str(cluster.base))
    assert result.exit_code == 0, result.output
    replies.poll_for(10, until=2)
    assert [value for value, _ in replies.values] == [1, 2], "the held increment, applied after the resume"
    assert replies.request(b"+")[0] == 3 and not replies.client.is_closed
    replies.client.close()
