"""The leader's commit thread (``consensus/leader_commit.py``), on a real
media driver: exclusive IPC publications stand in for the followers'
publications to the leader (an image each in a subscription that names the
thread's doorbell), two counters for the leader's rec-pos and commit-pos,
and two IPC streams for the publications to the followers, whose
CommitPositions this test reads."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar._native import ffi, lib
from fulmar.aeron import Aeron
from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.leader_commit import (
    IDLE,
    LOG_MESSAGE,
    NEEDS_AGENT,
    OTHER_MESSAGE,
    RUNNING,
    ArmedFollower,
    CommitThread,
)
from fulmar.consensus.member_auth import MemberAuth, derive_key
from fulmar.consensus.protocol import field_offset, session_message_frame
from fulmar.reader_doorbells import CounterWatch
from fulmar.subscription import Subscription
from support.doorbells import doorbell_of
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

IPC = "aeron:ipc?term-length=64k"
CONSENSUS_STREAM = 108
TERM = 7
LEADER = 0
STAND_IN_TYPE_ID = 4001  # any type: the thread reads values and registration ids
NULL_POSITION = -1


@pytest.fixture
def thread(aeron: Aeron) -> Iterator[CommitThread]:
    commit_thread = CommitThread(aeron, doorbell_of(aeron))
    try:
        yield commit_thread
    finally:
        commit_thread.close()


class CommitPositions:
    """What reaches one follower's stream, decoded."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.received: list[tuple[int, int, int]] = []
        self.raw: list[bytes] = []  # each message as it came, a trailer included
        self._body = codecs.CommitPositionDecoder()

    def _on_fragment(self, buffer: memoryview, offset: int, length: int, header: Any) -> None:
        self.raw.append(bytes(buffer[offset : offset + length]))
        _, template_id, schema_id, _ = struct.unpack_from("<HHHH", buffer, offset)
        assert (template_id, schema_id) == (codecs.CommitPositionEncoder.TEMPLATE_ID, codecs.SCHEMA_ID)
        body = self._body.wrap(buffer, offset + codecs.HEADER_LENGTH, length=length - codecs.HEADER_LENGTH)
        self.received.append((body.leadership_term_id, body.log_position, body.leader_member_id))

    def wait_for(self, count: int) -> list[tuple[int, int, int]]:
        def arrived() -> bool:
            self.subscription.poll(self._on_fragment, 10)
            return len(self.received) >= count

        wait_for(arrived, 10, f"{count} CommitPosition(s) from the thread (have {self.received})")
        return self.received


class Leader:
    """A leader's surroundings: the consensus subscription, a publication from
    each follower, the counters, and the streams to the followers."""

    def __init__(self, aeron: Aeron, thread: CommitThread, follower_ids: tuple[int, ...] = (1, 2)) -> None:
        self.aeron = aeron
        self.thread = thread
        self.subscription = aeron.add_subscription(f"{IPC}|doorbell-id={thread.doorbell_id}", CONSENSUS_STREAM)
        self.from_followers = {
            member: aeron.add_exclusive_publication(IPC, CONSENSUS_STREAM) for member in follower_ids
        }
        wait_for(
            lambda: len(self.subscription.images) == len(follower_ids), 10, "an image of each follower's publication"
        )
        self.to_followers = {}
        self.commit_positions = {}
        for member in follower_ids:
            self.to_followers[member] = aeron.add_publication(IPC, 1000 + member)
            self.commit_positions[member] = CommitPositions(aeron.add_subscription(IPC, 1000 + member))
        for publication in self.to_followers.values():
            wait_for(lambda: publication.is_connected, 10, "the publication to a follower to connect")
        self.rec_pos = aeron.add_counter(STAND_IN_TYPE_ID, "rec-pos stand-in")
        self.commit_pos = aeron.add_counter(STAND_IN_TYPE_ID, "commit-pos stand-in")
        self.auth: MemberAuth | None = None  # the leader's, in a cluster with a secret

    def arm(self, **fields: int) -> None:
        self.thread.arm(
            self.subscription.images,
            [
                ArmedFollower(member, publication, fields.pop(f"position_{member}", 0), 0)
                for member, publication in self.to_followers.items()
            ],
            leadership_term_id=TERM,
            leader_member_id=LEADER,
            term_base_log_position=fields.pop("term_base", 0),
            commit_position=fields.pop("commit_position", 0),
            sent_position=fields.pop("sent_position", NULL_POSITION),
            sent_time_ns=0,
            recording_position_id=self.rec_pos.id,
            recording_position_registration_id=fields.pop("registration_id", self.rec_pos.registration_id),
            commit_position_id=self.commit_pos.id,
            auth=self.auth,
        )
        assert not fields, fields

    def record(self, position: int) -> None:
        """The leader's archive: the position, then a ring of rec-pos's watchers."""
        self.rec_pos.set(position)
        self.aeron.conductor.ring_counter_watchers(self.rec_pos.id)

    def report(self, member: int, position: int, term: int = TERM, reporter: int | None = None) -> None:
        """An AppendPosition from ``member`` (naming ``reporter`` in it, if given)."""
        message = bytearray(codecs.HEADER_LENGTH + codecs.AppendPositionEncoder.BLOCK_LENGTH)
        length = codecs.AppendPositionEncoder.encode(
            message,
            0,
            leadership_term_id=term,
            log_position=position,
            follower_member_id=member if reporter is None else reporter,
            flags=0,
        )
        self.offer(member, bytes(message[:length]))

    def offer(self, member: int, message: bytes) -> None:
        publication = self.from_followers[member]
        wait_for(lambda: publication.offer(message) > 0, 10, "the follower's offer")

    def commit(self) -> int:
        return self.aeron.counters_reader.counter_value(self.commit_pos.id)


