"""Seed 003, a client's messages into the log: a steady leader's clients'
session messages are appended by the native ingress thread
(``consensus/leader_ingress.py``) while the module sleeps; the module arms
it as it goes to sleep, takes the ingress back first thing in its next
cycle (the images' positions, the sessions' activity), and reads the
ingress itself whenever something else is on it.

The module is a real ``ConsensusModuleAgent`` (member 1 of three) on a real
media driver, made leader by hand, with an IPC log publication this test
reads; an exclusive publication to its ingress endpoint stands in for a
client whose session is open.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.channel_uri import ChannelUri
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.agent import ClusterRole, ConsensusModuleAgent, ConsensusModuleState
from fulmar.consensus.cluster_session import ClusterSession, ClusterSessionState
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.leader_ingress import NEEDS_AGENT, RUNNING
from fulmar.driver.counters import RECEIVER_POSITION_TYPE_ID
from fulmar.subscription import Subscription
from support.cluster import bare_member_agent
from support.driver import wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

TERM = 5
SESSION = 7
LOG = "aeron:ipc?term-length=64k"


def encoded(encoder: Any, **fields: Any) -> bytes:
    buffer = bytearray(256)
    length = encoder.encode(buffer, 0, **fields)
    return bytes(buffer[:length])


def session_message(payload: bytes, session_id: int = SESSION) -> bytes:
    return (
        encoded(codecs.SessionMessageHeaderEncoder, leadership_term_id=TERM, cluster_session_id=session_id, timestamp=0)
        + payload
    )


class Leader:
    """Member 1 as the steady leader of TERM, one open session, its log and a client."""

    def __init__(self, agent: ConsensusModuleAgent, aeron: Aeron, now_ns: int) -> None:
        self.agent, self.aeron, self.now_ns = agent, aeron, now_ns
        agent.state = ConsensusModuleState.ACTIVE
        agent.role = ClusterRole.LEADER
        agent.leader_member_id = agent.member_id
        agent.leadership_term_id = TERM
        agent._slow_tick_deadline_ns = now_ns + 3_600_000_000_000  # (no archive here to tick)
        for follower in agent._followers.values():
            follower.time_of_last_append_position_ns = now_ns
        publication = aeron.add_exclusive_publication(LOG, agent.context.log_stream_id)
        publication.defer_rings()
        agent.log_publisher.publication = publication
        self.log_reader: Subscription = aeron.add_subscription(LOG, agent.context.log_stream_id)
        wait_for(lambda: publication.is_connected, 10, "the log to connect")
        self.session = ClusterSession(SESSION, 102, "aeron:ipc", now_ns=now_ns)
        self.session.state = ClusterSessionState.OPEN
        agent.sessions[SESSION] = self.session
        assert agent.connect_ingress(now_ns) == 1
        assert agent.ingress is not None
        endpoint = ChannelUri.parse(agent.context.ingress_channel).get("endpoint")
        self.client = aeron.add_exclusive_publication(f"aeron:udp?endpoint={endpoint}", agent.context.ingress_stream_id)
        wait_for(lambda: self.client.is_connected, 10, "the client's publication to the ingress")

        def image_added() -> bool:
            agent.do_work(now_ns)
            return len(agent.ingress.images) == 1  # type: ignore[union-attr]

        wait_for(image_added, 10, "the agent to add the client's image")
        self.logged: list[tuple[int, int, bytes]] = []
        self.timestamps: list[int] = []

    def send(self, message: bytes) -> int:
        """Offers ``message`` as the client; the client's position after it."""
        wait_for(lambda: self.client.offer(message) > 0, 10, "the client's offer")
        return self.client.position

    def wait_received(self, position: int) -> None:
        """Until the ingress image holds everything the client sent up to ``position``."""
        (image,) = self.agent.ingress.images  # type: ignore[union-attr]
        counters = self.aeron.counters_reader
        counter_id = counters.find_by_type_and_registration(RECEIVER_POSITION_TYPE_ID, image.correlation_id)
        wait_for(lambda: counters.counter_value(counter_id) >= position, 10, f"the ingress image up to {position}")

    def read_log(self, count: int) -> list[tuple[int, int, bytes]]:
        """The first ``count`` log messages: (template id, session, what follows a session header)."""

        def on_fragment(buffer: memoryview, offset: int, length: int, header: Any) -> None:
            _, template, _, _, _, session, timestamp = struct.unpack_from("<HHHHqqq", buffer, offset)
            self.logged.append((template, session, bytes(buffer[offset + 32 : offset + length])))
            self.timestamps.append(timestamp)

        def arrived() -> bool:
            self.log_reader.poll(on_fragment, 100)
            return len(self.logged) >= count

        wait_for(arrived, 10, f"{count} log message(s) (have {self.logged})")
        return self.logged


@pytest.fixture
def leader(start_driver: Any, tmp_path: Path) -> Iterator[Leader]:
    aeron = start_driver().connect()
    agent = bare_member_agent(aeron, tmp_path)
    try:
        yield Leader(agent, aeron, time.monotonic_ns())
    finally:
        agent.close()
        aeron.close()


