"""The leader's ingress thread (``consensus/leader_ingress.py``), on a real
media driver: exclusive IPC publications stand in for the clients'
publications to the ingress (an image each in a subscription that names the
thread's doorbell), an exclusive IPC publication for the log, which this
test reads, and a counter for invalid-requests."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fulmar._native import ffi, lib
from fulmar.aeron import Aeron
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.leader_ingress import (
    BACK_PRESSURE,
    IDLE,
    NEEDS_AGENT,
    OTHER_MESSAGE,
    RUNNING,
    LeaderIngressThread,
)
from fulmar.subscription import Subscription
from support.doorbells import doorbell_of
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

IPC = "aeron:ipc?term-length=64k"
INGRESS_STREAM, LOG_STREAM = 101, 100
TERM = 4
STAND_IN_TYPE_ID = 4001
HEADER = struct.Struct("<HHHHqqq")  # SBE header, then term, session, timestamp


@pytest.fixture
def thread(aeron: Aeron) -> Iterator[LeaderIngressThread]:
    ingress_thread = LeaderIngressThread(aeron, doorbell_of(aeron))
    try:
        yield ingress_thread
    finally:
        ingress_thread.close()


def session_message(session_id: int, payload: bytes, term: int = TERM) -> bytes:
    buffer = bytearray(codecs.HEADER_LENGTH + codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH)
    codecs.SessionMessageHeaderEncoder.encode(
        buffer, 0, leadership_term_id=term, cluster_session_id=session_id, timestamp=0
    )
    return bytes(buffer) + payload


def encoded(encoder: Any, **fields: Any) -> bytes:
    buffer = bytearray(256)
    length = encoder.encode(buffer, 0, **fields)
    return bytes(buffer[:length])


class Leader:
    """A leader's ingress (a publication per client) and its log."""

    def __init__(self, aeron: Aeron, thread: LeaderIngressThread, clients: int = 2, log_term: str = "64k") -> None:
        self.aeron = aeron
        self.thread = thread
        self.ingress = aeron.add_subscription(f"{IPC}|doorbell-id={thread.doorbell_id}", INGRESS_STREAM)
        self.clients = [aeron.add_exclusive_publication(IPC, INGRESS_STREAM) for _ in range(clients)]
        wait_for(lambda: len(self.ingress.images) == clients, 10, "an image of each client's publication")
        self.log = aeron.add_exclusive_publication(f"aeron:ipc?term-length={log_term}", LOG_STREAM)
        self.log.defer_rings()  # as the module's: the thread rings for its own appends
        self.log_reader: Subscription = aeron.add_subscription(f"aeron:ipc?term-length={log_term}", LOG_STREAM)
        wait_for(lambda: self.log.is_connected, 10, "the log to connect")
        self.invalid = aeron.add_counter(STAND_IN_TYPE_ID, "invalid-requests stand-in")
        self.logged: list[tuple[int, int, int, bytes]] = []

    def arm(self, session_ids: list[int], term: int = TERM) -> None:
        self.thread.arm(
            self.ingress.images, session_ids, self.log, leadership_term_id=term, invalid_requests_id=self.invalid.id
        )

    def send(self, client: int, message: bytes) -> None:
        publication = self.clients[client]
        wait_for(lambda: publication.offer(message) > 0, 10, "the client's offer")

    def image_of(self, client: int) -> Any:
        session_id = self.clients[client].session_id
        return next(image for image in self.ingress.images if image.session_id == session_id)

    def read_log(self, count: int) -> list[tuple[int, int, int, bytes]]:
        """The first ``count`` log messages: (term, session, timestamp, payload)."""

        def on_fragment(buffer: memoryview, offset: int, length: int, header: Any) -> None:
            _, template, schema, _, term, session, timestamp = HEADER.unpack_from(buffer, offset)
            assert (template, schema) == (codecs.SessionMessageHeaderEncoder.TEMPLATE_ID, codecs.SCHEMA_ID)
            self.logged.append((term, session, timestamp, bytes(buffer[offset + HEADER.size : offset + length])))

        def arrived() -> bool:
            self.log_reader.poll(on_fragment, 100)
            return len(self.logged) >= count

        wait_for(arrived, 10, f"{count} log message(s) (have {len(self.logged)})")
        return self.logged

    def invalid_count(self) -> int:
        return self.aeron.counters_reader.counter_value(self.invalid.id)