def watchers(aeron: Aeron, counter_id: int) -> list[int]:
    return CounterWatch(aeron.conductor.cnc.counters_values, 0).watchers(counter_id)


def test_a_quorum_of_recorded_positions_commits_and_each_follower_is_told(aeron: Aeron, thread: CommitThread) -> None:
    leader = Leader(aeron, thread)
    leader.record(1024)
    leader.arm()
    # Nothing committed past the term's base yet; the followers hear of position 0 (the agent would tell them too).
    for member in (1, 2):
        assert leader.commit_positions[member].wait_for(1) == [(TERM, 0, LEADER)]
    before_ns = time.monotonic_ns()
    leader.report(1, 1024)  # with the leader's own recording: a quorum of three
    wait_for(lambda: leader.commit() == 1024, 10, "commit-pos to move to the quorum's position")
    for member in (1, 2):
        assert leader.commit_positions[member].wait_for(2)[1] == (TERM, 1024, LEADER)

    # The followers run ahead of the leader's archive: its recording holds the
    # commit, and the thread is woken by that recording, no report needed.
    leader.report(2, 4096)
    wait_for(lambda: thread.doorbell_id in watchers(aeron, leader.rec_pos.id), 10, "the thread to watch rec-pos")
    leader.report(1, 4096)
    wait_for(lambda: thread.state().follower_positions == (4096, 4096), 10, "both reports read")
    assert leader.commit() == 1024
    leader.record(2048)
    wait_for(lambda: leader.commit() == 2048, 10, "the recording to let the commit move")
    leader.record(4096)
    wait_for(lambda: leader.commit() == 4096, 10, "the recording to let the commit move")
    for member in (1, 2):
        assert [position for _, position, _ in leader.commit_positions[member].wait_for(4)] == [0, 1024, 2048, 4096]
    wait_for(lambda: thread.doorbell_id not in watchers(aeron, leader.rec_pos.id), 10, "rec-pos to be left alone")

    state = thread.state()
    assert (state.status, state.commit_position, state.sent_position) == (RUNNING, 4096, 4096)
    assert all(before_ns <= time_ns <= time.monotonic_ns() for time_ns in state.follower_times_ns)
    counts = thread.counts()
    assert (counts["append_positions"], counts["commits"], counts["commit_positions_sent"]) == (3, 3, 8)
    # The images' positions are the thread's, published in their sub-pos counters.
    images = leader.subscription.images
    for image, position in zip(images, state.image_positions):
        assert position > 0
        assert aeron.counters_reader.counter_value(image.subscriber_position_id) == position

    halted = thread.halt()
    assert halted is not None and halted.status == IDLE
    assert [image.position for image in images] == list(state.image_positions)  # the agent reads on from there
    assert not thread.is_armed


def test_reports_of_another_term_or_member_are_passed_over_and_other_messages_handed_back(
    aeron: Aeron, thread: CommitThread
) -> None:
    leader = Leader(aeron, thread)
    leader.record(8192)
    leader.arm(sent_position=0)
    leader.report(1, 4096, term=TERM - 1)  # an old term's: not this leader's business
    leader.report(1, 4096, reporter=9)  # not a member it leads
    wait_for(lambda: thread.counts()["append_positions"] == 2, 10, "the two reports read")
    assert thread.state().follower_positions == (0, 0)
    assert leader.commit() == 0

    agent_doorbell = aeron.conductor.data_doorbell
    token = agent_doorbell.prepare()  # the agent, asleep
    canvass = bytearray(64)
    length = codecs.CanvassPositionEncoder.encode(
        canvass,
        0,
        log_leadership_term_id=TERM,
        log_position=0,
        leadership_term_id=TERM,
        follower_member_id=1,
        protocol_version=0,
    )
    leader.offer(1, bytes(canvass[:length]))
    leader.report(1, 8192)  # behind the other message: the agent's to read
    assert agent_doorbell.wait(token, 10_000_000_000), "the agent was not rung"
    wait_for(lambda: thread.state().status == NEEDS_AGENT, 10, "the thread to hand back")
    assert thread.state().reason == OTHER_MESSAGE
    assert leader.commit() == 0

    images = {image.session_id: image for image in leader.subscription.images}
    thread.halt()
    read: list[int] = []
    image = images[leader.from_followers[1].session_id]

    def on_fragment(buffer: memoryview, offset: int, length: int, header: Any) -> None:
        read.append(struct.unpack_from("<H", buffer, offset + 2)[0])  # the template id

    def read_on() -> bool:
        image.poll(on_fragment, 10)
        return len(read) >= 2

    wait_for(read_on, 10, "the agent to read what the thread left")
    assert read == [codecs.CanvassPositionEncoder.TEMPLATE_ID, codecs.AppendPositionEncoder.TEMPLATE_ID]


