"""How long an idle agent sleeps.

A steady consensus module, a service container following its log and an
archive with nothing in progress sleep up to their idle wait (100 ms): what
they wait for rings them, and their own periodic work is in seconds.  A
module still wakes for its own duties (its heartbeat, its leader's timeout, a
cluster timer), and keeps the slow tick's pace (10 ms) while something no
ring announces is under way: an election, a session being opened or told of
an event, a follower catching up, an ingress to reconnect.  A service keeps
that pace while it joins a log or awaits its termination; a ClusterBackup
keeps it in every state but BACKING_UP.  (At the old
10 ms pace, an idle three-member cluster's Python agents woke about a
thousand times a second between them, and under a ping load those wake-ups
took the two cores from the round trip.)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fulmar.consensus.agent import ClusterRole, ConsensusModuleAgent
from fulmar.consensus.backup import SLOW_TICK_INTERVAL_NS, ClusterBackupAgent, ClusterBackupState
from fulmar.consensus.cluster_session import ClusterSessionState
from fulmar.service.agent import NULL_POSITION, ClusteredServiceAgent
from fulmar.service.context import ServiceContext
from support.agents import MEMBERS, FakeSubscription, complete_election, new_agent

MS = 1_000_000
MAX_WAIT = 100 * MS
NOW = 5_000 * MS


def steady(role: ClusterRole) -> ConsensusModuleAgent:
    """Member 0 leading three, or member 1 following it, ACTIVE after its election, its ingress open."""
    agent = new_agent(MEMBERS, member_id=0 if role is ClusterRole.LEADER else 1)
    complete_election(agent, role, leader=0, term=0)
    agent.ingress = FakeSubscription()  # type: ignore[assignment]
    agent._now_ns = NOW
    agent._time_of_last_commit_position_sent_ns = NOW
    agent._time_of_last_append_position_sent_ns = NOW
    agent._time_of_last_leader_message_ns = NOW
    assert agent.is_steady()
    return agent


def test_a_steady_leader_sleeps_until_its_commit_position_heartbeat() -> None:
    agent = steady(ClusterRole.LEADER)
    slow = agent.context.slow_tick_interval_ns
    interval = agent.context.leader_heartbeat_interval_ns
    assert agent.idle_wait_ns(MAX_WAIT) == MAX_WAIT  # sent just now: due in 200 ms
    agent._time_of_last_commit_position_sent_ns = NOW - interval + 30 * MS
    assert agent.idle_wait_ns(MAX_WAIT) == 30 * MS
    # Overdue (a heartbeat the thread could not send yet): the slow tick's pace, never a spin.
    agent._time_of_last_commit_position_sent_ns = NOW - 10 * interval
    assert agent.idle_wait_ns(MAX_WAIT) == slow
    # A cluster timer due sooner ends the sleep then (timers are in cluster time, ms).
    agent._time_of_last_commit_position_sent_ns = NOW
    agent.timers.schedule(1, agent.cluster_time() + 7)
    assert agent.idle_wait_ns(MAX_WAIT) == 7 * MS


def test_a_steady_follower_sleeps_until_its_append_position_heartbeat_or_its_leaders_timeout() -> None:
    agent = steady(ClusterRole.FOLLOWER)
    interval = agent.context.leader_heartbeat_interval_ns
    timeout = agent.context.leader_heartbeat_timeout_ns
    assert agent.idle_wait_ns(MAX_WAIT) == MAX_WAIT
    agent._time_of_last_append_position_sent_ns = NOW - interval + 80 * MS
    assert agent.idle_wait_ns(MAX_WAIT) == 80 * MS
    agent._time_of_last_append_position_sent_ns = NOW
    agent._time_of_last_leader_message_ns = NOW - timeout + 40 * MS  # the leader silent: an election in 40 ms
    assert agent.idle_wait_ns(MAX_WAIT) == 40 * MS


def test_work_that_no_ring_announces_keeps_the_slow_tick() -> None:
    agent = steady(ClusterRole.LEADER)
    slow = agent.context.slow_tick_interval_ns
    session: Any = SimpleNamespace()
    for collection in (
        agent.pending_sessions,
        agent.pending_backup_sessions,
        agent.redirect_sessions,
        agent.rejected_sessions,
        agent.rejected_backup_sessions,
    ):
        collection.append(session)
        assert agent.idle_wait_ns(MAX_WAIT) == slow
        collection.clear()
        assert agent.idle_wait_ns(MAX_WAIT) == MAX_WAIT

    agent._followers[2].catchup_replay_session_id = 11  # a follower catching up from this leader's archive
    assert agent.idle_wait_ns(MAX_WAIT) == slow
    agent._followers[2].catchup_replay_session_id = -1
    agent.ingress = None
    assert agent.idle_wait_ns(MAX_WAIT) == slow
    agent.ingress = FakeSubscription()  # type: ignore[assignment]
    agent.election = SimpleNamespace(wake_deadline_ns=lambda: None)
    assert agent.idle_wait_ns(MAX_WAIT) == slow


def test_a_session_event_still_to_send_keeps_the_slow_tick_until_it_is_sent() -> None:
    agent = steady(ClusterRole.LEADER)
    slow = agent.context.slow_tick_interval_ns
    # An opened session whose OK waits for its egress to connect (no publication yet).
    session: Any = SimpleNamespace(
        id=4,
        state=ClusterSessionState.OPEN,
        time_of_last_activity_ns=NOW,
        has_open_event_pending=True,
        has_new_leader_event_pending=False,
        publication=None,
    )
    agent.sessions[session.id] = session
    agent._session_events_pending = True  # as _process_pending_sessions sets it on the open
    agent._check_sessions(NOW)
    assert agent.idle_wait_ns(MAX_WAIT) == slow
    session.has_open_event_pending = False  # (sent)
    agent._check_sessions(NOW)
    assert agent.idle_wait_ns(MAX_WAIT) == MAX_WAIT
    # A follower sends no session events: a flag left from its time as leader does not hold it.
    follower = steady(ClusterRole.FOLLOWER)
    follower._session_events_pending = True
    assert follower.idle_wait_ns(MAX_WAIT) == MAX_WAIT


def service_wait(**state: Any) -> int:
    """The container's idle wait for an agent in ``state`` (a following agent unless overridden)."""
    agent = SimpleNamespace(
        context=ServiceContext(), _active_log=None, _termination_position=NULL_POSITION, _commit_watched=True
    )
    vars(agent).update(state)
    return ClusteredServiceAgent.idle_wait_ns(agent, MAX_WAIT)  # type: ignore[arg-type]


