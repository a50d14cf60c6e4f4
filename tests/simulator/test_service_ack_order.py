"""The consensus module of several members matches its services' acks to its
requests in their order (Aeron's per-service ack queue, each ack expected with
the next ack id): of two requests waiting on the same log position, the older
takes each service's first ack, the younger the next (BUG-1, simulator seed 109
of 3 members)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.agent import ConsensusModuleAgent
from fulmar.consensus.service_acks import ServiceAcks


def module(service_count: int = 1) -> Any:
    """The ack bookkeeping of a ConsensusModuleAgent of several members, alone."""
    agent: Any = ConsensusModuleAgent.__new__(ConsensusModuleAgent)
    agent.is_multi_member = True
    agent.context = SimpleNamespace(service_count=service_count)
    agent.errors = []
    agent._error = agent.errors.append
    agent.service_acks = ServiceAcks(service_count, agent._error)
    agent.timers = []
    agent.timers_counter = SimpleNamespace(set=lambda value: None)
    return agent


def ack(agent: Any, ack_id: int, log_position: int, relevant_id: int = -1, service_id: int = 0) -> None:
    """A ServiceAck as the service container sends it, through the module's handler."""
    buffer = bytearray(128)
    length = codecs.ServiceAckEncoder.encode(
        buffer,
        0,
        log_position=log_position,
        timestamp=0,
        ack_id=ack_id,
        relevant_id=relevant_id,
        service_id=service_id,
    )
    agent._on_service_message(memoryview(buffer), 0, length, None)


def snapshot_request(agent: Any, log_position: int) -> int:
    """As _on_follower_snapshot_action asks (an ack that came first counts)."""
    ack_id: int = agent.service_acks.next_ack_id(any_arrival=True, log_position=log_position)
    return ack_id


def test_a_join_log_at_a_snapshot_position_takes_the_ack_after_the_snapshot_s() -> None:
    agent = module()
    snapshot = snapshot_request(agent, 4096)
    join = agent.next_ack_id(join_log=True)
    ack(agent, 7, 4096, relevant_id=42)  # the snapshot's (its recording)
    # The JoinLog, asked first, does not take the snapshot's ack.
    assert agent.services_acked(join, 4096) is None
    ack(agent, 8, 4096)  # the JoinLog's
    assert [a.relevant_id for a in agent.services_acked(join, 4096)] == [-1]
    assert [a.relevant_id for a in agent.services_acked(snapshot, 4096)] == [42]
    assert agent.errors == []


def test_each_service_s_acks_answer_in_their_order() -> None:
    agent = module(service_count=2)
    snapshot = snapshot_request(agent, 4096)
    join = agent.next_ack_id(join_log=True)
    ack(agent, 3, 4096, relevant_id=10, service_id=1)
    ack(agent, 3, 4096, relevant_id=11, service_id=0)
    ack(agent, 4, 4096, service_id=1)
    assert agent.services_acked(join, 4096) is None  # service 0 has not joined
    ack(agent, 4, 4096, service_id=0)
    assert [(a.service_id, a.relevant_id) for a in agent.services_acked(join, 4096)] == [(0, -1), (1, -1)]
    assert [(a.service_id, a.relevant_id) for a in agent.services_acked(snapshot, 4096)] == [(0, 11), (1, 10)]


def test_a_join_log_supersedes_one_never_answered() -> None:
    """A service joins only the newest log it was sent: the older JoinLog's
    request waits for nothing, and takes no ack from the newer."""
    agent = module()
    first = agent.next_ack_id(join_log=True)
    assert agent.services_acked(first, 2048) is None
    second = agent.next_ack_id(join_log=True)
    ack(agent, 5, 2048)
    assert agent.services_acked(second, 2048) is not None
    assert agent.services_acked(first, 2048) is None


def test_an_ack_out_of_sequence_is_an_error() -> None:
    agent = module()
    request = agent.next_ack_id()
    ack(agent, 5, 1024)
    ack(agent, 4, 1024)
    assert agent.services_acked(request, 1024) is not None
    assert any("out of sequence" in error for error in agent.errors)
