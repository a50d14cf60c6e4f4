"""Clusters of three and five members as real processes on 127.0.0.1 (issue 7):
an election, the log replicated to every member, failover when a leader's
consensus module, driver, archive or whole node is killed during a write
workload, the old leader rejoining, a member that missed two leadership terms
(seed 001's walk-through), and quorum loss and recovery with five members.

The election and heartbeat timeouts are short (``FAST_ELECTION_ARGS``: 3 s
leader heartbeat timeout, 500 ms election timeout)."""

from __future__ import annotations

import json
import signal
import struct
import time

import pytest
from click.testing import CliRunner

from fulmar.cli import cluster_tool
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog
from fulmar.subscription import Image
from support.cluster import LocalCluster
from support.driver import main_thread_wakes_per_second, wait_for
from support.multi_node import (
    COUNTER_SERVICE,
    CounterWorkload,
    assert_same_logs,
    member_log_path,
    member_view,
    next_term,
    read_counter,
    wait_for_commit,
    wait_for_leader,
)

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

HEARTBEAT_TIMEOUT_S = 3.0
# A new leader within the heartbeat timeout plus an election (canvass, ballot,
# replay: a few election timeouts on a loaded two-core machine).
FAILOVER_BOUND_S = HEARTBEAT_TIMEOUT_S + 7.0
# Aeron clients and archives learn a process died from the driver's client
# liveness timeout: short here, so a dead archive is noticed quickly.
DRIVER_ARGS = ("--client-liveness-timeout", "5s")


@pytest.fixture
def cluster():
    with LocalCluster(3, COUNTER_SERVICE, extra_driver_args=DRIVER_ARGS) as local:
        yield local


def all_commit_position(cluster: LocalCluster, members: list[int]) -> int:
    return min(member_view(cluster, m).commit_position or 0 for m in members)


def test_three_members_elect_one_leader_hold_the_same_log_and_sleep_when_idle(cluster: LocalCluster) -> None:
    cluster.start()
    leader = wait_for_leader(cluster, 30)
    # Usually term 0; a split first vote (two nominations within a message's delay) moves it on by one
    # per ballot, so what must hold is that every member is in the leader's term (checked below).
    assert leader.leadership_term_id is not None
    workload = CounterWorkload(cluster).start()
    try:
        workload.wait_for_acks(200, 60)
    finally:
        workload.stop()
    client = cluster.connect_client()
    final = read_counter(client)
    workload.check(final)
    position = member_view(cluster, leader.member).commit_position
    assert position is not None
    wait_for_commit(cluster, [0, 1, 2], position, 20)
    assert_same_logs(cluster, [0, 1, 2], position)
    roles = [member_view(cluster, m).role for m in range(3)]
    assert sorted(role for role in roles if role is not None) == [0, 0, 2], roles  # two followers, one leader
    assert [member_view(cluster, m).leadership_term_id for m in range(3)] == [leader.leadership_term_id] * 3
    # cluster-tool sees every member of the local cluster's base directory.
    listing = CliRunner().invoke(cluster_tool.main, ["list-members", "--dir", str(cluster.base), "--json"])
    assert listing.exit_code == 0, listing.output
    document = json.loads(listing.output)
    assert document["leader"] == f"node{leader.member}"
    assert sorted(node["role_name"] for node in document["nodes"]) == ["FOLLOWER", "FOLLOWER", "LEADER"]
    assert all(node["commit_position"] >= position for node in document["nodes"])
    is_leader = CliRunner().invoke(
        cluster_tool.main, ["is-leader", "--dir", str(cluster.base / f"node{leader.member}")]
    )
    assert is_leader.exit_code == 0, is_leader.output
    described = CliRunner().invoke(cluster_tool.main, ["describe", "--dir", str(cluster.base)])
    assert described.exit_code == 0, described.output
    assert described.output.count("role LEADER") == 1 and described.output.count("role FOLLOWER") == 2, described.output

    # Idle, each member's Python agents sleep until something rings them or
    # their own next duty falls due (a heartbeat every 200 ms, the driver's
    # keepalive, the mark file): a few wake-ups a second each, where a 10 ms
    # pace woke each about a hundred times a second.
    client.close()
    pids = {
        f"member {m} {kind}": cluster.process(m, kind).process.pid  # type: ignore[union-attr]
        for m in range(3)
        for kind in ("consensus", "archive", "service")
    }
    rates = main_thread_wakes_per_second(pids, 2.0)
    assert all(rate < 30 for rate in rates.values()), rates