def with_block_length(message: bytes, block_length: int) -> bytes:
    """The message with its SBE header's block length replaced."""
    edited = bytearray(message)
    struct.pack_into("<H", edited, 0, block_length)
    return bytes(edited)


def append_position(term: int, position: int, member: int) -> bytes:
    message = bytearray(codecs.HEADER_LENGTH + codecs.AppendPositionEncoder.BLOCK_LENGTH)
    length = codecs.AppendPositionEncoder.encode(
        message, 0, leadership_term_id=term, log_position=position, follower_member_id=member, flags=0
    )
    return bytes(message[:length])


# A block length past the message's end, one short of its last field (the
# agent's decoder refuses both), and a longer one of a newer version in a
# message that holds it (the decoder's to read: its extension rule).
OFF_BLOCK_LENGTHS = [(60_000, False), (codecs.AppendPositionEncoder.BLOCK_LENGTH - 1, False), (29, True)]


@pytest.mark.parametrize("block_length, decodable", OFF_BLOCK_LENGTHS)
def test_a_report_whose_block_length_is_not_the_schemas_is_handed_back_to_the_agent(
    aeron: Aeron, thread: CommitThread, block_length: int, decodable: bool
) -> None:
    """Read here, an AppendPosition with a forged block length passed for a
    report and never reached the agent, which counts and logs malformed
    consensus messages (a stranger's image on the consensus stream)."""
    leader = Leader(aeron, thread)
    leader.record(8192)
    leader.arm(sent_position=0)
    message = with_block_length(append_position(TERM, 4096, 1), block_length)
    if decodable:
        message += bytes(codecs.HEADER_LENGTH + block_length - len(message))
        report = codecs.decode(message, 0, len(message))
        assert isinstance(report, codecs.AppendPositionDecoder) and report.log_position == 4096
    else:
        with pytest.raises(CodecError):
            codecs.decode(message, 0, len(message))
    leader.offer(1, message)
    wait_for(lambda: thread.state().status == NEEDS_AGENT, 10, "the thread to hand back")
    assert thread.state().reason == OTHER_MESSAGE
    assert thread.counts()["append_positions"] == 0
    assert thread.state().follower_positions == (0, 0)
    assert leader.commit() == 0


def test_an_idle_thread_passes_each_ring_on_to_the_agent(aeron: Aeron, thread: CommitThread) -> None:
    """A follower's or candidate's consensus stream names the thread's doorbell
    too: nothing of it may wait for the agent's idle timeout."""
    leader = Leader(aeron, thread, follower_ids=(1,))
    agent_doorbell = aeron.conductor.data_doorbell
    for round_number in range(3):
        token = agent_doorbell.prepare()
        leader.report(1, 1024 * (round_number + 1))
        # Within 2 s: the thread's own sleep while not armed is 10 s, so only a relay of the ring answers.
        assert agent_doorbell.wait(token, 2_000_000_000), f"ring {round_number} not passed on"
        wait_for(lambda: thread.counts()["relayed"] >= round_number + 1, 10, "the relay to be counted")
    assert thread.state().status == IDLE
    assert leader.subscription.images[0].position == 0  # the thread read nothing


def test_no_commit_before_an_entry_of_the_term(aeron: Aeron, thread: CommitThread) -> None:
    """Raft's rule: the commit must pass the term's base position."""
    leader = Leader(aeron, thread)
    leader.record(4096)
    leader.arm(term_base=4096, commit_position=4096, sent_position=4096)
    leader.report(1, 4096)
    leader.report(2, 4096)
    wait_for(lambda: thread.state().follower_positions == (4096, 4096), 10, "both reports read")
    assert (leader.commit(), thread.counts()["commits"]) == (0, 0)
    leader.record(4160)
    leader.report(2, 4160)
    wait_for(lambda: leader.commit() == 4160, 10, "the first entry of the term to commit")


