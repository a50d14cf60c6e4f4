"""Unit tests of the multi-member election, state by state, with a fake host
and a publisher that records what it would send (seed 001)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.agent import ClusterRole, ConsensusModuleAgent, ElectionState
from fulmar.consensus.cluster_member import ClusterMember
from fulmar.consensus.consensus_adapter import ConsensusAdapter
from fulmar.consensus.consensus_publisher import APPEND_POSITION_FLAG_CATCHUP, ConsensusPublisher
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.election import Election, ElectionTimeouts, TermEntry, compare_log, next_term_for
from fulmar.consensus.protocol import NULL_POSITION, NULL_VALUE
from support.agents import MEMBERS, new_agent

MS = 1_000_000
S = 1_000 * MS
TIMEOUTS = ElectionTimeouts()

# Seed 001's positions.
A, B, C, D = 1312, 2848, 4064, 6496


class FakeReplication:
    def __init__(self) -> None:
        self.done = False
        self.has_failed = False
        self.closed = False

    def is_done(self) -> bool:
        return self.done

    def failed(self) -> bool:
        return self.has_failed

    def close(self) -> None:
        self.closed = True


class FakeHost:
    def __init__(self, terms: list[tuple[int, int]] | None = None, append: int = 0) -> None:
        self.terms = list(terms or [])
        self.append = append
        self.commit = 0
        self.calls: list[tuple[Any, ...]] = []
        self.replications: list[FakeReplication] = []
        self.replay_finished = True
        self.connected = False
        # What the driver refuses (a port still held by a dead process): False until it is free.
        self.subscription_ok = True
        self.live_destination_ok = True
        self.catchup_destination_ok = True
        self.near_live = False
        self.live_destination_added = False
        self.candidate_term_id = NULL_VALUE
        self.role = ClusterRole.FOLLOWER
        self.completed: tuple[Any, ...] | None = None
        self.last_leader_update_ns = 0  # when the node last heard a leader (the canvass deadline)

    def term_entries(self) -> list[TermEntry]:
        out = []
        for i, (t, base) in enumerate(self.terms):
            end = self.terms[i + 1][1] if i + 1 < len(self.terms) else NULL_POSITION
            out.append(TermEntry(t, base, end))
        return out

    def append_position(self) -> int:
        return self.append

    def log_recording_id(self) -> int:
        return 0

    def commit_position(self) -> int:
        return self.commit

    def time_of_last_leader_update_ns(self) -> int:
        return self.last_leader_update_ns

    def processed_position(self) -> int:
        return 0

    def truncate_log_to(self, position: int) -> None:
        self.calls.append(("truncate_log_to", position))
        self.append = position
        self.terms = [t for t in self.terms if t[1] <= position]

    def drop_term(self, leadership_term_id: int) -> None:
        self.calls.append(("drop_term", leadership_term_id))
        self.terms = [t for t in self.terms if t[0] != leadership_term_id]

    def append_term(self, leadership_term_id: int, term_base_log_position: int) -> None:
        self.calls.append(("append_term", leadership_term_id, term_base_log_position))
        if all(t != leadership_term_id for t, _ in self.terms):
            self.terms.append((leadership_term_id, term_base_log_position))

    def replicate(self, leader_member_id: int, leader_recording_id: int, stop_position: int) -> FakeReplication:
        self.calls.append(("replicate", leader_member_id, leader_recording_id, stop_position))
        self.replications.append(FakeReplication())
        return self.replications[-1]

    def start_replay(self, from_position: int, to_position: int) -> None:
        self.calls.append(("start_replay", from_position, to_position))

    def replay_done(self) -> bool:
        return self.replay_finished

    def close_ingress_and_egress(self) -> None:
        self.calls.append(("close_ingress_and_egress",))

    def prepare_for_election(self) -> None:
        self.calls.append(("prepare_for_election",))

    def create_log_publication(self, leadership_term_id: int, log_position: int) -> int:
        self.calls.append(("create_log_publication", leadership_term_id, log_position))
        return 77

    def join_log_as_leader(self, leadership_term_id: int, term_base_log_position: int) -> None:
        self.calls.append(("join_log_as_leader", leadership_term_id, term_base_log_position))
        self.append_term(leadership_term_id, term_base_log_position)

    def append_new_leadership_term_event(self, leadership_term_id: int, log_position: int, timestamp: int) -> bool:
        self.calls.append(("append_new_leadership_term_event", leadership_term_id, log_position))
        return True

    def join_log_as_follower(
        self, leader_member_id: int, leadership_term_id: int, term_base_log_position: int, log_session_id: int
    ) -> bool:
        if not self.subscription_ok:
            self.calls.append(("join_log_as_follower refused",))
            return False
        self.calls.append(
            ("join_log_as_follower", leader_member_id, leadership_term_id, term_base_log_position, log_session_id)
        )
        self.append_term(leadership_term_id, term_base_log_position)
        return True

    def add_live_destination(self) -> bool:
        if not self.live_destination_ok:
            self.calls.append(("add_live_destination refused",))
            return False
        if not self.live_destination_added:
            self.calls.append(("add_live_destination",))
        self.live_destination_added = True
        return True

    def is_catchup_near_live(self, leader_log_position: int) -> bool:
        return self.near_live

    def is_log_connected(self) -> bool:
        return self.connected

    def catchup(self, leader_member_id: int, from_position: int) -> str | None:
        if not self.catchup_destination_ok:
            self.calls.append(("catchup refused",))
            return None
        self.calls.append(("catchup", leader_member_id, from_position))
        return "localhost:9005"

    def stop_catchup(self) -> None:
        self.calls.append(("stop_catchup",))

    def persist_candidate_term_id(self, candidate_term_id: int) -> None:
        self.candidate_term_id = candidate_term_id

    def on_role_change(self, role: ClusterRole) -> None:
        self.role = role

    def on_leadership_term_change(self, leadership_term_id: int) -> None:
        self.calls.append(("on_leadership_term_change", leadership_term_id))

    def notify_commit_position(self, commit_position: int) -> None:
        self.calls.append(("notify_commit_position", commit_position))

    def election_complete(self, role: ClusterRole, leader_member_id: int, leadership_term_id: int) -> None:
        self.completed = (role, leader_member_id, leadership_term_id)

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == name]


class RecordingPublisher:
    """Records each message as (name, to, fields)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def send(to_member_id: int, **fields: Any) -> bool:
            self.sent.append((name, to_member_id, fields))
            return True

        return send

    def named(self, name: str) -> list[tuple[int, dict[str, Any]]]:
        return [(to, f) for n, to, f in self.sent if n == name]

    def clear(self) -> None:
        self.sent.clear()


def make(
    member_id: int = 0, members: tuple[int, ...] = (0, 1, 2), host: FakeHost | None = None, **kw: Any
) -> tuple[Election, FakeHost, RecordingPublisher]:
    host = host or FakeHost()
    publisher = RecordingPublisher()
    terms = host.term_entries()
    election = Election(
        member_id,
        list(members),
        host,
        publisher,
        random.Random(7),
        TIMEOUTS,
        kw.pop("is_startup", False),
        terms[-1].leadership_term_id if terms else NULL_VALUE,
        host.append,
        **kw,
    )
    return election, host, publisher


def to_canvass(election: Election, now: int = 0) -> None:
    election.do_work(now)
    assert election.state_value == ElectionState.CANVASS


# --------------------------------------------------------------------------- init


@pytest.mark.parametrize("members", [(0, 1, 2), (0,)])
def test_init_closes_the_ingress_and_the_sessions_egress_before_anything_else(members: tuple[int, ...]) -> None:
    """Seed 001 INIT: "It closes the Ingress and any Egress connections" (Aeron's
    prepareForNewLeadership closes the ingress first): no client is served, and
    a deposed leader holds no client, until the election is over."""
    election, host, _ = make(members=members, host=FakeHost([(0, 0)], append=1024))
    election.do_work(0)
    assert host.calls[0] == ("close_ingress_and_egress",)
    assert host.calls[1] == ("prepare_for_election",)
    assert len(host.named("close_ingress_and_egress")) == 1
    # Nothing later in the election opens or closes them again: the node opens
    # its ingress when the election completes.
    host.calls.clear()
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.on_canvass_position(0, 1024, 0, 2, 0)
    for now in range(1, 40):
        election.do_work(now * 100 * MS)
    assert host.named("close_ingress_and_egress") == []


# --------------------------------------------------------------------------- canvass to leader


