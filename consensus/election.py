"""The election of a multi-member cluster (seed 001), as a plain object.

``Election.do_work(now_ns)`` runs the method of the current state (one method
per ``ElectionState``, named after it).  Every transition goes through
``state(new_state, now_ns, reason)``, which runs the exit and entry actions,
writes the election state counter and restarts the state's timers.  The
``on_*`` handlers, called by the consensus adapter, only record facts; the
state methods act on them.

The election talks to its node through two small injected objects: an
``ElectionHost`` (the node's log, archive and roles) and a consensus
publisher (``ConsensusPublisher``: encodes messages to another member).  It
reads no clock (``now_ns`` is passed in) and draws randomness from the given
``random.Random``, so the same code runs in the consensus module process and
in the deterministic simulation of ``tests/support/election_simulation.py``.

Rules beyond the seed, chosen for safety and written down here:

* A follower reports its position (AppendPosition with the new leadership
  term) only once its log is known to agree with the leader's up to that
  position: after the NewLeadershipTerm check (truncation, replication).  The
  leader counts only such reports, never the positions carried by votes.
* The leader's commit position moves only through the node
  (``host.commit_position()``); the node advances it when a quorum holds an
  entry of the current leadership term (Raft's rule: a leader never commits
  an older term's entries by counting replicas), and never past what the
  leader's own archive holds (Aeron's updateLeaderPosition).
* A member remembers its vote: a repeated RequestVote from the same candidate
  for the same term gets the same answer (the network may duplicate), and a
  member never follows a leader of a term lower than one it followed or may
  have voted in for another member (its own candidacy does not bar it).
* A NewLeadershipTerm whose ``nextLeadershipTermId`` is ``NULL_VALUE`` while
  its ``logLeadershipTermId`` (the follower's last term) is older than the
  leader's term says "the leader's log has no entry for your last term": the
  follower drops that whole term (its entries cannot have been committed) and
  canvasses again.  (Aeron's leaders send ``NULL_VALUE`` only to a follower
  whose log is in the current term, meaning "no next term".)
* A follower never completes its election without the log it needs: the log
  subscription, the catchup destination and the live log destination are each
  set up before the state that needs them moves on (the host retries a refused
  registration with back-off and reports it once); what cannot be set up
  within the leader heartbeat timeout sends the follower back to CANVASS.
"""

from __future__ import annotations

import random as _random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fulmar.consensus.consensus_publisher import APPEND_POSITION_FLAG_CATCHUP, APPEND_POSITION_FLAG_NONE
from fulmar.consensus.protocol import NULL_MEMBER_ID, NULL_POSITION, NULL_VALUE
from fulmar.consensus.states import ClusterRole, ElectionState
from fulmar.errors import FulmarError

_LEADER_STATES = frozenset(
    {
        ElectionState.LEADER_LOG_REPLICATION,
        ElectionState.LEADER_REPLAY,
        ElectionState.LEADER_INIT,
        ElectionState.LEADER_READY,
    }
)
_FOLLOWER_ALIGNED_STATES = frozenset(
    {
        ElectionState.FOLLOWER_LOG_REPLICATION,
        ElectionState.FOLLOWER_REPLAY,
        ElectionState.FOLLOWER_CATCHUP_INIT,
        ElectionState.FOLLOWER_CATCHUP_AWAIT,
        ElectionState.FOLLOWER_CATCHUP,
        ElectionState.FOLLOWER_LOG_INIT,
        ElectionState.FOLLOWER_LOG_AWAIT,
        ElectionState.FOLLOWER_READY,
    }
)


# Where a member answers a RequestVote with its vote (Aeron's rule): elsewhere
# it leads, follows or is still setting up, and only says no to a candidate
# whose log is behind its own.
_VOTING_STATES = frozenset(
    {
        ElectionState.CANVASS,
        ElectionState.NOMINATE,
        ElectionState.CANDIDATE_BALLOT,
        ElectionState.FOLLOWER_BALLOT,
    }
)


class ElectionError(FulmarError):
    """The election met a fact that breaks an invariant of the protocol."""


@dataclass(frozen=True)
class ElectionTimeouts:
    """Timeouts of the election (Aeron's defaults)."""

    election_timeout_ns: int = 1_000_000_000
    election_status_interval_ns: int = 100_000_000
    startup_canvass_timeout_ns: int = 60_000_000_000
    leader_heartbeat_timeout_ns: int = 10_000_000_000
    leader_heartbeat_interval_ns: int = 200_000_000


@dataclass(frozen=True)
class TermEntry:
    """A leadership term of the member's recording log: where it starts and,
    for a term followed by another, where it ends (``NULL_POSITION`` while
    it is the last term)."""

    leadership_term_id: int
    term_base_log_position: int
    log_position: int = NULL_POSITION


class ReplicationHandle(Protocol):
    """A running replication of the leader's log recording into the local one."""

    def is_done(self) -> bool:
        """The local recording reached the stop position."""
        ...

    def failed(self) -> bool:
        """The replication stopped without reaching the stop position."""
        ...

    def close(self) -> None:
        """Stop the replication (idempotent)."""
        ...


class ConsensusPublisherLike(Protocol):
    """The consensus messages the election sends (see ``ConsensusPublisher``)."""

    def canvass_position(
        self,
        to_member_id: int,
        *,
        log_leadership_term_id: int,
        log_position: int,
        leadership_term_id: int,
        follower_member_id: int,
    ) -> bool: ...

    def request_vote(
        self,
        to_member_id: int,
        *,
        log_leadership_term_id: int,
        log_position: int,
        candidate_term_id: int,
        candidate_member_id: int,
    ) -> bool: ...

    def place_vote(
        self,
        to_member_id: int,
        *,
        candidate_term_id: int,
        log_leadership_term_id: int,
        log_position: int,
        candidate_member_id: int,
        follower_member_id: int,
        vote: bool,
    ) -> bool: ...

    def new_leadership_term(
        self,
        to_member_id: int,
        *,
        log_leadership_term_id: int,
        next_leadership_term_id: int,
        next_term_base_log_position: int,
        next_log_position: int,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        leader_recording_id: int,
        timestamp: int,
        leader_member_id: int,
        log_session_id: int,
        app_version: int,
        is_startup: bool,
    ) -> bool: ...

    def append_position(
        self,
        to_member_id: int,
        *,
        leadership_term_id: int,
        log_position: int,
        follower_member_id: int,
        flags: int = ...,
    ) -> bool: ...

    def commit_position(
        self, to_member_id: int, *, leadership_term_id: int, log_position: int, leader_member_id: int
    ) -> bool: ...

    def catchup_position(
        self,
        to_member_id: int,
        *,
        leadership_term_id: int,
        log_position: int,
        follower_member_id: int,
        catchup_endpoint: str,
    ) -> bool: ...


