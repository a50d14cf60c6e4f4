"""A cluster log recorded by a real 3-member cluster, for the analytics tests.

``record_counter_cluster`` runs ``CounterService`` on three members, sends
a known workload through one client session (increments, increments the
service re-offers through the log, messages long enough to be fragmented),
takes a snapshot, kills the leader so that a second leadership term begins,
lets timers fire, closes the session, waits until every member has
committed everything, stops the cluster and copies each member's archive
and cluster directories out (the cluster's own directories are removed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fulmar.analytics.log_decoder import read_log
from fulmar.cli.cluster_commands import cluster_operate
from fulmar.consensus.recording_log import RecordingLog
from support.cluster import LocalCluster
from support.driver import wait_for
from support.multi_node import COUNTER_SERVICE, member_view, wait_for_commit, wait_for_leader

FRAGMENTED_LENGTH = 5000  # over the default MTU (1408): fragmented in the log


@dataclass
class RecordedLog:
    base: Path
    members: int
    client_session_id: int = -1
    increments: int = 0  # b"+" acknowledged
    offered_increments: int = 0  # b"!" acknowledged (the service offers b"+" into the log)
    fragmented: list[bytes] = field(default_factory=list, repr=False)
    # (leadership term id, leader member) as the cluster reported them, in
    # order. The second term's id is whatever the election reached: a
    # candidacy that fails (a split vote) spends a term id.
    terms: list[tuple[int, int]] = field(default_factory=list)
    final_value: int = -1
    commit_position: int = -1

    def archive_dir(self, member: int) -> Path:
        return self.base / f"node{member}" / "archive"

    def cluster_dir(self, member: int) -> Path:
        return self.base / f"node{member}" / "cluster"

    def snapshot_positions(self, member: int) -> list[int]:
        log = RecordingLog.open(self.cluster_dir(member), create=False)
        try:
            return sorted({e.log_position for e in log.entries if e.is_valid_snapshot})
        finally:
            log.close()


def _value(reply: bytes) -> int:
    return int.from_bytes(reply[:8], "little", signed=True)


def _ticks(reply: bytes) -> int:
    return int.from_bytes(reply[8:16], "little", signed=True)


def record_counter_cluster(base: Path, *, increments: int = 60) -> RecordedLog:
    recorded = RecordedLog(base, 3)
    with LocalCluster(3, COUNTER_SERVICE) as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 60)
        recorded.terms.append((leader.leadership_term_id or 0, leader.member))
        client = cluster.connect_client()
        recorded.client_session_id = client.cluster_session_id
        for i in range(increments):
            client.request(b"+", timeout_s=20)
            recorded.increments += 1
            if i % 10 == 0:
                client.request(b"!", timeout_s=20)
                recorded.offered_increments += 1
        for i in range(3):
            payload = bytes([65 + i]) * FRAGMENTED_LENGTH
            client.request(payload, timeout_s=20)
            recorded.fragmented.append(payload)
        cluster_operate(cluster.base, "snapshot", 60)
        # A second leadership term: the leader dies, the others elect one.
        cluster.kill_member(leader.member)
        second = wait_for_leader(cluster, 60, not_member=leader.member, min_term=1)
        recorded.terms.append((second.leadership_term_id or 0, second.member))

        def follows_new_leader() -> bool:
            client.poll_egress()
            return client.leader_member_id == second.member and client.leadership_term_id >= 1

        wait_for(follows_new_leader, 30, f"the client to follow the new leader {second.member}")
        for _ in range(increments // 2):
            client.request(b"+", timeout_s=30)
            recorded.increments += 1
        cluster.start_member(leader.member)

        # Increments until the timer has ticked three times (once a second
        # of cluster time while a session is open: replies carry the ticks).
        def ticked() -> bool:
            reply = client.request(b"+", timeout_s=30)
            recorded.increments += 1
            return _ticks(reply) >= 3

        wait_for(ticked, 30, "three timer ticks", poll_s=0.05)
        recorded.final_value = _value(client.request(b"?", timeout_s=30))
        client.close()
        cluster.clients.remove(client)
        leader_now = wait_for_leader(cluster, 60)
        if (leader_now.leadership_term_id or 0, leader_now.member) != recorded.terms[-1]:
            recorded.terms.append((leader_now.leadership_term_id or 0, leader_now.member))

        def close_committed() -> int:
            # The leader's log ends with this session's close, and it commits it:
            # after that, nothing is appended (no session, no timer).
            # No batch at all until the close is in the log (not yet appended or recorded).
            rows = [
                row
                for batch in read_log(
                    str(cluster.archive_dir(leader_now.member)), {"messageTypes": "SessionCloseEvent"}
                )
                for row in batch.to_pylist()
            ]
            ends = [r["next_position"] for r in rows if r["cluster_session_id"] == recorded.client_session_id]
            committed = member_view(cluster, leader_now.member).commit_position or -1
            return ends[0] if ends and committed >= ends[0] else 0

        recorded.commit_position = wait_for(close_committed, 30, "the session's close to be committed", poll_s=0.05)
        wait_for_commit(cluster, [0, 1, 2], recorded.commit_position, 60)
        # Stop in order (consensus and services first, then archives and
        # drivers), and copy the files out before the cluster removes them.
        cluster.close(timeout_s=20, copy_to=base)
    return recorded
