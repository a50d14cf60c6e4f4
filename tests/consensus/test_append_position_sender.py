"""The follower's AppendPosition thread (``consensus/append_position_sender.py``),
on a real media driver: a counter stands in for the archive's rec-pos, an IPC
publication for the one to the leader, and this test reads what the thread
appends to it."""

from __future__ import annotations

import hmac
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar._native import ffi, lib
from fulmar.aeron import Aeron
from fulmar.clock import epoch_ms
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.append_position_sender import IDLE, NEEDS_AGENT, RUNNING, AppendPositionSender
from fulmar.consensus.member_auth import TRAILER_LENGTH, MemberAuth, MemberSigner, derive_key
from fulmar.consensus.protocol import field_offset
from fulmar.log_writer import NOT_CONNECTED
from fulmar.publication import Publication
from fulmar.reader_doorbells import CounterWatch
from fulmar.subscription import Subscription
from support.doorbells import doorbell_of
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TO_LEADER = "aeron:ipc?term-length=64k"
STREAM = 108
STAND_IN_TYPE_ID = 4001  # any type: the thread reads the value and the registration id
NULL_POSITION = -1
RETRY_WAIT_NS = 1_000_000


@pytest.fixture
def sender(aeron: Aeron) -> Iterator[AppendPositionSender]:
    thread = AppendPositionSender(aeron, doorbell_of(aeron), RETRY_WAIT_NS)
    try:
        yield thread
    finally:
        thread.close()


class Reports:
    """The AppendPositions that reach the subscription, decoded."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.received: list[tuple[int, int, int, int]] = []
        self._body = codecs.AppendPositionDecoder()

    def _on_fragment(self, buffer: memoryview, offset: int, length: int, header: Any) -> None:
        block_length, template_id, schema_id, _ = struct.unpack_from("<HHHH", buffer, offset)
        assert (template_id, block_length, schema_id) == (
            codecs.AppendPositionEncoder.TEMPLATE_ID,
            codecs.AppendPositionEncoder.BLOCK_LENGTH,
            codecs.SCHEMA_ID,
        )
        assert length == codecs.HEADER_LENGTH + codecs.AppendPositionEncoder.BLOCK_LENGTH
        body = self._body.wrap(buffer, offset + codecs.HEADER_LENGTH, length=length - codecs.HEADER_LENGTH)
        self.received.append((body.leadership_term_id, body.log_position, body.follower_member_id, body.flags))

    def wait_for(self, count: int) -> list[tuple[int, int, int, int]]:
        def arrived() -> bool:
            self.subscription.poll(self._on_fragment, 10)
            return len(self.received) >= count

        wait_for(arrived, 10, f"{count} AppendPosition(s) from the thread (have {self.received})")
        return self.received


def rec_pos_stand_in(aeron: Aeron) -> Any:
    counter = aeron.add_counter(STAND_IN_TYPE_ID, "rec-pos stand-in")
    assert aeron.counters_reader.counter_registration_id(counter.id) == counter.registration_id
    return counter


def record(aeron: Aeron, counter: Any, position: int) -> None:
    """What the archive's recorder does once a block is written: the position, then a ring of its watchers."""
    counter.set(position)
    aeron.conductor.ring_counter_watchers(counter.id)


def watchers(aeron: Aeron, counter_id: int) -> list[int]:
    return CounterWatch(aeron.conductor.cnc.counters_values, 0).watchers(counter_id)


def arm(sender: AppendPositionSender, publication: Publication, counter: Any, **fields: int) -> None:
    armed = sender.arm(
        publication,
        counter.id,
        fields.pop("registration_id", counter.registration_id),
        leadership_term_id=7,
        follower_member_id=2,
        sent_position=fields.pop("sent_position", NULL_POSITION),
        sent_time_ns=0,
    )
    assert armed