def test_a_heartbeat_repeats_the_commit_position(aeron: Aeron, thread: CommitThread) -> None:
    leader = Leader(aeron, thread)
    leader.record(512)
    leader.arm(position_1=512, commit_position=512, sent_position=512)
    thread.send_now()
    for member in (1, 2):
        assert leader.commit_positions[member].wait_for(1) == [(TERM, 512, LEADER)]
    assert thread.state().sent_time_ns > 0


def test_a_single_member_commits_its_own_recording_as_it_is_made(aeron: Aeron, thread: CommitThread) -> None:
    """No followers and no images: a single member's quorum is itself, and no
    term rule holds it (the agent arms it with NULL_POSITION as the base)."""
    rec_pos = aeron.add_counter(STAND_IN_TYPE_ID, "rec-pos stand-in")
    commit_pos = aeron.add_counter(STAND_IN_TYPE_ID, "commit-pos stand-in")
    rec_pos.set(256)
    thread.arm(
        (),
        (),
        leadership_term_id=TERM,
        leader_member_id=LEADER,
        term_base_log_position=NULL_POSITION,
        commit_position=0,
        sent_position=NULL_POSITION,
        sent_time_ns=0,
        recording_position_id=rec_pos.id,
        recording_position_registration_id=rec_pos.registration_id,
        commit_position_id=commit_pos.id,
    )
    assert thread.is_armed and not thread.is_armed_as_follower

    def committed(position: int) -> bool:
        return aeron.counters_reader.counter_value(commit_pos.id) == position

    wait_for(lambda: committed(256), 10, "what was recorded before the arming to be committed")
    # rec-pos is watched for good: each recording wakes the thread.
    wait_for(lambda: thread.doorbell_id in watchers(aeron, rec_pos.id), 10, "the thread to watch rec-pos")
    for position in (1024, 4096):
        rec_pos.set(position)
        aeron.conductor.ring_counter_watchers(rec_pos.id)
        wait_for(lambda: committed(position), 10, f"the recording to {position} to be committed")
    counts = thread.counts()
    assert (counts["commits"], counts["commit_positions_sent"], counts["refused"]) == (3, 0, 0)
    assert thread.halt() is not None and not thread.is_armed
    assert thread.doorbell_id not in watchers(aeron, rec_pos.id)


def test_a_rec_pos_counter_that_is_not_the_armed_one_hands_back(aeron: Aeron, thread: CommitThread) -> None:
    leader = Leader(aeron, thread)
    agent_doorbell = aeron.conductor.data_doorbell
    token = agent_doorbell.prepare()
    leader.arm(registration_id=leader.rec_pos.registration_id + 1)
    assert agent_doorbell.wait(token, 10_000_000_000), "the agent was not rung"
    wait_for(lambda: thread.state().status == NEEDS_AGENT, 10, "the thread to hand back")
    assert thread.state().reason == int(lib.FULMAR_LEADER_COMMIT_RECORDING_GONE)
    thread.send_now()  # a heartbeat asked of a stopped thread changes nothing
    assert thread.state().status == NEEDS_AGENT
    assert thread.counts()["commit_positions_sent"] == 0


def test_an_arming_the_thread_cannot_use_is_refused(aeron: Aeron, thread: CommitThread) -> None:
    leader = Leader(aeron, thread, follower_ids=(1,))
    leader.arm()
    good = ffi.new("fulmar_leader_commit_arm_t *", thread._arm[0])
    thread.halt()
    handle = thread._handle
    for field, value in (
        ("follower_count", -1),
        ("follower_count", int(lib.FULMAR_LEADER_COMMIT_MAX_FOLLOWERS) + 1),
        ("image_count", int(lib.FULMAR_LEADER_COMMIT_MAX_IMAGES) + 1),
        ("position_offset", good.message_length - 4),  # the position would end past the message
        ("log_position_offset", good.append_position_length - 4),
        ("recording_position_id", 1 << 30),  # not a counter
        ("commit_position_id", -1),
    ):
        bad = ffi.new("fulmar_leader_commit_arm_t *", good[0])
        setattr(bad, field, value)
        assert lib.fulmar_leader_commit_arm(handle, bad) == -1, field
        assert thread.state().status == IDLE
    bad = ffi.new("fulmar_leader_commit_arm_t *", good[0])
    bad.images[0].term_length = 65536 + 32  # not a power of two
    assert lib.fulmar_leader_commit_arm(handle, bad) == -1
    assert lib.fulmar_leader_commit_arm(handle, good) == 0
    lib.fulmar_leader_commit_halt(handle)


# ---------------------------------------------------------------- a follower's


LOG_STREAM = 100
LEADER_OF_FOLLOWER = 2  # the leader the follower's thread is armed with