class ElectionHost(Protocol):
    """What the election needs from its node, and nothing more."""

    # -- the local log ------------------------------------------------------------------
    def term_entries(self) -> Sequence[TermEntry]:
        """The leadership terms of the recording log, oldest first."""
        ...

    def append_position(self) -> int:
        """How far the local log recording reaches (the append position)."""
        ...

    def log_recording_id(self) -> int:
        """The id of the local log recording (sent to followers as leaderRecordingId)."""
        ...

    def commit_position(self) -> int:
        """The node's commit position (the leader publishes it in CommitPosition)."""
        ...

    def time_of_last_leader_update_ns(self) -> int:
        """When the node last heard a leader of its term or a newer one
        (NewLeadershipTerm or CommitPosition; 0 if never)."""
        ...

    def processed_position(self) -> int:
        """Where the node and its services have processed the log to (snapshot or earlier replay)."""
        ...

    def truncate_log_to(self, position: int) -> None:
        """Drop the log from ``position`` on (uncommitted entries the leader does not have),
        with the recording log's terms that start after ``position``."""
        ...

    def drop_term(self, leadership_term_id: int) -> None:
        """Remove an emptied last term from the recording log (the leader never had it)."""
        ...

    def append_term(self, leadership_term_id: int, term_base_log_position: int) -> None:
        """Record that a term starts at a position (idempotent), after replicating into it."""
        ...

    # -- archive work -------------------------------------------------------------------
    def replicate(self, leader_member_id: int, leader_recording_id: int, stop_position: int) -> ReplicationHandle:
        """Replicate the leader's recording from the local append position to ``stop_position``
        (ReplicateRequest2 to the local archive, seed 001)."""
        ...

    def start_replay(self, from_position: int, to_position: int) -> None:
        """Replay the local log from ``from_position`` to ``to_position`` into the node and
        its services (asynchronous; see ``replay_done``)."""
        ...

    def replay_done(self) -> bool:
        """The replay started by ``start_replay`` has been processed to its end."""
        ...

    # -- roles and the live log -----------------------------------------------------------
    def close_ingress_and_egress(self) -> None:
        """INIT (seed 001): stop taking client requests and close every client
        session's egress until the election is over; the new leader reconnects the
        sessions' egress (NewLeaderEvent) and every member opens its ingress again."""
        ...

    def prepare_for_election(self) -> None:
        """Clear the decks: close the log publication or subscription and stop any replay,
        replication or catchup of a previous role."""
        ...

    def create_log_publication(self, leadership_term_id: int, log_position: int) -> int:
        """As the new leader, create the log publication starting at ``log_position``;
        returns its session id (logSessionId of NewLeadershipTerm)."""
        ...

    def join_log_as_leader(self, leadership_term_id: int, term_base_log_position: int) -> None:
        """Record the log publication, append the term to the recording log and let the
        services join the live log."""
        ...

    def append_new_leadership_term_event(self, leadership_term_id: int, log_position: int, timestamp: int) -> bool:
        """Append NewLeadershipTermEvent to the log; False on back pressure (retried)."""
        ...

    def join_log_as_follower(
        self, leader_member_id: int, leadership_term_id: int, term_base_log_position: int, log_session_id: int
    ) -> bool:
        """Create the log subscription for the leader's log (no destination yet) and
        start recording it.  True once done; False while the driver or the archive
        refuses (the host retries with back-off on later calls and reports the error)."""
        ...

    def add_live_destination(self) -> bool:
        """Receive the leader's live log on this member's log endpoint (idempotent).
        True once added; False while the driver refuses it (a port still held, say:
        retried with back-off on later calls)."""
        ...

    def is_catchup_near_live(self, leader_log_position: int) -> bool:
        """A catching-up follower is close enough to ``leader_log_position`` for the
        live log to join the catchup without a gap the log buffers cannot hold."""
        ...

    def is_log_connected(self) -> bool:
        """The leader's log (live or catchup) has connected to the log subscription."""
        ...

    def catchup(self, leader_member_id: int, from_position: int) -> str | None:
        """Add the catchup destination to the log subscription; returns the endpoint the
        election sends to the leader in CatchupPosition, or None while the driver
        refuses the destination (retried with back-off on later calls)."""
        ...

    def stop_catchup(self) -> None:
        """Catchup is over (StopCatchup): remove the catchup destination, stay on the live log."""
        ...

    # -- notifications ------------------------------------------------------------------
    def persist_candidate_term_id(self, candidate_term_id: int) -> None:
        """Durably store the highest term this member has voted or stood in (mark file)."""
        ...

    def on_role_change(self, role: ClusterRole) -> None:
        """The member's role changed (node role counter)."""
        ...

    def on_leadership_term_change(self, leadership_term_id: int) -> None:
        """The member moved to a new leadership term."""
        ...

    def notify_commit_position(self, commit_position: int) -> None:
        """A follower learnt a commit position it may apply (never beyond its append position)."""
        ...

    def election_complete(self, role: ClusterRole, leader_member_id: int, leadership_term_id: int) -> None:
        """The election is over: the node does consensus work in ``role``."""
        ...


class StateCounter(Protocol):
    def set(self, value: int) -> None: ...


def compare_log(term_a: int, position_a: int, term_b: int, position_b: int) -> int:
    """Order two logs by (last leadership term, position): <0, 0 or >0."""
    if term_a != term_b:
        return -1 if term_a < term_b else 1
    if position_a != position_b:
        return -1 if position_a < position_b else 1
    return 0


def quorum_threshold(member_count: int) -> int:
    return member_count // 2 + 1


def next_term_for(
    entries: Sequence[TermEntry],
    follower_log_leadership_term_id: int,
    leadership_term_id: int,
    term_base_log_position: int,
) -> tuple[int, int, int]:
    """A leader's answer about a follower's last log term:
    ``(nextLeadershipTermId, nextTermBaseLogPosition, nextLogPosition)``.

    The next term is the first term of the leader's log after the follower's,
    the current term included even before it is recorded.  ``nextLogPosition``
    is ``NULL_POSITION`` for the current term (still growing).  The follower's
    own term being the current one gives ``(NULL_VALUE, NULL_POSITION,
    NULL_POSITION)``: no next term (what an Aeron leader sends then); an older
    term the leader's log does not have gives the same ``NULL_VALUE`` beside
    ``logLeadershipTermId`` older than the current term, which an Aeron leader
    never sends: this leader's "your last term was never mine".
    """
    terms = [e for e in entries if e.leadership_term_id < leadership_term_id]
    terms.append(TermEntry(leadership_term_id, term_base_log_position, NULL_POSITION))
    if follower_log_leadership_term_id == leadership_term_id:
        return NULL_VALUE, NULL_POSITION, NULL_POSITION
    index = -1
    if follower_log_leadership_term_id != NULL_VALUE:
        found = [i for i, e in enumerate(terms) if e.leadership_term_id == follower_log_leadership_term_id]
        if not found:
            return NULL_VALUE, NULL_POSITION, NULL_POSITION
        index = found[0]
    following = terms[index + 1]
    if following.leadership_term_id == leadership_term_id:
        return leadership_term_id, following.term_base_log_position, NULL_POSITION
    end = terms[index + 2].term_base_log_position
    return following.leadership_term_id, following.term_base_log_position, end


