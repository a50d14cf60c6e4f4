"""Seed 000, follower ordering: a follower's consensus module reads the log up
to the notified commit position before it moves commit-pos, and moves it to
what it has read, so its services (which read the log up to commit-pos) never
apply a position the module has not.

The module here is a real ``ConsensusModuleAgent`` (member 1 of three) on a
real media driver; its log image is an IPC stream this test publishes to.
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
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.agent import ClusterRole, ConsensusModuleAgent, ConsensusModuleState
from fulmar.consensus.append_position_sender import IDLE
from fulmar.consensus.cluster_member import find_member
from fulmar.consensus.leader_commit import IDLE as COMMIT_IDLE
from fulmar.consensus.leader_commit import NEEDS_AGENT, RUNNING
from fulmar.consensus.protocol import session_message_frame
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header
from fulmar.reader_doorbells import THREAD_DOORBELL_TYPE_ID, CounterWatch
from support.cluster import bare_member_agent
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

LOG = "aeron:ipc?term-length=64k"
LOG_STREAM = 100
MESSAGES = 100  # more than the 64 fragments the module reads per poll


@pytest.fixture
def follower(start_driver: Any, tmp_path: Path) -> Iterator[tuple[ConsensusModuleAgent, Aeron]]:
    driver = start_driver()
    aeron = driver.connect()
    agent = bare_member_agent(aeron, tmp_path)  # a follower after its election, following the leader's log
    try:
        yield agent, aeron
    finally:
        agent.close()
        aeron.close()


def follow_timer_events(agent: ConsensusModuleAgent, aeron: Aeron, count: int) -> list[int]:
    """``count`` TimerEvents on a log the follower has joined, all of them
    notified as committed; the log position after each."""
    publication = aeron.add_exclusive_publication(LOG, LOG_STREAM)
    subscription = aeron.add_subscription(LOG, LOG_STREAM)
    image = wait_for(lambda: subscription.image_by_session_id(publication.session_id), 10, "the log image")
    buffer = bytearray(256)
    positions = []
    for correlation_id in range(count):
        length = codecs.TimerEventEncoder.encode(
            buffer, 0, leadership_term_id=0, correlation_id=correlation_id, timestamp=correlation_id
        )
        assert publication.offer(bytes(buffer[:length])) > 0
        positions.append(publication.position)
    agent.host.is_log_joined = True
    agent.on_log_image(image)
    agent.notify_commit_position(positions[-1])
    return positions


def make_steady_follower(agent: ConsensusModuleAgent, aeron: Aeron) -> Any:
    """Member 1, an ACTIVE follower of member 0 in term 3, with a stand-in
    for its log recording's rec-pos counter (returned)."""
    agent.state = ConsensusModuleState.ACTIVE
    agent.role = ClusterRole.FOLLOWER
    agent.leader_member_id = 0
    agent.leadership_term_id = 3
    agent.log_recording_id, agent.log_session_id, agent._archive_id = 5, 77, 9
    return aeron.add_counter(
        RECORDING_POSITION_TYPE_ID, "rec-pos stand-in", recording_position_key(5, 77, "stand-in", 9)
    )


def test_the_follower_module_reads_the_log_before_commit_pos_moves(follower: Any) -> None:
    agent, aeron = follower
    publication = aeron.add_exclusive_publication(LOG, LOG_STREAM)
    subscription = aeron.add_subscription(LOG, LOG_STREAM)
    image = wait_for(lambda: subscription.image_by_session_id(publication.session_id), 10, "the log image")
    buffer = bytearray(256)
    for correlation_id in range(MESSAGES):
        length = codecs.TimerEventEncoder.encode(
            buffer, 0, leadership_term_id=0, correlation_id=correlation_id, timestamp=correlation_id
        )
        assert publication.offer(bytes(buffer[:length])) > 0
    end = publication.position

    # What the follower's services could read when the module applies each message:
    # commit-pos must not yet include it.
    commit_when_applied: list[tuple[int, int]] = []

    def spy(message: memoryview, offset: int, length: int, header: Header) -> None:
        commit_when_applied.append((agent.commit_position_counter.get(), header.position))
        agent.log_adapter.on_message(message, offset, length, header)

    agent.log_adapter.assembler = FragmentAssembler(spy)
    agent.host.is_log_joined = True
    agent.on_log_image(image)
    agent.notify_commit_position(end)  # the leader's CommitPosition
    agent.append_position = end  # and this member's archive has recorded it all

    assert agent._apply_follower_log(agent.read_append_position()) > 0
    # Stopped short at its fragment limit: commit-pos is where the module is,
    # not the notified position (Aeron: commitPosition.proposeMaxRelease(logAdapter.position())).
    assert len(commit_when_applied) == 64
    assert agent.log_position == image.position < end
    assert agent.commit_position_counter.get() == agent.commit_position == image.position
    while agent.log_position < end:
        assert agent._apply_follower_log(agent.read_append_position()) > 0
    assert agent.commit_position_counter.get() == end
    assert len(commit_when_applied) == MESSAGES
    ahead = [(commit, position) for commit, position in commit_when_applied if commit >= position]
    assert not ahead, f"commit-pos included {len(ahead)} messages before the module applied them, e.g. {ahead[:3]}"
    assert agent._apply_follower_log(agent.read_append_position()) == 0  # nothing past the notified position


