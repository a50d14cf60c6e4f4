"""A cluster's consensus endpoints refuse strangers (issue 48).

Three members on 127.0.0.1 with one secret.  A member's consensus endpoint
(stream 108) is a UDP port: before the members signed their consensus
messages, one AppendPosition in a follower's name, sent there by a process
that is no member, made a leader whose followers were both stopped commit a
client's message and answer it (an acknowledged write that one member held);
a RequestVote, a NewLeadershipTerm or a CommitPosition of a newer term made
the members hold an election; and a member's genuine message sent again was
taken again.  Here the stranger is a client of a driver of its own, like a
process on another machine (its datagrams come from 127.0.0.1: a host filter
alone would let it in; the member trailer does not).

Checked against the code without the check: with ``FULMAR_TEST_NO_MEMBER_AUTH=1``
the cluster runs with ``--no-authenticate-members`` (what every member was
before: no trailer checked, and the stranger's host is a member's), and each
attack test fails: the forged AppendPosition commits and answers the pending
call, the forged messages start elections, the replay is taken, and nothing
is counted.

Then the same cluster, its members signing every consensus message, fails
over when its leader is killed and serves on.  One cluster for all of these
(module scope); a last test starts a cluster without a secret, whose members
hear member messages from their members' hosts only.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.archive.catalog import Catalog
from fulmar.archive.protocol import RECORDING_POSITION_TYPE_ID
from fulmar.cli import cluster_commands
from fulmar.clock import epoch_ms
from fulmar.cnc import CncFile
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol as cluster_protocol
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.member_auth import MemberSigner, derive_key
from fulmar.consensus.protocol import LOG_STREAM_ID
from fulmar.counters import CountersReader
from fulmar.driver.counters import RECEIVER_HWM_TYPE_ID, SystemCounter
from fulmar.error_log import read_error_log
from support.cluster import LocalCluster
from support.driver import wait_for
from support.multi_node import (
    assert_same_logs,
    log_frames,
    member_view,
    read_counter,
    wait_for_commit,
    wait_for_leader,
)

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SECRET = "cluster-s3cret"
# The members' own secret: the clients hold SECRET, not this one.
MEMBER_SECRET = "members-s3cret"
COUNTER_SERVICE = "fulmar.service.samples:CounterService"
CONSENSUS_STREAM_ID = 108
NO_MEMBER_AUTH = os.environ.get("FULMAR_TEST_NO_MEMBER_AUTH") == "1"
HEARTBEAT_TIMEOUT_ARGS = [
    "--startup-canvass-timeout",
    "2s",
    "--election-timeout",
    "500ms",
    "--election-status-interval",
    "50ms",
    # Long enough that the followers' pause in the first test ends no leadership.
    "--leader-heartbeat-timeout",
    "6s",
    "--leader-heartbeat-interval",
    "100ms",
]
HUGE_POSITION = 1 << 40


@dataclass
class Secured:
    cluster: LocalCluster
    client: ClusterClient
    stranger: Aeron
    _publications: dict[int, Any]

    def counter(self, member: int, type_id: int) -> int:
        with CncFile.open(self.cluster.driver_dir(member)) as cnc:
            reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
            values = [reader.counter_value(c.counter_id) for c in reader if c.type_id == type_id]
        assert len(values) == 1, f"member {member}: {len(values)} counters of type {type_id}"
        return values[0]

    def driver_counter(self, member: int, which: int) -> int:
        """One of the member's driver's system counters (by its id)."""
        with CncFile.open(self.cluster.driver_dir(member)) as cnc:
            reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
            return reader.counter_value(int(which))

    def refused(self, member: int) -> int:
        return self.counter(member, cluster_protocol.CLUSTER_CONSENSUS_REFUSED_TYPE_ID)

    def elections(self, member: int) -> int:
        return self.counter(member, cluster_protocol.CLUSTER_ELECTION_COUNT_TYPE_ID)

    def recorded(self, member: int) -> int:
        with CncFile.open(self.cluster.driver_dir(member)) as cnc:
            reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
            return max(reader.counter_value(c.counter_id) for c in reader if c.type_id == RECORDING_POSITION_TYPE_ID)

    def send(self, member: int, encoder: Any, **fields: Any) -> bytes:
        """A raw consensus message from the stranger to ``member``'s endpoint."""
        buffer = bytearray(256)
        length = encoder.encode(buffer, 0, **fields)
        message = bytes(buffer[:length])
        self.send_raw(member, message)
        return message

    def send_raw(self, member: int, message: bytes) -> None:
        publication = self._publications.get(member)
        if publication is None:
            endpoint = self.cluster.ports[member].endpoint("consensus")
            publication = self.stranger.add_publication(f"aeron:udp?endpoint={endpoint}", CONSENSUS_STREAM_ID)
            self._publications[member] = publication
            wait_for(lambda: publication.is_connected, 10, f"the stranger's publication to member {member}")
        wait_for(lambda: publication.offer(message) > 0, 10, f"the stranger's offer to member {member}")


