"""The leader's commit position (Aeron's ConsensusModuleAgent.updateLeaderPosition):
the quorum position of what the members have recorded, but never past what the
leader's own archive has recorded.  Its services read the spy of its log up to
commit-pos, and whatever they apply must be in its archive: a leader whose
archive lags behind two followers' would otherwise commit (and tell the
followers it committed) a log it does not hold itself.

The module here is a real ``ConsensusModuleAgent`` (member 1 of three) on a
real media driver; the followers' append positions and the leader's own
recorded position are set as the consensus messages and the archive's rec-pos
counter would set them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fulmar.archive.protocol import RECORDING_POSITION_TYPE_ID
from fulmar.consensus.agent import ConsensusModuleAgent, ConsensusModuleState
from fulmar.security import CredentialsAuthenticator
from support.cluster import bare_member_agent
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system


class RecordingPublisher:
    """The consensus publisher's CommitPosition, as the followers would get it."""

    def __init__(self) -> None:
        self.commit_positions: list[tuple[int, int]] = []  # (to member, log position)

    def commit_position(
        self, to_member_id: int, *, leadership_term_id: int, log_position: int, leader_member_id: int
    ) -> bool:
        self.commit_positions.append((to_member_id, log_position))
        return True


@pytest.fixture
def leader(start_driver: Any, tmp_path: Path) -> Iterator[tuple[ConsensusModuleAgent, RecordingPublisher]]:
    driver = start_driver()
    aeron = driver.connect()
    agent = bare_member_agent(aeron, tmp_path)  # the leader of term 0, its log from position 0
    publisher = RecordingPublisher()
    agent.consensus_publisher = publisher
    try:
        yield agent, publisher
    finally:
        agent.close()
        aeron.close()


def followers_recorded(agent: ConsensusModuleAgent, positions: dict[int, int], now_ns: int) -> None:
    """The followers' AppendPosition messages, just received."""
    for member_id, position in positions.items():
        agent._followers[member_id].log_position = position
        agent._followers[member_id].time_of_last_append_position_ns = now_ns


def test_the_leader_commits_no_further_than_its_own_archive_recorded(leader: Any) -> None:
    agent, publisher = leader
    now_ns = 10_000_000_000
    # Both followers' archives hold 4096 bytes of the log, the leader's only 1024.
    followers_recorded(agent, {0: 4096, 2: 4096}, now_ns)
    agent.append_position = 1024
    agent._update_quorum_commit_position(now_ns)
    assert agent.commit_position == agent.commit_position_counter.get() == 1024
    assert {position for _, position in publisher.commit_positions} == {1024}

    # Its archive catches up: the rest is committed.
    publisher.commit_positions.clear()
    agent.append_position = 4096
    agent._update_quorum_commit_position(now_ns + 1)
    assert agent.commit_position == agent.commit_position_counter.get() == 4096
    assert sorted(publisher.commit_positions) == [(0, 4096), (2, 4096)]


def test_the_leader_ahead_of_its_followers_commits_what_a_quorum_recorded(leader: Any) -> None:
    agent, publisher = leader
    now_ns = 10_000_000_000
    followers_recorded(agent, {0: 4096, 2: 512}, now_ns)
    agent.append_position = 8192
    agent._update_quorum_commit_position(now_ns)
    assert agent.commit_position == agent.commit_position_counter.get() == 4096
    assert {position for _, position in publisher.commit_positions} == {4096}


def test_a_module_is_steady_only_with_nothing_of_its_own_left_and_has_work_sees_its_archive(leader: Any) -> None:
    """A steady module (no election, ACTIVE, no service message left to
    append) goes to sleep right after a cycle that worked, without a further
    cycle that would find nothing: what the next cycle could do is then only
    what arrives, and ``has_work`` (checked after the module has registered as
    a sleeper) sees it, the archive's recorded position included, for a
    single member as for a leader of several."""
    agent, _ = leader
    agent.state = ConsensusModuleState.ACTIVE
    assert agent.is_steady()
    agent.pending_service_messages.append((1, b"a message a service sent"))
    assert not agent.is_steady()  # appended by the next cycle: that one still runs
    agent.pending_service_messages.clear()
    agent.state = ConsensusModuleState.SNAPSHOT
    assert not agent.is_steady()
    agent.state = ConsensusModuleState.ACTIVE

    rec_pos = agent.aeron.add_counter(RECORDING_POSITION_TYPE_ID, "rec-pos: a test's log recording")
    try:
        agent._recording_position_counter_id = rec_pos.id
        agent._recording_position_registration_id = rec_pos.registration_id
        agent.append_position = 1024
        rec_pos.set(1024)
        for multi_member in (True, False):
            agent.is_multi_member = multi_member
            assert not agent.has_work()
            rec_pos.set(2048)  # the archive recorded more: a follower reports it, a leader commits
            assert agent.has_work()
            rec_pos.set(1024)
    finally:
        agent.is_multi_member = True
        rec_pos.close()