def test_the_follower_module_reads_no_further_than_its_archive_recorded(follower: Any) -> None:
    agent, aeron = follower
    positions = follow_timer_events(agent, aeron, 4)
    agent.append_position = positions[1]  # recorded: two messages of four
    agent._apply_follower_log(agent.read_append_position())
    assert agent.log_position == agent.commit_position_counter.get() == positions[1]
    assert not agent.has_work()  # the rest waits for the archive (its rec-pos counter), not a busy loop


def test_a_follower_whose_log_image_closes_starts_an_election(follower: Any) -> None:
    """As Aeron's follower ("log disconnected from leader"): once the log image
    is closed and nothing is left to read, the module starts an election; the
    archive records no other image, so waiting on would commit nothing more
    while the leader's heartbeats kept it a follower (a member left behind)."""
    agent, aeron = follower
    publication = aeron.add_exclusive_publication(LOG, LOG_STREAM)
    subscription = aeron.add_subscription(LOG, LOG_STREAM)
    image = wait_for(lambda: subscription.image_by_session_id(publication.session_id), 10, "the log image")
    agent.host.is_log_joined = True
    agent.on_log_image(image)
    elections: list[str] = []
    # The decision, not a real election (a graceful leader's id aside).
    agent.start_election = lambda reason, *graceful: elections.append(reason)

    agent.state = ConsensusModuleState.ACTIVE  # a follower serving, its election over
    now_ns = agent._now_ns
    agent._time_of_last_leader_message_ns = now_ns  # the leader is alive: no heartbeat timeout
    errors_before = agent.error_counter.get()
    agent._follower_work(now_ns)
    assert elections == [] and agent.error_counter.get() == errors_before  # an open image: it follows on
    subscription.close()
    assert image.is_closed
    assert agent._follower_work(now_ns) == 1
    assert elections == ["log disconnected from leader (end of stream: no)"]
    assert agent.error_counter.get() == errors_before + 1  # counted, as Aeron's WARN is


def test_the_follower_reports_every_position_it_takes_from_its_archive(follower: Any) -> None:
    """The archive may record more while a follower's cycle runs.  The cycle
    reads the archive's position once: what it sends in AppendPosition is what
    it holds as its append position, so a position recorded after that read is
    still ahead of it, which is what has_work looks for before the module sleeps
    (the archive's ring came while the module was awake).  Reading it again
    later in the cycle took in a position that was never sent, and the module
    slept a whole idle timeout before it reported it."""
    agent, aeron = follower
    positions = follow_timer_events(agent, aeron, 2)
    agent.role = ClusterRole.FOLLOWER
    agent.leader_member_id = 0
    sent: list[int] = []

    class Publisher:
        def append_position(self, to_member_id: int, *, log_position: int, **fields: Any) -> bool:
            sent.append(log_position)
            return True

    agent.consensus_publisher = Publisher()
    # The archive: the first message recorded when the cycle starts, the second
    # a moment later, while the cycle runs.
    recorded = iter(positions)
    last = [positions[0]]

    def archive_position() -> int:
        last[0] = next(recorded, last[0])
        agent.append_position = max(agent.append_position, last[0])
        return agent.append_position

    agent.read_append_position = archive_position
    agent._follower_work(time.monotonic_ns())
    assert sent == [positions[0]]
    assert agent.append_position == positions[0], "the cycle took in a position it did not report"
    # The next cycle reads the position the archive reached meanwhile and reports it.
    agent._follower_work(time.monotonic_ns())
    assert sent == positions
    assert agent.append_position == positions[1]