def _consensus_args() -> list[str]:
    args = list(HEARTBEAT_TIMEOUT_ARGS)
    return [*args, "--no-authenticate-members"] if NO_MEMBER_AUTH else args


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    with LocalCluster(
        3,
        COUNTER_SERVICE,
        extra_consensus_args=_consensus_args(),
        secret=SECRET,
        member_secret=MEMBER_SECRET,
    ) as cluster:
        cluster.start()
        wait_for_leader(cluster, 30)
        client = cluster.connect_client(credentials=SECRET.encode())
        for _ in range(5):
            client.request(b"+", timeout_s=10)
        yield Secured(cluster, client, cluster.connect(), {})


def _roles(secured: Secured) -> tuple[int, list[int], int]:
    """The leader, its followers and the leadership term."""
    leader = wait_for_leader(secured.cluster, 20)
    followers = [m for m in range(secured.cluster.size) if m != leader.member]
    assert leader.leadership_term_id is not None
    return leader.member, followers, leader.leadership_term_id


def _signal_member(cluster: LocalCluster, member: int, signum: int) -> None:
    for process in cluster.processes[member].values():
        if process.alive:
            process.process.send_signal(signum)


def test_the_native_consensus_threads_run_and_sign(secured: Secured) -> None:
    """With the secret the native consensus threads stay on, signing and
    checking: the leader's commit thread, and each follower's commit and
    AppendPosition threads, say in the module's log that they were armed
    with member trailers (so the attacks below meet the threads first)."""
    cluster = secured.cluster
    leader, followers, _ = _roles(secured)
    trailers = "no member trailers" if NO_MEMBER_AUTH else "member trailers signed and checked"

    def said(member: int) -> str:
        return cluster.log_path(member, "consensus").read_text(errors="replace")

    wait_for(lambda: "the leader's commit thread armed for term" in said(leader), 10, "the leader's thread")
    assert f"({trailers})" in said(leader), said(leader)[-2000:]
    for follower in followers:
        for thread in ("the follower's commit thread", "the AppendPosition thread"):
            wait_for(lambda: f"{thread} armed for term" in said(follower), 10, f"{thread} of member {follower}")
        lines = [line for line in said(follower).splitlines() if " thread armed for term " in line]
        assert lines and all(line.endswith(f"({trailers})") for line in lines), lines


def test_a_forged_append_position_commits_nothing(secured: Secured) -> None:
    """Both followers stopped, a client's call pending: a stranger's
    AppendPositions in the followers' names (the current term, a huge
    position) are dropped and counted; the commit position stays, the call
    unanswered, until the followers go on."""
    cluster = secured.cluster
    leader, followers, term = _roles(secured)
    committed = member_view(cluster, leader).commit_position
    refused = secured.refused(leader)
    replies: list[Any] = []
    for follower in followers:
        _signal_member(cluster, follower, signal.SIGSTOP)
    try:
        call = threading.Thread(target=lambda: replies.append(secured.client.request(b"+", timeout_s=30)))
        call.start()
        assert committed is not None
        wait_for(lambda: secured.recorded(leader) > committed, 10, "the leader to record the pending call")
        for attempt in range(6):
            secured.send(
                leader,
                codecs.AppendPositionEncoder,
                leadership_term_id=term,
                log_position=HUGE_POSITION,
                follower_member_id=followers[attempt % 2],
                flags=0,
            )
        wait_for(lambda: secured.refused(leader) >= refused + 6 or replies, 10, "the forgeries to be counted")
        assert not replies, f"a forged AppendPosition answered the call while both followers were stopped: {replies}"
        assert member_view(cluster, leader).commit_position == committed
        assert call.is_alive()
    finally:
        for follower in followers:
            _signal_member(cluster, follower, signal.SIGCONT)
    call.join(30)
    assert replies, "the call was not answered once the followers went on"
    assert secured.refused(leader) >= refused + 6
    errors = cluster_commands.cluster_errors_node(cluster_commands.ClusterNode("leader", cluster.cluster_dir(leader)))
    texts = [error["text"] for file in errors["files"] for error in file["errors"]]
    assert any("member message without a member trailer" in text for text in texts), texts
    said = cluster.log_path(leader, "consensus").read_text(errors="replace")
    assert "consensus stream: dropped a message from '127.0.0.1:" in said, said[-2000:]