def test_canvass_nominate_candidate_ballot_leader() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=1024))
    to_canvass(election)
    election.do_work(1)
    canvass = publisher.named("canvass_position")
    assert {to for to, _ in canvass} == {1, 2}
    assert canvass[0][1] == dict(
        log_leadership_term_id=0, log_position=1024, leadership_term_id=0, follower_member_id=0
    )
    # Both others report logs no better than ours: unanimous candidate.
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.on_canvass_position(0, 512, 0, 2, 0)
    election.do_work(2)
    assert election.state_value == ElectionState.NOMINATE
    assert 2 <= election.nomination_deadline_ns < 2 + TIMEOUTS.election_timeout_ns // 2
    election.do_work(election.nomination_deadline_ns)
    assert election.state_value == ElectionState.CANDIDATE_BALLOT
    assert election.candidate_term_id == 1 and host.candidate_term_id == 1
    assert host.role == ClusterRole.CANDIDATE
    now = election.nomination_deadline_ns + 1
    election.do_work(now)
    requests = publisher.named("request_vote")
    assert {to for to, _ in requests} == {1, 2}
    assert requests[0][1] == dict(
        log_leadership_term_id=0, log_position=1024, candidate_term_id=1, candidate_member_id=0
    )
    election.do_work(now + 1)
    assert election.state_value == ElectionState.CANDIDATE_BALLOT  # its own vote alone is no majority
    election.on_vote(1, 0, 1024, 0, 1, True)
    election.do_work(now + 2)
    # One more vote makes a majority of three (seed 001), but Aeron's candidate
    # leads at once only on every vote: with member 2 silent it waits out the
    # election timeout, then leads with the quorum (no vote against).
    assert election.state_value == ElectionState.CANDIDATE_BALLOT
    ballot_started = election.nomination_deadline_ns
    election.do_work(ballot_started + TIMEOUTS.election_timeout_ns - 1)
    assert election.state_value == ElectionState.CANDIDATE_BALLOT
    election.do_work(ballot_started + TIMEOUTS.election_timeout_ns)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    assert host.named("create_log_publication") == [("create_log_publication", 1, 1024)]
    assert host.role == ClusterRole.LEADER


def test_an_idle_module_sleeps_no_later_than_its_nomination_deadline() -> None:
    """Seed 001 NOMINATE: each candidate waits a random time so that one asks
    for votes before the others.  A module that slept past its deadline would
    nominate when a peer's canvass woke it, together with every other member
    that canvass woke (a split vote, and a term id spent).  Its idle wait ends
    at the deadline instead."""
    election, _, _ = make(host=FakeHost([(0, 0)], append=1024))
    to_canvass(election)
    assert election.wake_deadline_ns() is None
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.on_canvass_position(0, 1024, 0, 2, 0)
    election.do_work(S)
    assert election.state_value == ElectionState.NOMINATE
    deadline = election.nomination_deadline_ns
    assert election.wake_deadline_ns() == deadline

    agent = new_agent(MEMBERS)
    agent.election.election = election
    max_wait = 10 * MS
    agent._now_ns = deadline - 3 * MS
    assert agent.idle_wait_ns(max_wait) == 3 * MS
    agent._now_ns = deadline - 30 * MS
    assert agent.idle_wait_ns(max_wait) == max_wait
    agent._now_ns = deadline + 1
    assert agent.idle_wait_ns(max_wait) == 1

    election.do_work(deadline)
    assert election.state_value == ElectionState.CANDIDATE_BALLOT
    assert election.wake_deadline_ns() is None
    assert agent.idle_wait_ns(max_wait) == max_wait


def test_unanimous_votes_win_at_once_and_leader_runs_to_closed() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=1024))
    to_canvass(election)
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.on_canvass_position(0, 1024, 0, 2, 0)
    election.do_work(1)
    election.do_work(election.nomination_deadline_ns)
    now = election.nomination_deadline_ns
    election.on_vote(1, 0, 1024, 0, 1, True)
    election.on_vote(1, 0, 1024, 0, 2, True)
    election.do_work(now + 1)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    publisher.clear()
    election.do_work(now + 2)
    nlt = publisher.named("new_leadership_term")
    assert {to for to, _ in nlt} == {1, 2}
    assert nlt[0][1]["leadership_term_id"] == 1 and nlt[0][1]["term_base_log_position"] == 1024
    assert nlt[0][1]["log_session_id"] == 77
    # Votes' positions do not count: a quorum must report AppendPosition in the new term
    # (so no commit position to tell either).
    assert publisher.named("commit_position") == []
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    election.on_append_position(0, 1024, 1, 0)  # an older term: ignored
    election.do_work(now + 3)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    election.on_append_position(1, 1024, 1, 0)
    election.do_work(now + 4)
    # The quorum's position is told as the commit position at once (Aeron's
    # publishCommitPositionOnInterval), then LEADER_REPLAY.
    assert {(to, f["log_position"]) for to, f in publisher.named("commit_position")} == {(1, 1024), (2, 1024)}
    assert election.state_value == ElectionState.LEADER_REPLAY
    assert host.named("start_replay") == [("start_replay", 0, 1024)]
    election.do_work(now + 5)
    assert election.state_value == ElectionState.LEADER_INIT
    election.do_work(now + 6)
    assert election.state_value == ElectionState.LEADER_READY
    assert host.named("join_log_as_leader") == [("join_log_as_leader", 1, 1024)]
    election.do_work(now + 7)
    assert election.state_value == ElectionState.LEADER_READY  # positions were reset in LEADER_REPLAY
    election.on_append_position(1, 1024, 2, 0)
    election.do_work(now + 8)
    # A quorum, but Aeron's leader waits for every member that voted (member 1 too).
    assert election.state_value == ElectionState.LEADER_READY
    election.on_append_position(1, 1024, 1, 0)
    election.do_work(now + 9)
    assert election.state_value == ElectionState.CLOSED
    assert host.named("append_new_leadership_term_event") == [("append_new_leadership_term_event", 1, 1024)]
    assert host.completed == (ClusterRole.LEADER, 0, 1)


def _to_leader_ready(election: Election, host: FakeHost, voters: tuple[int, ...]) -> int:
    """Member 0 of three through its ballot (``voters`` vote for it) and
    LEADER_LOG_REPLICATION and LEADER_REPLAY, to LEADER_READY; the time."""
    to_canvass(election)
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.on_canvass_position(0, 1024, 0, 2, 0)
    election.do_work(1)
    now = election.nomination_deadline_ns
    election.do_work(now)
    for voter in voters:
        election.on_vote(1, 0, 1024, 0, voter, True)
    now += TIMEOUTS.election_timeout_ns  # (unanimity leads at once, a quorum at the timeout)
    election.do_work(now)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    for voter in voters:
        election.on_append_position(1, 1024, voter, 0)
    for step in range(1, 4):
        election.do_work(now + step)
    assert election.state_value == ElectionState.LEADER_READY
    return now + 3


def test_a_leader_ready_waits_for_every_voter_or_a_quorum_after_the_heartbeat_timeout() -> None:
    """Aeron's LEADER_READY: every member that voted has reported the leader's
    position in its term; failing that, a quorum once the leader heartbeat
    timeout has passed (a voter that died since must not hold the cluster
    for good), counting only AppendPositions of the new term."""
    election, host, _ = make(host=FakeHost([(0, 0)], append=1024))
    ready_at = _to_leader_ready(election, host, voters=(1, 2))
    election.on_append_position(1, 1024, 1, 0)  # member 2, which voted too, is silent now
    election.do_work(ready_at + TIMEOUTS.leader_heartbeat_timeout_ns - 10)
    assert election.state_value == ElectionState.LEADER_READY
    election.do_work(ready_at + TIMEOUTS.leader_heartbeat_timeout_ns)
    assert election.state_value == ElectionState.CLOSED


