"""A consensus module agent on fakes (publications, subscriptions, counters, an Aeron that starts nothing), for the tests of its states, terms, election and idle waits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.agent import (
    ClusterRole,
    ConsensusModuleAgent,
    ConsensusModuleState,
)
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.protocol import CONSENSUS_MODULE_STATE_TYPE_ID


class FakeCounter:
    def __init__(self) -> None:
        self.value = 0

    def get(self) -> int:
        return self.value

    def set(self, value: int) -> None:
        self.value = int(value)

    def increment(self) -> None:
        self.value += 1

    def propose_max(self, value: int) -> None:
        self.value = max(self.value, int(value))


class FakePublication:
    """Keeps what is offered: the leader's log, as decoded messages."""

    term_buffer_length = 64 * 1024
    session_id = 7
    is_connected = True

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.position = 0

    def offer(self, message: bytes) -> int:
        self.messages.append(bytes(message))
        self.position += (32 + len(message) + 31) & ~31
        return self.position

    def decoded(self) -> list[Any]:
        return [codecs.decode(message) for message in self.messages]

    def close(self) -> None:
        pass


class FakeSubscription:
    def poll(self, handler: Any, limit: int) -> int:
        return 0

    def poll_session_runs(self, handler: Any, on_session_messages: Any, limit: int) -> int:
        return 0

    def is_data_available(self) -> bool:
        return False

    def close(self) -> None:
        pass


class FakeAeron:
    def __init__(self) -> None:
        self.counters: dict[int, FakeCounter] = {}
        self.counters_reader: list[Any] = []  # no archive: no recording position counter
        self.conductor = SimpleNamespace(ring_counter_watchers=lambda counter_id: 0)

    def add_subscription(self, channel: str, stream_id: int, **options: Any) -> FakeSubscription:
        return FakeSubscription()

    def add_exclusive_publication(self, channel: str, stream_id: int) -> FakePublication:
        return FakePublication()

    def add_publication(self, channel: str, stream_id: int) -> FakePublication:
        return FakePublication()

    def add_counter(self, type_id: int, label: str, key: bytes) -> FakeCounter:
        counter = FakeCounter()
        self.counters[type_id] = counter
        return counter

    def do_work(self, now_ns: int = 0) -> int:
        return 0


MEMBERS = "|".join(
    f"{m},127.0.0.1:{20110 + m},127.0.0.1:{20220 + m},127.0.0.1:{20330 + m},127.0.0.1:{20440 + m},127.0.0.1:{8010 + m}"
    for m in range(3)
)


def new_agent(cluster_members: str = "", member_id: int = 0) -> ConsensusModuleAgent:
    # No driver here: no native commit thread, a leader's or a follower's (it needs the driver's counters).
    context = ConsensusModuleContext(
        cluster_members=cluster_members, member_id=member_id, native_commit=False, native_follower_commit=False
    )
    agent = ConsensusModuleAgent(
        context,
        FakeAeron(),  # type: ignore[arg-type]  # a fake: counters and publications in memory
        None,  # type: ignore[arg-type]  # no archive: these agents never record
        None,  # type: ignore[arg-type]
        epoch_ms=lambda: 1_000_000,
    )
    agent.log_event = lambda text: None  # type: ignore[method-assign]
    return agent


def state_counter(agent: ConsensusModuleAgent) -> ConsensusModuleState:
    return ConsensusModuleState(agent.aeron.counters[CONSENSUS_MODULE_STATE_TYPE_ID].get())  # type: ignore[attr-defined]


def apply_log(agent: ConsensusModuleAgent, *actions: codecs.ClusterAction, position: int = 4096) -> None:
    """Hand the agent's log handler ClusterActionRequests, as its log adapter would."""
    buffer = bytearray(256)
    for action in actions:
        length = codecs.ClusterActionRequestEncoder.encode(
            buffer,
            0,
            leadership_term_id=agent.leadership_term_id,
            log_position=position,
            timestamp=1,
            action=int(action),
            flags=0,
        )
        agent.log_adapter.on_message(memoryview(buffer), 0, length, SimpleNamespace(position=position))  # type: ignore[arg-type]


def complete_election(agent: ConsensusModuleAgent, role: ClusterRole, leader: int, term: int) -> None:
    agent.election = SimpleNamespace(election=SimpleNamespace(term_base_log_position=0))
    if role is ClusterRole.LEADER:
        publication = FakePublication()
        agent._log_publication = publication  # type: ignore[assignment]
        agent.log_publisher.publication = publication  # type: ignore[assignment]
    agent.on_multi_member_election_complete(role, leader, term)


def log_of(agent: ConsensusModuleAgent) -> list[Any]:
    publication = agent.log_publisher.publication
    assert isinstance(publication, FakePublication)
    return publication.decoded()