def test_a_steady_follower_hands_its_reports_to_the_native_thread(follower: Any) -> None:
    """Once steady, a follower's AppendPositions come from the native thread,
    woken by the archive's recording and not by the agent; the agent asks it
    for the heartbeat, watches the recording only while a commit waits on it,
    and takes the reports back when an election starts."""
    agent, aeron = follower
    rec_pos = make_steady_follower(agent, aeron)
    leader = find_member(agent.members, 0)
    to_leader = ChannelUri.parse(agent.context.consensus_channel).with_param("endpoint", leader.consensus_endpoint)
    at_leader = aeron.add_subscription(str(to_leader), agent.context.consensus_stream_id)
    reports: list[tuple[int, int, int]] = []
    decoder = codecs.AppendPositionDecoder()

    def on_fragment(buffer: memoryview, offset: int, length: int, header: Header) -> None:
        body = decoder.wrap(buffer, offset + codecs.HEADER_LENGTH, length=length - codecs.HEADER_LENGTH)
        reports.append((body.leadership_term_id, body.log_position, body.follower_member_id))

    def reported(count: int) -> list[tuple[int, int, int]]:
        def arrived() -> bool:
            at_leader.poll(on_fragment, 10)
            return len(reports) >= count

        wait_for(arrived, 10, f"{count} AppendPosition(s) at the leader (have {reports})")
        return reports

    watches = CounterWatch(aeron.conductor.cnc.counters_values, 0)
    agent_doorbell = aeron.conductor.doorbell_id
    now_ns = time.monotonic_ns()
    agent._slow_tick_deadline_ns = now_ns + 3_600_000_000_000  # (no archive here to tick)
    agent._time_of_last_leader_message_ns = now_ns
    wait_for(lambda: agent._consensus_publications[0].is_connected, 10, "the publication to the leader")
    agent.do_work(now_ns)
    sender = agent.handovers.append_position.thread
    assert sender is not None and sender.is_armed
    assert reported(1) == [(3, 0, 1)]
    # The archive records; the agent does nothing, the thread reports.
    rec_pos.set(8192)
    aeron.conductor.ring_counter_watchers(rec_pos.id)
    assert reported(2)[1] == (3, 8192, 1)
    assert watches.watchers(rec_pos.id) == [sender.doorbell_id]  # not the agent: nothing for it to do
    # A commit beyond what this member recorded: the agent must apply it once
    # recorded, so it watches the recording again.
    agent.notify_commit_position(16384)
    agent.do_work(now_ns)
    assert sorted(watches.watchers(rec_pos.id)) == sorted([sender.doorbell_id, agent_doorbell])
    # A heartbeat interval without a new position: the thread reports the same again, asked by the agent.
    later_ns = sender.state()[2] + agent.context.leader_heartbeat_interval_ns
    agent._time_of_last_leader_message_ns = later_ns
    agent.do_work(later_ns)
    assert reported(3)[2] == (3, 8192, 1)
    assert agent._last_append_position_sent == 8192

    agent.start_election("a test's")
    assert not sender.is_armed and sender.state()[0] == IDLE
    assert watches.watchers(rec_pos.id) == [agent_doorbell]  # the agent reports again


def test_a_followers_log_rings_a_doorbell_nobody_sleeps_on(follower: Any) -> None:
    """With the AppendPosition thread on, the leader's log landing has nothing
    for a follower's module to do (it applies what is committed and recorded,
    which CommitPosition and rec-pos wake it for): its log subscription names
    a thread doorbell of its own that nobody sleeps on (the driver accepts
    only such a counter of the same client)."""
    agent, aeron = follower
    host = agent.host
    host._channel_tag, host._log_session_id = aeron.next_correlation_id(), 55
    subscription = host._add_log_subscription()
    doorbell_id = agent.quiet_log_doorbell_id()
    assert doorbell_id is not None and doorbell_id != aeron.conductor.doorbell_id
    assert ChannelUri.parse(subscription.channel).params["doorbell-id"] == str(doorbell_id)
    assert aeron.counters_reader.counter_type_id(doorbell_id) == THREAD_DOORBELL_TYPE_ID
    subscription.close()
    agent.context.native_append_position = False  # the module reports itself: its log wakes it as before
    host._channel_tag = aeron.next_correlation_id()
    assert "doorbell-id" not in ChannelUri.parse(host._add_log_subscription().channel).params