class Follower:
    """A follower's surroundings: its consensus subscription (an exclusive
    publication stands in for the leader's to it), the leader's log and this
    member's image of it, and counters for its rec-pos and commit-pos."""

    def __init__(self, aeron: Aeron, thread: CommitThread) -> None:
        self.aeron = aeron
        self.thread = thread
        self.subscription = aeron.add_subscription(f"{IPC}|doorbell-id={thread.doorbell_id}", CONSENSUS_STREAM)
        self.from_leader = aeron.add_exclusive_publication(IPC, CONSENSUS_STREAM)
        wait_for(
            lambda: self.subscription.image_by_session_id(self.from_leader.session_id),
            10,
            "an image of the leader's publication",
        )
        self.log = aeron.add_exclusive_publication(IPC, LOG_STREAM)
        self.log_subscription = aeron.add_subscription(IPC, LOG_STREAM)
        self.log_image = wait_for(
            lambda: self.log_subscription.image_by_session_id(self.log.session_id), 10, "the log image"
        )
        self.rec_pos = aeron.add_counter(STAND_IN_TYPE_ID, "rec-pos stand-in")
        self.commit_pos = aeron.add_counter(STAND_IN_TYPE_ID, "commit-pos stand-in")
        self.auth: MemberAuth | None = None  # the follower's, in a cluster with a secret

    def arm(self, **fields: int) -> None:
        self.thread.arm_follower(
            self.subscription.images,
            self.log_image,
            leadership_term_id=TERM,
            leader_member_id=LEADER_OF_FOLLOWER,
            notified_commit_position=fields.pop("notified", 0),
            commit_position=fields.pop("commit_position", 0),
            leader_time_ns=0,
            recording_position_id=self.rec_pos.id,
            recording_position_registration_id=self.rec_pos.registration_id,
            commit_position_id=self.commit_pos.id,
            auth=self.auth,
        )
        assert not fields, fields

    def offer(self, message: bytes) -> None:
        wait_for(lambda: self.from_leader.offer(message) > 0, 10, "the leader's offer")

    def append(self, message: bytes) -> int:
        """The leader's log: the position after ``message``."""
        wait_for(lambda: self.log.offer(message) > 0, 10, "the log's offer")
        return self.log.position

    def client_message(self, session_id: int, payload: bytes = b"order") -> int:
        return self.append(session_message_frame(TERM, session_id, 1_700_000_000_000) + payload)

    def record(self, position: int) -> None:
        self.rec_pos.set(position)
        self.aeron.conductor.ring_counter_watchers(self.rec_pos.id)

    def commit_position(self, position: int, term: int = TERM, leader: int = LEADER_OF_FOLLOWER) -> None:
        """A CommitPosition from the leader (naming ``leader`` and ``term`` in it)."""
        message = bytearray(codecs.HEADER_LENGTH + codecs.CommitPositionEncoder.BLOCK_LENGTH)
        length = codecs.CommitPositionEncoder.encode(
            message, 0, leadership_term_id=term, log_position=position, leader_member_id=leader
        )
        wait_for(lambda: self.from_leader.offer(bytes(message[:length])) > 0, 10, "the leader's offer")

    def commit(self) -> int:
        return self.aeron.counters_reader.counter_value(self.commit_pos.id)


def test_a_follower_commits_the_client_messages_its_leader_committed_and_it_recorded(
    aeron: Aeron, thread: CommitThread
) -> None:
    follower = Follower(aeron, thread)
    positions = [follower.client_message(session_id) for session_id in (1, 2, 1)]
    follower.arm()
    assert thread.is_armed_as_follower and thread.follower_state().status == RUNNING
    # commit-pos's watchers (the services) are rung when it moves.
    assert aeron.conductor.counter_watch().watch(follower.commit_pos.id)
    services = aeron.conductor.data_doorbell
    token = services.prepare()
    before_ns = time.monotonic_ns()

    # Committed by the leader but not yet recorded here: nothing to apply, and
    # the recording is watched.
    follower.commit_position(positions[1])
    wait_for(lambda: thread.follower_state().notified_commit_position == positions[1], 10, "the CommitPosition")
    wait_for(lambda: thread.doorbell_id in watchers(aeron, follower.rec_pos.id), 10, "the thread to watch rec-pos")
    assert follower.commit() == 0
    # The archive records all three: the commit moves to the notified position, no further.
    follower.record(positions[2])
    wait_for(lambda: follower.commit() == positions[1], 10, "commit-pos to move to the notified position")
    assert services.wait(token, 10_000_000_000), "commit-pos's watchers were not rung"
    wait_for(lambda: thread.doorbell_id not in watchers(aeron, follower.rec_pos.id), 10, "rec-pos left alone")
    follower.commit_position(positions[2])
    wait_for(lambda: follower.commit() == positions[2], 10, "commit-pos to move to the end")

    state = thread.follower_state()
    assert (state.status, state.notified_commit_position, state.commit_position, state.log_position) == (
        RUNNING,
        positions[2],
        positions[2],
        positions[2],
    )
    assert before_ns <= state.leader_time_ns <= time.monotonic_ns()
    assert aeron.counters_reader.counter_value(follower.log_image.subscriber_position_id) == positions[2]
    counts = thread.counts()
    assert (counts["commit_positions_read"], counts["log_messages"], counts["commits"]) == (2, 3, 2)

    halted = thread.halt_follower()
    assert halted is not None and halted.status == IDLE
    assert follower.log_image.position == positions[2]  # the agent reads on from there
    assert [image.position for image in follower.subscription.images] == list(state.image_positions)
    assert not thread.is_armed


