"""The sessions of tools that are not clients (seed 000's pendingBackupSessions,
seed 003's BACKUP, HEARTBEAT and STANDBY_SNAPSHOT actions) and the
STANDBY_SNAPSHOT cluster action with its flags (seed 004), against a running
three-member cluster.

A tool sends its request on a member's consensus endpoint (stream 108) with
a response channel of its own; the member connects a publication back to it,
answers once and closes it: BackupResponse to a BackupQuery (where the log is
recorded, the latest snapshots, the members and the leader), HeartbeatResponse
to a HeartbeatRequest, a SessionEvent ERROR to a request of another major
version.  Leader and followers answer alike.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.cli import cluster_commands, supervisor
from fulmar.cnc import CncFile
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.consensus.agent import ConsensusModuleState, ElectionState
from fulmar.consensus.recording_log import ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_STANDBY_SNAPSHOT, RecordingLog
from fulmar.counters import CountersReader
from fulmar.semantic_version import compose_version
from fulmar.subscription import Subscription
from support.cluster import FAST_ELECTION_ARGS, LocalCluster
from support.driver import wait_for
from support.multi_node import log_frames, member_view, wait_for_commit, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

ECHO_SERVICE = "fulmar.service.samples:EchoService"
RESPONSE_STREAM_ID = 108


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, ECHO_SERVICE) as local:
        local.start()
        wait_for_leader(local, 30)
        client = local.connect_client()
        for number in range(20):
            assert (
                client.request(f"before the snapshot {number}".encode(), timeout_s=10)
                == f"before the snapshot {number}".encode()
            )
        yield local


class Tool:
    """A tool on the clients' driver: a publication to one member's consensus
    endpoint and a subscription for the answers on a port of its own."""

    def __init__(self, cluster: LocalCluster, member: int) -> None:
        self.aeron: Aeron = cluster.connect()
        # A port of its own (two subscriptions to ``127.0.0.1:0`` in one driver
        # are one channel, so they would share their answers).
        self.response_channel = f"aeron:udp?endpoint=127.0.0.1:{supervisor.free_udp_port()}"
        self.subscription: Subscription = self.aeron.add_subscription(self.response_channel, RESPONSE_STREAM_ID)
        self.publication = self.aeron.add_publication(
            f"aeron:udp?term-length=64k|endpoint={cluster.ports[member].endpoint('consensus')}",
            protocol.CONSENSUS_STREAM_ID,
        )
        wait_for(lambda: self.publication.is_connected, 10, f"a publication to member {member}'s consensus endpoint")
        self._buffer = bytearray(4096)

    def send(self, encoder: Any, **fields: Any) -> None:
        length = encoder.encode(self._buffer, 0, **fields)
        message = bytes(self._buffer[:length])
        wait_for(lambda: self.publication.offer(message) > 0, 10, f"an offer of {encoder.NAME}")

    def answer(self, timeout_s: float = 15, skipping: type | None = None) -> Any:
        """The first message on the response channel, decoded (``skipping``:
        past messages of that type)."""
        return self._answer(time.monotonic() + timeout_s, skipping)

    def ask(self, encoder: Any, resend_s: float = 2.0, timeout_s: float = 15, **fields: Any) -> Any:
        """Send a request and return the first answer, sending it again each
        ``resend_s`` without one, as ClusterBackup does: a member takes a tool's
        request only while no election runs (Aeron's rule), and a tool that
        hears nothing asks again."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.send(encoder, **fields)
            try:
                return self._answer(min(deadline, time.monotonic() + resend_s), None)
            except AssertionError:
                if time.monotonic() >= deadline:
                    raise

    def _answer(self, deadline: float, skipping: type | None) -> Any:
        received: list[Any] = []

        def on_fragment(buffer: Any, offset: int, length: int, header: Any) -> None:
            message = codecs.decode(bytes(buffer[offset : offset + length]))
            if skipping is None or not isinstance(message, skipping):
                received.append(message)

        def answered() -> bool:
            self.subscription.poll(on_fragment, 1)
            return bool(received)

        wait_for(answered, max(0.0, deadline - time.monotonic()), "an answer on the response channel")
        return received[0]

    def close(self) -> None:
        self.publication.close()
        self.subscription.close()


@pytest.fixture
def tools(cluster: LocalCluster) -> Iterator[list[Tool]]:
    made: list[Tool] = []
    yield made
    for tool in made:
        tool.close()


def counter(cluster: LocalCluster, member: int, type_id: int) -> int:
    with CncFile.open(cluster.driver_dir(member)) as cnc:
        reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
        values = [reader.counter_value(c.counter_id) for c in reader if c.type_id == type_id]
    assert len(values) == 1, f"member {member}: {len(values)} counters of type {type_id}"
    return values[0]


def commit_position_counter_ids(cluster: LocalCluster, member: int) -> list[int]:
    with CncFile.open(cluster.driver_dir(member)) as cnc:
        reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
        return [c.counter_id for c in reader if c.type_id == protocol.COMMIT_POSITION_TYPE_ID]


def recording_log_entries(cluster: LocalCluster, member: int) -> list[Any]:
    log = RecordingLog.open(cluster.cluster_dir(member), create=False)
    try:
        return list(log.entries)
    finally:
        log.close()


def take_snapshot(cluster: LocalCluster) -> None:
    print(cluster_commands.cluster_operate(cluster.base, "snapshot", 30))


def test_each_member_answers_a_backup_query_with_its_log_snapshots_members_and_leader(
    cluster: LocalCluster, tools: list[Tool]
) -> None:
    take_snapshot(cluster)
    leader = wait_for_leader(cluster, 30).member
    for member in range(cluster.size):
        tool = Tool(cluster, member)
        tools.append(tool)
        correlation_id = 7000 + member
        response = tool.ask(
            codecs.BackupQueryEncoder,
            correlation_id=correlation_id,
            response_stream_id=RESPONSE_STREAM_ID,
            version=protocol.PROTOCOL_SEMANTIC_VERSION,
            response_channel=tool.response_channel,
            encoded_credentials=b"",
        )
        assert isinstance(response, codecs.BackupResponseDecoder), response
        entries = recording_log_entries(cluster, member)
        last_term = [e for e in entries if e.entry_type == 0 and e.is_valid][-1]
        assert response.correlation_id == correlation_id
        assert response.member_id == member
        assert response.leader_member_id == leader
        assert response.log_recording_id == last_term.recording_id
        assert (response.last_leadership_term_id, response.last_term_base_log_position) == (
            last_term.leadership_term_id,
            last_term.term_base_log_position,
        )
        assert (response.log_leadership_term_id, response.log_term_base_log_position) == (
            last_term.leadership_term_id,
            last_term.term_base_log_position,
        )
        assert response.cluster_members == cluster.cluster_members
        assert response.commit_position_counter_id in commit_position_counter_ids(cluster, member)
        # The newest snapshot set: the consensus module's, then the service's, at one position.
        snapshots = [e for e in entries if e.entry_type == ENTRY_TYPE_SNAPSHOT and e.is_valid]
        newest = snapshots[-1].log_position
        expected = sorted((e.recording_id, e.service_id, e.log_position) for e in snapshots if e.log_position == newest)
        assert sorted((s.recording_id, s.service_id, s.log_position) for s in response.snapshots) == expected
        assert [s.service_id for s in response.snapshots] == [-1, 0]
        # Answered once: the member lets the session's publication go.
        wait_for(
            lambda: not tool.subscription.is_connected,
            15,
            f"member {member} to close the backup session's response publication",
        )


def test_each_member_answers_a_heartbeat_request(cluster: LocalCluster, tools: list[Tool]) -> None:
    for member in range(cluster.size):
        tool = Tool(cluster, member)
        tools.append(tool)
        response = tool.ask(
            codecs.HeartbeatRequestEncoder,
            correlation_id=42 + member,
            response_stream_id=RESPONSE_STREAM_ID,
            response_channel=tool.response_channel,
            encoded_credentials=b"",
        )
        assert isinstance(response, codecs.HeartbeatResponseDecoder), response
        assert response.correlation_id == 42 + member


def test_a_backup_query_of_another_major_version_is_refused_with_an_error_event(
    cluster: LocalCluster, tools: list[Tool]
) -> None:
    leader = wait_for_leader(cluster, 30).member
    tool = Tool(cluster, leader)
    tools.append(tool)
    event = tool.ask(
        codecs.BackupQueryEncoder,
        correlation_id=99,
        response_stream_id=RESPONSE_STREAM_ID,
        version=compose_version(protocol.PROTOCOL_MAJOR_VERSION + 1, 0, 0),
        response_channel=tool.response_channel,
        encoded_credentials=b"",
    )
    assert isinstance(event, codecs.SessionEventDecoder), event
    assert event.correlation_id == 99
    assert event.code_raw == codecs.EventCode.ERROR
    assert "invalid client version" in event.detail, event.detail


def test_a_standby_snapshot_is_refused_unless_the_member_accepts_them(cluster: LocalCluster, tools: list[Tool]) -> None:
    member = 1
    tool = Tool(cluster, member)
    tools.append(tool)
    invalid_before = counter(cluster, member, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID)
    entries_before = recording_log_entries(cluster, member)
    tool.send(
        codecs.StandbySnapshotEncoder,
        correlation_id=5,
        version=protocol.PROTOCOL_SEMANTIC_VERSION,
        response_stream_id=RESPONSE_STREAM_ID,
        response_channel=tool.response_channel,
        snapshots=[
            dict(
                recording_id=77,
                leadership_term_id=0,
                term_base_log_position=0,
                log_position=1024,
                timestamp=1,
                service_id=0,
                archive_endpoint="127.0.0.1:9999",
            )
        ],
    )
    wait_for(
        lambda: counter(cluster, member, protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID) > invalid_before,
        15,
        "the refused StandbySnapshot to be counted as an invalid request",
    )
    assert counter(cluster, member, protocol.CLUSTER_STANDBY_SNAPSHOT_COUNTER_TYPE_ID) == 0
    assert recording_log_entries(cluster, member) == entries_before


def test_the_standby_snapshot_action_is_in_every_log_with_its_flag_and_no_member_snapshots(
    cluster: LocalCluster,
) -> None:
    snapshot_counts = [counter(cluster, m, protocol.SNAPSHOT_COUNTER_TYPE_ID) for m in range(cluster.size)]
    snapshot_entries = [
        sum(1 for e in recording_log_entries(cluster, m) if e.entry_type == ENTRY_TYPE_SNAPSHOT)
        for m in range(cluster.size)
    ]
    print(cluster_commands.cluster_operate(cluster.base, "standby-snapshot", 30))
    client = cluster.connect_client()
    assert client.request(b"after the standby snapshot", timeout_s=10) == b"after the standby snapshot"
    leader = wait_for_leader(cluster, 30).member
    position = member_view(cluster, leader).commit_position
    assert position is not None
    wait_for_commit(cluster, list(range(cluster.size)), position, 15)
    for member in range(cluster.size):
        actions: list[codecs.ClusterActionRequestDecoder] = []
        for _, _, payload in log_frames(cluster, member, position):
            if struct.unpack_from("<H", payload, 2)[0] == codecs.ClusterActionRequestDecoder.TEMPLATE_ID:
                request = codecs.decode(payload)
                assert isinstance(request, codecs.ClusterActionRequestDecoder)
                actions.append(request)
        standby = [a for a in actions if a.flags == protocol.CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT]
        assert len(standby) == 1, f"member {member}: {actions}"
        assert standby[0].action_raw == codecs.ClusterAction.SNAPSHOT
        assert all(a.flags == protocol.CLUSTER_ACTION_FLAGS_DEFAULT for a in actions if a is not standby[0])
        # No member (and no service) took a snapshot on it.
        assert counter(cluster, member, protocol.SNAPSHOT_COUNTER_TYPE_ID) == snapshot_counts[member]
        assert (
            sum(1 for e in recording_log_entries(cluster, member) if e.entry_type == ENTRY_TYPE_SNAPSHOT)
            == snapshot_entries[member]
        )


def test_a_member_that_accepts_standby_snapshots_records_them_in_its_recording_log(
    cluster: LocalCluster, tools: list[Tool]
) -> None:
    """(Last in this module: it restarts member 2 with the setting on.)"""
    member = 2
    cluster.kill_member(member)
    cluster.extra_consensus_args.append("--accept-standby-snapshots")
    cluster.start_member(member)
    wait_for_leader(cluster, 30)
    # A request is taken only outside an election, by a running module (a tool
    # that hears nothing asks again; this test asks once, when it will be taken).
    wait_for(
        lambda: (
            counter(cluster, member, protocol.ELECTION_STATE_TYPE_ID) == ElectionState.CLOSED
            and counter(cluster, member, protocol.CONSENSUS_MODULE_STATE_TYPE_ID) == ConsensusModuleState.ACTIVE
        ),
        30,
        f"member {member} to be back in the cluster, its election closed",
    )
    tool = Tool(cluster, member)
    tools.append(tool)
    tool.send(
        codecs.StandbySnapshotEncoder,
        correlation_id=5,
        version=protocol.PROTOCOL_SEMANTIC_VERSION,
        response_stream_id=RESPONSE_STREAM_ID,
        response_channel=tool.response_channel,
        snapshots=[
            dict(
                recording_id=77,
                leadership_term_id=0,
                term_base_log_position=0,
                log_position=1024,
                timestamp=1,
                service_id=service_id,
                archive_endpoint="127.0.0.1:9999",
            )
            for service_id in (-1, 0)
        ],
    )
    wait_for(
        lambda: counter(cluster, member, protocol.CLUSTER_STANDBY_SNAPSHOT_COUNTER_TYPE_ID) == 1,
        30,
        "the standby snapshot counter to count the StandbySnapshot",
    )
    standby = [e for e in recording_log_entries(cluster, member) if e.entry_type == ENTRY_TYPE_STANDBY_SNAPSHOT]
    assert [(e.recording_id, e.service_id, e.log_position, e.archive_endpoint) for e in standby] == [
        (77, -1, 1024, "127.0.0.1:9999"),
        (77, 0, 1024, "127.0.0.1:9999"),
    ]


def test_a_challenged_backup_query_is_answered_once_its_tool_answers_the_challenge() -> None:
    """With a secret, a BackupQuery without credentials is challenged on its
    response channel; the tool's ChallengeResponse goes on the consensus
    stream under the session id the challenge named.  The right secret gets
    the BackupResponse, a wrong one a SessionEvent AUTHENTICATION_REJECTED."""
    with LocalCluster(3, ECHO_SERVICE, extra_consensus_args=FAST_ELECTION_ARGS, secret="s3cret") as secured:
        secured.start()
        leader = wait_for_leader(secured, 30).member
        answers = {}
        for secret in (b"s3cret", b"wrong"):
            tool = Tool(secured, leader)
            try:
                challenge = tool.ask(
                    codecs.BackupQueryEncoder,
                    correlation_id=1,
                    response_stream_id=RESPONSE_STREAM_ID,
                    version=protocol.PROTOCOL_SEMANTIC_VERSION,
                    response_channel=tool.response_channel,
                    encoded_credentials=b"",
                )
                assert isinstance(challenge, codecs.ChallengeDecoder), challenge
                assert challenge.cluster_session_id < 0  # a tool's session, not a client's
                tool.send(
                    codecs.ChallengeResponseEncoder,
                    correlation_id=2,
                    cluster_session_id=challenge.cluster_session_id,
                    encoded_credentials=secret,
                )
                answers[secret] = tool.answer(skipping=codecs.ChallengeDecoder)  # (a resent query's)
            finally:
                tool.close()
        assert isinstance(answers[b"s3cret"], codecs.BackupResponseDecoder), answers
        assert answers[b"s3cret"].correlation_id == 2 and answers[b"s3cret"].leader_member_id == leader
        rejected = answers[b"wrong"]
        assert isinstance(rejected, codecs.SessionEventDecoder), rejected
        assert rejected.code_raw == codecs.EventCode.AUTHENTICATION_REJECTED
