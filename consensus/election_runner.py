"""What runs the election on the agent's duty cycle: ``SingleNodeElection``
(a cluster of one: its states are a straight line), ``MemberElection`` (a
member of several: waits for the services, then runs ``election.Election``
with the node as its host) and ``LoneMemberConsensusListener`` (what a
cluster of one does with what it hears on the consensus stream).

They drive the agent through its methods (``start_leadership_term``,
``services_acked``, ``new_election``...): the agent owns the log, the
services' acknowledgements and the counters, so they hold a reference to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fulmar.consensus.errors import ClusterTerminationError
from fulmar.consensus.log_replay import LogReplay
from fulmar.consensus.protocol import NULL_MEMBER_ID, NULL_POSITION, NULL_VALUE
from fulmar.consensus.states import ClusterRole, ElectionState

if TYPE_CHECKING:
    from fulmar.consensus.agent import ConsensusModuleAgent


class LoneMemberConsensusListener:
    """What a cluster of one hears on its consensus stream.  No other member
    talks there, but the tools that are not members do: a ClusterBackup's
    BackupQuery, a HeartbeatRequest, a StandbySnapshot, and their answers to
    a challenge; those go to the agent.  A member's message (a canvass, a
    vote, a leader's word) is someone's mistake, or a stranger's: counted as
    an invalid request and reported, never the start of an election."""

    def __init__(self, agent: ConsensusModuleAgent) -> None:
        self.agent = agent
        self.on_backup_query = agent.on_backup_query
        self.on_heartbeat_request = agent.on_heartbeat_request
        self.on_standby_snapshot = agent.on_standby_snapshot
        self.on_consensus_challenge_response = agent.on_consensus_challenge_response

    def _refuse(self, message: str, member_id: int) -> None:
        self.agent.invalid_requests_counter.increment()
        self.agent.report_error(f"consensus stream: a {message} from member {member_id} refused: this member is alone")

    def on_canvass_position(
        self,
        log_leadership_term_id: int,
        log_position: int,
        leadership_term_id: int,
        follower_member_id: int,
        protocol_version: int,
    ) -> None:
        self._refuse("CanvassPosition", follower_member_id)

    def on_request_vote(
        self,
        log_leadership_term_id: int,
        log_position: int,
        candidate_term_id: int,
        candidate_member_id: int,
        protocol_version: int,
    ) -> None:
        self._refuse("RequestVote", candidate_member_id)

    def on_vote(
        self,
        candidate_term_id: int,
        log_leadership_term_id: int,
        log_position: int,
        candidate_member_id: int,
        follower_member_id: int,
        vote: bool,
    ) -> None:
        self._refuse("Vote", follower_member_id)

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
        app_version: int,
        is_startup: bool,
    ) -> None:
        self._refuse("NewLeadershipTerm", leader_member_id)

    def on_append_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, flags: int
    ) -> None:
        self._refuse("AppendPosition", follower_member_id)

    def on_commit_position(self, leadership_term_id: int, log_position: int, leader_member_id: int) -> None:
        self._refuse("CommitPosition", leader_member_id)

    def on_catchup_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, catchup_endpoint: str
    ) -> None:
        self._refuse("CatchupPosition", follower_member_id)

    def on_stop_catchup(self, leadership_term_id: int, follower_member_id: int) -> None:
        self._refuse("StopCatchup", follower_member_id)

    def on_termination_position(self, leadership_term_id: int, log_position: int) -> None:
        self._refuse("TerminationPosition", NULL_MEMBER_ID)

    def on_termination_ack(self, leadership_term_id: int, log_position: int, member_id: int) -> None:
        self._refuse("TerminationAck", member_id)


class SingleNodeElection:
    """The election of a one-member cluster (seed 001's single-node path):
    INIT -> LEADER_LOG_REPLICATION -> LEADER_REPLAY -> LEADER_INIT ->
    LEADER_READY -> CLOSED.  One method per state; every transition goes
    through ``state``, which writes the election state counter."""

    def __init__(self, agent: ConsensusModuleAgent) -> None:
        self.agent = agent
        self.state = ElectionState.INIT
        self.deadline_ns = 0
        self._ack_id = NULL_VALUE
        self._replay: LogReplay | None = None
        self._joined = False

    def set_state(self, state: ElectionState, now_ns: int) -> None:
        self.state = state
        self.agent.election_state_counter.set(int(state))
        self.deadline_ns = now_ns + self.agent.context.service_ack_timeout_ns
        self._joined = False

    def wake_deadline_ns(self) -> int | None:
        return None  # nothing random to keep to: it only waits for its own processes

    def do_work(self, now_ns: int) -> int:
        if self.deadline_ns == 0:  # the first cycle: the election's clock starts now
            self.deadline_ns = now_ns + self.agent.context.service_ack_timeout_ns
        handler = getattr(self, self.state.name.lower())
        return int(handler(now_ns))

    def _check_deadline(self, now_ns: int, what: str) -> None:
        if now_ns > self.deadline_ns:
            raise ClusterTerminationError(f"election {self.state.name}: timed out {what}")

    def init(self, now_ns: int) -> int:
        """Clear the decks: the services have started from the same snapshot
        as this module (their first acknowledgement) before anything moves."""
        agent = self.agent
        if self._ack_id == NULL_VALUE:
            self._ack_id = agent.next_ack_id()
        if agent.services_acked(self._ack_id, agent.log_position) is None:
            self._check_deadline(now_ns, "waiting for the services to start")
            return 0
        self.set_state(ElectionState.LEADER_LOG_REPLICATION, now_ns)
        return 1

    def leader_log_replication(self, now_ns: int) -> int:
        # Alone, this member's log is the quorum's log.
        self.set_state(ElectionState.LEADER_REPLAY, now_ns)
        return 1

    def leader_replay(self, now_ns: int) -> int:
        agent = self.agent
        if self._replay is None:
            self._replay = LogReplay(agent, agent.log_position, agent.append_position, now_ns)
        work = self._replay.do_work(now_ns)
        if self._replay.is_done:
            self._replay = None
            self.set_state(ElectionState.LEADER_INIT, now_ns)
            return 1
        return work

    def leader_init(self, now_ns: int) -> int:
        agent = self.agent
        if not self._joined:
            agent.start_leadership_term()
            self._ack_id = agent.next_ack_id(join_log=True)
            agent.service_proxy.join_log(
                agent.append_position,
                NULL_POSITION,
                agent.member_id,
                agent.log_session_id,
                agent.context.log_stream_id,
                False,
                int(ClusterRole.LEADER),
                agent.live_log_channel(),
            )
            self._joined = True
            return 1
        if agent.services_acked(self._ack_id, agent.append_position) is None:
            self._check_deadline(now_ns, "waiting for the services to join the live log")
            return 0
        self.set_state(ElectionState.LEADER_READY, now_ns)
        return 1

    def leader_ready(self, now_ns: int) -> int:
        agent = self.agent
        publisher = agent.log_publisher
        if (
            publisher.append_new_leadership_term(
                agent.leadership_term_id,
                agent.cluster_time(),
                agent.term_base_log_position,
                agent.member_id,
                agent.log_session_id,
                agent.context.app_version,
            )
            <= 0
        ):
            self._check_deadline(now_ns, "appending the NewLeadershipTermEvent")
            return 0
        self.set_state(ElectionState.CLOSED, now_ns)
        agent.on_election_complete()
        return 1

    def closed(self, now_ns: int) -> int:
        return 0


class MemberElection:
    """The election of a member of a multi-member cluster: on start-up it first
    waits for the services to have loaded the same snapshot as the module (their
    first acknowledgement), then runs ``election.Election`` with this node as its
    host.  ``state`` is the election state (INIT until it runs)."""

    def __init__(
        self,
        agent: ConsensusModuleAgent,
        is_startup: bool,
        not_before_ns: int = 0,
        graceful_closed_leader_id: int = NULL_MEMBER_ID,
    ) -> None:
        self.agent = agent
        self.is_startup = is_startup
        self.graceful_closed_leader_id = graceful_closed_leader_id
        self.election: Any = None
        self._ack_id = agent.next_ack_id() if is_startup else NULL_VALUE
        self._deadline_ns = 0
        self._not_before_ns = not_before_ns  # (after a failed election: its back-off)

    @property
    def state(self) -> ElectionState:
        return ElectionState(self.election.state_value) if self.election is not None else ElectionState.INIT

    def start_now(self) -> Any:
        """Begin at once (a peer's message that starts the election is handed to it)."""
        if self.election is None and self._ack_id == NULL_VALUE:
            self.election = self.agent.new_election(self.is_startup, self.graceful_closed_leader_id)
            self.election.do_work(self.agent.now_ns)
        return self.election

    def wake_deadline_ns(self) -> int | None:
        election = self.election
        if election is None:
            return self._not_before_ns if self._not_before_ns else None
        return election.wake_deadline_ns()

    def do_work(self, now_ns: int) -> int:
        agent = self.agent
        if self.election is None:
            if now_ns < self._not_before_ns:
                return 0
            if self._ack_id != NULL_VALUE:
                if self._deadline_ns == 0:
                    self._deadline_ns = now_ns + agent.context.service_ack_timeout_ns
                if agent.services_acked(self._ack_id, agent.log_position) is None:
                    if now_ns > self._deadline_ns:
                        raise ClusterTerminationError("election INIT: timed out waiting for the services to start")
                    return 0
                self._ack_id = NULL_VALUE
            self.election = agent.new_election(self.is_startup, self.graceful_closed_leader_id)
        return int(self.election.do_work(now_ns))