def test_a_replaying_leader_tells_the_quorum_position_not_its_own_commit() -> None:
    """Aeron's LEADER_LOG_REPLICATION and LEADER_REPLAY: the commit position
    the followers hear is the quorum's position in the new term, sent as soon
    as it rises (a follower catching up applies it) and again on the
    heartbeat interval; not the node's own commit position, which lags until
    the leader has replayed and joined its log."""
    election, host, publisher = make(host=FakeHost([(0, 0)], append=2048))
    host.commit = 512  # the node's own, behind
    to_canvass(election)
    election.on_canvass_position(0, 2048, 0, 1, 0)
    election.on_canvass_position(0, 1024, 0, 2, 0)
    election.do_work(1)
    now = election.nomination_deadline_ns
    election.do_work(now)
    election.on_vote(1, 0, 2048, 0, 1, True)
    election.on_vote(1, 0, 1024, 0, 2, True)
    election.do_work(now + 1)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    election.on_append_position(1, 1024, 2, 0)  # member 2, replicated to 1024
    election.do_work(now + 2)
    assert {(to, f["log_position"]) for to, f in publisher.named("commit_position")} == {(1, 1024), (2, 1024)}
    publisher.clear()
    election.on_append_position(1, 2048, 1, 0)
    host.replay_finished = False
    election.do_work(now + 3)  # the quorum reaches 2048: told at once, then LEADER_REPLAY
    assert {(to, f["log_position"]) for to, f in publisher.named("commit_position")} == {(1, 2048), (2, 2048)}
    assert election.state_value == ElectionState.LEADER_REPLAY
    publisher.clear()
    election.do_work(now + 4)
    assert publisher.named("commit_position") == []  # reports start afresh in LEADER_REPLAY
    election.on_append_position(1, 2048, 1, 0)
    election.do_work(now + 5)
    assert publisher.named("commit_position") == []  # unchanged: not again before the interval
    election.do_work(now + 3 + TIMEOUTS.leader_heartbeat_interval_ns)
    assert {f["log_position"] for _, f in publisher.named("commit_position")} == {2048}
    assert election.state_value == ElectionState.LEADER_REPLAY


def test_a_leader_ready_does_not_wait_for_a_member_that_never_voted() -> None:
    election, host, _ = make(host=FakeHost([(0, 0)], append=1024))
    ready_at = _to_leader_ready(election, host, voters=(1,))  # member 2 down during the ballot
    election.on_append_position(1, 1024, 1, 0)
    election.do_work(ready_at + 1)
    assert election.state_value == ElectionState.CLOSED


def test_not_a_candidate_when_another_log_is_better() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=512))
    to_canvass(election)
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.on_canvass_position(0, 1024, 0, 2, 0)
    election.do_work(10 * S)
    assert election.state_value == ElectionState.CANVASS


def test_quorum_candidate_waits_a_heartbeat_timeout_from_the_last_word_of_a_leader() -> None:
    """Aeron's canvass deadline outside start-up: a member that heard a leader
    (NewLeadershipTerm or CommitPosition) gives it the leader heartbeat
    timeout from then, not from entering CANVASS, before it stands with a
    quorum's view (every member's view makes it stand at once)."""
    host = FakeHost([(0, 0)], append=512)
    heard_ns = 30 * S
    host.last_leader_update_ns = heard_ns
    election, host, publisher = make(host=host)
    entered_ns = heard_ns + 2 * S  # the node's election began later (its log disconnected, say)
    to_canvass(election, entered_ns)
    election.on_canvass_position(0, 256, 0, 1, 0)  # member 2 silent
    election.do_work(entered_ns + TIMEOUTS.election_timeout_ns)
    assert election.state_value == ElectionState.CANVASS
    election.do_work(heard_ns + TIMEOUTS.leader_heartbeat_timeout_ns - 1)
    assert election.state_value == ElectionState.CANVASS
    election.do_work(heard_ns + TIMEOUTS.leader_heartbeat_timeout_ns)
    assert election.state_value == ElectionState.NOMINATE


def test_a_member_that_never_heard_a_leader_stands_with_a_quorum_at_once() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=512))
    start = 20 * S  # no leader heard: the deadline (0 + the heartbeat timeout) is past
    to_canvass(election, start)
    election.on_canvass_position(0, 256, 0, 1, 0)
    election.do_work(start + 1)
    assert election.state_value == ElectionState.NOMINATE


def test_startup_uses_the_startup_canvass_timeout() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=512), is_startup=True)
    to_canvass(election)
    election.on_canvass_position(0, 256, 0, 1, 0)
    election.do_work(TIMEOUTS.election_timeout_ns)
    assert election.state_value == ElectionState.CANVASS
    election.do_work(TIMEOUTS.startup_canvass_timeout_ns)
    assert election.state_value == ElectionState.NOMINATE


def test_split_vote_times_out_to_canvass_and_next_candidacy_uses_a_higher_term() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=0))
    to_canvass(election)
    election.on_canvass_position(0, 0, 0, 1, 0)
    election.on_canvass_position(0, 0, 0, 2, 0)
    election.do_work(1)
    start = election.nomination_deadline_ns
    election.do_work(start)
    assert election.candidate_term_id == 1
    election.on_vote(1, 0, 0, 0, 1, False)
    election.on_vote(1, 0, 0, 0, 2, False)
    election.do_work(start + TIMEOUTS.election_timeout_ns)
    assert election.state_value == ElectionState.CANVASS
    election.on_canvass_position(0, 0, 0, 1, 0)
    election.on_canvass_position(0, 0, 0, 2, 0)
    election.do_work(start + TIMEOUTS.election_timeout_ns + 1)
    election.do_work(election.nomination_deadline_ns)
    assert election.state_value == ElectionState.CANDIDATE_BALLOT
    assert election.candidate_term_id == 2 and host.candidate_term_id == 2


def test_follower_ballot_times_out_to_canvass() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=0))
    to_canvass(election)
    election.on_request_vote(0, 0, 1, 1, 0)
    assert election.state_value == ElectionState.FOLLOWER_BALLOT
    election.do_work(TIMEOUTS.election_timeout_ns)
    assert election.state_value == ElectionState.CANVASS


def test_single_member_goes_straight_to_leader_log_replication() -> None:
    election, host, publisher = make(members=(0,), host=FakeHost([(3, 0)], append=640))
    election.do_work(0)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    assert election.leadership_term_id == 4
    for now in range(1, 6):
        election.do_work(now)
    assert election.state_value == ElectionState.CLOSED
    assert host.completed == (ClusterRole.LEADER, 0, 4)
    assert publisher.sent == []


def test_appointed_leader_nominates_at_once_and_others_never_do() -> None:
    leader, _, _ = make(member_id=1, host=FakeHost([(0, 0)], append=0), appointed_leader_id=1)
    to_canvass(leader)
    leader.on_canvass_position(0, 0, 0, 0, 0)
    leader.do_work(1)
    assert leader.state_value == ElectionState.NOMINATE and leader.nomination_deadline_ns == 1
    other, _, _ = make(member_id=0, host=FakeHost([(0, 0)], append=0), appointed_leader_id=1)
    to_canvass(other)
    other.on_canvass_position(0, 0, 0, 1, 0)
    other.on_canvass_position(0, 0, 0, 2, 0)
    other.do_work(100 * S)
    assert other.state_value == ElectionState.CANVASS


# --------------------------------------------------------------------------- vote rules


def votes(publisher: RecordingPublisher) -> list[tuple[int, int, bool]]:
    return [(to, f["candidate_term_id"], f["vote"]) for to, f in publisher.named("place_vote")]


def test_vote_for_a_candidate_with_a_log_at_least_as_good() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=1024))
    to_canvass(election)
    election.on_request_vote(0, 1024, 1, 2, 0)
    assert votes(publisher) == [(2, 1, True)]
    assert election.state_value == ElectionState.FOLLOWER_BALLOT
    assert host.candidate_term_id == 1  # persisted before the vote left


def test_vote_against_a_candidate_with_a_worse_log_and_canvass() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=1024))
    to_canvass(election)
    election.on_request_vote(0, 512, 1, 2, 0)
    assert votes(publisher) == [(2, 1, False)]
    assert election.state_value == ElectionState.CANVASS
    assert election.candidate_term_id == 1  # that term is spent
    election.on_request_vote(0, 1024, 1, 1, 0)
    assert votes(publisher)[-1] == (1, 1, False)


def test_vote_against_an_older_log_term_even_if_longer() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0), (2, 512)], append=600))
    to_canvass(election)
    election.on_request_vote(1, 4096, 3, 1, 0)
    assert votes(publisher) == [(1, 3, False)]


def test_one_vote_per_candidate_term_remembered() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=0))
    to_canvass(election)
    election.on_request_vote(0, 0, 1, 1, 0)
    election.on_request_vote(0, 0, 1, 1, 0)  # duplicated by the network: same answer
    election.on_request_vote(0, 0, 1, 2, 0)  # another candidate, same term: against
    assert votes(publisher) == [(1, 1, True), (1, 1, True), (2, 1, False)]


def test_vote_against_a_term_not_newer_than_ours() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0), (5, 0)], append=0))
    to_canvass(election)
    election.on_request_vote(5, 0, 5, 1, 0)
    assert votes(publisher) == [(1, 5, False)]


# --------------------------------------------------------------------------- follower on NewLeadershipTerm


def new_leadership_term(
    election: Election,
    *,
    log_term: int,
    next_term: int,
    next_base: int,
    next_pos: int,
    term: int,
    base: int,
    pos: int,
    leader: int = 1,
) -> None:
    election.on_new_leadership_term(
        log_term, next_term, next_base, next_pos, term, base, pos, 0, 0, leader, 1115055142, 1, False
    )