class _Member:
    __slots__ = (
        "member_id",
        "log_leadership_term_id",
        "log_position",
        "leadership_term_id",
        "canvassed",
        "candidate_term_id",
        "vote",
        "ballot_sent_ns",
        "append_term_id",
        "append_position",
        "append_ns",
        "new_leadership_term_due",
    )

    def __init__(self, member_id: int) -> None:
        self.member_id = member_id
        self.log_leadership_term_id = NULL_VALUE
        self.log_position = NULL_POSITION
        self.leadership_term_id = NULL_VALUE
        self.canvassed = False
        self.candidate_term_id = NULL_VALUE
        self.vote: bool | None = None
        self.ballot_sent_ns = -1
        self.append_term_id = NULL_VALUE
        self.append_position = NULL_POSITION
        self.append_ns = 0
        self.new_leadership_term_due = False

    def reset_canvass(self) -> None:
        self.canvassed = False
        self.vote = None
        self.candidate_term_id = NULL_VALUE
        self.ballot_sent_ns = -1


class Election:
    """One election of a member of a cluster of ``members`` (member ids, this one included)."""

    def __init__(
        self,
        member_id: int,
        members: Sequence[int],
        host: ElectionHost,
        publisher: ConsensusPublisherLike,
        random: _random.Random,
        timeouts: ElectionTimeouts,
        is_startup: bool,
        log_leadership_term_id: int,
        log_position: int,
        appointed_leader_id: int = NULL_MEMBER_ID,
        *,
        leadership_term_id: int | None = None,
        candidate_term_id: int = NULL_VALUE,
        app_version: int = 0,
        state_counter: StateCounter | None = None,
        graceful_closed_leader_id: int = NULL_MEMBER_ID,
    ) -> None:
        if member_id not in members:
            raise ValueError(f"member {member_id} is not one of {list(members)}")
        self.member_id = member_id
        self.members = {m: _Member(m) for m in members}
        self.others = [m for m in members if m != member_id]
        self.quorum = quorum_threshold(len(self.members))
        self.host = host
        self.publisher = publisher
        self.random = random
        self.timeouts = timeouts
        self.is_startup = is_startup
        self.is_extended_canvass = is_startup
        self.appointed_leader_id = appointed_leader_id
        self.app_version = app_version
        self.state_counter = state_counter
        # A leader that closed its log in order (Aeron's gracefulClosedLeaderId):
        # a unanimous view, or a unanimous vote, leaves it out, so the others
        # need not wait out the heartbeat or election timeout for it; it counts
        # again once it is heard (it came back).
        self.graceful_closed_leader_id = graceful_closed_leader_id

        self.log_leadership_term_id = log_leadership_term_id
        self.append_position = log_position
        current_term_id: int = log_leadership_term_id
        if leadership_term_id is not None:
            current_term_id = leadership_term_id
        self.leadership_term_id = current_term_id
        self.candidate_term_id = max(candidate_term_id, self.leadership_term_id)
        self.leader_member_id = NULL_MEMBER_ID
        self.term_base_log_position = NULL_POSITION
        self.log_session_id = NULL_VALUE
        self.leader_recording_id = NULL_VALUE
        self.leader_log_position = NULL_POSITION
        self.is_leader_startup = False
        self.notified_commit_position = NULL_POSITION
        # What this leader last told its followers is committed, and when.
        self.published_commit_position = NULL_POSITION
        self.commit_published_ns = 0
        self.catchup_join_position = NULL_POSITION
        self.replication_leadership_term_id = NULL_VALUE
        self.replication_term_base_log_position = NULL_POSITION
        self.replication_stop_position = NULL_POSITION
        self.replication: ReplicationHandle | None = None
        self.stop_catchup_received = False
        # CatchupPosition asked again until the catchup connects (see follower_catchup_await).
        self.catchup_endpoint = ""
        self.catchup_requests = 0
        self.catchup_requested_ns = 0
        self.joined_log = False
        self.voted_for: tuple[int, int] | None = None  # (candidate term, candidate) of our FOR vote
        # The highest term in which this member may have voted for another
        # member: it never follows a leader of a lower term than that.  A
        # candidate term it stood in itself does not count (a leader of a
        # lower term that answers it may be followed, as Aeron's members do);
        # one persisted before a restart might be either, so it counts.
        self.highest_term_voted_for_another = candidate_term_id

        self.state_value = ElectionState.INIT
        self.state_change_ns = 0
        self.nomination_deadline_ns = 0
        self.last_status_ns = -(1 << 62)
        self.last_heartbeat_ns = -(1 << 62)
        self.last_progress_ns = 0
        self.last_progress_position = NULL_POSITION
        self.now_ns = 0
        self.transitions: deque[tuple[int, ElectionState, ElectionState, str]] = deque(maxlen=64)
        self.transition_count = 0  # all so far (``transitions`` keeps the latest)
        self._started = False

    # ------------------------------------------------------------------ driving

    @property
    def is_closed(self) -> bool:
        return self.state_value == ElectionState.CLOSED

    def do_work(self, now_ns: int) -> int:
        self.now_ns = now_ns
        if not self._started:
            self._started = True
            self.state_change_ns = now_ns
            self.last_progress_ns = now_ns
        handler = _STATE_METHODS[self.state_value]
        return handler(self, now_ns)

    def state(self, new_state: ElectionState, now_ns: int, reason: str = "") -> None:
        """Every transition: exit actions, the counter, timers, entry actions."""
        old = self.state_value
        self._exit(old, new_state)
        self.transitions.append((now_ns, old, new_state, reason))
        self.transition_count += 1
        self.state_value = new_state
        self.state_change_ns = now_ns
        self.last_progress_ns = now_ns
        self.last_progress_position = NULL_POSITION
        self.last_status_ns = -(1 << 62)
        self.last_heartbeat_ns = -(1 << 62)
        if self.state_counter is not None:
            self.state_counter.set(int(new_state))
        self._enter(new_state, now_ns)

    def _exit(self, old: ElectionState, new: ElectionState) -> None:
        if old == ElectionState.FOLLOWER_LOG_REPLICATION and self.replication is not None:
            self.replication.close()
            self.replication = None
        engaged = _LEADER_STATES | _FOLLOWER_ALIGNED_STATES
        if old in engaged and new not in engaged and new != ElectionState.CLOSED:
            # Leaving a leader or a follower: nothing more may flow from or to the old log.
            self.host.prepare_for_election()
        if old == ElectionState.CANVASS and new != ElectionState.CANVASS:
            self.is_extended_canvass = False

    def _enter(self, new: ElectionState, now_ns: int) -> None:
        host = self.host
        if new == ElectionState.CANVASS:
            for member in self.members.values():
                member.reset_canvass()
            self.leader_member_id = NULL_MEMBER_ID
            self.joined_log = False
            self.stop_catchup_received = False
            self.catchup_join_position = NULL_POSITION
            self.catchup_requests = 0
            self._refresh_log()
            host.on_role_change(ClusterRole.FOLLOWER)
        elif new == ElectionState.CANDIDATE_BALLOT:
            highest = max(
                [self.candidate_term_id, self.leadership_term_id]
                + [m.leadership_term_id for m in self.members.values() if m.canvassed]
            )
            self.candidate_term_id = highest + 1
            host.persist_candidate_term_id(self.candidate_term_id)
            for member in self.members.values():
                member.reset_canvass()
            me = self.members[self.member_id]
            me.candidate_term_id = self.candidate_term_id
            me.vote = True
            host.on_role_change(ClusterRole.CANDIDATE)
        elif new == ElectionState.LEADER_LOG_REPLICATION:
            self.leader_member_id = self.member_id
            self.leadership_term_id = self.candidate_term_id
            self.term_base_log_position = self.append_position
            self.leader_log_position = self.append_position
            self.is_leader_startup = self.is_startup
            self.published_commit_position = NULL_POSITION
            for member in self.members.values():
                member.append_term_id = NULL_VALUE
                member.append_position = NULL_POSITION
                member.new_leadership_term_due = True
            self.log_session_id = host.create_log_publication(self.leadership_term_id, self.append_position)
            host.on_leadership_term_change(self.leadership_term_id)
            host.on_role_change(ClusterRole.LEADER)
        elif new == ElectionState.LEADER_REPLAY:
            for member in self.members.values():  # LEADER_READY needs fresh reports (seed 001)
                member.append_term_id = NULL_VALUE
                member.append_position = NULL_POSITION
                # Ask for them now: a follower answers a NewLeadershipTerm of its
                # term with its AppendPosition, instead of on its next heartbeat.
                member.new_leadership_term_due = True
            host.start_replay(host.processed_position(), self.append_position)
        elif new == ElectionState.FOLLOWER_LOG_REPLICATION:
            host.on_role_change(ClusterRole.FOLLOWER)  # (a candidate that heard a leader follows it)
            self.replication = host.replicate(
                self.leader_member_id, self.leader_recording_id, self.replication_stop_position
            )
        elif new == ElectionState.FOLLOWER_REPLAY:
            host.on_role_change(ClusterRole.FOLLOWER)
            host.start_replay(host.processed_position(), self.append_position)

    def _refresh_log(self) -> None:
        entries = self.host.term_entries()
        self.log_leadership_term_id = entries[-1].leadership_term_id if entries else NULL_VALUE
        self.append_position = self.host.append_position()

    # ------------------------------------------------------------------ states

    def init(self, now_ns: int) -> int:
        # Nobody leads while this runs: a client's request would wait unanswered
        # in the ingress, and a deposed leader would go on holding its clients.
        self.host.close_ingress_and_egress()
        self.host.prepare_for_election()
        self.host.on_role_change(ClusterRole.FOLLOWER)
        self._refresh_log()
        if len(self.members) == 1:
            self.candidate_term_id = max(self.candidate_term_id, self.leadership_term_id) + 1
            self.host.persist_candidate_term_id(self.candidate_term_id)
            self.state(ElectionState.LEADER_LOG_REPLICATION, now_ns, "single member")
        else:
            self.state(ElectionState.CANVASS, now_ns, "multi member")
        return 1

    def canvass(self, now_ns: int) -> int:
        work = self._publish_canvass_on_interval(now_ns)
        if self.appointed_leader_id not in (NULL_MEMBER_ID, self.member_id):
            return work
        me = self.members[self.member_id]
        me.log_leadership_term_id = self.log_leadership_term_id
        me.log_position = self.append_position
        me.leadership_term_id = self.leadership_term_id
        me.canvassed = True
        # Aeron's deadline: at start-up the extended canvass (the others may
        # still be starting); after that the leader heartbeat timeout from the
        # node's last word from a leader, so a member that heard a leader
        # lately gives it that long to answer before standing itself.
        if self.is_extended_canvass:
            deadline_ns = self.state_change_ns + self.timeouts.startup_canvass_timeout_ns
        else:
            deadline_ns = self.host.time_of_last_leader_update_ns() + self.timeouts.leader_heartbeat_timeout_ns
        if self.appointed_leader_id == self.member_id:
            if self._is_quorum_candidate():
                self.nomination_deadline_ns = now_ns
                self.state(ElectionState.NOMINATE, now_ns, "appointed leader")
                return work + 1
            return work
        if self._is_unanimous_candidate() or (self._is_quorum_candidate() and now_ns >= deadline_ns):
            self.nomination_deadline_ns = now_ns + self.random.randrange(max(1, self.timeouts.election_timeout_ns >> 1))
            self.state(ElectionState.NOMINATE, now_ns, "possible candidate")
            return work + 1
        return work

    def wake_deadline_ns(self) -> int | None:
        """When the module must run again even if no message arrives: in
        NOMINATE, at the nomination deadline.  The deadline's randomness is what
        keeps the candidates apart.  A module that slept past it would nominate
        when the next message woke it, and a peer's canvass wakes every member
        at once: their ballots would start together and split the vote."""
        if self.state_value == ElectionState.NOMINATE:
            return self.nomination_deadline_ns
        return None

    def nominate(self, now_ns: int) -> int:
        if now_ns >= self.nomination_deadline_ns:
            self.state(ElectionState.CANDIDATE_BALLOT, now_ns, "nomination deadline")
            return 1
        return self._publish_canvass_on_interval(now_ns)

    def candidate_ballot(self, now_ns: int) -> int:
        # Aeron's rule: a candidate leads at once when every member voted for
        # it; otherwise it waits out the election timeout, then leads with a
        # quorum of votes for it and none against (a member whose log is
        # newer says no), or canvasses again.
        if self._is_unanimous_leader():
            self.state(ElectionState.LEADER_LOG_REPLICATION, now_ns, "unanimous vote")
            return 1
        if now_ns >= self.state_change_ns + self.timeouts.election_timeout_ns:
            if self._is_quorum_leader():
                self.state(ElectionState.LEADER_LOG_REPLICATION, now_ns, "quorum vote at the election timeout")
            else:
                self.state(ElectionState.CANVASS, now_ns, "election timeout")
            return 1
        work = 0
        for member_id in self.others:
            member = self.members[member_id]
            if member.vote is None and (
                member.ballot_sent_ns < 0 or now_ns >= member.ballot_sent_ns + self.timeouts.election_status_interval_ns
            ):
                if self.publisher.request_vote(
                    member_id,
                    log_leadership_term_id=self.log_leadership_term_id,
                    log_position=self.append_position,
                    candidate_term_id=self.candidate_term_id,
                    candidate_member_id=self.member_id,
                ):
                    member.ballot_sent_ns = now_ns
                work += 1
        return work

    def follower_ballot(self, now_ns: int) -> int:
        if now_ns >= self.state_change_ns + self.timeouts.election_timeout_ns:
            self.state(ElectionState.CANVASS, now_ns, "no leader within the election timeout")
            return 1
        return 0

    def leader_log_replication(self, now_ns: int) -> int:
        work = self._leader_heartbeats(now_ns) + self._publish_quorum_commit_position(now_ns)
        if self._quorum_reached(self.append_position):
            self.state(ElectionState.LEADER_REPLAY, now_ns, "quorum at the leader's log position")
            return work + 1
        return work + self._check_leader_timeout(now_ns)

    def leader_replay(self, now_ns: int) -> int:
        work = self._leader_heartbeats(now_ns) + self._publish_quorum_commit_position(now_ns)
        if self.host.replay_done():
            self.state(ElectionState.LEADER_INIT, now_ns, "log replayed")
            return work + 1
        return work

    def leader_init(self, now_ns: int) -> int:
        self.host.join_log_as_leader(self.leadership_term_id, self.term_base_log_position)
        self.log_leadership_term_id = self.leadership_term_id
        self.state(ElectionState.LEADER_READY, now_ns, "log recorded")
        return 1

    def leader_ready(self, now_ns: int) -> int:
        work = self._leader_heartbeats(now_ns)
        # Aeron's rule: every member that voted in this leader's ballot has
        # joined the log at its position, or, once the leader heartbeat
        # timeout has passed, a quorum has.
        position = self.append_position
        timed_out = now_ns >= self.state_change_ns + self.timeouts.leader_heartbeat_timeout_ns
        if self._voters_reached(position) or (timed_out and self._quorum_reached(position)):
            if self.host.append_new_leadership_term_event(self.leadership_term_id, position, now_ns // 1_000_000):
                self.state(ElectionState.CLOSED, now_ns, "followers ready")
                self.host.election_complete(ClusterRole.LEADER, self.member_id, self.leadership_term_id)
                return work + 1
            return work
        return work + self._check_leader_timeout(now_ns)

    def follower_log_replication(self, now_ns: int) -> int:
        replication = self.replication
        assert replication is not None
        work = self._follower_heartbeat(now_ns, APPEND_POSITION_FLAG_NONE)
        if replication.is_done():
            self.replication = None
            replication.close()
            if self.replication_leadership_term_id != self.log_leadership_term_id:
                self.host.append_term(self.replication_leadership_term_id, self.replication_term_base_log_position)
            self.state(ElectionState.CANVASS, now_ns, "replicated a leadership term")
            return work + 1
        if replication.failed():
            self.state(ElectionState.CANVASS, now_ns, "replication failed")
            return work + 1
        return work + self._check_follower_progress(now_ns)

    def follower_replay(self, now_ns: int) -> int:
        # No AppendPosition yet: the leader's LEADER_READY counts only members
        # that follow its log (or are catching up to it), not ones replaying.
        work = 0
        if self.host.replay_done():
            if self.catchup_join_position != NULL_POSITION and self.append_position < self.catchup_join_position:
                self.state(ElectionState.FOLLOWER_CATCHUP_INIT, now_ns, "behind in the current term")
            else:
                self.state(ElectionState.FOLLOWER_LOG_INIT, now_ns, "log replayed")
            return work + 1
        return work

    def follower_catchup_init(self, now_ns: int) -> int:
        # Nothing is asked of the leader before the log can take the catchup;
        # what the host cannot set up within the heartbeat timeout means CANVASS.
        if not self.joined_log and not self._join_log():
            return self._check_follower_progress(now_ns)
        endpoint = self.host.catchup(self.leader_member_id, self.append_position)
        if endpoint is None:
            return self._check_follower_progress(now_ns)
        self.catchup_endpoint = endpoint
        if not self._send_catchup_position(now_ns):
            return self._check_follower_progress(now_ns)
        self.state(ElectionState.FOLLOWER_CATCHUP_AWAIT, now_ns, "catchup requested")
        return 1

    def follower_catchup_await(self, now_ns: int) -> int:
        if self.host.is_log_connected():
            self.state(ElectionState.FOLLOWER_CATCHUP, now_ns, "leader connected the catchup")
            return 1
        # A leader still in its own election cannot serve a catchup yet (its log
        # is not recorded until LEADER_INIT) and lets the request go: ask again,
        # at the heartbeat interval doubling to eight of them, rather than wait
        # out the progress timeout.  A leader already replaying to this member
        # takes a repeat as nothing.  (Aeron's follower asks once: its leader
        # serves a catchup as soon as it leads, even during its election.)
        interval_ns = self.timeouts.leader_heartbeat_interval_ns << min(self.catchup_requests - 1, 3)
        work = 0
        if now_ns >= self.catchup_requested_ns + interval_ns:
            work += int(self._send_catchup_position(now_ns))
        return work + self._check_follower_progress(now_ns)

    def _send_catchup_position(self, now_ns: int) -> bool:
        sent = self.publisher.catchup_position(
            self.leader_member_id,
            leadership_term_id=self.leadership_term_id,
            log_position=self.append_position,
            follower_member_id=self.member_id,
            catchup_endpoint=self.catchup_endpoint,
        )
        if sent:
            self.catchup_requests += 1
            self.catchup_requested_ns = now_ns
        return sent

    def follower_catchup(self, now_ns: int) -> int:
        self.append_position = self.host.append_position()
        # Replay merge: near the leader's position the live log joins the catchup,
        # before this member reports a position the leader takes as caught up
        # (it stops the catchup replay then, and the live log must be flowing).
        live = (
            self.stop_catchup_received
            or self.host.is_catchup_near_live(max(self.leader_log_position, self.notified_commit_position))
        ) and self.host.add_live_destination()
        if live and self.stop_catchup_received:
            self.host.stop_catchup()
            self.state(ElectionState.FOLLOWER_LOG_INIT, now_ns, "StopCatchup")
            return 1
        work = self._follower_heartbeat(now_ns, APPEND_POSITION_FLAG_CATCHUP)
        self._notify_commit()
        # With the live destination refused (its port still held), nothing more
        # arrives once the leader has stopped the catchup (StopCatchup): no
        # progress for the heartbeat timeout means CANVASS, and a catchup that
        # ended before the live log flowed is found in FOLLOWER_LOG_INIT; never
        # an election completed on a log that does not flow.
        return work + self._check_follower_progress(now_ns)

    def follower_log_init(self, now_ns: int) -> int:
        if self.joined_log:  # joined while catching up, the live log added before StopCatchup
            if not (self.host.add_live_destination() and self.host.is_log_connected()):
                return self._check_follower_progress(now_ns)
            self.state(ElectionState.FOLLOWER_READY, now_ns, "log already joined")
        else:
            if not self._join_log():
                return self._check_follower_progress(now_ns)
            self.state(ElectionState.FOLLOWER_LOG_AWAIT, now_ns, "log subscription created")
        return 1

    def follower_log_await(self, now_ns: int) -> int:
        if self.host.add_live_destination() and self.host.is_log_connected():
            self.state(ElectionState.FOLLOWER_READY, now_ns, "leader's log connected")
            return 1
        return self._check_follower_progress(now_ns)

    def follower_ready(self, now_ns: int) -> int:
        self.append_position = self.host.append_position()
        if self.publisher.append_position(
            self.leader_member_id,
            leadership_term_id=self.leadership_term_id,
            log_position=self.append_position,
            follower_member_id=self.member_id,
            flags=APPEND_POSITION_FLAG_NONE,
        ):
            self._notify_commit()
            self.state(ElectionState.CLOSED, now_ns, "joined the leader")
            self.host.election_complete(ClusterRole.FOLLOWER, self.leader_member_id, self.leadership_term_id)
            return 1
        return self._check_follower_progress(now_ns)

    def closed(self, now_ns: int) -> int:
        return 0

    # ------------------------------------------------------------------ helpers

    def _is_unanimous_candidate(self) -> bool:
        """Every member canvassed and none has a better log (a leader that
        closed in order aside, while that still leaves a quorum)."""
        me = self.members[self.member_id]
        possible_votes = 0
        for member in self.members.values():
            if member.member_id == self.graceful_closed_leader_id:
                continue
            if not member.canvassed:
                return False
            if (
                compare_log(
                    me.log_leadership_term_id, me.log_position, member.log_leadership_term_id, member.log_position
                )
                < 0
            ):
                return False
            possible_votes += 1
        return possible_votes >= self.quorum

    def _is_quorum_candidate(self) -> bool:
        me = self.members[self.member_id]
        count = sum(
            1
            for m in self.members.values()
            if m.canvassed
            and compare_log(me.log_leadership_term_id, me.log_position, m.log_leadership_term_id, m.log_position) >= 0
        )
        return count >= self.quorum

    def _publish_canvass_on_interval(self, now_ns: int) -> int:
        if now_ns < self.last_status_ns + self.timeouts.election_status_interval_ns:
            return 0
        self.last_status_ns = now_ns
        for member_id in self.others:
            self.publisher.canvass_position(
                member_id,
                log_leadership_term_id=self.log_leadership_term_id,
                log_position=self.append_position,
                leadership_term_id=self.leadership_term_id,
                follower_member_id=self.member_id,
            )
        return 1

    def _is_unanimous_leader(self) -> bool:
        """Every member voted for this candidate in its term (a leader that
        closed in order aside, while that still leaves a quorum)."""
        voters = [m for m in self.members.values() if m.member_id != self.graceful_closed_leader_id]
        return len(voters) >= self.quorum and all(
            m.candidate_term_id == self.candidate_term_id and m.vote is True for m in voters
        )

    def _is_quorum_leader(self) -> bool:
        """A quorum voted for this candidate in its term and nobody against."""
        votes_for = 0
        for member in self.members.values():
            if member.candidate_term_id == self.candidate_term_id:
                if member.vote is False:
                    return False
                if member.vote is True:
                    votes_for += 1
        return votes_for >= self.quorum

    def _voters_reached(self, position: int) -> bool:
        """Every member that voted in this leader's ballot (for or against)
        reported ``position`` in this term (Aeron's hasVotersAtPosition; a
        member that never answered, down say, is not waited for)."""
        for member_id in self.others:
            member = self.members[member_id]
            if member.vote is not None and not (
                member.append_term_id == self.leadership_term_id and member.append_position >= position
            ):
                return False
        return True

    def _quorum_position(self) -> int:
        """The highest position a quorum holds in this term, this leader
        included (followers count only once they report in this term, after
        the NewLeadershipTerm check that truncates what the leader lacks)."""
        positions = [self.append_position] + [
            member.append_position
            for member_id, member in self.members.items()
            if member_id != self.member_id and member.append_term_id == self.leadership_term_id
        ]
        if len(positions) < self.quorum:
            return NULL_POSITION
        positions.sort(reverse=True)
        return min(positions[self.quorum - 1], self.append_position)

    def _publish_quorum_commit_position(self, now_ns: int) -> int:
        """Before its log is joined (LEADER_LOG_REPLICATION, LEADER_REPLAY) the
        leader tells the followers the quorum's position as the commit
        position, as soon as it rises and else on the heartbeat interval
        (Aeron's publishCommitPositionOnInterval): a follower catching up or
        replicating learns what it may apply without waiting for the leader's
        own commit, which only moves once the log is joined."""
        position = self._quorum_position()
        if position == NULL_POSITION:
            return 0
        if position < self.published_commit_position or (
            position == self.published_commit_position
            and now_ns < self.commit_published_ns + self.timeouts.leader_heartbeat_interval_ns
        ):
            return 0
        self.published_commit_position = position
        self.commit_published_ns = now_ns
        for member_id in self.others:
            self.publisher.commit_position(
                member_id,
                leadership_term_id=self.leadership_term_id,
                log_position=position,
                leader_member_id=self.member_id,
            )
        return 1

    def _quorum_reached(self, position: int) -> bool:
        count = 1  # the leader itself
        for member_id in self.others:
            member = self.members[member_id]
            if member.append_term_id == self.leadership_term_id and member.append_position >= position:
                count += 1
        return count >= self.quorum

    def _leader_heartbeats(self, now_ns: int) -> int:
        """NewLeadershipTerm to each follower (on the heartbeat interval, or at once when a
        canvassing follower is due an answer); in LEADER_READY, with the log
        joined, the node's commit position to all on the interval (before,
        ``_publish_quorum_commit_position`` tells them the quorum's)."""
        interval_due = now_ns >= self.last_heartbeat_ns + self.timeouts.leader_heartbeat_interval_ns
        work = 0
        for member_id in self.others:
            member = self.members[member_id]
            if interval_due or member.new_leadership_term_due:
                member.new_leadership_term_due = False
                self.send_new_leadership_term(
                    member_id,
                    member.log_leadership_term_id
                    if member.log_leadership_term_id != NULL_VALUE or member.canvassed
                    else self.log_leadership_term_id,
                    now_ns,
                )
                work += 1
        if interval_due:
            self.last_heartbeat_ns = now_ns
        if interval_due and self.state_value == ElectionState.LEADER_READY:
            commit = self.host.commit_position()
            for member_id in self.others:
                self.publisher.commit_position(
                    member_id,
                    leadership_term_id=self.leadership_term_id,
                    log_position=commit,
                    leader_member_id=self.member_id,
                )
        return work

    def send_new_leadership_term(self, to_member_id: int, follower_log_leadership_term_id: int, now_ns: int) -> bool:
        next_term_id, next_base, next_position = next_term_for(
            self.host.term_entries(),
            follower_log_leadership_term_id,
            self.leadership_term_id,
            self.term_base_log_position,
        )
        return self.publisher.new_leadership_term(
            to_member_id,
            log_leadership_term_id=follower_log_leadership_term_id,
            next_leadership_term_id=next_term_id,
            next_term_base_log_position=next_base,
            next_log_position=next_position,
            leadership_term_id=self.leadership_term_id,
            term_base_log_position=self.term_base_log_position,
            log_position=self.append_position,
            leader_recording_id=self.host.log_recording_id(),
            timestamp=now_ns // 1_000_000,
            leader_member_id=self.member_id,
            log_session_id=self.log_session_id,
            app_version=self.app_version,
            is_startup=self.is_leader_startup,
        )

    def _check_leader_timeout(self, now_ns: int) -> int:
        if now_ns >= self.state_change_ns + self.timeouts.leader_heartbeat_timeout_ns:
            self.state(ElectionState.CANVASS, now_ns, "no quorum of followers")
            return 1
        return 0

    def _follower_heartbeat(self, now_ns: int, flags: int) -> int:
        position = self.host.append_position()
        if (
            position == self.last_progress_position
            and now_ns < self.last_heartbeat_ns + self.timeouts.leader_heartbeat_interval_ns
        ):
            return 0
        if position != self.last_progress_position:
            self.last_progress_position = position
            self.last_progress_ns = now_ns
        self.last_heartbeat_ns = now_ns
        self.publisher.append_position(
            self.leader_member_id,
            leadership_term_id=self.leadership_term_id,
            log_position=position,
            follower_member_id=self.member_id,
            flags=flags,
        )
        return 1

    def _check_follower_progress(self, now_ns: int) -> int:
        if now_ns >= self.last_progress_ns + self.timeouts.leader_heartbeat_timeout_ns:
            self.state(ElectionState.CANVASS, now_ns, f"no progress in {self.state_value.name}")
            return 1
        return 0

    def _join_log(self) -> bool:
        if not self.host.join_log_as_follower(
            self.leader_member_id, self.leadership_term_id, self.term_base_log_position, self.log_session_id
        ):
            return False
        self.log_leadership_term_id = self.leadership_term_id
        self.joined_log = True
        return True

    def _notify_commit(self) -> None:
        if self.notified_commit_position != NULL_POSITION:
            self.host.notify_commit_position(min(self.notified_commit_position, self.host.append_position()))

    def _accepts_term(self, leadership_term_id: int) -> bool:
        """Raft's rule, as narrow as safety needs: never follow a leader of a
        term lower than one this member followed or may have voted in for
        another member.  (A quorum that voted for a leader of a higher term
        then never also follows a lower one, so the two cannot both commit.)"""
        return (
            leadership_term_id >= self.leadership_term_id and leadership_term_id >= self.highest_term_voted_for_another
        )

    # ------------------------------------------------------------------ handlers (record facts)

    def on_canvass_position(
        self,
        log_leadership_term_id: int,
        log_position: int,
        leadership_term_id: int,
        follower_member_id: int,
        protocol_version: int = 0,
    ) -> None:
        member = self.members.get(follower_member_id)
        if member is None or follower_member_id == self.member_id or self.state_value == ElectionState.INIT:
            return
        if follower_member_id == self.graceful_closed_leader_id:
            self.graceful_closed_leader_id = NULL_MEMBER_ID  # it is back
        member.log_leadership_term_id = log_leadership_term_id
        member.log_position = log_position
        member.leadership_term_id = leadership_term_id
        member.canvassed = True
        if self.state_value in _LEADER_STATES:
            if leadership_term_id > self.leadership_term_id:
                self.state(ElectionState.CANVASS, self.now_ns, "a member is in a newer term")
            elif log_leadership_term_id > self.leadership_term_id and self.state_value in (
                ElectionState.LEADER_LOG_REPLICATION,
                ElectionState.LEADER_READY,
            ):
                # Its log holds a term newer than this leader's (Aeron: "potential
                # new election in progress"): this leader cannot give it a log.
                self.state(ElectionState.CANVASS, self.now_ns, "a member's log is in a newer term")
            else:
                member.new_leadership_term_due = True

    def on_request_vote(
        self,
        log_leadership_term_id: int,
        log_position: int,
        candidate_term_id: int,
        candidate_member_id: int,
        protocol_version: int = 0,
    ) -> None:
        if (
            candidate_member_id == self.member_id
            or candidate_member_id not in self.members
            or self.state_value in (ElectionState.INIT, ElectionState.CLOSED)
        ):
            return
        if self.voted_for == (candidate_term_id, candidate_member_id):
            self._place_vote(candidate_term_id, candidate_member_id, True)  # a repeated request
            return
        if candidate_term_id <= self.leadership_term_id or candidate_term_id <= self.candidate_term_id:
            self._place_vote(candidate_term_id, candidate_member_id, False)
            return
        if compare_log(self.log_leadership_term_id, self.append_position, log_leadership_term_id, log_position) > 0:
            # The candidate's log is behind: no, and this member will not vote
            # in that term again.  A leader tells the candidate where its log
            # stands (Aeron's onRequestVote), so that it can follow instead.
            self.candidate_term_id = candidate_term_id
            self.host.persist_candidate_term_id(candidate_term_id)
            self._place_vote(candidate_term_id, candidate_member_id, False)
            if self.state_value in _LEADER_STATES:
                self.send_new_leadership_term(candidate_member_id, log_leadership_term_id, self.now_ns)
            return
        if self.state_value not in _VOTING_STATES:
            return  # a member already following or leading does not vote (Aeron's rule)
        self.candidate_term_id = candidate_term_id
        self.host.persist_candidate_term_id(candidate_term_id)
        self.voted_for = (candidate_term_id, candidate_member_id)
        self.highest_term_voted_for_another = max(self.highest_term_voted_for_another, candidate_term_id)
        self._place_vote(candidate_term_id, candidate_member_id, True)
        self.state(ElectionState.FOLLOWER_BALLOT, self.now_ns, "voted for a candidate")

    def _place_vote(self, candidate_term_id: int, candidate_member_id: int, vote: bool) -> None:
        self.publisher.place_vote(
            candidate_member_id,
            candidate_term_id=candidate_term_id,
            log_leadership_term_id=self.log_leadership_term_id,
            log_position=self.append_position,
            candidate_member_id=candidate_member_id,
            follower_member_id=self.member_id,
            vote=vote,
        )

    def on_vote(
        self,
        candidate_term_id: int,
        log_leadership_term_id: int,
        log_position: int,
        candidate_member_id: int,
        follower_member_id: int,
        vote: bool,
    ) -> None:
        member = self.members.get(follower_member_id)
        if (
            member is None
            or self.state_value != ElectionState.CANDIDATE_BALLOT
            or candidate_member_id != self.member_id
            or candidate_term_id != self.candidate_term_id
        ):
            return
        member.candidate_term_id = candidate_term_id
        member.log_leadership_term_id = log_leadership_term_id
        member.log_position = log_position
        member.vote = vote

    def on_new_leadership_term(
        self,
        log_leadership_term_id: int,
        next_leadership_term_id: int,
        next_term_base_log_position: int,
        next_log_position: int,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        leader_recording_id: int,
        timestamp: int,
        leader_member_id: int,
        log_session_id: int,
        app_version: int = 0,
        is_startup: bool = False,
    ) -> None:
        if leader_member_id == self.member_id or leader_member_id not in self.members:
            return
        if leader_member_id == self.graceful_closed_leader_id:
            self.graceful_closed_leader_id = NULL_MEMBER_ID  # it is back
        now_ns = self.now_ns
        if self.state_value in _LEADER_STATES:
            if leadership_term_id > self.leadership_term_id:
                self.state(ElectionState.CANVASS, now_ns, "a newer leader")
            else:
                return
        if self.state_value in _FOLLOWER_ALIGNED_STATES:
            if leader_member_id == self.leader_member_id and leadership_term_id == self.leadership_term_id:
                self.leader_log_position = max(self.leader_log_position, log_position)
                return
            if leadership_term_id > self.leadership_term_id and self._accepts_term(leadership_term_id):
                self.state(ElectionState.CANVASS, now_ns, "a newer leader")
            else:
                return
        # Aeron's rule: a canvassing member takes a leader's word; one in a
        # ballot only that of the leader of the ballot's term (NOMINATE waits
        # for its deadline).
        if self.state_value == ElectionState.CANVASS:
            pass
        elif self.state_value in (ElectionState.CANDIDATE_BALLOT, ElectionState.FOLLOWER_BALLOT):
            if leadership_term_id != self.candidate_term_id:
                return
        else:
            return
        if not self._accepts_term(leadership_term_id):
            return
        if log_leadership_term_id != self.log_leadership_term_id:
            if self.state_value != ElectionState.CANVASS:
                self.state(ElectionState.CANVASS, now_ns, "NewLeadershipTerm for another log term")
            return
        if next_leadership_term_id == NULL_VALUE and log_leadership_term_id != leadership_term_id:
            # (With our log in the leader's term, NULL_VALUE is Aeron's "no next
            # term": nothing to truncate or replicate.  Otherwise it is this
            # leader's answer that its log has no entry of our last term, which
            # an Aeron leader never sends.)  None of that term was committed.
            entries = self.host.term_entries()
            if entries and entries[-1].leadership_term_id == log_leadership_term_id:
                self.host.truncate_log_to(entries[-1].term_base_log_position)
                self.host.drop_term(log_leadership_term_id)
            self.state(ElectionState.CANVASS, now_ns, "leader does not have our last term")
            return
        if next_term_base_log_position != NULL_POSITION and next_term_base_log_position < self.append_position:
            self.host.truncate_log_to(next_term_base_log_position)
            self.append_position = self.host.append_position()
        self.leader_member_id = leader_member_id
        if leadership_term_id != self.leadership_term_id:
            self.leadership_term_id = leadership_term_id
            self.host.on_leadership_term_change(leadership_term_id)
        self.candidate_term_id = max(self.candidate_term_id, leadership_term_id)
        self.term_base_log_position = term_base_log_position
        self.leader_log_position = log_position
        self.leader_recording_id = leader_recording_id
        self.log_session_id = log_session_id
        self.is_leader_startup = is_startup
        if self.append_position < term_base_log_position:
            if self.append_position < next_term_base_log_position:
                self.replication_leadership_term_id = log_leadership_term_id
                self.replication_term_base_log_position = NULL_POSITION
                self.replication_stop_position = next_term_base_log_position
            elif self.append_position == next_term_base_log_position and next_log_position != NULL_POSITION:
                self.replication_leadership_term_id = next_leadership_term_id
                self.replication_term_base_log_position = next_term_base_log_position
                self.replication_stop_position = next_log_position
            else:
                self.state(ElectionState.CANVASS, now_ns, "inconsistent NewLeadershipTerm")
                return
            self.state(ElectionState.FOLLOWER_LOG_REPLICATION, now_ns, "needs to replicate an old term")
        else:
            self.catchup_join_position = log_position if self.append_position < log_position else NULL_POSITION
            self.state(ElectionState.FOLLOWER_REPLAY, now_ns, "no log to replicate")

    def on_append_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, flags: int = 0
    ) -> None:
        member = self.members.get(follower_member_id)
        if member is None or follower_member_id == self.member_id:
            return
        if leadership_term_id == self.leadership_term_id and self.state_value in _LEADER_STATES:
            member.append_term_id = leadership_term_id
            member.append_position = max(member.append_position, log_position)
            member.append_ns = self.now_ns

    def on_commit_position(self, leadership_term_id: int, log_position: int, leader_member_id: int) -> None:
        if self.state_value in _LEADER_STATES:
            if leadership_term_id > self.leadership_term_id:
                self.state(ElectionState.CANVASS, self.now_ns, "a newer leader")
            return
        if (
            leadership_term_id == self.leadership_term_id
            and leader_member_id == self.leader_member_id
            and self.state_value in _FOLLOWER_ALIGNED_STATES
        ):
            self.notified_commit_position = max(self.notified_commit_position, log_position)

    def on_catchup_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, catchup_endpoint: str
    ) -> None:
        """Catchup is served by the leader's consensus work, after its election."""

    def on_stop_catchup(self, leadership_term_id: int, follower_member_id: int) -> None:
        if (
            follower_member_id == self.member_id
            and leadership_term_id == self.leadership_term_id
            and self.state_value == ElectionState.FOLLOWER_CATCHUP
        ):
            self.stop_catchup_received = True

    def on_termination_position(self, leadership_term_id: int, log_position: int) -> None:
        """Termination is handled by the consensus module, not the election."""

    def on_termination_ack(self, leadership_term_id: int, log_position: int, member_id: int) -> None:
        """Termination is handled by the consensus module, not the election."""

    def __repr__(self) -> str:
        return (
            f"Election(member={self.member_id}, state={self.state_value.name}, "
            f"leadership_term_id={self.leadership_term_id}, candidate_term_id={self.candidate_term_id}, "
            f"leader={self.leader_member_id}, log=({self.log_leadership_term_id}, {self.append_position}))"
        )


