"""Seed 000, the leader's commit: a steady leader's commit comes from the
native commit thread (``consensus/leader_commit.py``), which the followers'
AppendPositions wake, not from the module's duty cycle; the agent takes in
what the thread did, asks it for the heartbeat, and reads the consensus
stream itself again whenever something else is on it.

The module is a real ``ConsensusModuleAgent`` (member 1 of three) on a real
media driver, made leader by hand; exclusive publications to its consensus
endpoint stand in for members 0 and 2, and subscriptions at their endpoints
read the CommitPositions it sends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.archive.protocol import RECORDING_POSITION_TYPE_ID, recording_position_key
from fulmar.channel_uri import ChannelUri
from fulmar.clock import epoch_ms
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.agent import ClusterRole, ConsensusModuleAgent, ConsensusModuleState
from fulmar.consensus.cluster_member import find_member
from fulmar.consensus.leader_commit import IDLE, RUNNING
from fulmar.consensus.member_auth import MemberAuth, derive_key
from fulmar.consensus.protocol import field_offset
from fulmar.log_reader import Header
from fulmar.reader_doorbells import CounterWatch
from fulmar.security import CredentialsAuthenticator
from support.cluster import bare_member_agent
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TERM = 3
SECRET = b"cluster-s3cret"


@pytest.fixture
def leader(start_driver: Any, tmp_path: Path) -> Iterator[tuple[ConsensusModuleAgent, Aeron]]:
    driver = start_driver()
    aeron = driver.connect()
    agent = bare_member_agent(aeron, tmp_path)
    try:
        yield agent, aeron
    finally:
        agent.close()
        aeron.close()


class Followers:
    """Members 0 and 2, as far as the leader's consensus stream goes."""

    def __init__(self, agent: ConsensusModuleAgent, aeron: Aeron) -> None:
        base = ChannelUri.parse(agent.context.consensus_channel)
        stream = agent.context.consensus_stream_id
        me = find_member(agent.members, agent.member_id)
        self.to_leader = {
            member: aeron.add_exclusive_publication(str(base.with_param("endpoint", me.consensus_endpoint)), stream)
            for member in (0, 2)
        }
        self.at_follower = {
            member: aeron.add_subscription(
                str(base.with_param("endpoint", find_member(agent.members, member).consensus_endpoint)), stream
            )
            for member in (0, 2)
        }
        self.commits: dict[int, list[tuple[int, int, int]]] = {0: [], 2: []}
        self._decoder = codecs.CommitPositionDecoder()
        for publication in self.to_leader.values():
            wait_for(lambda: publication.is_connected, 10, "a follower's publication to the leader")
        for member, to_follower in agent._consensus_publications.items():
            wait_for(lambda: to_follower.is_connected, 10, f"the leader's publication to member {member}")

    def send(self, member: int, encoder: Any, **fields: int) -> None:
        buffer = bytearray(128)
        length = encoder.encode(buffer, 0, **fields)
        publication = self.to_leader[member]
        wait_for(lambda: publication.offer(bytes(buffer[:length])) > 0, 10, f"member {member}'s offer")

    def report(self, member: int, position: int) -> None:
        self.send(
            member,
            codecs.AppendPositionEncoder,
            leadership_term_id=TERM,
            log_position=position,
            follower_member_id=member,
            flags=0,
        )

    def commit_positions(self, member: int, count: int) -> list[int]:
        """The positions of the first ``count`` CommitPositions member got."""
        received = self.commits[member]

        def on_fragment(buffer: memoryview, offset: int, length: int, header: Header) -> None:
            body = self._decoder.wrap(buffer, offset + codecs.HEADER_LENGTH, length=length - codecs.HEADER_LENGTH)
            received.append((body.leadership_term_id, body.log_position, body.leader_member_id))

        def arrived() -> bool:
            self.at_follower[member].poll(on_fragment, 10)
            return len(received) >= count

        wait_for(arrived, 10, f"{count} CommitPosition(s) at member {member} (have {received})")
        assert all((term, leader) == (TERM, 1) for term, _, leader in received)
        return [position for _, position, _ in received]


def make_leader(agent: ConsensusModuleAgent, aeron: Aeron, now_ns: int) -> Any:
    """Member 1, the steady leader of term 3 with its log recording's rec-pos counter."""
    agent.state = ConsensusModuleState.ACTIVE
    agent.role = ClusterRole.LEADER
    agent.leader_member_id = agent.member_id
    agent.leadership_term_id = TERM
    agent.log_recording_id, agent.log_session_id, agent._archive_id = 5, 77, 9
    agent._slow_tick_deadline_ns = now_ns + 3_600_000_000_000  # (no archive here to tick)
    for follower in agent._followers.values():
        follower.time_of_last_append_position_ns = now_ns
    return aeron.add_counter(
        RECORDING_POSITION_TYPE_ID, "rec-pos stand-in", recording_position_key(5, 77, "stand-in", 9)
    )