def test_follower_joins_directly_when_logs_match() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=1024))
    to_canvass(election)
    election.on_request_vote(0, 1024, 1, 1, 0)
    new_leadership_term(
        election, log_term=0, next_term=1, next_base=1024, next_pos=NULL_POSITION, term=1, base=1024, pos=1024
    )
    assert election.state_value == ElectionState.FOLLOWER_REPLAY
    assert host.named("start_replay") == [("start_replay", 0, 1024)]
    election.do_work(1)
    assert election.state_value == ElectionState.FOLLOWER_LOG_INIT
    election.do_work(2)
    assert election.state_value == ElectionState.FOLLOWER_LOG_AWAIT
    assert host.named("join_log_as_follower") == [("join_log_as_follower", 1, 1, 1024, 1115055142)]
    election.do_work(3)
    assert election.state_value == ElectionState.FOLLOWER_LOG_AWAIT
    host.connected = True
    election.do_work(4)
    assert election.state_value == ElectionState.FOLLOWER_READY
    publisher.clear()
    election.do_work(5)
    assert election.state_value == ElectionState.CLOSED
    assert publisher.named("append_position") == [
        (1, dict(leadership_term_id=1, log_position=1024, follower_member_id=0, flags=0))
    ]
    assert host.completed == (ClusterRole.FOLLOWER, 1, 1)


def test_follower_truncates_entries_the_leader_does_not_have() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=2048))
    to_canvass(election)
    new_leadership_term(
        election, log_term=0, next_term=1, next_base=1024, next_pos=NULL_POSITION, term=1, base=1024, pos=1024
    )
    assert host.named("truncate_log_to") == [("truncate_log_to", 1024)]
    assert election.state_value == ElectionState.FOLLOWER_REPLAY


def test_follower_drops_a_term_the_leader_never_had() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0), (2, 512)], append=640))
    to_canvass(election)
    new_leadership_term(
        election,
        log_term=2,
        next_term=NULL_VALUE,
        next_base=NULL_POSITION,
        next_pos=NULL_POSITION,
        term=3,
        base=800,
        pos=800,
    )
    assert host.named("truncate_log_to") == [("truncate_log_to", 512)]
    assert host.named("drop_term") == [("drop_term", 2)]
    assert election.state_value == ElectionState.CANVASS
    assert election.log_leadership_term_id == 0


def test_follower_canvasses_on_a_new_leadership_term_for_another_log_term() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0), (1, 100)], append=200))
    to_canvass(election)
    election.on_request_vote(1, 200, 2, 1, 0)
    new_leadership_term(election, log_term=0, next_term=1, next_base=100, next_pos=300, term=2, base=300, pos=300)
    assert election.state_value == ElectionState.CANVASS


def test_follower_ignores_a_leader_of_a_term_older_than_its_vote() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=0))
    to_canvass(election)
    election.on_request_vote(0, 0, 5, 2, 0)
    new_leadership_term(election, log_term=0, next_term=4, next_base=0, next_pos=NULL_POSITION, term=4, base=0, pos=0)
    assert election.state_value == ElectionState.FOLLOWER_BALLOT


def test_follower_catches_up_within_the_current_term() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0), (2, C)], append=C + 320))
    to_canvass(election)
    new_leadership_term(
        election, log_term=2, next_term=2, next_base=NULL_POSITION, next_pos=NULL_POSITION, term=2, base=C, pos=D
    )
    assert election.state_value == ElectionState.FOLLOWER_REPLAY
    election.do_work(1)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_INIT
    publisher.clear()
    election.do_work(2)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_AWAIT
    assert host.named("catchup") == [("catchup", 1, C + 320)]
    assert publisher.named("catchup_position") == [
        (1, dict(leadership_term_id=2, log_position=C + 320, follower_member_id=0, catchup_endpoint="localhost:9005"))
    ]
    host.connected = True
    election.do_work(3)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP
    host.append = 5280
    publisher.clear()
    election.do_work(4)
    assert publisher.named("append_position") == [
        (1, dict(leadership_term_id=2, log_position=5280, follower_member_id=0, flags=APPEND_POSITION_FLAG_CATCHUP))
    ]
    election.on_commit_position(2, 6880, 1)
    election.do_work(5)
    assert host.named("notify_commit_position")[-1] == ("notify_commit_position", 5280)
    election.on_stop_catchup(2, 2)  # someone else's
    election.do_work(6)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP
    election.on_stop_catchup(2, 0)
    election.do_work(7)
    assert host.named("stop_catchup") == [("stop_catchup",)]
    assert election.state_value == ElectionState.FOLLOWER_LOG_INIT
    election.do_work(8)
    assert election.state_value == ElectionState.FOLLOWER_READY  # the log was joined for catchup
    election.do_work(9)
    assert election.state_value == ElectionState.CLOSED


def _to_catchup_await(election: Election, publisher: RecordingPublisher) -> int:
    """From CANVASS to FOLLOWER_CATCHUP_AWAIT (behind the leader in its term); the time reached."""
    to_canvass(election)
    new_leadership_term(
        election, log_term=2, next_term=2, next_base=NULL_POSITION, next_pos=NULL_POSITION, term=2, base=C, pos=D
    )
    election.do_work(1)
    publisher.clear()
    election.do_work(2)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_AWAIT
    return 2


def test_catchup_position_is_asked_again_until_the_catchup_connects() -> None:
    """A leader still in its own election lets CatchupPosition go (it can serve a
    catchup only once its log is recorded): the follower asks again at the
    heartbeat interval, backing off to eight of them, instead of waiting out its
    progress timeout (the leader heartbeat timeout) with nothing coming."""
    election, host, publisher = make(host=FakeHost([(0, 0), (2, C)], append=C + 320))
    start = _to_catchup_await(election, publisher)
    interval = TIMEOUTS.leader_heartbeat_interval_ns
    request = (
        1,
        dict(leadership_term_id=2, log_position=C + 320, follower_member_id=0, catchup_endpoint="localhost:9005"),
    )
    assert publisher.named("catchup_position") == [request]
    sent_at = []
    for now in range(start, start + TIMEOUTS.leader_heartbeat_timeout_ns - MS, MS):
        before = len(publisher.named("catchup_position"))
        election.do_work(now)
        if len(publisher.named("catchup_position")) > before:
            sent_at.append(now)
    assert all(sent == request for sent in publisher.named("catchup_position"))
    gaps = [b - a for a, b in zip([start] + sent_at, sent_at)]
    assert gaps[:5] == [interval, 2 * interval, 4 * interval, 8 * interval, 8 * interval]
    assert all(gap == 8 * interval for gap in gaps[3:])  # never faster: no flood of a leader that cannot answer
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_AWAIT
    # The leader serves one of them: the catchup connects, and no more requests go.
    host.connected = True
    now = start + TIMEOUTS.leader_heartbeat_timeout_ns - MS
    election.do_work(now)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP
    publisher.clear()
    for later in range(now, now + 20 * interval, interval):
        election.do_work(later)
    assert publisher.named("catchup_position") == []


def test_a_leader_that_drops_the_first_catchup_position_serves_the_next_well_before_the_timeout() -> None:
    """The exchange with a leader that is still in its election when the first
    request comes and leads a moment later: the catchup connects one heartbeat
    interval later, not a leader heartbeat timeout later (10 s by default)."""
    election, host, publisher = make(host=FakeHost([(0, 0), (2, C)], append=C + 320))
    start = _to_catchup_await(election, publisher)
    publisher.clear()  # the leader, in LEADER_READY, lets the first request go
    leader_serves_ns = start + 50 * MS  # its election closes
    now = start
    while not host.connected:
        now += MS
        election.do_work(now)
        if now >= leader_serves_ns and publisher.named("catchup_position"):
            host.connected = True  # it replays to the catchup endpoint
        assert now < start + TIMEOUTS.leader_heartbeat_timeout_ns, "the follower never asked again"
    election.do_work(now + MS)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP
    assert now - start <= TIMEOUTS.leader_heartbeat_interval_ns + MS


