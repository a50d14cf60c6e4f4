"""The consensus module's state and toggles where they differed from Aeron's
(issue "Trusted on every path"), with the agent over fake streams (no
processes; see test_cluster_suspend's fakes)."""

from __future__ import annotations

from typing import Any

import pytest

from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import snapshot
from fulmar.consensus.agent import ClusterRole, ConsensusModuleState, ControlToggle, LoneMemberConsensusListener
from support.agents import MEMBERS, apply_log, complete_election, new_agent, state_counter


class CountingIngress:
    """An ingress with a message always waiting; counts the polls."""

    def __init__(self) -> None:
        self.polls = 0

    def is_data_available(self) -> bool:
        return True

    def poll(self, handler: Any, limit: int) -> int:
        self.polls += 1
        return 0

    def poll_session_runs(self, handler: Any, on_session_messages: Any, limit: int) -> int:
        self.polls += 1
        return 0

    def close(self) -> None:
        pass


def test_a_suspended_leader_leaves_its_ingress_unread_and_does_not_wake_for_it() -> None:
    """Aeron polls the ingress only while ACTIVE: suspended, a connect or a
    close waits in the ingress behind the held messages, in its order (it
    was read and appended ahead of them), and what waits there is no work
    (else has_work would keep the module awake for the whole suspension)."""
    agent = new_agent(MEMBERS, member_id=0)
    complete_election(agent, ClusterRole.LEADER, leader=0, term=0)
    ingress = CountingIngress()
    agent.ingress = ingress  # type: ignore[assignment]
    agent.aeron.conductor.has_driver_news = lambda: False  # type: ignore[method-assign]
    agent._leader_work(1)
    assert ingress.polls == 1  # ACTIVE: read
    agent._set_state(ConsensusModuleState.SUSPENDED)
    agent._leader_work(2)
    assert ingress.polls == 1
    assert not agent.has_work()
    agent._set_state(ConsensusModuleState.ACTIVE)
    assert agent.has_work()


def test_an_election_makes_the_control_toggle_inactive_until_the_member_leads() -> None:
    """Aeron's prepareForNewLeadership: a toggle set during an election would
    be dropped, so cluster-tool finds INACTIVE and says an election is under
    way instead."""
    agent = new_agent(MEMBERS, member_id=0)
    complete_election(agent, ClusterRole.LEADER, leader=0, term=0)
    assert agent.control_toggle.get() == ControlToggle.NEUTRAL
    agent.host.prepare_for_election()
    assert agent.control_toggle.get() == ControlToggle.INACTIVE
    complete_election(agent, ClusterRole.LEADER, leader=0, term=1)
    assert agent.control_toggle.get() == ControlToggle.NEUTRAL


def test_a_follower_taking_a_snapshot_shows_snapshot_until_its_services_have(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = new_agent(MEMBERS, member_id=1)
    complete_election(agent, ClusterRole.FOLLOWER, leader=0, term=0)
    monkeypatch.setattr(snapshot, "take_consensus_module_snapshot", lambda agent, position: 42)
    recorded: list[int] = []
    monkeypatch.setattr(
        agent, "_record_snapshot", lambda position, recording_id, acks, *term: recorded.append(position)
    )
    acks: list[Any] = []
    monkeypatch.setattr(agent, "services_acked", lambda ack_id, position=None: acks or None)
    apply_log(agent, codecs.ClusterAction.SNAPSHOT, position=4096)
    assert agent.state is ConsensusModuleState.SNAPSHOT
    assert state_counter(agent) is ConsensusModuleState.SNAPSHOT  # what cluster-tool reads
    assert agent._check_follower_snapshot() == 0  # the services have yet to take theirs
    assert agent.state is ConsensusModuleState.SNAPSHOT
    acks.append(object())
    assert agent._check_follower_snapshot() == 1
    assert recorded == [4096]
    assert agent.state is ConsensusModuleState.ACTIVE


def test_a_suspended_follower_returns_to_suspended_after_its_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = new_agent(MEMBERS, member_id=1)
    complete_election(agent, ClusterRole.FOLLOWER, leader=0, term=0)
    monkeypatch.setattr(snapshot, "take_consensus_module_snapshot", lambda agent, position: 42)
    monkeypatch.setattr(agent, "_record_snapshot", lambda position, recording_id, acks, *term: None)
    monkeypatch.setattr(agent, "services_acked", lambda ack_id, position=None: [object()])
    apply_log(agent, codecs.ClusterAction.SUSPEND, codecs.ClusterAction.SNAPSHOT)
    assert agent.state is ConsensusModuleState.SNAPSHOT
    agent._check_follower_snapshot()
    assert agent.state is ConsensusModuleState.SUSPENDED


LONE_MEMBER = "0,127.0.0.1:20110,127.0.0.1:20220,127.0.0.1:20330,127.0.0.1:20440,127.0.0.1:8010"


def test_a_cluster_of_one_hears_the_tools_but_no_member_on_its_consensus_stream() -> None:
    """A lone member's consensus stream is for a ClusterBackup and the other
    tools: a member's message there (a stranger's canvass, vote request or
    leader's word) is counted and reported, and starts no election."""
    agent = new_agent(LONE_MEMBER, member_id=0)
    assert agent.consensus_adapter is not None
    listener = agent.consensus_adapter.listener
    assert isinstance(listener, LoneMemberConsensusListener)
    errors: list[str] = []
    agent.report_error = errors.append  # type: ignore[assignment]
    listener.on_canvass_position(0, 0, 5, 1, 0)
    listener.on_request_vote(0, 0, 6, 1, 0)
    listener.on_commit_position(7, 1 << 40, 2)
    assert not agent.is_multi_member and agent.consensus_publisher is None
    assert agent.invalid_requests_counter.get() == 3
    assert [e.split(" refused")[0] for e in errors] == [
        "consensus stream: a CanvassPosition from member 1",
        "consensus stream: a RequestVote from member 1",
        "consensus stream: a CommitPosition from member 2",
    ]
    assert listener.on_backup_query == agent.on_backup_query


def test_a_leader_that_stood_still_reads_its_backlog_before_judging_its_followers() -> None:
    """A leader whose process was stopped (SIGSTOP) longer than the heartbeat
    timeout has its followers' messages unread in its buffers: the silence
    is its own.  It gives them a timeout from when it runs again instead of
    stepping down at once on 'inactive follower quorum' (and then standing on
    stale canvasses from the same backlog, deposing the leader the others
    elected meanwhile)."""
    agent = new_agent(MEMBERS, member_id=0)
    complete_election(agent, ClusterRole.LEADER, leader=0, term=0)
    agent.aeron.conductor.has_driver_news = lambda: False  # type: ignore[method-assign]
    agent._slow_tick_deadline_ns = 1 << 62  # (its periodic work is not what this is about)
    timeout_ns = agent.context.leader_heartbeat_timeout_ns
    start = 1_000_000_000
    for follower in agent._followers.values():
        follower.time_of_last_append_position_ns = start
    agent.do_work(start)
    assert agent.election is None
    resumed = start + 2 * timeout_ns  # stopped for two heartbeat timeouts
    agent.do_work(resumed)
    assert agent.election is None, "stepped down on its own silence"
    assert all(f.time_of_last_append_position_ns == resumed for f in agent._followers.values())
    # Running on (a cycle every 100 ms), still nothing from them a whole timeout later: they are gone.
    now = resumed
    while agent.election is None and now < resumed + 2 * timeout_ns:
        now += 100_000_000
        agent.do_work(now)
    assert agent.election is not None and resumed + timeout_ns <= now <= resumed + timeout_ns + 100_000_000
