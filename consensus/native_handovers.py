"""The consensus module agent's hand-overs to its native threads.

A steady member hands steps of its duty cycle to C threads that run without
the GIL while the agent sleeps (DESIGN.md: a hop is the unit of latency):

- the leader's ingress (``consensus/leader_ingress.py``): the open sessions'
  messages appended to the log, armed as the agent goes to sleep;
- the leader's commit (``consensus/leader_commit.py``, armed as a leader's):
  the followers' AppendPositions read, commit-pos moved, CommitPositions sent;
- the follower's commit (the same thread, armed as a follower's): the
  leader's CommitPositions and the log's client messages read, commit-pos moved;
- the follower's AppendPositions (``consensus/append_position_sender.py``).

Each is one object, owning its thread and what it was armed with, behind one
interface (``Handover``):

- ``arm()``: hand the step to the thread when its conditions hold; True while
  the thread has it (armed now or before);
- ``take_back(now_ns)``: take in what the thread did, into the agent's view;
  halt it where it gave the step back or its conditions no longer hold (the
  agent then does the step itself, in this cycle); the work done;
- ``halt()``: the agent does the step from here (an election, a new consensus
  image, the log closing, the close), from where the thread left it;
- ``has_news()``: the armed thread gave its step back and waits for the agent
  (its ring may have come while the agent was awake): what ``has_work`` asks;
- ``close()``: stop the thread (after ``halt``).

A thread that gives a step back for good (a malformed frame, a refused
arming) is not armed again with the same key (the rec-pos counter, the term,
the leader): the agent does that step itself for the rest of the term.  The
context's ``native_ingress``, ``native_commit``, ``native_follower_commit``
and ``native_append_position`` say for each whether it runs in C at all.

The hand-overs are parts of the agent, as its methods were: they read and
write its view (positions, followers, sessions) and report through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fulmar import clock
from fulmar.consensus.append_position_sender import RUNNING as APPEND_POSITION_RUNNING
from fulmar.consensus.append_position_sender import AppendPositionSender
from fulmar.consensus.cluster_session import ClusterSessionState
from fulmar.consensus.leader_commit import (
    LOG_MESSAGE as COMMIT_LOG_MESSAGE,
)
from fulmar.consensus.leader_commit import (
    OTHER_MESSAGE as COMMIT_OTHER_MESSAGE,
)
from fulmar.consensus.leader_commit import (
    REASONS as COMMIT_REASONS,
)
from fulmar.consensus.leader_commit import (
    RUNNING as COMMIT_RUNNING,
)
from fulmar.consensus.leader_commit import (
    ArmedFollower,
    CommitState,
    CommitThread,
    FollowerCommitState,
)
from fulmar.consensus.leader_ingress import (
    BACK_PRESSURE as INGRESS_BACK_PRESSURE,
)
from fulmar.consensus.leader_ingress import (
    OTHER_MESSAGE as INGRESS_OTHER_MESSAGE,
)
from fulmar.consensus.leader_ingress import (
    REASONS as INGRESS_REASONS,
)
from fulmar.consensus.leader_ingress import (
    RUNNING as INGRESS_RUNNING,
)
from fulmar.consensus.leader_ingress import (
    LeaderIngressThread,
)
from fulmar.consensus.protocol import NULL_POSITION, NULL_VALUE
from fulmar.consensus.states import ClusterRole, ConsensusModuleState
from fulmar.errors import FulmarError

if TYPE_CHECKING:
    from fulmar.consensus.agent import ConsensusModuleAgent

# How soon the AppendPosition thread offers again after the publication
# refused (back pressure, or the leader's image not connected yet).
APPEND_POSITION_RETRY_WAIT_NS = 1_000_000


class Handover(Protocol):
    """One step of the duty cycle that a native thread may do instead of the agent."""

    @property
    def is_armed(self) -> bool: ...

    def arm(self) -> bool: ...

    def take_back(self, now_ns: int) -> int: ...

    def halt(self) -> None: ...

    def has_news(self) -> bool: ...

    def close(self) -> None: ...


class _Handover:
    """What each hand-over keeps: the key it was armed with (None: the agent
    does the step), the key its thread gave back for good, the key last said
    in the module's log."""

    name = ""  # in the module's log

    def __init__(self, agent: ConsensusModuleAgent) -> None:
        self._agent = agent
        self.armed_for: tuple[int, ...] | None = None
        self.refused_for: tuple[int, ...] | None = None
        self._said_for: tuple[int, ...] | None = None

    @property
    def is_armed(self) -> bool:
        return self.armed_for is not None

    def _steady(self, role: ClusterRole) -> bool:
        """This member is an active member of that role with no election: what
        a thread needs to be armed, and to stay armed."""
        agent = self._agent
        return agent.election is None and agent.role is role and agent.state is ConsensusModuleState.ACTIVE

    def _armed(self, key: tuple[int, ...]) -> None:
        """Armed: said in the module's log once per key (not for each re-arming
        after a hand-back): an operator, and the tests, see which threads run
        and whether they sign."""
        self.armed_for = key
        if self._said_for == key:
            return
        self._said_for = key
        agent = self._agent
        trailers = "member trailers signed and checked" if agent._member_auth is not None else "no member trailers"
        agent.log_event(f"{self.name} armed for term {agent.leadership_term_id} ({trailers})")