def test_a_follower_reads_no_message_past_the_commit(aeron: Aeron, thread: CommitThread) -> None:
    """Not even one that starts before the notified position: a commit
    position inside a message (no leader sends one) takes none of it."""
    follower = Follower(aeron, thread)
    positions = [follower.client_message(session_id) for session_id in (1, 2)]
    follower.record(positions[1])
    follower.arm(notified=positions[0] + 32)
    wait_for(lambda: follower.commit() == positions[0], 10, "the first message to be committed")
    assert thread.follower_state().log_position == positions[0]
    follower.commit_position(positions[1])
    wait_for(lambda: follower.commit() == positions[1], 10, "the second message to be committed")


def test_a_follower_passes_over_old_commit_positions_and_hands_back_a_newer_term(
    aeron: Aeron, thread: CommitThread
) -> None:
    follower = Follower(aeron, thread)
    end = follower.client_message(1)
    follower.record(end)
    follower.arm()
    follower.commit_position(end, term=TERM - 1)  # an old term's
    follower.commit_position(end, leader=LEADER_OF_FOLLOWER + 1)  # not the leader it follows
    wait_for(lambda: thread.counts()["commit_positions_read"] == 2, 10, "both read")
    assert thread.follower_state().notified_commit_position == 0
    assert follower.commit() == 0

    agent_doorbell = aeron.conductor.data_doorbell
    token = agent_doorbell.prepare()
    follower.commit_position(end, term=TERM + 1)  # a newer term: the agent's election
    assert agent_doorbell.wait(token, 10_000_000_000), "the agent was not rung"
    wait_for(lambda: thread.follower_state().status == NEEDS_AGENT, 10, "the thread to hand back")
    assert thread.follower_state().reason == OTHER_MESSAGE
    assert follower.commit() == 0
    thread.halt_follower()
    image = follower.subscription.image_by_session_id(follower.from_leader.session_id)
    assert image is not None
    terms: list[int] = []

    def on_fragment(buffer: memoryview, offset: int, length: int, header: Any) -> None:
        terms.append(struct.unpack_from("<q", buffer, offset + codecs.HEADER_LENGTH)[0])

    wait_for(lambda: image.poll(on_fragment, 10) > 0 or bool(terms), 10, "the agent to read what was left")
    assert terms == [TERM + 1]


@pytest.mark.parametrize("block_length, decodable", [(60_000, False), (19, False), (28, True)])
def test_a_follower_hands_back_a_commit_position_whose_block_length_is_not_the_schemas(
    aeron: Aeron, thread: CommitThread, block_length: int, decodable: bool
) -> None:
    follower = Follower(aeron, thread)
    end = follower.client_message(1)
    follower.record(end)
    follower.arm()
    message = bytearray(codecs.HEADER_LENGTH + codecs.CommitPositionEncoder.BLOCK_LENGTH)
    length = codecs.CommitPositionEncoder.encode(
        message, 0, leadership_term_id=TERM, log_position=end, leader_member_id=LEADER_OF_FOLLOWER
    )
    forged = with_block_length(bytes(message[:length]), block_length)
    if decodable:
        forged += bytes(codecs.HEADER_LENGTH + block_length - len(forged))
        report = codecs.decode(forged, 0, len(forged))
        assert isinstance(report, codecs.CommitPositionDecoder) and report.log_position == end
    else:
        with pytest.raises(CodecError):
            codecs.decode(forged, 0, len(forged))
    wait_for(lambda: follower.from_leader.offer(forged) > 0, 10, "the leader's offer")
    wait_for(lambda: thread.follower_state().status == NEEDS_AGENT, 10, "the thread to hand back")
    assert thread.follower_state().reason == OTHER_MESSAGE
    assert thread.follower_state().notified_commit_position == 0
    assert follower.commit() == 0