def test_catchup_requests_start_over_after_a_new_canvass() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0), (2, C)], append=C + 320))
    start = _to_catchup_await(election, publisher)
    interval = TIMEOUTS.leader_heartbeat_interval_ns
    for now in range(start, start + 9 * interval, MS):
        election.do_work(now)
    assert election.catchup_requests >= 4
    # No progress: back to CANVASS; the next catchup asks at the short interval again.
    election.do_work(start + TIMEOUTS.leader_heartbeat_timeout_ns)
    assert election.state_value == ElectionState.CANVASS
    again = start + TIMEOUTS.leader_heartbeat_timeout_ns + 1
    election.do_work(again)
    new_leadership_term(
        election, log_term=2, next_term=2, next_base=NULL_POSITION, next_pos=NULL_POSITION, term=2, base=C, pos=D
    )
    election.do_work(again + 1)
    election.do_work(again + 2)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_AWAIT
    publisher.clear()
    election.do_work(again + 2 + interval)
    assert len(publisher.named("catchup_position")) == 1


class FakeArchive:
    """The leader's archive as its catchup work uses it: replays started and stopped."""

    def __init__(self) -> None:
        self.replays: list[tuple[str, int]] = []
        self.stopped: list[int] = []

    def start_replay(self, recording_id: int, channel: str, stream_id: int, position: int) -> int:
        self.replays.append((channel, position))
        return 500 + len(self.replays)

    def stop_replay(self, replay_session_id: int) -> None:
        self.stopped.append(replay_session_id)


def leading_agent() -> tuple[ConsensusModuleAgent, FakeArchive, list[tuple[int, int]]]:
    """A consensus module leading term 2 after its election (only what its
    catchup work reads; no driver, archive or peers)."""
    agent = ConsensusModuleAgent.__new__(ConsensusModuleAgent)
    archive = FakeArchive()
    answers: list[tuple[int, int]] = []
    agent.member_id = 0
    agent.role = ClusterRole.LEADER
    agent.leadership_term_id = 2
    agent.election = None
    agent._followers = {1: ClusterMember(1, "h:1", "h:2", "h:3", "h:4", "h:5")}
    agent.archive = archive  # type: ignore[assignment]
    agent._leader_services_joined = True
    agent.log_session_id = 77
    agent.log_recording_id = 0
    agent.context = ConsensusModuleContext(log_stream_id=100)
    agent._now_ns = 0
    agent._send_new_leadership_term = lambda to, log_term: answers.append((to, log_term))  # type: ignore[assignment]
    return agent, archive, answers


def test_the_leader_stops_a_stale_catchup_when_the_follower_canvasses_again() -> None:
    """A follower that starts over (it restarted, or its catchup failed) canvasses,
    then asks for a catchup from where it is now.  A replay still running to it
    from its last request must not make the new request look like a repeat, or
    the follower waits out its progress timeout while the old replay feeds its
    endpoint from the wrong position (Aeron's stopExistingCatchupReplay)."""
    agent, archive, answers = leading_agent()
    agent.on_catchup_position(2, C, 1, "h:4")
    assert archive.replays == [("aeron:udp?endpoint=h:4|session-id=77|linger=0", C)]
    agent.on_catchup_position(2, C, 1, "h:4")  # a repeat while it runs: nothing new
    assert len(archive.replays) == 1 and archive.stopped == []
    agent.on_canvass_position(2, C + 640, 2, 1, 0)  # the follower starts over
    assert archive.stopped == [501]
    assert answers == [(1, 2)]
    agent.on_catchup_position(2, C + 640, 1, "h:4")
    assert archive.replays[-1] == ("aeron:udp?endpoint=h:4|session-id=77|linger=0", C + 640)


def test_a_leader_in_its_election_leaves_catchup_to_the_followers_next_request() -> None:
    agent, archive, answers = leading_agent()
    agent._leader_services_joined = False  # LEADER_READY: its log is not yet followed
    agent.on_catchup_position(2, C, 1, "h:4")
    assert archive.replays == []
    agent._leader_services_joined = True  # election closed: the follower's next request is served
    agent.on_catchup_position(2, C, 1, "h:4")
    assert archive.replays == [("aeron:udp?endpoint=h:4|session-id=77|linger=0", C)]


def test_seed_001_member_0_replicates_two_terms_then_catches_up() -> None:
    """Member 0 is behind across two leadership changes: it replicates the rest of
    term 0 (A to B), then term 1 (B to C), then catches up in term 2 (from C)."""
    host = FakeHost([(0, 0)], append=A)
    election, host, publisher = make(host=host)
    to_canvass(election)
    election.do_work(1)
    assert publisher.named("canvass_position")[0][1] == dict(
        log_leadership_term_id=0, log_position=A, leadership_term_id=0, follower_member_id=0
    )

    new_leadership_term(election, log_term=0, next_term=1, next_base=B, next_pos=C, term=2, base=C, pos=D)
    assert election.state_value == ElectionState.FOLLOWER_LOG_REPLICATION
    assert host.named("replicate") == [("replicate", 1, 0, B)]
    host.append = B
    host.replications[-1].done = True
    publisher.clear()
    election.do_work(2)
    assert election.state_value == ElectionState.CANVASS
    election.do_work(3)
    assert publisher.named("canvass_position")[0][1] == dict(
        log_leadership_term_id=0, log_position=B, leadership_term_id=2, follower_member_id=0
    )

    new_leadership_term(election, log_term=0, next_term=1, next_base=B, next_pos=C, term=2, base=C, pos=6592)
    assert election.state_value == ElectionState.FOLLOWER_LOG_REPLICATION
    assert host.named("replicate") == [("replicate", 1, 0, B), ("replicate", 1, 0, C)]
    host.append = C
    host.replications[-1].done = True
    publisher.clear()
    election.do_work(4)
    assert host.named("append_term") == [("append_term", 1, B)]
    assert election.state_value == ElectionState.CANVASS
    election.do_work(5)
    assert publisher.named("canvass_position")[0][1] == dict(
        log_leadership_term_id=1, log_position=C, leadership_term_id=2, follower_member_id=0
    )

    new_leadership_term(
        election, log_term=1, next_term=2, next_base=C, next_pos=NULL_POSITION, term=2, base=C, pos=6656
    )
    assert election.state_value == ElectionState.FOLLOWER_REPLAY
    assert host.named("start_replay") == [("start_replay", 0, C)]
    election.do_work(6)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_INIT
    publisher.clear()
    election.do_work(7)
    assert publisher.named("catchup_position")[0][1]["log_position"] == C
    assert host.named("join_log_as_follower") == [("join_log_as_follower", 1, 2, C, 1115055142)]


def test_replication_failure_returns_to_canvass() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=A))
    to_canvass(election)
    new_leadership_term(election, log_term=0, next_term=1, next_base=B, next_pos=C, term=2, base=C, pos=D)
    host.replications[-1].has_failed = True
    election.do_work(1)
    assert election.state_value == ElectionState.CANVASS
    assert host.replications[-1].closed


# --------------------------------------------------------------------------- what the follower's log needs (issue 18)

HEARTBEAT_TIMEOUT = TIMEOUTS.leader_heartbeat_timeout_ns


def to_follower_log_init(host: FakeHost) -> tuple[Election, FakeHost, RecordingPublisher]:
    """A follower whose log matches the leader's: FOLLOWER_LOG_INIT at time 1."""
    election, host, publisher = make(host=host)
    to_canvass(election)
    new_leadership_term(
        election, log_term=0, next_term=1, next_base=1024, next_pos=NULL_POSITION, term=1, base=1024, pos=1024
    )
    election.do_work(1)
    assert election.state_value == ElectionState.FOLLOWER_LOG_INIT
    return election, host, publisher


def to_follower_catchup_init(host: FakeHost) -> tuple[Election, FakeHost, RecordingPublisher]:
    """A follower behind in the leader's current term: FOLLOWER_CATCHUP_INIT at time 1."""
    election, host, publisher = make(host=host)
    to_canvass(election)
    new_leadership_term(
        election, log_term=2, next_term=2, next_base=NULL_POSITION, next_pos=NULL_POSITION, term=2, base=C, pos=D
    )
    election.do_work(1)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_INIT
    return election, host, publisher


def test_a_follower_whose_live_destination_is_refused_is_not_ready_until_it_is_added() -> None:
    election, host, publisher = to_follower_log_init(FakeHost([(0, 0)], append=1024))
    host.live_destination_ok = False
    host.connected = True
    election.do_work(2)
    assert election.state_value == ElectionState.FOLLOWER_LOG_AWAIT
    for now in range(3, 100):
        election.do_work(now * MS)
    assert election.state_value == ElectionState.FOLLOWER_LOG_AWAIT  # connected, yet no live log: not ready
    assert host.completed is None
    host.live_destination_ok = True
    election.do_work(100 * MS)
    assert election.state_value == ElectionState.FOLLOWER_READY
    election.do_work(101 * MS)
    assert election.state_value == ElectionState.CLOSED
    assert host.completed == (ClusterRole.FOLLOWER, 1, 1)