def test_forged_votes_terms_and_commits_change_nothing(secured: Secured) -> None:
    """A stranger's RequestVote, NewLeadershipTerm and CommitPosition of a
    newer term, each to every member in another member's name: no election,
    no term change, no commit moved past what was committed; each counted
    where it landed."""
    cluster = secured.cluster
    leader, followers, term = _roles(secured)
    members = range(cluster.size)
    elections = {m: secured.elections(m) for m in members}
    refused = {m: secured.refused(m) for m in members}
    for target in members:
        other = followers[0] if target != followers[0] else followers[1]
        secured.send(
            target,
            codecs.RequestVoteEncoder,
            log_leadership_term_id=term,
            log_position=HUGE_POSITION,
            candidate_term_id=term + 1,
            candidate_member_id=other,
            protocol_version=cluster_protocol.compose_version(1, 0, 0),
        )
        secured.send(
            target,
            codecs.NewLeadershipTermEncoder,
            log_leadership_term_id=term,
            next_leadership_term_id=term + 1,
            next_term_base_log_position=HUGE_POSITION,
            next_log_position=HUGE_POSITION,
            leadership_term_id=term + 1,
            term_base_log_position=HUGE_POSITION,
            log_position=HUGE_POSITION,
            leader_recording_id=0,
            timestamp=epoch_ms(),
            leader_member_id=other,
            log_session_id=1234,
            app_version=0,
            is_startup=int(codecs.BooleanType.FALSE),
        )
        secured.send(
            target,
            codecs.CommitPositionEncoder,
            leadership_term_id=term + 1,
            log_position=HUGE_POSITION,
            leader_member_id=other,
        )
    wait_for(
        lambda: (
            all(secured.refused(m) >= refused[m] + 3 for m in members)
            or any(secured.elections(m) != elections[m] for m in members)
        ),
        10,
        "the forgeries to be counted",
    )
    assert {m: secured.elections(m) for m in members} == elections, "a forged message started an election"
    views = [member_view(cluster, m) for m in members]
    assert [v.leadership_term_id for v in views] == [term] * cluster.size
    assert all(v.commit_position is not None and v.commit_position < HUGE_POSITION for v in views)
    assert wait_for_leader(cluster, 5).member == leader
    assert secured.client.request(b"+", timeout_s=10)


def test_a_replayed_member_message_is_dropped(secured: Secured) -> None:
    """A genuine AppendPosition (made with a follower's own signing code and
    key, as a recording of one would be) is taken once; the same bytes again
    are dropped as a replay, and sent to another member they are dropped as
    addressed elsewhere."""
    cluster = secured.cluster
    leader, followers, term = _roles(secured)
    committed = member_view(cluster, leader).commit_position
    assert committed is not None
    signer = MemberSigner(followers[0], derive_key(MEMBER_SECRET.encode()), epoch_ms)
    buffer = bytearray(64)
    length = codecs.AppendPositionEncoder.encode(
        buffer, 0, leadership_term_id=term, log_position=committed, follower_member_id=followers[0], flags=0
    )
    genuine = signer.sign(bytes(buffer[:length]), leader)
    refused = secured.refused(leader)
    refused_elsewhere = secured.refused(followers[1])
    secured.send_raw(leader, genuine)
    secured.client.request(b"+", timeout_s=10)  # a round trip: the genuine one has been read by now
    assert secured.refused(leader) == refused, "the genuine member message was refused"
    secured.send_raw(leader, genuine)
    secured.send_raw(followers[1], genuine)
    wait_for(lambda: secured.refused(leader) > refused, 10, "the replay to be counted")
    wait_for(lambda: secured.refused(followers[1]) > refused_elsewhere, 10, "the misdirected copy to be counted")
    node = cluster_commands.ClusterNode("leader", cluster.cluster_dir(leader))
    texts = [error["text"] for file in cluster_commands.cluster_errors_node(node)["files"] for error in file["errors"]]
    assert any("replayed" in text for text in texts), texts