class LeaderIngressHandover(_Handover):
    """A steady leader's clients' session messages, appended by the ingress
    thread while the agent sleeps, whose doorbell the ingress subscription
    names.  Armed as the agent goes to sleep, taken back first thing in its
    next cycle: the log's exclusive writer has one writer at a time.  Only on
    the wall clock the thread reads too (tests give their own)."""

    name = "the ingress thread"

    def __init__(self, agent: ConsensusModuleAgent) -> None:
        super().__init__(agent)
        self.thread: LeaderIngressThread | None = None
        self.refused_for = (NULL_VALUE,)  # (its key: the term)

    def doorbell_id(self) -> int | None:
        """The doorbell the ingress subscription names: the thread's, started
        the first time; None when the agent appends the ingress itself."""
        agent = self._agent
        if not agent.context.native_ingress or agent.epoch_ms is not clock.epoch_ms:
            return None
        if self.thread is None:
            try:
                self.thread = LeaderIngressThread(agent.aeron, agent._watches().doorbell_id)
            except (OSError, FulmarError) as error:
                agent._error(f"the ingress thread: {error}; this module appends the ingress itself")
                return None
        return self.thread.doorbell_id

    def arm(self) -> bool:
        """Before the agent sleeps: a steady, active leader with nothing of
        the ingress left over (back-pressured messages wait in the agent, in
        order) hands the ingress to the thread."""
        if self.is_armed:
            return True
        agent = self._agent
        thread = self.thread
        ingress = agent.ingress
        publication = agent.log_publisher.publication
        key = (agent.leadership_term_id,)
        if (
            thread is None
            or ingress is None
            or publication is None
            or agent._pending_ingress
            or not self._steady(ClusterRole.LEADER)
            or key == self.refused_for
        ):
            return False
        # (Every open session each time: a cycle may have opened or closed any.)
        open_ids = [session.id for session in agent.sessions.values() if session.state is ClusterSessionState.OPEN]
        try:
            thread.arm(
                ingress.images,
                open_ids,
                publication,
                leadership_term_id=agent.leadership_term_id,
                invalid_requests_id=agent.invalid_requests_counter.id,
            )
        except ValueError as error:
            agent._error(f"{error}; this module appends the ingress itself this term")
            self.refused_for = key
            return False
        self.armed_for = key
        return True

    def take_back(self, now_ns: int) -> int:
        """Halt the thread and take back what it did: the images' positions,
        the sessions' activity.  A thread that gave back for a message it
        does not take leaves it unread for the agent's poll.  Before anything
        of the agent reads the ingress or appends to the log (the duty cycle,
        an election, a stop request)."""
        thread = self.thread
        if thread is None or not self.is_armed:
            return 0
        session_ids = thread.session_ids
        state = thread.halt()
        self.armed_for = None
        if state is None:
            return 0
        sessions = self._agent.sessions
        for session_id, activity_ns in zip(session_ids, state.activity_ns):
            session = sessions.get(session_id)
            if activity_ns and session is not None and activity_ns > session.time_of_last_activity_ns:
                session.time_of_last_activity(activity_ns)
        if state.status == INGRESS_RUNNING:
            return 0
        if state.reason not in (INGRESS_OTHER_MESSAGE, INGRESS_BACK_PRESSURE):
            # A frame the agent's own poll may not get past either: the agent
            # reads the ingress itself for the rest of the term (no hand-back loop).
            reason = INGRESS_REASONS.get(state.reason, f"reason {state.reason}")
            counts = thread.counts()
            self._agent._error(
                f"the ingress thread gave back: {reason} (last refusal {counts['last_failure']}, "
                f"{counts['messages']} messages); this module appends the ingress itself this term"
            )
            self.refused_for = (self._agent.leadership_term_id,)
        return 1

    def halt(self) -> None:
        self.take_back(self._agent.now_ns)

    def has_news(self) -> bool:
        return self.is_armed and self.thread is not None and self.thread.status() != INGRESS_RUNNING

    def close(self) -> None:
        if self.thread is not None:
            self.halt()
            self.thread.close()
            self.thread = None