def test_a_service_sleeps_long_while_it_follows_its_log_and_keeps_the_slow_tick_otherwise() -> None:
    slow = ServiceContext().slow_tick_interval_ns
    assert service_wait() == MAX_WAIT
    assert service_wait(_active_log=object()) == slow  # a log to join: its image, or a retry
    assert service_wait(_termination_position=4096) == slow
    assert service_wait(_commit_watched=False) == slow  # commits are then noticed by the wait


def backup_wait(state: ClusterBackupState, next_query_ms: int, now_ms: int) -> int:
    """The idle wait of a backup in ``state`` whose next query is due at ``next_query_ms``."""
    agent = SimpleNamespace(state=state, next_query_deadline_counter=SimpleNamespace(get=lambda: next_query_ms))
    return ClusterBackupAgent.idle_wait_ns(agent, MAX_WAIT, now_ms)  # type: ignore[arg-type]


def test_a_backup_sleeps_long_only_while_backing_up_and_wakes_for_its_next_query() -> None:
    now_ms = 1_700_000_000_000
    assert backup_wait(ClusterBackupState.BACKING_UP, now_ms + 5_000, now_ms) == MAX_WAIT
    assert backup_wait(ClusterBackupState.BACKING_UP, now_ms + 30, now_ms) == 30 * MS
    # Overdue (not yet sent): the slow tick's pace, never a spin.
    assert backup_wait(ClusterBackupState.BACKING_UP, now_ms - 1_000, now_ms) == SLOW_TICK_INTERVAL_NS
    for state in ClusterBackupState:
        if state is not ClusterBackupState.BACKING_UP:
            assert backup_wait(state, now_ms + 5_000, now_ms) == SLOW_TICK_INTERVAL_NS, state.name