def test_a_follower_whose_live_destination_stays_refused_canvasses_after_the_heartbeat_timeout() -> None:
    election, host, publisher = to_follower_log_init(FakeHost([(0, 0)], append=1024))
    host.live_destination_ok = False
    host.connected = True
    election.do_work(2)
    assert election.state_value == ElectionState.FOLLOWER_LOG_AWAIT
    election.do_work(2 + HEARTBEAT_TIMEOUT - 1)
    assert election.state_value == ElectionState.FOLLOWER_LOG_AWAIT
    election.do_work(2 + HEARTBEAT_TIMEOUT)
    assert election.state_value == ElectionState.CANVASS
    assert election.transitions[-1][3] == "no progress in FOLLOWER_LOG_AWAIT"
    assert host.named("prepare_for_election")  # the log subscription goes with the attempt
    assert host.completed is None


def test_a_follower_whose_log_subscription_is_refused_retries_then_canvasses() -> None:
    election, host, publisher = to_follower_log_init(FakeHost([(0, 0)], append=1024))
    host.subscription_ok = False
    election.do_work(2)
    election.do_work(3)
    assert election.state_value == ElectionState.FOLLOWER_LOG_INIT
    assert len(host.named("join_log_as_follower refused")) == 2  # asked again (the host backs off)
    host.subscription_ok = True
    election.do_work(4)
    assert election.state_value == ElectionState.FOLLOWER_LOG_AWAIT
    assert election.joined_log

    election, host, publisher = to_follower_log_init(FakeHost([(0, 0)], append=1024))
    host.subscription_ok = False
    election.do_work(1 + HEARTBEAT_TIMEOUT)
    assert election.state_value == ElectionState.CANVASS
    assert not election.joined_log and host.completed is None


def test_a_follower_asks_for_catchup_only_once_its_catchup_destination_is_added() -> None:
    election, host, publisher = to_follower_catchup_init(FakeHost([(0, 0), (2, C)], append=C + 320))
    host.catchup_destination_ok = False
    publisher.clear()
    election.do_work(2)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_INIT
    assert publisher.named("catchup_position") == []
    host.catchup_destination_ok = True
    election.do_work(3)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP_AWAIT
    assert len(publisher.named("catchup_position")) == 1

    election, host, publisher = to_follower_catchup_init(FakeHost([(0, 0), (2, C)], append=C + 320))
    host.catchup_destination_ok = False
    election.do_work(1 + HEARTBEAT_TIMEOUT)
    assert election.state_value == ElectionState.CANVASS
    assert election.transitions[-1][3] == "no progress in FOLLOWER_CATCHUP_INIT"


def to_follower_catchup(host: FakeHost) -> tuple[Election, FakeHost, RecordingPublisher]:
    election, host, publisher = to_follower_catchup_init(host)
    election.do_work(2)
    host.connected = True
    election.do_work(3)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP
    return election, host, publisher


def test_a_catching_up_follower_adds_the_live_destination_when_near_live_before_reporting() -> None:
    election, host, publisher = to_follower_catchup(FakeHost([(0, 0), (2, C)], append=C + 320))
    election.do_work(4)
    assert host.named("add_live_destination") == []  # far behind: the catchup alone
    host.near_live = True
    host.append = D
    publisher.clear()
    calls_before = len(host.calls)
    election.do_work(5)
    assert host.calls[calls_before:] == [("add_live_destination",)]
    # (added before the AppendPosition that tells the leader this member caught up)
    assert publisher.named("append_position")[0][1]["log_position"] == D


def test_stop_catchup_without_the_live_log_waits_for_it_and_never_completes_without_it() -> None:
    election, host, publisher = to_follower_catchup(FakeHost([(0, 0), (2, C)], append=C + 320))
    host.live_destination_ok = False
    host.near_live = True
    host.append = D
    election.do_work(4)
    election.on_stop_catchup(2, 0)
    for now in range(5, 50):
        election.do_work(now * MS)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP
    assert host.named("stop_catchup") == []  # the catchup destination stays while the live one is refused
    host.live_destination_ok = True
    election.do_work(50 * MS)
    assert host.named("stop_catchup") == [("stop_catchup",)]
    assert election.state_value == ElectionState.FOLLOWER_LOG_INIT
    election.do_work(51 * MS)
    assert election.state_value == ElectionState.FOLLOWER_READY  # "log already joined", with the live log
    election.do_work(52 * MS)
    assert host.completed == (ClusterRole.FOLLOWER, 1, 2)

    # Refused for the whole heartbeat timeout after the last progress: CANVASS, not ready.
    election, host, publisher = to_follower_catchup(FakeHost([(0, 0), (2, C)], append=C + 320))
    host.live_destination_ok = False
    host.append = D
    election.do_work(4)
    election.on_stop_catchup(2, 0)
    election.do_work(4 + HEARTBEAT_TIMEOUT - 1)
    assert election.state_value == ElectionState.FOLLOWER_CATCHUP
    election.do_work(4 + HEARTBEAT_TIMEOUT)
    assert election.state_value == ElectionState.CANVASS
    assert election.transitions[-1][3] == "no progress in FOLLOWER_CATCHUP"
    assert host.completed is None and host.named("stop_catchup") == []


def test_a_log_joined_for_catchup_that_no_longer_flows_is_not_ready() -> None:
    """StopCatchup with the live log added, but the log is not connected (its
    image ended with the catchup before the live log flowed): not ready; the
    heartbeat timeout sends the follower back to CANVASS."""
    election, host, publisher = to_follower_catchup(FakeHost([(0, 0), (2, C)], append=C + 320))
    host.append = D
    election.on_stop_catchup(2, 0)
    election.do_work(4)
    assert election.state_value == ElectionState.FOLLOWER_LOG_INIT
    host.connected = False
    election.do_work(5)
    assert election.state_value == ElectionState.FOLLOWER_LOG_INIT
    election.do_work(4 + HEARTBEAT_TIMEOUT)
    assert election.state_value == ElectionState.CANVASS
    assert host.completed is None


# --------------------------------------------------------------------------- the leader's answers


def test_leader_answers_a_canvass_about_an_old_term_as_in_seed_001() -> None:
    entries = [TermEntry(0, 0, B), TermEntry(1, B, C), TermEntry(2, C, NULL_POSITION)]
    assert next_term_for(entries, 0, 2, C) == (1, B, C)
    assert next_term_for(entries, 1, 2, C) == (2, C, NULL_POSITION)
    assert next_term_for(entries, 2, 2, C) == (NULL_VALUE, NULL_POSITION, NULL_POSITION)  # Aeron: no next term
    assert next_term_for(entries[:2], 0, 3, C) == (1, B, C)  # term 3 not recorded yet
    assert next_term_for(entries, 7, 9, D) == (NULL_VALUE, NULL_POSITION, NULL_POSITION)
    assert next_term_for(entries, NULL_VALUE, 2, C) == (0, 0, B)


def test_leader_in_election_answers_canvass_with_a_tailored_new_leadership_term() -> None:
    host = FakeHost([(0, 0), (1, B)], append=C)
    election, host, publisher = make(
        member_id=1, members=(0, 1, 2), host=host, leadership_term_id=1, candidate_term_id=1
    )
    to_canvass(election)
    election.on_canvass_position(1, C, 1, 0, 0)
    election.on_canvass_position(1, C, 1, 2, 0)
    election.do_work(1)
    election.do_work(election.nomination_deadline_ns)
    now = election.nomination_deadline_ns
    election.on_vote(2, 1, C, 1, 0, True)
    election.on_vote(2, 1, C, 1, 2, True)
    election.do_work(now + 1)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    election.do_work(now + 2)
    publisher.clear()
    election.on_canvass_position(0, A, 0, 0, 0)
    election.do_work(now + 3)
    nlt = publisher.named("new_leadership_term")
    assert len(nlt) == 1 and nlt[0][0] == 0
    fields = nlt[0][1]
    assert (
        fields["log_leadership_term_id"],
        fields["next_leadership_term_id"],
        fields["next_term_base_log_position"],
        fields["next_log_position"],
    ) == (0, 1, B, C)
    assert (
        fields["leadership_term_id"],
        fields["term_base_log_position"],
        fields["log_position"],
        fields["leader_member_id"],
    ) == (2, C, C, 1)