def test_a_steady_leader_commits_from_the_native_thread(leader: Any) -> None:
    agent, aeron = leader
    now_ns = time.monotonic_ns()
    rec_pos = make_leader(agent, aeron, now_ns)
    followers = Followers(agent, aeron)
    commit_pos = agent.commit_position_counter.id
    reader = aeron.counters_reader
    agent.do_work(now_ns)
    thread = agent.handovers.leader_commit.thread
    assert thread is not None and thread.is_armed
    assert thread.follower_ids == (0, 2)
    assert followers.commit_positions(0, 1) == [0]  # the first commit position, from the thread

    # The leader's archive records and member 0 reports the same: committed,
    # with no cycle of the agent, and both followers are told.
    rec_pos.set(4096)
    aeron.conductor.ring_counter_watchers(rec_pos.id)
    followers.report(0, 4096)
    wait_for(lambda: reader.counter_value(commit_pos) == 4096, 10, "the thread to commit")
    assert followers.commit_positions(0, 2) == [0, 4096]
    assert followers.commit_positions(2, 2) == [0, 4096]
    assert agent.commit_position == 0  # the agent has not looked yet
    assert agent.aeron.conductor.doorbell_id not in CounterWatch(aeron.conductor.cnc.counters_values, 0).watchers(
        rec_pos.id
    )
    agent.do_work(now_ns)
    assert agent.commit_position == 4096
    assert agent._followers[0].log_position == 4096
    assert agent._followers[0].time_of_last_append_position_ns > now_ns
    assert agent._follower_position_counters[0].get() == 4096  # shown to operators as before

    # Something else on the stream: the thread stops before it and rings the
    # agent, whose next cycle takes the stream back, reads it (and the report
    # behind it) and then arms the thread again.
    adapter = agent.consensus_adapter
    polls = []
    real_poll = adapter.poll

    def counted_poll() -> int:
        polls.append(not thread.is_armed)
        return real_poll()

    adapter.poll = counted_poll
    followers.send(0, codecs.CommitPositionEncoder, leadership_term_id=TERM - 1, log_position=1, leader_member_id=0)
    followers.report(2, 4096 + 64)
    wait_for(lambda: thread.state().status != RUNNING, 10, "the thread to hand back")
    agent.do_work(now_ns)
    assert polls == [True]  # one poll by the agent, with the thread halted
    assert thread.is_armed
    assert agent._followers[2].log_position == 4096 + 64
    agent.do_work(now_ns)
    assert polls == [True]  # armed: the agent leaves the stream to the thread

    # A heartbeat interval after the last CommitPosition the agent asks the thread for one.
    later_ns = thread.state().sent_time_ns + agent.context.leader_heartbeat_interval_ns
    for follower in agent._followers.values():
        follower.time_of_last_append_position_ns = later_ns
    sent = len(followers.commits[2])
    agent.do_work(later_ns)
    assert followers.commit_positions(2, sent + 1)[-1] == 4096

    # Another member's publication comes: the thread is armed again with its image.
    extra = aeron.add_exclusive_publication(str(followers.to_leader[0].channel), agent.context.consensus_stream_id)
    wait_for(lambda: extra.is_connected, 10, "a third publication to the leader")

    def rearmed_with_three() -> bool:
        agent.do_work(later_ns)
        return len(thread.images) == 3

    wait_for(rearmed_with_three, 10, "the thread to be armed with the new image")

    agent.start_election("a test's")
    assert not thread.is_armed and thread.state().status == IDLE
    assert agent.commit_position == 4096


def test_without_the_thread_the_module_commits_itself(start_driver: Any, tmp_path: Path) -> None:
    """--agent-commit: a steady leader commits in its duty cycle (the thread,
    there for a follower's commit, is never armed as a leader's); with
    --agent-follower-commit as well there is no thread, and the consensus
    stream rings the module."""
    aeron = start_driver().connect()
    try:
        agent = bare_member_agent(aeron, tmp_path / "leader", native_commit=False)
        try:
            now_ns = time.monotonic_ns()
            make_leader(agent, aeron, now_ns)
            agent.do_work(now_ns)
            assert (
                agent.handovers.leader_commit.thread is not None and not agent.handovers.leader_commit.thread.is_armed
            )
            assert not agent.handovers.leader_commit.is_armed
        finally:
            agent.close()
        agent = bare_member_agent(aeron, tmp_path / "neither", native_commit=False, native_follower_commit=False)
        try:
            assert agent.handovers.leader_commit.thread is None
            assert "doorbell-id" not in ChannelUri.parse(agent._consensus_subscription.channel).params
        finally:
            agent.close()
    finally:
        aeron.close()