def test_open_sessions_messages_go_to_the_log_with_the_cluster_time(aeron: Aeron, thread: LeaderIngressThread) -> None:
    leader = Leader(aeron, thread)
    leader.arm([12, 3])  # in any order
    assert thread.is_armed and thread.session_ids == (3, 12)
    before_ms, before_ns = time.time_ns() // 1_000_000, time.monotonic_ns()
    leader.send(0, session_message(3, b"first"))
    leader.send(1, session_message(12, b"second"))
    leader.send(0, session_message(3, b"third"))
    logged = leader.read_log(3)
    after_ms = time.time_ns() // 1_000_000
    # Each client's messages in its order; the two clients' in the order the thread met them.
    assert sorted(payload for *_, payload in logged) == [b"first", b"second", b"third"]
    assert [payload for _, session, _, payload in logged if session == 3] == [b"first", b"third"]
    for term, _, timestamp, _ in logged:
        assert term == TERM and before_ms <= timestamp <= after_ms
    assert leader.log.position == leader.log_reader.images[0].position  # the thread appended to the log itself

    wait_for(lambda: thread.counts()["messages"] == 3, 10, "the appends to be counted")
    images = leader.ingress.images
    reached = [aeron.counters_reader.counter_value(image.subscriber_position_id) for image in images]
    assert all(position > 0 for position in reached)  # published in the images' sub-pos counters
    state = thread.halt()
    assert state is not None and state.status == RUNNING  # (what it was when halted)
    assert [image.position for image in images] == reached  # the agent reads on from there
    assert all(before_ns <= activity <= time.monotonic_ns() for activity in state.activity_ns)
    assert thread.status() == IDLE and not thread.is_armed
    assert leader.invalid_count() == 0


def test_another_terms_or_a_session_not_open_is_counted_and_passed_over(
    aeron: Aeron, thread: LeaderIngressThread
) -> None:
    leader = Leader(aeron, thread, clients=1)
    leader.arm([3])
    leader.send(0, session_message(3, b"old", term=TERM - 1))
    leader.send(0, session_message(9, b"closed"))
    leader.send(0, encoded(codecs.SessionKeepAliveEncoder, leadership_term_id=TERM - 1, cluster_session_id=3))
    leader.send(0, session_message(3, b"good"))
    assert [payload for *_, payload in leader.read_log(1)] == [b"good"]
    wait_for(lambda: leader.invalid_count() == 3, 10, "three invalid requests counted")
    counts = thread.counts()
    assert (counts["invalid"], counts["messages"], counts["keep_alives"]) == (3, 1, 0)
    assert thread.status() == RUNNING


def test_a_keep_alive_notes_activity_and_one_of_a_session_not_open_is_handed_back(
    aeron: Aeron, thread: LeaderIngressThread
) -> None:
    leader = Leader(aeron, thread, clients=1)
    leader.arm([3, 4])
    before_ns = time.monotonic_ns()
    leader.send(0, encoded(codecs.SessionKeepAliveEncoder, leadership_term_id=TERM, cluster_session_id=4))
    wait_for(lambda: thread.counts()["keep_alives"] == 1, 10, "the keep-alive to be taken")
    assert leader.log.position == 0  # nothing for the log

    agent_doorbell = aeron.conductor.data_doorbell
    token = agent_doorbell.prepare()  # the agent, asleep
    leader.send(0, encoded(codecs.SessionKeepAliveEncoder, leadership_term_id=TERM, cluster_session_id=8))
    assert agent_doorbell.wait(token, 10_000_000_000), "the agent was not rung"
    wait_for(lambda: thread.status() == NEEDS_AGENT, 10, "the thread to hand back")
    image = leader.image_of(0)
    state = thread.halt()
    assert state is not None and (state.status, state.reason) == (NEEDS_AGENT, OTHER_MESSAGE)
    assert state.activity_ns[0] == 0 and state.activity_ns[1] >= before_ns  # sessions 3 and 4
    templates: list[int] = []
    image.poll(
        lambda buffer, offset, length, header: templates.append(struct.unpack_from("<HH", buffer, offset)[1]), 10
    )
    assert templates == [codecs.SessionKeepAliveEncoder.TEMPLATE_ID]  # the second one, left unread