def test_a_client_holding_the_clusters_secret_cannot_sign_as_a_member(secured: Secured) -> None:
    """The members sign with their own secret: a CommitPosition of a newer
    term in the leader's name, to each follower, with a trailer right in
    every field but made with the key of the secret the clients hold, is
    dropped as having a wrong MAC, and starts no election.  (Checked with the
    members' key derived from the clients' secret, no member secret set: the
    same message started an election on both followers.)"""
    cluster = secured.cluster
    leader, followers, term = _roles(secured)
    elections = {m: secured.elections(m) for m in followers}
    refused = {m: secured.refused(m) for m in followers}
    signer = MemberSigner(leader, derive_key(SECRET.encode()), epoch_ms)
    for follower in followers:
        buffer = bytearray(64)
        length = codecs.CommitPositionEncoder.encode(
            buffer, 0, leadership_term_id=term + 1, log_position=HUGE_POSITION, leader_member_id=leader
        )
        secured.send_raw(follower, signer.sign(bytes(buffer[:length]), follower))
    wait_for(
        lambda: (
            all(secured.refused(m) > refused[m] for m in followers)
            or any(secured.elections(m) != elections[m] for m in followers)
        ),
        10,
        "the client's forgeries to be counted",
    )
    assert {m: secured.elections(m) for m in followers} == elections, "a client's signature started an election"
    assert all(member_view(cluster, m).leadership_term_id == term for m in range(cluster.size))
    node = cluster_commands.ClusterNode("follower", cluster.cluster_dir(followers[0]))
    texts = [error["text"] for file in cluster_commands.cluster_errors_node(node)["files"] for error in file["errors"]]
    assert any("wrong MAC" in text for text in texts), texts
    assert secured.client.request(b"+", timeout_s=10)


def _log_image(secured: Secured, member: int) -> tuple[int, int, str]:
    """The session id and receiver high-water mark of ``member``'s log image,
    and its channel, from its driver's rcv-hwm counter (label ``rcv-hwm:
    registration session stream channel``)."""
    with CncFile.open(secured.cluster.driver_dir(member)) as cnc:
        reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
        images = []
        for counter in reader:
            if counter.type_id != RECEIVER_HWM_TYPE_ID:
                continue
            _, _registration, session, stream, channel = counter.label.split(" ", 4)
            if int(stream) == LOG_STREAM_ID:
                images.append((int(session), reader.counter_value(counter.counter_id), channel))
    assert len(images) == 1, f"member {member}: log images {images}"
    return images[0]


def _forged_data(session_id: int, term_id: int, term_offset: int, payload: bytes) -> bytes:
    """A DATA frame of the log, unfragmented: what a stranger who watched the
    log go by (its session, term and offset are in every datagram) can build."""
    header = struct.pack(
        "<iBBhiiiiq", 32 + len(payload), 0, 0xC0, 1, term_offset, session_id, LOG_STREAM_ID, term_id, 0
    )
    return header + payload


def test_a_strangers_datagrams_in_the_log_are_refused_unread(secured: Secured) -> None:
    """The log between members carries the drivers' datagram MACs: a
    stranger's DATA frames sent to a follower's log endpoint, for the log's
    session and term, at the very offset the follower expects next and
    further ahead, are refused by its driver (counted, in its error log), and
    the follower's recorded log stays frame for frame the leader's while the
    cluster commits past those offsets.  (Checked with the members not
    authenticating, no MACs: the follower's log took the stranger's frame at
    the next offset, and the follower never committed past it again.)"""
    cluster = secured.cluster
    leader, followers, _term = _roles(secured)
    follower = followers[0]
    session_id, high_water, channel = _log_image(secured, follower)
    if not NO_MEMBER_AUTH:
        assert "datagram-mac=true" in channel, channel
    catalog = Catalog.open_read_only(cluster.archive_dir(follower))
    try:
        descriptor = max(catalog.recordings(), key=lambda d: d.start_timestamp if d.stream_id == LOG_STREAM_ID else -1)
    finally:
        catalog.close()
    term_length = descriptor.term_buffer_length
    term_id = descriptor.initial_term_id + high_water // term_length
    term_offset = high_water % term_length
    assert term_offset + 8192 < term_length, "the test's offsets must stay in this term"
    refused = secured.driver_counter(follower, SystemCounter.DATAGRAMS_REFUSED_NO_MAC)
    forged = [_forged_data(session_id, term_id, term_offset + ahead, b"stranger" * 4) for ahead in (0, 1024, 4096)]
    endpoint = cluster.ports[follower].endpoint("log")
    host, _, port = endpoint.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        for datagram in forged:
            stranger.sendto(datagram, (host, int(port)))
    if not NO_MEMBER_AUTH:
        wait_for(
            lambda: secured.driver_counter(follower, SystemCounter.DATAGRAMS_REFUSED_NO_MAC) >= refused + len(forged),
            10,
            "the follower's driver to refuse the stranger's datagrams",
        )
    for _ in range(200):  # about 20 KB of log: past every forged offset
        secured.client.request(b"+", timeout_s=10)
    committed = member_view(cluster, leader).commit_position
    assert committed is not None and committed > high_water + 8192
    wait_for_commit(cluster, list(range(cluster.size)), committed, 30)
    assert_same_logs(cluster, [leader, follower], committed)
    assert all(b"stranger" not in payload for _, _, payload in log_frames(cluster, follower, committed))
    if not NO_MEMBER_AUTH:
        with CncFile.open(cluster.driver_dir(follower)) as cnc:
            texts = [observation.text for observation in read_error_log(cnc.error_log)]
        assert any("datagram refused: no valid MAC" in text for text in texts), texts