def test_a_sleeping_leaders_ingress_goes_to_the_log_from_the_native_thread(leader: Leader) -> None:
    agent = leader.agent
    thread = agent.handovers.leader_ingress.thread
    assert thread is not None
    assert ChannelUri.parse(agent.ingress.channel).get("doorbell-id") == str(thread.doorbell_id)  # type: ignore[union-attr]
    agent.arm_leader_ingress()  # as the module goes to sleep
    assert agent.handovers.leader_ingress.is_armed and thread.session_ids == (SESSION,)
    assert not agent.has_work()  # the ingress is the thread's: nothing wakes the agent for it

    before_ms = time.time_ns() // 1_000_000
    leader.send(session_message(b"while the agent sleeps"))
    assert leader.read_log(1) == [(codecs.SessionMessageHeaderEncoder.TEMPLATE_ID, SESSION, b"while the agent sleeps")]
    # The cluster time, the thread's (the session header's third field).
    assert before_ms <= leader.timestamps[0] <= time.time_ns() // 1_000_000
    assert not agent.has_work()
    activity_before = leader.session.time_of_last_activity_ns

    # The agent's next cycle takes the ingress back, with what the thread did.
    agent.do_work(leader.now_ns)
    assert not agent.handovers.leader_ingress.is_armed and thread.status() != RUNNING
    assert leader.session.time_of_last_activity_ns > activity_before
    image = agent.ingress.images[0]
    assert image.position == agent.aeron.counters_reader.counter_value(image.subscriber_position_id) > 0


def test_a_message_the_thread_does_not_take_is_the_agents_in_its_next_cycle(leader: Leader) -> None:
    agent = leader.agent
    thread = agent.handovers.leader_ingress.thread
    assert thread is not None
    agent.arm_leader_ingress()
    invalid_before = agent.invalid_requests_counter.get()
    leader.send(encoded(codecs.SessionCloseRequestEncoder, leadership_term_id=TERM, cluster_session_id=SESSION))
    sent = leader.send(session_message(b"after the close"))
    wait_for(lambda: thread.status() == NEEDS_AGENT, 10, "the thread to hand back")
    assert agent.has_work()  # (its ring may have come while the agent was awake)
    # The second message may land after the thread handed back (its own
    # datagram, on a busy machine): the agent's cycle reads what has landed.
    leader.wait_received(sent)

    agent.do_work(leader.now_ns)  # the agent reads both itself
    assert SESSION not in agent.sessions
    assert agent.invalid_requests_counter.get() == invalid_before + 1  # a message of a closed session
    assert [template for template, _, _ in leader.read_log(1)] == [codecs.SessionCloseEventEncoder.TEMPLATE_ID]
    agent.arm_leader_ingress()
    assert agent.handovers.leader_ingress.is_armed and thread.session_ids == ()


def test_the_thread_is_armed_only_for_a_steady_leader_with_nothing_left_over(leader: Leader) -> None:
    agent = leader.agent
    agent._pending_ingress.append(session_message(b"back-pressured before"))
    agent.arm_leader_ingress()
    assert not agent.handovers.leader_ingress.is_armed  # what waits goes first, from the agent
    agent._pending_ingress.clear()
    agent.state = ConsensusModuleState.SUSPENDED
    agent.arm_leader_ingress()
    assert not agent.handovers.leader_ingress.is_armed
    agent.state = ConsensusModuleState.ACTIVE
    agent.role = ClusterRole.FOLLOWER
    agent.arm_leader_ingress()
    assert not agent.handovers.leader_ingress.is_armed
    agent.role = ClusterRole.LEADER
    agent.arm_leader_ingress()
    assert agent.handovers.leader_ingress.is_armed
    agent.start_election("a test's")  # an election: the agent's first act takes the ingress back
    assert not agent.handovers.leader_ingress.is_armed


def test_without_the_thread_the_module_appends_the_ingress_itself(start_driver: Any, tmp_path: Path) -> None:
    """--agent-ingress, or a clock of the caller's own (the thread reads the wall clock)."""
    aeron = start_driver().connect()
    try:
        for fields in ({"native_ingress": False}, {}):
            agent = bare_member_agent(aeron, tmp_path, **fields)
            if not fields:
                agent.epoch_ms = lambda: 1_000_000
            try:
                agent.connect_ingress(time.monotonic_ns())
                assert agent.handovers.leader_ingress.thread is None
                assert "doorbell-id" not in ChannelUri.parse(agent.ingress.channel).params
            finally:
                agent.close()
    finally:
        aeron.close()


def test_a_single_member_opens_its_ingress_through_the_thread(start_driver: Any, tmp_path: Path) -> None:
    """A member alone opens its ingress at once (no election to wait for), and
    it too names the ingress thread's doorbell, and starts the commit thread
    that commits its own recording: its round trip has no wake-up of the
    Python module.  Switched off, neither thread."""
    aeron = start_driver().connect()
    try:
        for native in (True, False):
            context = ConsensusModuleContext(
                cluster_dir=tmp_path / str(native),
                ingress_channel="aeron:udp?endpoint=127.0.0.1:0",
                native_ingress=native,
                native_commit=native,
            )
            agent = ConsensusModuleAgent(context, aeron, archive=None, recording_log=None)  # type: ignore[arg-type]
            try:
                assert not agent.is_multi_member and agent.ingress is not None
                doorbell = ChannelUri.parse(agent.ingress.channel).params.get("doorbell-id")
                if native:
                    assert (
                        agent.handovers.leader_ingress.thread is not None
                        and agent.handovers.leader_commit.thread is not None
                    )
                    assert doorbell == str(agent.handovers.leader_ingress.thread.doorbell_id)
                else:
                    assert (
                        agent.handovers.leader_ingress.thread is None and agent.handovers.leader_commit.thread is None
                    )
                    assert doorbell is None
            finally:
                agent.close()
    finally:
        aeron.close()