class LeaderCommitHandover(_Handover):
    """A steady leader's commit: the followers' AppendPositions, commit-pos
    and the CommitPositions, done by the commit thread, whose doorbell the
    consensus subscription names (a single member's: its own recording,
    committed as it is made).  It owns the thread, which the follower's
    commit borrows."""

    name = "the leader's commit thread"

    def __init__(self, agent: ConsensusModuleAgent) -> None:
        super().__init__(agent)
        self.thread: CommitThread | None = None

    def start(self) -> bool:
        """The commit thread (for a leader's commit and a follower's)."""
        agent = self._agent
        try:
            self.thread = CommitThread(agent.aeron, agent._watches().doorbell_id)
        except (OSError, FulmarError) as error:
            agent._error(f"the commit thread: {error}; this module commits itself")
            return False
        return True

    def arm(self) -> bool:
        """A steady, active leader whose log recording's rec-pos counter is
        known hands the followers' reports and the commit to the thread."""
        if self.is_armed:
            return True
        agent = self._agent
        thread = self.thread
        if thread is None or not agent.context.native_commit or not self._steady(ClusterRole.LEADER):
            return False
        counter_id = agent._recording_position_counter()
        if counter_id == NULL_VALUE:
            return False
        key = (counter_id, agent._recording_position_registration_id, agent.leadership_term_id)
        if key == self.refused_for:
            return False
        followers = []
        for member_id, follower in agent._followers.items():
            publication = agent._consensus_publications.get(member_id)
            if publication is None:
                return False
            followers.append(
                ArmedFollower(member_id, publication, follower.log_position, follower.time_of_last_append_position_ns)
            )
        try:
            thread.arm(
                # (A single member has no followers on its consensus stream,
                # and no term rule: all it records is committed.)
                agent._consensus_subscription.images
                if agent.is_multi_member and agent._consensus_subscription is not None
                else (),
                followers,
                leadership_term_id=agent.leadership_term_id,
                leader_member_id=agent.member_id,
                term_base_log_position=agent.term_base_log_position if agent.is_multi_member else NULL_POSITION,
                commit_position=agent.commit_position,
                sent_position=agent._last_commit_position_sent,
                sent_time_ns=agent._time_of_last_commit_position_sent_ns,
                recording_position_id=counter_id,
                recording_position_registration_id=agent._recording_position_registration_id,
                commit_position_id=agent.commit_position_counter.id,
                auth=agent._member_auth,
            )
        except ValueError as error:
            agent._error(f"{error}; this module commits itself this term")
            self.refused_for = key
            return False
        self._armed(key)
        # The thread's doorbell watches rec-pos when the leader's recording
        # holds the commit; the agent has nothing to do for it.
        agent._watch_own_recording(False)
        return True

    def take_back(self, now_ns: int) -> int:
        """Take in what the armed thread did; halt it when it gave the stream
        back or this member is no longer a steady, active leader (the agent
        then reads the stream itself)."""
        thread = self.thread
        if thread is None or not self.is_armed:
            return 0
        state = thread.state()
        if state.status == COMMIT_RUNNING and self._steady(ClusterRole.LEADER):
            self._take_state(state, thread.follower_ids)
            return 0  # (the thread's work: the agent has no more of it to do now)
        if state.status != COMMIT_RUNNING:
            reason = COMMIT_REASONS.get(state.reason, f"reason {state.reason}")
            if state.reason != COMMIT_OTHER_MESSAGE:
                counts = thread.counts()
                self._agent._error(
                    f"the commit thread gave back: {reason} (last refusal {counts['last_failure']}, "
                    f"{counts['commits']} commits); this module commits itself this term"
                )
                self.refused_for = self.armed_for
        self.halt()
        return 1

    def heartbeat(self, now_ns: int) -> None:
        """The CommitPosition heartbeat from the armed thread, when due."""
        agent = self._agent
        if now_ns >= agent._time_of_last_commit_position_sent_ns + agent.context.leader_heartbeat_interval_ns:
            assert self.thread is not None
            self.thread.send_now(now_ns)

    def _take_state(self, state: CommitState, follower_ids: tuple[int, ...]) -> None:
        agent = self._agent
        for member_id, position, time_ns in zip(follower_ids, state.follower_positions, state.follower_times_ns):
            follower = agent._followers.get(member_id)
            if follower is not None:
                follower.log_position = max(follower.log_position, position)
                follower.time_of_last_append_position_ns = max(follower.time_of_last_append_position_ns, time_ns)
        agent._last_commit_position_sent = state.sent_position
        agent._time_of_last_commit_position_sent_ns = state.sent_time_ns
        if state.commit_position > agent.commit_position:
            agent.commit_position = state.commit_position
            agent._sweep_uncommitted(state.commit_position)

    def halt(self) -> None:
        """The agent reads the consensus stream and commits again from here,
        from where the thread left both."""
        thread = self.thread
        if thread is None or not self.is_armed:
            return
        follower_ids = thread.follower_ids
        state = thread.halt()
        self.armed_for = None
        if state is not None:
            self._take_state(state, follower_ids)

    def has_news(self) -> bool:
        return self.is_armed and self.thread is not None and self.thread.status() != COMMIT_RUNNING

    def close(self) -> None:
        if self.thread is not None:
            self.halt()
            self.thread.close()
            self.thread = None