def test_the_signing_cluster_fails_over_and_serves(secured: Secured) -> None:
    """Elections, replication and failover with every consensus message
    signed: the leader killed, the others elect one of them, which commits
    the client's calls; the old leader restarted rejoins as a follower and
    commits as the others do (no member refused a member's message)."""
    cluster = secured.cluster
    leader, followers, term = _roles(secured)
    before = read_counter(secured.client)
    refused = {m: secured.refused(m) for m in followers}
    cluster.kill_member(leader)
    new_leader = wait_for_leader(cluster, 30, not_member=leader, min_term=term + 1)
    assert secured.client.request(b"+", timeout_s=30)
    assert read_counter(secured.client) == before + 1
    assert {m: secured.refused(m) for m in followers} == refused, "a member's own message was refused"
    assert new_leader.member in followers
    # The old leader restarts (a new boot id, its counter from 1, the others'
    # boots new to it): it rejoins and follows the new leader's commits.
    cluster.start_member(leader)
    assert secured.client.request(b"+", timeout_s=30)
    committed = member_view(cluster, new_leader.member).commit_position
    assert committed is not None
    wait_for_commit(cluster, list(range(cluster.size)), committed, 30)
    assert wait_for_leader(cluster, 5).member == new_leader.member
    assert all(secured.refused(m) == refused.get(m, 0) for m in range(cluster.size)), "a member's message was refused"


def test_without_a_secret_only_the_members_hosts_are_heard() -> None:
    """A cluster without a secret takes member messages only from its
    members' hosts: a stranger on 127.0.0.2 (its publication bound there)
    sending a RequestVote of a newer term to each member starts no election
    and is counted.  Checked with the host filter taken out of the agent's
    guard (nothing checked, as before the change): every member went to an
    election."""
    with LocalCluster(3, COUNTER_SERVICE, extra_consensus_args=HEARTBEAT_TIMEOUT_ARGS) as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 30)
        client = cluster.connect_client()
        assert client.request(b"+", timeout_s=10)
        open_cluster = Secured(cluster, client, cluster.connect(), {})
        members = range(cluster.size)
        elections = {m: open_cluster.elections(m) for m in members}
        for target in members:
            endpoint = cluster.ports[target].endpoint("consensus")
            publication = open_cluster.stranger.add_publication(
                f"aeron:udp?endpoint={endpoint}|interface=127.0.0.2", CONSENSUS_STREAM_ID
            )
            open_cluster._publications[target] = publication
            wait_for(lambda: publication.is_connected, 10, f"the stranger's publication to member {target}")
            open_cluster.send(
                target,
                codecs.RequestVoteEncoder,
                log_leadership_term_id=leader.leadership_term_id,
                log_position=HUGE_POSITION,
                candidate_term_id=(leader.leadership_term_id or 0) + 1,
                candidate_member_id=(target + 1) % cluster.size,
                protocol_version=cluster_protocol.compose_version(1, 0, 0),
            )
        wait_for(
            lambda: (
                all(open_cluster.refused(m) >= 1 for m in members)
                or any(open_cluster.elections(m) != elections[m] for m in members)
            ),
            10,
            "the stranger's messages to be counted",
        )
        assert {m: open_cluster.elections(m) for m in members} == elections, "a stranger started an election"
        assert wait_for_leader(cluster, 5).member == leader.member
        assert client.request(b"+", timeout_s=10)