def test_a_client_that_knows_only_a_follower_is_redirected_to_the_leader(cluster: LocalCluster) -> None:
    cluster.start()
    leader = wait_for_leader(cluster, 30)
    follower = next(m for m in range(3) if m != leader.member)
    endpoint = cluster.ingress_endpoints.split(",")[follower]
    client = ClusterClient.connect(
        cluster.connect(),
        "aeron:udp",
        endpoint,
        egress_channel="aeron:udp?endpoint=127.0.0.1:0",
        message_timeout_ns=20_000_000_000,
    )
    try:
        assert client.leader_member_id == leader.member
        assert read_counter(client) == 0
    finally:
        client.close()


@pytest.mark.parametrize("victim", ["consensus", "driver", "archive", "member"])
def test_leader_killed_during_writes_fails_over_and_rejoins(cluster: LocalCluster, victim: str) -> None:
    cluster.start()
    old = wait_for_leader(cluster, 30)
    workload = CounterWorkload(cluster).start()
    try:
        workload.wait_for_acks(100, 60)
        killed_at = time.monotonic()
        if victim == "member":
            cluster.kill_member(old.member)
        else:
            cluster.kill_process(old.member, victim)
        new = wait_for_leader(
            cluster,
            FAILOVER_BOUND_S + (5 if victim == "archive" else 0),
            not_member=old.member,
            min_term=next_term(old),
        )
        elected_at = time.monotonic()
        assert elected_at - killed_at < FAILOVER_BOUND_S + (5 if victim == "archive" else 0)
        # The client follows the new leader (NewLeaderEvent) and goes on.
        workload.wait_for_acks(100, 60)
        assert workload.ack_times[-1] > elected_at
        # The old leader's node comes back and follows.  What lived on without
        # its driver or its module restarts with them (Aeron clients notice a
        # dead driver only after its liveness timeout).
        for kind in ("archive", "consensus", "service") if victim == "driver" else ("consensus", "service"):
            if cluster.is_running(old.member, kind):
                cluster.kill_process(old.member, kind)
        cluster.start_member(old.member)
        workload.wait_for_acks(50, 60)
    finally:
        workload.stop()
    client = cluster.connect_client()
    final = read_counter(client)
    workload.check(final)
    leader = wait_for_leader(cluster, 10)
    assert leader.member == new.member
    position = member_view(cluster, leader.member).commit_position
    assert position is not None
    wait_for_commit(cluster, [0, 1, 2], position, 60)
    assert member_view(cluster, old.member).role == 0
    assert_same_logs(cluster, [0, 1, 2], position)


def test_member_down_across_two_leadership_terms_replicates_and_catches_up(cluster: LocalCluster) -> None:
    """Seed 001: a member is down while the leadership changes twice; it comes
    back, replicates the terms it missed from the leader's archive one term at
    a time, catches up in the current term and joins."""
    cluster.start()
    first = wait_for_leader(cluster, 30)
    absent = next(m for m in range(3) if m != first.member)
    workload = CounterWorkload(cluster).start()
    try:
        workload.wait_for_acks(50, 60)
        cluster.kill_member(absent)
        workload.wait_for_acks(50, 60)  # term 0 goes on without it
        term = first.leadership_term_id or 0
        for _ in range(2):  # two leadership changes: the leader's module dies and comes back
            leader = wait_for_leader(cluster, 30, min_term=term)
            cluster.kill_process(leader.member, "consensus")
            cluster.kill_process(leader.member, "service")
            cluster.start_process(leader.member, "consensus")
            cluster.start_process(leader.member, "service")
            leader = wait_for_leader(cluster, 60, min_term=term + 1)
            term = leader.leadership_term_id or 0
            workload.wait_for_acks(50, 60)
        assert term >= 2
        cluster.start_member(absent)
        workload.wait_for_acks(50, 60)
    finally:
        workload.stop()
    client = cluster.connect_client()
    workload.check(read_counter(client))
    leader = wait_for_leader(cluster, 10)
    position = member_view(cluster, leader.member).commit_position
    assert position is not None
    wait_for_commit(cluster, [0, 1, 2], position, 60)
    assert_same_logs(cluster, [0, 1, 2], position)
    text = cluster.log_path(absent, "consensus").read_text()
    assert "replicating the log from member" in text
    assert "FOLLOWER_LOG_REPLICATION" in text
    assert "FOLLOWER_CATCHUP" in text  # the current term, behind the leader: replay merge