def test_the_thread_reports_each_recorded_position_and_a_heartbeat_when_asked(
    aeron: Aeron, sender: AppendPositionSender
) -> None:
    publication = aeron.add_publication(TO_LEADER, STREAM)
    reports = Reports(aeron.add_subscription(TO_LEADER, STREAM))
    wait_for(lambda: publication.is_connected, 10, "the publication to connect")
    counter = rec_pos_stand_in(aeron)
    before_ns = time.monotonic_ns()
    arm(sender, publication, counter)
    assert sender.doorbell_id in watchers(aeron, counter.id)
    # Armed, the thread reports what is recorded already (position 0, past the NULL_POSITION sent).
    assert reports.wait_for(1) == [(7, 0, 2, 0)]
    record(aeron, counter, 4096)
    assert reports.wait_for(2)[1] == (7, 4096, 2, 0)
    sender.send_now()  # the heartbeat: the same position again
    assert reports.wait_for(3)[2] == (7, 4096, 2, 0)
    record(aeron, counter, 4096 + 64)
    assert reports.wait_for(4)[3] == (7, 4096 + 64, 2, 0)

    status, sent_position, sent_time_ns = sender.state()
    assert (status, sent_position) == (RUNNING, 4096 + 64)
    assert before_ns <= sent_time_ns <= time.monotonic_ns()  # the agent's clock
    assert sender.counts() == (4, 0, 0)
    assert len(reports.received) == 4  # no report without a new position or a heartbeat asked for

    sender.halt()
    assert sender.state()[0] == IDLE
    assert sender.doorbell_id not in watchers(aeron, counter.id)
    assert not sender.is_armed


def test_a_position_already_sent_is_not_sent_again_when_armed(aeron: Aeron, sender: AppendPositionSender) -> None:
    """The agent arms the thread with what it has told the leader: the thread
    reports only what comes after (and the agent's own heartbeat)."""
    publication = aeron.add_publication(TO_LEADER, STREAM)
    reports = Reports(aeron.add_subscription(TO_LEADER, STREAM))
    wait_for(lambda: publication.is_connected, 10, "the publication to connect")
    counter = rec_pos_stand_in(aeron)
    counter.set(1024)
    arm(sender, publication, counter, sent_position=1024)
    record(aeron, counter, 2048)
    assert reports.wait_for(1) == [(7, 2048, 2, 0)]


def test_a_refused_offer_is_tried_again_until_the_leader_takes_it(aeron: Aeron, sender: AppendPositionSender) -> None:
    publication = aeron.add_publication(TO_LEADER, STREAM)
    counter = rec_pos_stand_in(aeron)
    record(aeron, counter, 512)
    arm(sender, publication, counter)  # nobody subscribes yet: not connected
    wait_for(lambda: sender.counts()[1] >= 2, 10, "the thread to try again after a refusal")
    sent, _, failure = sender.counts()
    assert (sent, failure) == (0, NOT_CONNECTED)
    assert sender.state()[0] == RUNNING  # a refusal for a while: it goes on
    reports = Reports(aeron.add_subscription(TO_LEADER, STREAM))
    assert reports.wait_for(1) == [(7, 512, 2, 0)]  # without a new position: the retry sent it
    assert sender.counts()[0] == 1


def test_a_counter_that_is_not_the_armed_one_hands_the_reports_back(aeron: Aeron, sender: AppendPositionSender) -> None:
    """A rec-pos counter freed (the recording stopped) and its id reused shows
    another registration id: the thread stops and rings the agent."""
    publication = aeron.add_publication(TO_LEADER, STREAM)
    counter = rec_pos_stand_in(aeron)
    agent_doorbell = aeron.conductor.data_doorbell
    token = agent_doorbell.prepare()  # the agent, asleep
    arm(sender, publication, counter, registration_id=counter.registration_id + 1)
    assert agent_doorbell.wait(token, 10_000_000_000), "the agent was not rung"
    wait_for(lambda: sender.state()[0] == NEEDS_AGENT, 10, "the thread to hand back to the agent")
    assert sender.counts()[0] == 0
    sender.send_now()  # a heartbeat asked of a stopped thread changes nothing
    assert sender.state()[0] == NEEDS_AGENT
    sender.halt()
    assert sender.state()[0] == IDLE


def test_an_arming_the_thread_cannot_use_is_refused(aeron: Aeron, sender: AppendPositionSender) -> None:
    publication = aeron.add_publication(TO_LEADER, STREAM)
    counter = rec_pos_stand_in(aeron)
    arm_fields = ffi.new("fulmar_append_position_arm_t *")
    arm_fields.writer = publication.native_writer[0]
    arm_fields.recording_position_id = counter.id
    arm_fields.message_length = 29
    arm_fields.position_offset = 16
    handle = sender._handle
    assert lib.fulmar_append_position_arm(handle, arm_fields) == 0
    lib.fulmar_append_position_halt(handle)
    for field, value in (
        ("position_offset", 22),  # the position would end past the message
        ("message_length", int(lib.FULMAR_APPEND_POSITION_MESSAGE_CAPACITY) + 1),
        ("recording_position_id", 1 << 30),  # not a counter
    ):
        bad = ffi.new("fulmar_append_position_arm_t *", arm_fields[0])
        setattr(bad, field, value)
        assert lib.fulmar_append_position_arm(handle, bad) == -1, field
        assert sender.state()[0] == IDLE