class FollowerCommitHandover(_Handover):
    """A steady follower's commit: the leader's CommitPositions and the log's
    client messages, read by the commit thread (the leader's hand-over's,
    armed as a follower's), which moves commit-pos."""

    name = "the follower's commit thread"

    def __init__(self, agent: ConsensusModuleAgent, leader_commit: LeaderCommitHandover) -> None:
        super().__init__(agent)
        self._leader_commit = leader_commit

    @property
    def thread(self) -> CommitThread | None:
        return self._leader_commit.thread

    def arm(self) -> bool:
        """A steady, active follower of a joined log whose rec-pos counter is
        known hands the leader's CommitPositions and the log's client
        messages to the thread."""
        if self.is_armed:
            return True
        agent = self._agent
        thread = self.thread
        image = agent._log_image
        if (
            thread is None
            or not agent.context.native_follower_commit
            or not self._steady(ClusterRole.FOLLOWER)
            or image is None
            or image.is_closed
            or not agent.host.is_log_joined
        ):
            return False
        counter_id = agent._recording_position_counter()
        if counter_id == NULL_VALUE:
            return False
        key = (counter_id, agent._recording_position_registration_id, agent.leadership_term_id)
        if key == self.refused_for:
            return False
        try:
            assert agent._consensus_subscription is not None  # (a follower is one of several)
            thread.arm_follower(
                agent._consensus_subscription.images,
                image,
                leadership_term_id=agent.leadership_term_id,
                leader_member_id=agent.leader_member_id,
                notified_commit_position=agent.notified_commit_position,
                commit_position=agent.commit_position,
                leader_time_ns=agent._time_of_last_leader_message_ns,
                recording_position_id=counter_id,
                recording_position_registration_id=agent._recording_position_registration_id,
                commit_position_id=agent.commit_position_counter.id,
                auth=agent._member_auth,
            )
        except ValueError as error:
            agent._error(f"{error}; this module applies the log itself this term")
            self.refused_for = key
            return False
        self._armed(key)
        # The thread's doorbell watches rec-pos while a commit waits on it.
        agent._watch_own_recording(False)
        return True

    def take_back(self, now_ns: int) -> int:
        """Take in what the armed thread did; halt it when it gave the log or
        the consensus stream back, or this member is no longer a steady,
        active follower of that log (the agent then reads both itself)."""
        thread = self.thread
        if thread is None or not self.is_armed:
            return 0
        state = thread.follower_state()
        if (
            state.status == COMMIT_RUNNING
            and self._steady(ClusterRole.FOLLOWER)
            and self._agent._log_image is thread.log_image
        ):
            self._take_state(state)
            return 0
        if state.status != COMMIT_RUNNING and state.reason not in (COMMIT_OTHER_MESSAGE, COMMIT_LOG_MESSAGE):
            reason = COMMIT_REASONS.get(state.reason, f"reason {state.reason}")
            self._agent._error(f"the commit thread gave back: {reason}; this module applies the log itself this term")
            self.refused_for = self.armed_for
        self.halt()
        return 1

    def _take_state(self, state: FollowerCommitState) -> None:
        agent = self._agent
        if state.notified_commit_position > agent.notified_commit_position:
            agent.notified_commit_position = state.notified_commit_position
        if state.leader_time_ns > agent._time_of_last_leader_message_ns:
            agent._time_of_last_leader_message_ns = state.leader_time_ns
            agent.time_of_last_leader_update_ns = max(agent.time_of_last_leader_update_ns, state.leader_time_ns)
        if state.log_position > agent.log_position:
            agent.log_position = state.log_position
        if state.commit_position > agent.commit_position:
            agent.commit_position = state.commit_position  # (commit-pos holds it: the thread stored it)

    def halt(self) -> None:
        """The agent reads the log and the consensus stream again from here,
        from where the thread left them: before an election, before the log
        closes, on a new or lost consensus image."""
        thread = self.thread
        if thread is None or not self.is_armed:
            return
        state = thread.halt_follower()
        self.armed_for = None
        if state is not None:
            self._take_state(state)

    def has_news(self) -> bool:
        return self.is_armed and self.thread is not None and self.thread.status() != COMMIT_RUNNING

    def close(self) -> None:
        self.halt()  # (the thread is the leader's hand-over's to stop)