def test_five_members_serve_with_two_down_and_stop_committing_with_three_down() -> None:
    with LocalCluster(5, COUNTER_SERVICE, extra_driver_args=DRIVER_ARGS) as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 40)
        followers = [m for m in range(5) if m != leader.member]
        workload = CounterWorkload(cluster).start()
        try:
            workload.wait_for_acks(30, 60)
            cluster.kill_member(followers[0])
            cluster.kill_member(followers[1])
            workload.wait_for_acks(30, 60)  # three of five: a quorum
            cluster.kill_member(followers[2])
            stalled = len(workload.acked)
            time.sleep(2.0)  # (a bounded look: nothing may commit without a quorum)
            assert len(workload.acked) <= stalled + 1
            cluster.start_member(followers[2])
            workload.wait_for_acks(30, 90)
        finally:
            workload.stop()
        client = cluster.connect_client()
        workload.check(read_counter(client))
        live = [leader.member, followers[2], followers[3]]
        current = wait_for_leader(cluster, 30)
        position = member_view(cluster, current.member).commit_position
        assert position is not None
        wait_for_commit(cluster, live, position, 60)
        assert_same_logs(cluster, live, position)


def test_uncommitted_entries_of_a_deposed_leader_are_truncated_when_it_rejoins(cluster: LocalCluster) -> None:
    """The leader alone (both followers down) appends what it cannot commit;
    the followers come back without it and elect a leader of a newer term that
    never had those entries; the old leader, back, drops them and follows."""
    cluster.start()
    old = wait_for_leader(cluster, 30)
    followers = [m for m in range(3) if m != old.member]
    workload = CounterWorkload(cluster).start()
    try:
        workload.wait_for_acks(50, 60)
        committed = member_view(cluster, old.member).commit_position or 0
        unanswered = workload.unknown
        for member in followers:
            cluster.kill_member(member)
        # A request the lone leader appended but could not commit goes unanswered.
        wait_for(lambda: workload.unknown > unanswered, 15, "a request to the lone leader to go unanswered")
        cluster.kill_member(old.member)
        for member in followers:
            cluster.start_member(member)
        new = wait_for_leader(cluster, 60, not_member=old.member, min_term=(old.leadership_term_id or 0) + 1)
        workload.wait_for_acks(50, 60)
        cluster.start_member(old.member)
        workload.wait_for_acks(20, 60)
    finally:
        workload.stop()
    workload.check(read_counter(cluster.connect_client()))
    text = cluster.log_path(old.member, "consensus").read_text()
    assert "log truncated to" in text, text[-3000:]
    leader = wait_for_leader(cluster, 10)
    assert leader.member == new.member
    position = member_view(cluster, leader.member).commit_position or 0
    assert position > committed
    wait_for_commit(cluster, [0, 1, 2], position, 60)
    assert_same_logs(cluster, [0, 1, 2], position)


def test_the_appointed_leader_leads_the_first_term() -> None:
    with LocalCluster(3, COUNTER_SERVICE, extra_driver_args=DRIVER_ARGS) as cluster:
        cluster.extra_consensus_args += ["--appointed-leader-id", "2"]
        cluster.start()
        leader = wait_for_leader(cluster, 30)
        assert (leader.member, leader.leadership_term_id) == (2, 0)


def test_shutdown_through_the_leader_snapshots_and_stops_every_member(cluster: LocalCluster) -> None:
    cluster.start()
    leader = wait_for_leader(cluster, 30)
    workload = CounterWorkload(cluster).start()
    try:
        workload.wait_for_acks(50, 60)
    finally:
        workload.stop()
    client = cluster.connect_client()
    value = read_counter(client)
    client.close()
    result = CliRunner().invoke(cluster_tool.main, ["shutdown", "--dir", str(cluster.base / f"node{leader.member}")])
    assert result.exit_code == 0, result.output
    wait_for(
        lambda: not any(cluster.is_running(m, kind) for m in range(3) for kind in ("consensus", "service")),
        30,
        "every member's consensus module and service to stop",
    )
    for member in range(3):
        log = RecordingLog.open(cluster.cluster_dir(member), create=False)
        try:
            snapshot = log.get_latest_snapshot(-1)
            assert snapshot is not None, f"member {member} has no snapshot"
            assert log.get_latest_snapshot(0) is not None
        finally:
            log.close()
        text = cluster.log_path(member, "consensus").read_text()
        assert "at log position" in text
    # Every member starts again from its snapshot: the state is as it was.
    cluster.start()
    wait_for_leader(cluster, 30)
    client = cluster.connect_client()
    assert read_counter(client) == value