def _leading_in_election(append: int = 0) -> tuple[Election, FakeHost, RecordingPublisher]:
    """Member 0 of three in LEADER_LOG_REPLICATION of term 1 (both others voted for it)."""
    election, host, publisher = make(host=FakeHost([(0, 0)], append=append))
    to_canvass(election)
    election.on_canvass_position(0, append, 0, 1, 0)
    election.on_canvass_position(0, append, 0, 2, 0)
    election.do_work(1)
    election.do_work(election.nomination_deadline_ns)
    election.on_vote(1, 0, append, 0, 1, True)
    election.on_vote(1, 0, append, 0, 2, True)
    election.do_work(election.nomination_deadline_ns + 1)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    return election, host, publisher


def test_a_leader_in_its_election_does_not_vote() -> None:
    """Aeron votes only in CANVASS, NOMINATE and the two ballots: a member
    that leads (or follows) in its election neither votes for a candidate of
    a newer term nor steps down for it (the candidate times out, canvasses,
    and hears this leader)."""
    election, host, publisher = _leading_in_election()
    publisher.clear()
    election.on_request_vote(0, 0, 2, 2, 0)  # member 2 stands in term 2 with the same log
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    assert publisher.named("place_vote") == []
    assert ("prepare_for_election",) not in host.calls[-1:]


def test_a_leader_answers_a_lagging_candidate_with_where_its_log_stands() -> None:
    """Aeron's onRequestVote: a candidate whose log is behind gets a vote
    against, the member will not vote in that term again, and a leader sends
    the candidate a NewLeadershipTerm so that it can follow; the leader keeps
    its election."""
    election, host, publisher = _leading_in_election(append=1024)
    publisher.clear()
    election.on_request_vote(0, 512, 5, 2, 0)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION
    votes = publisher.named("place_vote")
    assert votes == [(2, dict(votes[0][1], vote=False))] and votes[0][1]["candidate_term_id"] == 5
    assert election.candidate_term_id == 5 and host.candidate_term_id == 5
    answers = publisher.named("new_leadership_term")
    assert [to for to, _ in answers] == [2]
    assert (answers[0][1]["log_leadership_term_id"], answers[0][1]["leadership_term_id"]) == (0, 1)


def test_a_follower_in_its_election_says_no_to_a_lagging_candidate_and_stays() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=1024))
    to_canvass(election)
    new_leadership_term(
        election, log_term=0, next_term=1, next_base=1024, next_pos=NULL_POSITION, term=1, base=1024, pos=1024
    )
    host.replay_finished = False
    assert election.state_value == ElectionState.FOLLOWER_REPLAY
    publisher.clear()
    election.on_request_vote(0, 512, 2, 2, 0)  # behind: no
    election.on_request_vote(0, 2048, 3, 2, 0)  # ahead, but this member follows: no vote at all
    assert election.state_value == ElectionState.FOLLOWER_REPLAY
    assert [f["vote"] for _, f in publisher.named("place_vote")] == [False]
    assert publisher.named("new_leadership_term") == []  # (only a leader answers with one)


def test_a_lagging_candidate_follows_the_leader_of_a_lower_term_after_its_ballot() -> None:
    """The candidate's own term (1) is above the leader's (0), but it voted
    for nobody else in it: once its ballot times out it canvasses and
    follows the leader that answered it (Aeron's CANVASS takes a leader's
    word); in the ballot it takes only a leader of the ballot's term."""
    election, host, publisher = make(member_id=2, host=FakeHost([(0, 0)], append=512))
    start = 20 * S  # no leader heard for longer than the heartbeat timeout
    to_canvass(election, start)
    election.on_canvass_position(0, 256, 0, 0, 0)
    election.do_work(start + 1)
    election.do_work(election.nomination_deadline_ns)
    assert election.state_value == ElectionState.CANDIDATE_BALLOT and election.candidate_term_id == 1
    election.on_vote(1, 0, 1024, 2, 0, False)  # member 0's log is ahead
    new_leadership_term(
        election,
        log_term=0,
        next_term=NULL_VALUE,
        next_base=NULL_POSITION,
        next_pos=NULL_POSITION,
        term=0,
        base=0,
        pos=1024,
        leader=0,
    )
    assert election.state_value == ElectionState.CANDIDATE_BALLOT  # not the ballot's term: ignored
    election.do_work(election.nomination_deadline_ns + TIMEOUTS.election_timeout_ns)
    assert election.state_value == ElectionState.CANVASS  # a vote against: no quorum leader
    new_leadership_term(
        election,
        log_term=0,
        next_term=NULL_VALUE,  # what an Aeron leader sends a follower in its term: no next term
        next_base=NULL_POSITION,
        next_pos=NULL_POSITION,
        term=0,
        base=0,
        pos=1024,
        leader=0,
    )
    assert election.state_value == ElectionState.FOLLOWER_REPLAY
    assert host.named("truncate_log_to") == []  # (not read as "the leader lacks your last term")
    assert election.leader_member_id == 0 and host.role == ClusterRole.FOLLOWER


def test_a_member_that_voted_for_another_never_follows_a_lower_term() -> None:
    """Raft's rule, kept: having voted for member 1 in term 3, this member
    does not follow a leader of term 2 (a quorum that voted in term 3 and a
    leader of term 2 could otherwise both commit)."""
    election, host, publisher = make(host=FakeHost([(0, 0)], append=512))
    to_canvass(election)
    election.on_request_vote(0, 512, 3, 1, 0)
    assert election.state_value == ElectionState.FOLLOWER_BALLOT
    election.do_work(TIMEOUTS.election_timeout_ns)
    assert election.state_value == ElectionState.CANVASS
    new_leadership_term(
        election, log_term=0, next_term=2, next_base=512, next_pos=NULL_POSITION, term=2, base=512, pos=512, leader=2
    )
    assert election.state_value == ElectionState.CANVASS
    new_leadership_term(
        election, log_term=0, next_term=3, next_base=512, next_pos=NULL_POSITION, term=3, base=512, pos=512, leader=1
    )
    assert election.state_value == ElectionState.FOLLOWER_REPLAY


def test_a_member_votes_only_while_canvassing_nominating_or_in_a_ballot() -> None:
    for state_name in ("CANVASS", "NOMINATE", "CANDIDATE_BALLOT", "FOLLOWER_BALLOT"):
        election, host, publisher = make(host=FakeHost([(0, 0)], append=512))
        to_canvass(election)
        election.state(ElectionState[state_name], 1)
        election.on_request_vote(0, 512, 4, 1, 0)
        assert [f["vote"] for _, f in publisher.named("place_vote")] == [True], state_name
        assert election.state_value == ElectionState.FOLLOWER_BALLOT, state_name


def test_a_candidate_that_hears_a_leader_is_a_follower_through_replay() -> None:
    """The role counter says FOLLOWER from FOLLOWER_REPLAY (and FOLLOWER_LOG_REPLICATION)
    on, as Aeron's election sets it, not CANDIDATE until the election closes."""
    election, host, publisher = make(host=FakeHost([(0, 0)], append=1024))
    to_canvass(election)
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.on_canvass_position(0, 1024, 0, 2, 0)
    election.do_work(1)
    election.do_work(election.nomination_deadline_ns)
    assert host.role == ClusterRole.CANDIDATE
    host.replay_finished = False
    new_leadership_term(
        election, log_term=0, next_term=1, next_base=1024, next_pos=NULL_POSITION, term=1, base=1024, pos=1024
    )
    assert election.state_value == ElectionState.FOLLOWER_REPLAY
    assert host.role == ClusterRole.FOLLOWER


def test_leader_in_election_gives_up_without_a_quorum() -> None:
    election, host, publisher = make(host=FakeHost([(0, 0)], append=0))
    to_canvass(election)
    election.on_canvass_position(0, 0, 0, 1, 0)
    election.on_canvass_position(0, 0, 0, 2, 0)
    election.do_work(1)
    start = election.nomination_deadline_ns
    election.do_work(start)
    election.on_vote(1, 0, 0, 0, 1, True)
    election.on_vote(1, 0, 0, 0, 2, True)
    election.do_work(start + 1)
    election.do_work(start + 1 + TIMEOUTS.leader_heartbeat_timeout_ns)
    assert election.state_value == ElectionState.CANVASS


def test_compare_log_orders_by_term_then_position() -> None:
    assert compare_log(1, 0, 0, 10_000) > 0
    assert compare_log(1, 64, 1, 128) < 0
    assert compare_log(2, 64, 2, 64) == 0


# --------------------------------------------------------------------------- codecs round trip


class Link:
    def __init__(self) -> None:
        self.messages: list[bytes] = []

    def offer(self, buffer: bytes) -> int:
        self.messages.append(buffer)
        return len(buffer)


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, args))