def test_with_a_secret_the_native_thread_commits_signed_reports_and_hands_forgeries_to_the_guard(
    start_driver: Any, tmp_path: Path
) -> None:
    """A cluster with a secret keeps the commit thread on: a follower's signed
    AppendPosition commits from the thread, the CommitPositions it sends are
    signed for each follower, and a stranger's AppendPosition (unsigned, or
    signed with a guessed key) commits nothing: the thread hands it to the
    agent, whose guard counts it (consensus-refused) and logs why, and the
    thread is armed again."""
    aeron = start_driver().connect()
    agent = bare_member_agent(aeron, tmp_path, authenticator=CredentialsAuthenticator(SECRET))
    errors: list[str] = []
    agent.record_error = errors.append
    try:
        now_ns = time.monotonic_ns()
        rec_pos = make_leader(agent, aeron, now_ns)
        followers = Followers(agent, aeron)
        key = derive_key(SECRET)
        member0 = MemberAuth(0, key, [0, 1, 2], 10_000)
        agent.do_work(now_ns)
        thread = agent.handovers.leader_commit.thread
        assert thread is not None and thread.is_armed, "the commit thread is off with a secret"

        def report(auth: MemberAuth, position: int) -> None:
            buffer = bytearray(64)
            length = codecs.AppendPositionEncoder.encode(
                buffer, 0, leadership_term_id=TERM, log_position=position, follower_member_id=0, flags=0
            )
            signed = auth.sign(bytes(buffer[:length]), 1, epoch_ms())
            wait_for(lambda: followers.to_leader[0].offer(signed) > 0, 10, "member 0's offer")

        rec_pos.set(4096)
        aeron.conductor.ring_counter_watchers(rec_pos.id)
        report(member0, 4096)
        reader = aeron.counters_reader
        wait_for(lambda: reader.counter_value(agent.commit_position_counter.id) == 4096, 10, "the thread to commit")
        assert followers.commit_positions(0, 2)[-1] == 4096
        assert thread.counts()["unauthenticated"] == 0

        # A CommitPosition as member 0 gets it: signed by the leader for member 0.
        at_member0: list[bytes] = []
        subscription = aeron.add_subscription(followers.at_follower[0].channel, agent.context.consensus_stream_id)
        wait_for(lambda: subscription.images, 10, "a second subscription at member 0")
        agent.handovers.leader_commit.thread.send_now()
        wait_for(
            lambda: (
                subscription.poll(lambda b, o, n, h: at_member0.append(bytes(b[o : o + n])), 10) >= 0
                and bool(at_member0)
            ),
            10,
            "a CommitPosition at member 0",
        )
        member_field = (field_offset(codecs._COMMIT_POSITION_LAYOUT, "leaderMemberId"), True)
        assert member0.check(at_member0[0], len(at_member0[0]), epoch_ms(), member_field) > 0

        refused = agent.consensus_refused_counter.get()
        rec_pos.set(1 << 30)  # the leader would commit whatever a quorum reported
        aeron.conductor.ring_counter_watchers(rec_pos.id)
        followers.report(0, 1 << 30)  # unsigned
        report(MemberAuth(0, derive_key(b"a guess"), [0, 1, 2], 10_000), 1 << 30)
        wait_for(lambda: thread.state().status != RUNNING, 10, "the thread to hand the forgery back")

        def guard_refused_both() -> bool:
            agent.do_work(now_ns)
            return agent.consensus_refused_counter.get() >= refused + 2

        wait_for(guard_refused_both, 10, "the agent's guard to refuse both")
        assert thread.counts()["unauthenticated"] >= 1
        assert agent.commit_position == 4096
        assert reader.counter_value(agent.commit_position_counter.id) == 4096
        assert agent._followers[0].log_position == 4096
        assert any("without a member trailer" in text for text in errors), errors
        assert any("wrong MAC" in text for text in errors), errors
        agent.do_work(now_ns)
        assert thread.is_armed and thread.state().status == RUNNING  # armed again
        report(member0, 1 << 30)
        wait_for(lambda: reader.counter_value(agent.commit_position_counter.id) == 1 << 30, 10, "a genuine commit")
    finally:
        agent.close()
        aeron.close()