def _live_egress_images(client: ClusterClient) -> dict[int, Image]:
    """The client's egress images still open (a follower that redirected the
    connect closed its own at once)."""
    client.poll_egress()
    return {image.session_id: image for image in client.subscription.images if not image.is_end_of_stream}


def test_clients_across_an_election_are_answered_and_follow_the_new_leader() -> None:
    """Seed 001 INIT: a member in an election closes its ingress and its
    sessions' egress.  The leader's consensus module is stopped (SIGSTOP): its
    driver still holds its ingress, so a connect request sent there is taken
    and never answered.  A client connecting while the others elect a new
    leader, the stopped leader's endpoint first in its list, must be answered
    within its timeout and end on the new leader.  Once the old leader's module
    runs again it lets go of its session's egress (module and service); that
    session hears NewLeaderEvent from the new leader and goes on."""
    # The stopped module must outlive the stop: its driver keeps it for 20 s.
    with LocalCluster(3, COUNTER_SERVICE, extra_driver_args=("--client-liveness-timeout", "20s")) as cluster:
        _clients_across_an_election(cluster)


def _clients_across_an_election(cluster: LocalCluster) -> None:
    cluster.start()
    old = wait_for_leader(cluster, 30)
    survivors = [m for m in range(3) if m != old.member]
    existing = cluster.connect_client()
    first = struct.unpack_from("<q", existing.request(b"+", timeout_s=10), 0)[0]
    old_egress = wait_for(
        lambda: len(_live_egress_images(existing)) == 1 and _live_egress_images(existing),
        10,
        "one egress image: the leader's",
    )
    stopped = cluster.process(old.member, "consensus")
    assert stopped is not None
    elections_before = [
        member_log_path(cluster, m).read_text().count("election: leader heartbeat timeout") for m in survivors
    ]
    stopped.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: any(
                member_log_path(cluster, m).read_text().count("election: leader heartbeat timeout") > before
                for m, before in zip(survivors, elections_before)
            ),
            HEARTBEAT_TIMEOUT_S + 10,
            "a survivor to start an election",
        )
        endpoints = cluster.ingress_endpoints.split(",")
        endpoints.sort(key=lambda endpoint: not endpoint.startswith(f"{old.member}="))
        client = ClusterClient.connect(
            cluster.connect(),
            "aeron:udp",
            ",".join(endpoints),
            egress_channel="aeron:udp?endpoint=127.0.0.1:0",
            message_timeout_ns=15_000_000_000,
        )
        cluster.clients.append(client)
        new = wait_for_leader(cluster, 10, not_member=old.member, min_term=(old.leadership_term_id or 0) + 1)
        assert client.leader_member_id == new.member
        assert client.leadership_term_id == new.leadership_term_id
        assert struct.unpack_from("<q", client.request(b"+", timeout_s=10), 0)[0] == first + 1
    finally:
        stopped.process.send_signal(signal.SIGCONT)
    # The deposed leader's module runs again: it lets go of the session's egress.
    wait_for(
        lambda: not set(old_egress) & set(_live_egress_images(existing)),
        10,
        "the deposed leader to close the session's egress",
    )
    # The old leader's session: NewLeaderEvent from the new leader, then on as before.
    wait_for(
        lambda: existing.poll_egress() >= 0 and existing.leader_member_id == new.member,
        10,
        "the old leader's session to hear of the new leader",
    )
    assert existing.leadership_term_id == new.leadership_term_id
    assert struct.unpack_from("<q", existing.request(b"+", timeout_s=10), 0)[0] == first + 2
    leader = wait_for_leader(cluster, 10)
    assert leader.member == new.member
    position = member_view(cluster, leader.member).commit_position
    assert position is not None
    wait_for_commit(cluster, [0, 1, 2], position, 60)