def test_a_follower_hands_back_any_log_entry_but_a_client_message(aeron: Aeron, thread: CommitThread) -> None:
    """Only a client's message (a session id that is not negative) is the
    thread's: a timer, a service's message, a session's opening, a fragment
    are the module's to apply, and commit-pos stops before them."""
    timer = bytearray(64)
    length = codecs.TimerEventEncoder.encode(timer, 0, leadership_term_id=TERM, correlation_id=5, timestamp=9)
    entries = (
        ("a timer", bytes(timer[:length])),
        ("a service's message", session_message_frame(TERM, -3, 9) + b"to the cluster"),
        ("a fragmented message", session_message_frame(TERM, 1, 9) + bytes(3_000)),
    )
    for what, entry in entries:
        follower = Follower(aeron, thread)
        before = follower.client_message(4)
        end = follower.append(entry)
        after = follower.client_message(4)
        follower.record(after)
        follower.arm(notified=after)
        wait_for(lambda: thread.follower_state().status == NEEDS_AGENT, 10, f"{what} to be handed back")
        state = thread.follower_state()
        assert (state.reason, state.log_position, follower.commit()) == (LOG_MESSAGE, before, before), what
        assert thread.halt_follower() is not None
        assert follower.log_image.position == before < end, what
        for closable in (follower.subscription, follower.from_leader, follower.log, follower.log_subscription):
            closable.close()


def test_a_follower_arming_the_thread_cannot_use_is_refused(aeron: Aeron, thread: CommitThread) -> None:
    follower = Follower(aeron, thread)
    follower.arm()
    good = ffi.new("fulmar_follower_commit_arm_t *", thread._follower_arm[0])
    thread.halt_follower()
    handle = thread._handle
    for field, value in (
        ("image_count", int(lib.FULMAR_LEADER_COMMIT_MAX_IMAGES) + 1),
        ("log_position_offset", good.commit_position_length - 4),
        ("cluster_session_id_offset", 8 + good.session_message_block_length - 4),
        ("recording_position_id", 1 << 30),
        ("commit_position_id", -1),
    ):
        bad = ffi.new("fulmar_follower_commit_arm_t *", good[0])
        setattr(bad, field, value)
        assert lib.fulmar_leader_commit_arm_follower(handle, bad) == -1, field
        assert thread.state().status == IDLE
    bad = ffi.new("fulmar_follower_commit_arm_t *", good[0])
    bad.log.log = ffi.NULL
    assert lib.fulmar_leader_commit_arm_follower(handle, bad) == -1
    assert lib.fulmar_leader_commit_arm_follower(handle, good) == 0
    assert lib.fulmar_leader_commit_send_now(handle, 0) == -1  # a leader's heartbeat: not a follower's thread
    lib.fulmar_leader_commit_halt(handle)


# ---------------------------------------------------------------- with a secret

KEY = derive_key(b"cluster-secret")
WINDOW_MS = 10_000
_LEADER_ID_OFFSET = field_offset(codecs._COMMIT_POSITION_LAYOUT, "leaderMemberId")


def member_auth(member_id: int, key: bytes = KEY) -> MemberAuth:
    return MemberAuth(member_id, key, [0, 1, 2], WINDOW_MS)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def skip_one(image: Any) -> None:
    """What the agent does with a message the thread handed back: reads it (its guard refuses it)."""
    wait_for(lambda: image.poll(lambda *_: None, 1) > 0, 10, "the agent to read the handed-back message")