def test_a_steady_follower_commits_from_the_native_thread(follower: Any) -> None:
    """Once steady, a follower's commit comes from the commit thread: the
    leader's CommitPositions and the log's client messages are its, the agent
    takes in what it did each cycle, applies itself whatever else the log
    holds (a timer here), and halts it for an election."""
    agent, aeron = follower
    rec_pos = make_steady_follower(agent, aeron)
    me = find_member(agent.members, agent.member_id)
    to_me = ChannelUri.parse(agent.context.consensus_channel).with_param("endpoint", me.consensus_endpoint)
    from_leader = aeron.add_exclusive_publication(str(to_me), agent.context.consensus_stream_id)
    wait_for(lambda: from_leader.is_connected, 10, "the leader's publication to this member")

    def commit_position(position: int, term: int = 3) -> None:
        buffer = bytearray(64)
        length = codecs.CommitPositionEncoder.encode(
            buffer, 0, leadership_term_id=term, log_position=position, leader_member_id=0
        )
        wait_for(lambda: from_leader.offer(bytes(buffer[:length])) > 0, 10, "the leader's offer")

    log = aeron.add_exclusive_publication(LOG, LOG_STREAM)
    image = wait_for(
        lambda: aeron.add_subscription(LOG, LOG_STREAM).image_by_session_id(log.session_id), 10, "the log image"
    )

    def append(message: bytes) -> int:
        assert log.offer(message) > 0
        return log.position

    positions = [append(session_message_frame(3, 1, 5) + b"order") for _ in range(2)]
    rec_pos.set(positions[1])
    agent.host.is_log_joined = True
    agent.on_log_image(image)
    now_ns = time.monotonic_ns()
    agent._slow_tick_deadline_ns = now_ns + 3_600_000_000_000  # (no archive here to tick)
    agent._time_of_last_leader_message_ns = now_ns
    agent.do_work(now_ns)
    thread = agent.handovers.leader_commit.thread
    assert thread is not None and thread.is_armed_as_follower and thread.log_image is image
    reader = aeron.counters_reader
    commit_pos = agent.commit_position_counter.id

    # The leader commits: commit-pos moves with no cycle of the agent.
    commit_position(positions[1])
    wait_for(lambda: reader.counter_value(commit_pos) == positions[1], 10, "the thread to commit")
    assert agent.commit_position == 0  # the agent has not looked yet
    agent.do_work(now_ns)
    assert (agent.notified_commit_position, agent.log_position, agent.commit_position) == (positions[1],) * 3
    assert agent._time_of_last_leader_message_ns > now_ns
    assert thread.is_armed_as_follower
    # The log and the consensus stream are the thread's: nothing for the agent to wake for.
    assert not agent.has_work()

    # A timer in the log: the thread stops before it; the agent's next cycle
    # takes the log back, applies it (the timer is no longer scheduled) and
    # the client message behind it, and arms the thread again.
    agent.timers.schedule(44, 1 << 60)
    timer = bytearray(64)
    length = codecs.TimerEventEncoder.encode(timer, 0, leadership_term_id=3, correlation_id=44, timestamp=6)
    end = append(session_message_frame(3, 1, 7) + b"order")
    end_of_timer = append(bytes(timer[:length]))
    end = append(session_message_frame(3, 1, 8) + b"order")
    rec_pos.set(end)
    commit_position(end)
    wait_for(lambda: thread.state().status == NEEDS_AGENT, 10, "the thread to hand the timer back")
    assert reader.counter_value(commit_pos) < end_of_timer
    agent.do_work(now_ns)
    assert 44 not in agent.timers
    assert agent.commit_position == reader.counter_value(commit_pos) == end
    assert thread.is_armed_as_follower and thread.state().status == RUNNING

    # A CommitPosition of a newer term: handed back to the agent, whose
    # election answers it (the decision is what is checked here); an election
    # halts the thread.
    newer_terms: list[int] = []
    agent.on_commit_position = lambda term, position, leader: newer_terms.append(term)
    commit_position(end, term=4)
    wait_for(lambda: thread.state().status == NEEDS_AGENT, 10, "the thread to hand the newer term back")
    agent.do_work(now_ns)
    assert newer_terms == [4]
    agent.start_election("a test's")
    assert not thread.is_armed and thread.state().status == COMMIT_IDLE
    assert image.position == end


def test_without_the_follower_commit_thread_the_module_applies_the_log(start_driver: Any, tmp_path: Path) -> None:
    """--agent-follower-commit: the thread is never armed as a follower's."""
    aeron = start_driver().connect()
    agent = bare_member_agent(aeron, tmp_path, native_follower_commit=False)
    try:
        positions = follow_timer_events(agent, aeron, 2)
        rec_pos = make_steady_follower(agent, aeron)
        rec_pos.set(positions[1])
        now_ns = time.monotonic_ns()
        agent._slow_tick_deadline_ns = now_ns + 3_600_000_000_000
        agent._time_of_last_leader_message_ns = now_ns
        agent.do_work(now_ns)
        assert agent.handovers.leader_commit.thread is not None and not agent.handovers.leader_commit.thread.is_armed
        assert agent.commit_position == positions[1]  # applied by the agent
    finally:
        agent.close()
        aeron.close()