def test_other_messages_and_fragments_are_left_to_the_agent(aeron: Aeron, thread: LeaderIngressThread) -> None:
    leader = Leader(aeron, thread, clients=1)
    leader.arm([3])
    leader.send(0, encoded(codecs.SessionCloseRequestEncoder, leadership_term_id=TERM, cluster_session_id=3))
    leader.send(0, session_message(3, b"behind it"))
    wait_for(lambda: thread.status() == NEEDS_AGENT, 10, "the thread to hand back")
    assert thread.counts()["messages"] == 0
    image = leader.image_of(0)
    thread.halt()
    assert image.position == 0
    read: list[int] = []
    image.poll(lambda buffer, offset, length, header: read.append(struct.unpack_from("<HH", buffer, offset)[1]), 1)
    assert read == [codecs.SessionCloseRequestEncoder.TEMPLATE_ID]  # the agent's to act on

    # Armed again past it: the message behind it is the thread's.
    leader.arm([3])
    assert [payload for *_, payload in leader.read_log(1)] == [b"behind it"]
    # A message longer than the ingress's MTU comes in fragments: the agent's assembler takes them.
    leader.send(0, session_message(3, bytes(3000)))
    wait_for(lambda: thread.status() == NEEDS_AGENT, 10, "the thread to hand back a fragment")
    assert thread.counts()["messages"] == 1


def test_a_back_pressured_log_hands_back_with_the_message_unread(aeron: Aeron, thread: LeaderIngressThread) -> None:
    leader = Leader(aeron, thread, clients=1)
    leader.arm([3])
    count = 40  # 40 KiB: more than the log's window ahead of its unread subscriber
    for sequence in range(count):
        leader.send(0, session_message(3, struct.pack("<i", sequence) + bytes(1000)))
    wait_for(lambda: thread.status() == NEEDS_AGENT, 10, "the log to push back")
    state = thread.halt()
    assert state is not None and state.reason == BACK_PRESSURE
    appended = thread.counts()["messages"]
    assert 0 < appended < count
    assert thread.counts()["refused"] == 1
    # The log drains; armed again, the thread appends the rest, in order, none twice.
    logged = leader.read_log(appended)
    wait_for(lambda: leader.log.position_limit > leader.log.position + 2048, 10, "the driver to move the log's limit")
    leader.arm([3])
    logged = leader.read_log(count)
    assert [struct.unpack_from("<i", payload)[0] for *_, payload in logged] == list(range(count))


def test_an_idle_thread_passes_each_ring_on_to_the_agent(aeron: Aeron, thread: LeaderIngressThread) -> None:
    """A follower's ingress names the thread's doorbell too, and so does a
    leader's while its agent is awake: nothing may wait for the agent's
    idle timeout."""
    leader = Leader(aeron, thread, clients=1)
    agent_doorbell = aeron.conductor.data_doorbell
    for round_number in range(3):
        token = agent_doorbell.prepare()
        leader.send(0, session_message(3, b"x"))
        # Within 2 s: the thread's own sleep while not armed is 10 s, so only a relay of the ring answers.
        assert agent_doorbell.wait(token, 2_000_000_000), f"ring {round_number} not passed on"
        wait_for(lambda: thread.counts()["relayed"] >= round_number + 1, 10, "the relay to be counted")
    assert thread.status() == IDLE
    assert leader.ingress.images[0].position == 0  # the thread read nothing


def test_an_arming_the_thread_cannot_use_is_refused(aeron: Aeron, thread: LeaderIngressThread) -> None:
    leader = Leader(aeron, thread, clients=1)
    leader.arm([3, 5])
    good = ffi.new("fulmar_leader_ingress_arm_t *", thread._arm[0])
    images = thread._images_buffer
    thread.halt()
    handle = thread._handle
    ids = ffi.new("int64_t[]", [3, 5])

    def arm(arm: Any, image_count: int = 1, session_ids: Any = ids, session_count: int = 2) -> int:
        return int(lib.fulmar_leader_ingress_arm(handle, arm, images, image_count, session_ids, session_count))

    for field, value in (
        ("invalid_requests_id", 1 << 30),  # not a counter
        ("invalid_requests_id", -1),
        ("timestamp_offset", good.session_header_length - 4),  # the timestamp would end past the header
        ("cluster_session_id_offset", good.keep_alive_length - 4),
        ("log_writer", ffi.NULL),
    ):
        bad = ffi.new("fulmar_leader_ingress_arm_t *", good[0])
        setattr(bad, field, value)
        assert arm(bad) == -1, field
        assert thread.status() == IDLE
    assert arm(good, session_ids=ffi.new("int64_t[]", [5, 3])) == -1  # not ascending
    assert arm(good, session_ids=ffi.new("int64_t[]", [3, 3])) == -1  # twice
    term_length = images[0].term_length
    images[0].term_length = term_length + 32  # not a power of two
    assert arm(good) == -1
    images[0].term_length = term_length
    assert thread.status() == IDLE
    assert arm(good) == 0
    lib.fulmar_leader_ingress_halt(handle, ffi.NULL, ffi.NULL, 0, ffi.NULL, 0)