def test_a_module_without_a_conductor_thread_reads_the_drivers_news_at_once(start_driver: Any, tmp_path: Path) -> None:
    """The module runs its client conductor itself.  What the driver broadcast
    (a new image: a client's ingress, the archive's responses) shows in
    ``has_work`` and is read in the next cycle, not at the next slow tick
    (before, a client's connect waited up to one slow tick for its image)."""
    driver = start_driver()
    aeron = driver.connect(use_conductor_thread=False)
    agent = bare_member_agent(aeron, tmp_path)
    try:
        agent.state = ConsensusModuleState.ACTIVE
        while aeron.do_work() > 0:
            pass
        assert not agent.has_work()
        with driver.connect() as other:
            other.add_publication("aeron:ipc", 4242)  # its response goes out on the broadcast to every client
            wait_for(agent.has_work, 10, "the module to see the driver's news")
            agent._slow_tick_deadline_ns = time.monotonic_ns() + 60_000_000_000  # no slow tick in this cycle
            agent.do_work(time.monotonic_ns())
            assert not aeron.conductor.has_driver_news()
            assert not agent.has_work()
    finally:
        agent.close()
        aeron.close()


def test_a_steady_leader_is_woken_by_its_own_recording_only_while_that_holds_the_commit(leader: Any) -> None:
    """A leader's own archive records an append long before a follower's
    AppendPosition comes back, so a wake-up for that recording would find
    nothing to commit.  The leader watches its rec-pos only while its own
    recording is what holds the commit back (the followers' quorum is past
    it), and then ``has_work`` sees a recording made in between; out of a
    steady ACTIVE state it always watches."""
    agent, _ = leader
    agent.state = ConsensusModuleState.ACTIVE
    agent.context.native_commit = (
        False  # the module's own commit (the native thread's: test_consensus_leader_commit_thread)
    )
    watch = agent.aeron.conductor.counter_watch()
    rec_pos = agent.aeron.add_counter(RECORDING_POSITION_TYPE_ID, "rec-pos: a test's log recording")
    try:
        agent._recording_position_counter_id = agent._watched_recording_counter_id = rec_pos.id
        agent._recording_position_registration_id = rec_pos.registration_id
        agent._watch_recording_counter(rec_pos.id)

        def watched() -> bool:
            return watch.doorbell_id in watch.watchers(rec_pos.id)

        now_ns = 10_000_000_000
        # The leader appended up to 4096 and has recorded 1024 of it; both followers have 4096.
        rec_pos.set(1024)
        followers_recorded(agent, {0: 4096, 2: 4096}, now_ns)
        agent._update_quorum_commit_position(now_ns)
        assert agent.commit_position == 1024
        assert watched()  # its own recording holds the commit at 1024
        rec_pos.set(4096)
        assert agent.has_work()

        # It records the rest: all of it is committed, and nothing more can be
        # until a follower reports more, so its recording wakes it no longer.
        agent._update_quorum_commit_position(now_ns + 1)
        assert agent.commit_position == 4096
        assert not watched()
        rec_pos.set(8192)  # its next append, recorded
        assert not agent.has_work()

        # One follower reports 8192: its cycle reads the recording anew and commits.
        followers_recorded(agent, {0: 8192}, now_ns + 2)
        agent._update_quorum_commit_position(now_ns + 2)
        assert agent.commit_position == 8192
        assert not watched()

        # A follower ahead of the leader's archive: watched again, and a
        # recording made before the module sleeps is seen by has_work.
        followers_recorded(agent, {2: 12288}, now_ns + 3)
        agent._update_quorum_commit_position(now_ns + 3)
        assert agent.commit_position == 8192
        assert watched()
        assert not agent.has_work()
        rec_pos.set(12288)
        assert agent.has_work()
        agent._update_quorum_commit_position(now_ns + 4)
        assert agent.commit_position == 12288
        assert not watched()

        # Not steady (a snapshot under way): it watches whatever the positions.
        agent.state = ConsensusModuleState.SNAPSHOT
        agent._update_quorum_commit_position(now_ns + 5)
        assert watched()
    finally:
        rec_pos.close()


def test_with_a_secret_the_module_keeps_its_native_threads_and_one_auth_context(
    start_driver: Any, tmp_path: Path
) -> None:
    """A secret no longer turns the native consensus threads off: the context
    keeps them, and the publisher's signer, the guard's verifier and the
    threads' arms share one member auth context (one send counter for the
    process, one memory of the counters taken)."""
    aeron = start_driver().connect()
    agent = bare_member_agent(aeron, tmp_path, authenticator=CredentialsAuthenticator(b"cluster-s3cret"))
    try:
        context = agent.context
        assert (context.native_commit, context.native_follower_commit, context.native_append_position) == (
            True,
            True,
            True,
        )
        auth = agent._member_auth
        assert auth is not None and auth.member_id == agent.member_id and auth.member_ids == {0, 1, 2}
        assert auth.window_ms == context.leader_heartbeat_timeout_ns // 1_000_000
        assert agent.consensus_publisher is not None and agent.consensus_publisher.signer.auth is auth
        guard = agent.consensus_adapter.guard
        assert guard is not None and guard.verifier is not None and guard.verifier.auth is auth
        assert agent.handovers.leader_commit.thread is not None  # started with the consensus streams
    finally:
        agent.close()
        aeron.close()