_STATE_METHODS = {
    ElectionState.INIT: Election.init,
    ElectionState.CANVASS: Election.canvass,
    ElectionState.NOMINATE: Election.nominate,
    ElectionState.CANDIDATE_BALLOT: Election.candidate_ballot,
    ElectionState.FOLLOWER_BALLOT: Election.follower_ballot,
    ElectionState.LEADER_LOG_REPLICATION: Election.leader_log_replication,
    ElectionState.LEADER_REPLAY: Election.leader_replay,
    ElectionState.LEADER_INIT: Election.leader_init,
    ElectionState.LEADER_READY: Election.leader_ready,
    ElectionState.FOLLOWER_LOG_REPLICATION: Election.follower_log_replication,
    ElectionState.FOLLOWER_REPLAY: Election.follower_replay,
    ElectionState.FOLLOWER_CATCHUP_INIT: Election.follower_catchup_init,
    ElectionState.FOLLOWER_CATCHUP_AWAIT: Election.follower_catchup_await,
    ElectionState.FOLLOWER_CATCHUP: Election.follower_catchup,
    ElectionState.FOLLOWER_LOG_INIT: Election.follower_log_init,
    ElectionState.FOLLOWER_LOG_AWAIT: Election.follower_log_await,
    ElectionState.FOLLOWER_READY: Election.follower_ready,
    ElectionState.CLOSED: Election.closed,
}
