"""The leadership term a consensus module appends under (issue "Trusted on
every path", item 1), with the agent over fake streams (no processes).

A new leader replays its log in LEADER_REPLAY before it leads: the replay
hands the old terms' NewLeadershipTermEvents to the agent's log handler,
which takes each one's term as its own (what a follower applying the log
must do).  Joining the log as leader must set the election's term back, or
the NewLeadershipTermEvent the leader appends next carries the old term
(and every follower applying it drops back to that term)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.protocol import CLUSTER_LEADERSHIP_TERM_ID_TYPE_ID
from support.agents import MEMBERS, FakePublication, log_of, new_agent


class FakeRecordingArchive:
    """The archive as joining the log as leader uses it: a recording asked for."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Any]] = []

    def extend_recording(self, recording_id: int, channel: str, stream_id: int, source: Any, **options: Any) -> int:
        self.requests.append(("extend", recording_id))
        return 900

    def start_recording(self, channel: str, stream_id: int, source: Any, **options: Any) -> int:
        self.requests.append(("start", channel))
        return 900


def replay_new_leadership_term_event(agent: Any, leadership_term_id: int, position: int) -> None:
    buffer = bytearray(256)
    length = codecs.NewLeadershipTermEventEncoder.encode(
        buffer,
        0,
        leadership_term_id=leadership_term_id,
        log_position=position,
        timestamp=1,
        term_base_log_position=position,
        leader_member_id=1,
        log_session_id=5,
        app_version=0,
    )
    agent.log_adapter.on_message(memoryview(buffer), 0, length, SimpleNamespace(position=position))


def test_a_leader_appends_its_own_term_after_replaying_an_older_ones_event() -> None:
    agent = new_agent(MEMBERS, member_id=0)
    agent.archive = FakeRecordingArchive()  # type: ignore[assignment]  # a fake
    agent.log_recording_id = 0
    publication = FakePublication()
    agent._log_publication = publication  # type: ignore[assignment]  # a fake
    agent.log_publisher.publication = publication  # type: ignore[assignment]  # a fake
    agent.set_leadership_term_id(2)  # LEADER_LOG_REPLICATION of term 2
    replay_new_leadership_term_event(agent, 1, 4096)  # LEADER_REPLAY of term 1's start
    assert agent.leadership_term_id == 1  # what a follower applying the log must do

    agent.join_log_as_leader(2, 8192)  # LEADER_INIT
    assert agent.leadership_term_id == 2
    # What cluster-tool shows (the fake Aeron keeps its counters by type).
    assert agent.aeron.counters[CLUSTER_LEADERSHIP_TERM_ID_TYPE_ID].get() == 2  # type: ignore[attr-defined]
    agent._leader_recording_started = True  # (the archive's START signal)
    agent._leader_services_joined = True  # (the services' acknowledgement)
    before = publication.position
    assert agent.append_new_leadership_term_event(8192)
    events = [m for m in log_of(agent) if isinstance(m, codecs.NewLeadershipTermEventDecoder)]
    assert [(e.leadership_term_id, e.term_base_log_position) for e in events] == [(2, 8192)]
    # Its logPosition is where the log stands after it, as Aeron's leader writes
    # it (an Aeron follower replaying the event takes it as its log position).
    assert events[0].log_position == before + 96 == publication.position