def test_a_leader_thread_with_a_secret_takes_only_signed_reports_and_signs_each_commit_position(
    aeron: Aeron, thread: CommitThread
) -> None:
    leader = Leader(aeron, thread)
    leader.auth = member_auth(LEADER)
    followers = {member: member_auth(member) for member in (1, 2)}
    leader.record(8192)
    leader.arm(sent_position=0)
    leader.offer(1, followers[1].sign(append_position(TERM, 1024, 1), LEADER, now_ms()))
    wait_for(lambda: leader.commit() == 1024, 10, "a signed report to commit")

    # Each follower's CommitPositions carry a trailer for it, from the leader,
    # with the one counter of the leader's process.
    for member in (1, 2):
        assert leader.commit_positions[member].wait_for(1) == [(TERM, 1024, LEADER)]
        raw = leader.commit_positions[member].raw
        for message in raw:
            body = followers[member].check(message, len(message), now_ms(), (_LEADER_ID_OFFSET, True))
            assert body == codecs.HEADER_LENGTH + codecs.CommitPositionEncoder.BLOCK_LENGTH, (member, body)
    counters = sorted(
        struct.unpack_from("<Q", message, len(message) - 56 + 24)[0]
        for member in (1, 2)
        for message in leader.commit_positions[member].raw
    )
    assert counters == [1, 2] and leader.auth.counter == 2

    # Unsigned, forged (another key), in another member's name, replayed: none
    # is counted toward the commit; each is handed back for the agent's guard,
    # which finds the same fault (the thread's failed check took no counter).
    genuine = followers[2].sign(append_position(TERM, 8192, 2), LEADER, now_ms())
    leader.offer(2, genuine)
    wait_for(lambda: leader.commit() == 8192, 10, "the genuine report to commit")
    images = {image.session_id: image for image in leader.subscription.images}
    image = images[leader.from_followers[2].session_id]
    wrong_member = followers[2].sign(append_position(TERM, 1 << 40, 1), LEADER, now_ms())
    bad = [
        (append_position(TERM, 1 << 40, 2), int(lib.FULMAR_MEMBER_AUTH_NO_TRAILER)),
        (member_auth(2, derive_key(b"guess")).sign(append_position(TERM, 1 << 40, 2), LEADER, now_ms()),
         int(lib.FULMAR_MEMBER_AUTH_WRONG_MAC)),
        (wrong_member, int(lib.FULMAR_MEMBER_AUTH_MEMBER_ID_MISMATCH)),
        (genuine, int(lib.FULMAR_MEMBER_AUTH_REPLAYED)),
    ]  # fmt: skip
    for count, (message, code) in enumerate(bad, start=1):
        leader.record(1 << 41)  # the leader would commit whatever a quorum reported
        leader.arm(position_1=1024, position_2=8192, commit_position=8192, sent_position=8192)
        leader.offer(2, message)
        wait_for(lambda: thread.state().status == NEEDS_AGENT, 10, "the thread to hand back")
        assert thread.state().reason == OTHER_MESSAGE
        assert thread.counts()["unauthenticated"] == count
        assert thread.state().follower_positions == (1024, 8192)
        assert leader.commit() == 8192
        thread.halt()
        # The agent's check finds the real reason.
        assert leader.auth.check(message, len(message), now_ms(), (field_offset(
            codecs._APPEND_POSITION_LAYOUT, "followerMemberId"), True)) == code  # fmt: skip
        skip_one(image)
    # After the hand-backs, a genuine report is taken again.
    leader.arm(position_1=1024, position_2=8192, commit_position=8192, sent_position=8192)
    leader.offer(1, followers[1].sign(append_position(TERM, 1 << 40, 1), LEADER, now_ms()))
    wait_for(lambda: leader.commit() == 1 << 40, 10, "a genuine report to commit")
    assert thread.state().status == RUNNING


def test_an_unsigned_thread_sends_the_agents_bytes_exactly(aeron: Aeron, thread: CommitThread) -> None:
    """Without a context the CommitPosition is the encoded message, no trailer."""
    leader = Leader(aeron, thread, follower_ids=(1,))
    leader.record(512)
    leader.arm(position_1=512, commit_position=512, sent_position=512)
    thread.send_now()
    leader.commit_positions[1].wait_for(1)
    expected = bytearray(64)
    length = codecs.CommitPositionEncoder.encode(
        expected, 0, leadership_term_id=TERM, log_position=512, leader_member_id=LEADER
    )
    assert leader.commit_positions[1].raw == [bytes(expected[:length])]


def test_a_follower_thread_with_a_secret_takes_only_its_leaders_signed_commit_positions(
    aeron: Aeron, thread: CommitThread
) -> None:
    follower = Follower(aeron, thread)
    follower.auth = member_auth(1)
    leader_auth = member_auth(LEADER_OF_FOLLOWER)
    positions = [follower.client_message(session_id) for session_id in (1, 2)]
    follower.record(positions[1])
    follower.arm()

    def commit_position(position: int, leader: int = LEADER_OF_FOLLOWER, term: int = TERM) -> bytes:
        message = bytearray(64)
        length = codecs.CommitPositionEncoder.encode(
            message, 0, leadership_term_id=term, log_position=position, leader_member_id=leader
        )
        return bytes(message[:length])

    follower.offer(leader_auth.sign(commit_position(positions[0]), 1, now_ms()))
    wait_for(lambda: follower.commit() == positions[0], 10, "a signed CommitPosition to commit")
    image = follower.subscription.image_by_session_id(follower.from_leader.session_id)
    assert image is not None
    bad = [
        commit_position(positions[1]),  # unsigned
        member_auth(LEADER_OF_FOLLOWER, derive_key(b"guess")).sign(commit_position(positions[1]), 1, now_ms()),
        member_auth(0).sign(commit_position(positions[1]), 1, now_ms()),  # naming another leader than its sender
        leader_auth.sign(commit_position(positions[1]), 0, now_ms()),  # addressed to another member
    ]
    for count, message in enumerate(bad, start=1):
        follower.offer(message)
        wait_for(lambda: thread.follower_state().status == NEEDS_AGENT, 10, "the thread to hand back")
        assert thread.follower_state().reason == OTHER_MESSAGE
        assert thread.counts()["unauthenticated"] == count
        assert thread.follower_state().notified_commit_position == positions[0]
        assert follower.commit() == positions[0]
        thread.halt_follower()
        skip_one(image)
        follower.arm(notified=positions[0], commit_position=positions[0])
    follower.offer(leader_auth.sign(commit_position(positions[1]), 1, now_ms()))
    wait_for(lambda: follower.commit() == positions[1], 10, "the leader's signed CommitPosition to commit")