def test_with_a_secret_each_report_leaves_with_a_fresh_trailer_for_the_leader(
    aeron: Aeron, sender: AppendPositionSender
) -> None:
    """Armed with the process's auth context, the thread signs each report for
    the leader: a trailer the leader's check takes (byte for byte the format's,
    by a pure-Python MAC), its counter the process's one counter, shared with
    the agent's signer."""
    key = derive_key(b"cluster-secret")
    auth = MemberAuth(2, key, [0, 1, 2], 10_000)
    agent_signer = MemberSigner(2, key, epoch_ms, auth=auth)
    leader = MemberAuth(0, key, [0, 1, 2], 10_000)
    publication = aeron.add_publication(TO_LEADER, STREAM)
    subscription = aeron.add_subscription(TO_LEADER, STREAM)
    wait_for(lambda: publication.is_connected, 10, "the publication to connect")
    counter = rec_pos_stand_in(aeron)
    received: list[bytes] = []

    def arrived(count: int) -> list[bytes]:
        def on_fragment(buffer: memoryview, offset: int, length: int, header: Any) -> None:
            received.append(bytes(buffer[offset : offset + length]))

        wait_for(lambda: subscription.poll(on_fragment, 10) >= 0 and len(received) >= count, 10, f"{count} reports")
        return received

    with pytest.raises(ValueError, match="leader's member id"):
        sender.arm(publication, counter.id, counter.registration_id, leadership_term_id=7, follower_member_id=2,
                   sent_position=NULL_POSITION, sent_time_ns=0, auth=auth)  # fmt: skip
    assert sender.arm(
        publication,
        counter.id,
        counter.registration_id,
        leadership_term_id=7,
        follower_member_id=2,
        sent_position=NULL_POSITION,
        sent_time_ns=0,
        auth=auth,
        leader_member_id=0,
    )
    arrived(1)
    assert agent_signer.sign(b"\x00" * 29, 0)  # the agent's message between two of the thread's: counter 2
    record(aeron, counter, 4096)
    arrived(2)
    body_length = codecs.HEADER_LENGTH + codecs.AppendPositionEncoder.BLOCK_LENGTH
    member_field = (field_offset(codecs._APPEND_POSITION_LAYOUT, "followerMemberId"), True)
    for message, position, counter_value in zip(received, (0, 4096), (1, 3)):
        assert len(message) == body_length + TRAILER_LENGTH
        body = message[:body_length]
        magic, sender_id, receiver, key_id, boot_id, taken, timestamp_ms = struct.unpack_from(
            "<4siiIQQq", message, body_length
        )
        assert (magic, sender_id, receiver, key_id, boot_id, taken) == (b"FMC1", 2, 0, 0, auth.boot_id, counter_value)
        assert abs(timestamp_ms - epoch_ms()) < 5_000
        signed = message[: body_length + 40]
        assert message[body_length + 40 :] == hmac.digest(key, signed, "sha256")[:16]
        assert struct.unpack_from("<q", body, 16)[0] == position
        assert leader.check(message, len(message), epoch_ms(), member_field) == body_length
    assert auth.counter == 3
    sender.halt()


def test_a_signed_message_must_fit_the_threads_buffer(aeron: Aeron, sender: AppendPositionSender) -> None:
    publication = aeron.add_publication(TO_LEADER, STREAM)
    counter = rec_pos_stand_in(aeron)
    auth = MemberAuth(2, derive_key(b"cluster-secret"), [0, 1, 2], 10_000)
    arm_fields = ffi.new("fulmar_append_position_arm_t *")
    arm_fields.writer = publication.native_writer[0]
    arm_fields.recording_position_id = counter.id
    arm_fields.position_offset = 16
    arm_fields.auth = auth.handle
    arm_fields.message_length = int(lib.FULMAR_APPEND_POSITION_MESSAGE_CAPACITY) - TRAILER_LENGTH
    assert lib.fulmar_append_position_arm(sender._handle, arm_fields) == 0
    lib.fulmar_append_position_halt(sender._handle)
    arm_fields.message_length += 1  # no room left for its trailer
    assert lib.fulmar_append_position_arm(sender._handle, arm_fields) == -1
    assert sender.state()[0] == IDLE