class AppendPositionHandover(_Handover):
    """A steady follower's AppendPositions, sent by their own thread (started
    at the first arming) whose doorbell the log recording's rec-pos counter
    rings; the agent only asks it for the heartbeat."""

    name = "the AppendPosition thread"

    def __init__(self, agent: ConsensusModuleAgent) -> None:
        super().__init__(agent)
        self.thread: AppendPositionSender | None = None

    def arm(self) -> bool:
        """An active (or suspended) follower whose rec-pos counter and
        publication to the leader are known hands its reports to the thread."""
        if self.is_armed:
            return True
        agent = self._agent
        if not agent.context.native_append_position or agent.state not in (
            ConsensusModuleState.ACTIVE,
            ConsensusModuleState.SUSPENDED,
        ):
            return False
        counter_id = agent._recording_position_counter()
        publication = agent._consensus_publications.get(agent.leader_member_id)
        if counter_id == NULL_VALUE or publication is None:
            return False
        key = (counter_id, agent._recording_position_registration_id, agent.leadership_term_id, agent.leader_member_id)
        if key == self.refused_for:
            return False
        sender = self.thread
        if sender is None:
            try:
                sender = self.thread = AppendPositionSender(
                    agent.aeron, agent._watches().doorbell_id, APPEND_POSITION_RETRY_WAIT_NS
                )
            except (OSError, FulmarError) as error:
                agent._error(f"the AppendPosition thread: {error}; this module sends them itself")
                self.refused_for = key
                return False
        if not sender.arm(
            publication,
            counter_id,
            agent._recording_position_registration_id,
            leadership_term_id=agent.leadership_term_id,
            follower_member_id=agent.member_id,
            sent_position=agent._last_append_position_sent,
            sent_time_ns=agent._time_of_last_append_position_sent_ns,
            auth=agent._member_auth,
            leader_member_id=agent.leader_member_id,
        ):
            agent._print_error(
                f"rec-pos counter {counter_id} has no free watcher slot: this module sends the AppendPositions itself"
            )
            self.refused_for = key
            return False
        self._armed(key)
        return True

    def take_back(self, now_ns: int) -> int:
        """What the armed thread sent, and the heartbeat asked of it when due;
        halted when the thread gave the reports back to the agent (which then
        sends them itself, in this cycle).  No work of the agent's."""
        sender = self.thread
        if sender is None or not self.is_armed:
            return 0
        agent = self._agent
        status, sent_position, sent_time_ns = sender.state()
        if status != APPEND_POSITION_RUNNING:
            sent, refused, failure = sender.counts()
            agent._error(
                f"the AppendPosition thread stopped (rec-pos counter {agent._recording_position_counter_id} "
                f"gone, or the publication to leader {agent.leader_member_id} closed: last refusal {failure}, "
                f"{sent} sent, {refused} refused); this module sends them itself"
            )
            self.refused_for = self.armed_for
            self.halt()
            return 0
        # A forced report (time 0: the leader's election waits on one) or a heartbeat.
        due = agent._time_of_last_append_position_sent_ns == 0 or (
            now_ns >= sent_time_ns + agent.context.leader_heartbeat_interval_ns
        )
        if sent_position != NULL_POSITION:
            agent._last_append_position_sent = sent_position
            agent._time_of_last_append_position_sent_ns = sent_time_ns
        if due:
            sender.send_now(now_ns)
        return 0

    def keeps_reports(self) -> bool:
        """At the end of the agent's cycle: the armed thread keeps the reports
        while this member is a follower with no election; else it is halted
        (the agent reports from the election on).  True when it keeps them."""
        if not self.is_armed:
            return False
        agent = self._agent
        if agent.election is not None or agent.role is not ClusterRole.FOLLOWER:
            self.halt()
            return False
        return True

    def halt(self) -> None:
        """The agent reports again from here (an election, a new term or leader)."""
        if self.thread is not None:
            self.thread.halt()
        self.armed_for = None

    def has_news(self) -> bool:
        return self.is_armed and self.thread is not None and self.thread.status() != APPEND_POSITION_RUNNING

    def close(self) -> None:
        if self.thread is not None:
            self.thread.close()
            self.thread = None
        self.armed_for = None


class NativeHandovers:
    """The agent's four hand-overs.  ``all`` is in the order of the duty
    cycle, for what concerns each alike (``has_work``, an election's halt,
    the close); the duty cycle calls each at its own point."""

    def __init__(self, agent: ConsensusModuleAgent) -> None:
        self.leader_ingress = LeaderIngressHandover(agent)
        self.leader_commit = LeaderCommitHandover(agent)
        self.follower_commit = FollowerCommitHandover(agent, self.leader_commit)
        self.append_position = AppendPositionHandover(agent)
        self.all: tuple[Handover, ...] = (
            self.leader_ingress,
            self.follower_commit,
            self.leader_commit,
            self.append_position,
        )

    def has_news(self) -> bool:
        for handover in self.all:
            if handover.has_news():
                return True
        return False

    def halt(self) -> None:
        for handover in self.all:
            handover.halt()

    def close(self) -> None:
        """Each halted first (the follower's commit before its thread stops), then closed."""
        self.halt()
        for handover in self.all:
            handover.close()