def test_publisher_and_adapter_round_trip_every_consensus_message() -> None:
    link = Link()
    publisher = ConsensusPublisher({1: link})
    assert publisher.canvass_position(
        1, log_leadership_term_id=0, log_position=A, leadership_term_id=0, follower_member_id=0
    )
    publisher.request_vote(1, log_leadership_term_id=0, log_position=A, candidate_term_id=1, candidate_member_id=0)
    publisher.place_vote(
        1,
        candidate_term_id=1,
        log_leadership_term_id=0,
        log_position=A,
        candidate_member_id=1,
        follower_member_id=0,
        vote=True,
    )
    publisher.new_leadership_term(
        1,
        log_leadership_term_id=0,
        next_leadership_term_id=1,
        next_term_base_log_position=B,
        next_log_position=C,
        leadership_term_id=2,
        term_base_log_position=C,
        log_position=D,
        leader_recording_id=0,
        timestamp=1737306989652,
        leader_member_id=1,
        log_session_id=1115055142,
        app_version=1,
        is_startup=False,
    )
    publisher.append_position(1, leadership_term_id=2, log_position=5280, follower_member_id=0, flags=1)
    publisher.commit_position(1, leadership_term_id=2, log_position=6880, leader_member_id=1)
    publisher.catchup_position(
        1, leadership_term_id=2, log_position=C, follower_member_id=0, catchup_endpoint="localhost:9005"
    )
    publisher.stop_catchup(1, leadership_term_id=3, follower_member_id=0)
    publisher.termination_position(1, leadership_term_id=2, log_position=D)
    publisher.termination_ack(1, leadership_term_id=2, log_position=D, member_id=0)
    assert not publisher.canvass_position(
        5, log_leadership_term_id=0, log_position=0, leadership_term_id=0, follower_member_id=0
    )  # no publication to member 5
    listener = Listener()
    adapter = ConsensusAdapter(listener)
    for message in link.messages:
        adapter.on_fragment(message, 0, len(message))
    assert adapter.errors == 0
    assert listener.calls == [
        ("on_canvass_position", (0, A, 0, 0, 65536)),
        ("on_request_vote", (0, A, 1, 0, 65536)),
        ("on_vote", (1, 0, A, 1, 0, True)),
        ("on_new_leadership_term", (0, 1, B, C, 2, C, D, 0, 1737306989652, 1, 1115055142, 1, False)),
        ("on_append_position", (2, 5280, 0, 1)),
        ("on_commit_position", (2, 6880, 1)),
        ("on_catchup_position", (2, C, 0, "localhost:9005")),
        ("on_stop_catchup", (3, 0)),
        ("on_termination_position", (2, D)),
        ("on_termination_ack", (2, D, 0)),
    ]


def test_adapter_passes_on_the_requests_of_tools_that_are_not_members() -> None:
    """BackupQuery, HeartbeatRequest and StandbySnapshot (a cluster backup's and
    other tools' requests on the consensus stream) reach the listener decoded."""
    buffer = bytearray(1024)
    messages = []
    length = codecs.BackupQueryEncoder.encode(
        buffer,
        0,
        correlation_id=11,
        response_stream_id=108,
        version=65536,
        response_channel="aeron:udp?endpoint=127.0.0.1:9100",
        encoded_credentials=b"user:pw",
    )
    messages.append(bytes(buffer[:length]))
    length = codecs.HeartbeatRequestEncoder.encode(
        buffer,
        0,
        correlation_id=12,
        response_stream_id=109,
        response_channel="aeron:udp?endpoint=127.0.0.1:9101",
        encoded_credentials=b"",
    )
    messages.append(bytes(buffer[:length]))
    length = codecs.StandbySnapshotEncoder.encode(
        buffer,
        0,
        correlation_id=13,
        version=65536,
        response_stream_id=110,
        snapshots=[
            dict(
                recording_id=5,
                leadership_term_id=2,
                term_base_log_position=0,
                log_position=4096,
                timestamp=99,
                service_id=0,
                archive_endpoint="127.0.0.1:8010",
            )
        ],
        response_channel="aeron:udp?endpoint=127.0.0.1:9102",
        encoded_credentials=b"x",
    )
    messages.append(bytes(buffer[:length]))
    listener = Listener()
    adapter = ConsensusAdapter(listener)
    for message in messages:
        adapter.on_fragment(message, 0, len(message))
    assert adapter.errors == 0
    assert listener.calls[:2] == [
        ("on_backup_query", (11, 108, 65536, "aeron:udp?endpoint=127.0.0.1:9100", b"user:pw")),
        ("on_heartbeat_request", (12, 109, "aeron:udp?endpoint=127.0.0.1:9101", b"")),
    ]
    name, (correlation_id, version, stream_id, snapshots, channel, credentials) = listener.calls[2]
    assert (name, correlation_id, version, stream_id, channel, credentials) == (
        "on_standby_snapshot",
        13,
        65536,
        110,
        "aeron:udp?endpoint=127.0.0.1:9102",
        b"x",
    )
    assert [
        (s.recording_id, s.leadership_term_id, s.log_position, s.service_id, s.archive_endpoint) for s in snapshots
    ] == [(5, 2, 4096, 0, "127.0.0.1:8010")]
    # A truncated one is an error the adapter counts, not an exception.
    adapter.on_fragment(messages[0][:20], 0, 20)
    assert adapter.errors == 1


def test_adapter_counts_bad_fragments_without_raising() -> None:
    errors: list[str] = []
    adapter = ConsensusAdapter(Listener(), error_handler=errors.append)
    adapter.on_fragment(b"\x01\x02", 0, 2)
    adapter.on_fragment(bytes(8) + bytes(32), 0, 40)  # schema 0
    link = Link()
    ConsensusPublisher({1: link}).commit_position(1, leadership_term_id=1, log_position=2, leader_member_id=0)
    adapter.on_fragment(link.messages[0][:12], 0, 12)  # truncated body
    bad_template = bytearray(link.messages[0])
    bad_template[2] = 99
    adapter.on_fragment(bytes(bad_template), 0, len(bad_template))
    assert adapter.errors == 4 and len(errors) == 4


@pytest.mark.parametrize("state", list(ElectionState))
def test_every_state_has_a_method(state: ElectionState) -> None:
    assert callable(getattr(Election, state.name.lower()))


def test_a_leader_that_closed_in_order_is_not_waited_for() -> None:
    """Aeron's gracefulClosedLeaderId: the leader's log ended with its end of
    stream (it stopped in order), so the other two need neither its canvass
    nor its vote: one stands at once and leads on their two votes, instead of
    waiting the heartbeat timeout from the leader's last word and then the
    election timeout.  Heard again, it counts again."""
    host = FakeHost([(0, 0)], append=1024)
    host.last_leader_update_ns = 5 * S  # the leader spoke just now
    election, host, publisher = make(host=host, graceful_closed_leader_id=2)
    to_canvass(election, 5 * S)
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.do_work(5 * S + 1)
    assert election.state_value == ElectionState.NOMINATE
    election.do_work(election.nomination_deadline_ns)
    assert election.state_value == ElectionState.CANDIDATE_BALLOT
    election.on_vote(1, 0, 1024, 0, 1, True)
    election.do_work(election.nomination_deadline_ns + 1)
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION


def test_a_leader_that_closed_in_order_counts_again_once_heard() -> None:
    host = FakeHost([(0, 0)], append=1024)
    host.last_leader_update_ns = 5 * S
    election, host, publisher = make(host=host, graceful_closed_leader_id=2)
    to_canvass(election, 5 * S)
    election.on_canvass_position(0, 512, 0, 2, 0)  # it restarted and canvasses
    election.on_canvass_position(0, 1024, 0, 1, 0)
    election.do_work(5 * S + 1)
    assert election.state_value == ElectionState.NOMINATE  # all three canvassed: unanimous
    election.do_work(election.nomination_deadline_ns)
    election.on_vote(1, 0, 1024, 0, 1, True)
    election.do_work(election.nomination_deadline_ns + 1)
    assert election.state_value == ElectionState.CANDIDATE_BALLOT  # member 2's vote is awaited again


def test_a_leader_in_its_election_gives_way_to_a_member_whose_log_is_in_a_newer_term() -> None:
    """Aeron's onCanvassPosition: in LEADER_LOG_REPLICATION (or LEADER_READY)
    a canvass from a member whose log's last term is newer than this leader's
    term means another election is under way: this leader canvasses again."""
    election, host, publisher = _leading_in_election()
    election.on_canvass_position(1, 4096, 0, 2, 0)  # member 2's log is in term 1, its leadership term 0
    assert election.state_value == ElectionState.LEADER_LOG_REPLICATION  # (term 1 is this leader's own)
    election.on_canvass_position(2, 4096, 0, 2, 0)
    assert election.state_value == ElectionState.CANVASS
