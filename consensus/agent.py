"""The consensus module agent (seed 000): sessions, timers, the log, the
commit position and the services, on one thread.

``do_work(now_ns)`` reads the clock once, runs the slow tick work every
10 ms (the client conductor in invoker mode, the mark file, the archive's
signals, sessions to redirect, reject or open, the control toggle, session
timeouts), then either advances the election or does consensus work: fire
timers onto the log, take service messages, sequence ingress into the log,
and move the commit position to where the archive has recorded the log.

This module runs a single-member cluster: its election goes straight from
INIT to LEADER_LOG_REPLICATION, replays whatever of its log recording was
not yet applied (seed 002), starts a new leadership term on a log
publication that continues the recording, and is then the leader.  The
multi-member states of the election come with the consensus stream.
"""

from __future__ import annotations

import struct
import time
from array import array
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulmar import clock, log_lines
from fulmar.archive.client import AeronArchive, ArchiveResponseError, RecordingSignal, SourceLocation
from fulmar.archive.protocol import RECORDING_POSITION_TYPE_ID, recording_position_ids
from fulmar.channel_uri import ChannelUri
from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol, snapshot
from fulmar.consensus.backup_sessions import BackupSessions
from fulmar.consensus.cluster_member import (
    ClusterMember,
    encode_cluster_members,
    find_member,
    ingress_endpoints,
    parse_cluster_members,
    quorum_position,
    quorum_threshold,
)
from fulmar.consensus.cluster_session import ClusterSession, ClusterSessionState, SessionProxy
from fulmar.consensus.consensus_adapter import ConsensusAdapter
from fulmar.consensus.consensus_publisher import ConsensusPublisher
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.election import Election, ElectionTimeouts, next_term_for
from fulmar.consensus.election_host import NodeElectionHost, leader_log_channel
from fulmar.consensus.election_runner import LoneMemberConsensusListener, MemberElection, SingleNodeElection
from fulmar.consensus.errors import ClusterTerminationError
from fulmar.consensus.ingress_adapter import IngressAdapter
from fulmar.consensus.log_adapter import LogAdapter
from fulmar.consensus.log_retention import apply_retention, plan_retention
from fulmar.consensus.mark_file import read_activity_timestamp, read_liveness, service_mark_file_name
from fulmar.consensus.member_auth import (
    ConsensusGuard,
    MemberAuth,
    MemberSigner,
    MemberVerifier,
    SourceFilter,
    is_loopback,
    source_host,
)
from fulmar.consensus.native_handovers import NativeHandovers
from fulmar.consensus.pending_service_messages import PendingServiceMessageTracker
from fulmar.consensus.protocol import (
    CLUSTER_ACTION_FLAGS_DEFAULT,
    CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT,
    CLUSTER_SCHEMA_ID,
    CLUSTER_SCHEMA_VERSION,
    NULL_MEMBER_ID,
    NULL_POSITION,
    NULL_VALUE,
    SESSION_MESSAGE_BLOCK_LENGTH,
    SESSION_MESSAGE_FRAME,
    SESSION_MESSAGE_TEMPLATE_ID,
    CloseReason,
    ClusterAction,
    EventCode,
)
from fulmar.consensus.publishers import SESSION_HEADER_LENGTH, EgressPublisher, LogPublisher, ServiceProxy
from fulmar.consensus.recording_log import RecordingLog
from fulmar.consensus.service_acks import ServiceAcks
from fulmar.consensus.states import ClusterRole, ConsensusModuleState, ControlToggle, ElectionState
from fulmar.consensus.timer_service import TimerService
from fulmar.counters import RECORD_ALLOCATED
from fulmar.duty_cycle import DutyCycleStallTracker
from fulmar.errors import FulmarError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header, SessionMessages
from fulmar.logbuffer import compute_term_id_from_position, position_bits_to_shift
from fulmar.orderly_stop import OrderlyStop, StopCause
from fulmar.reader_doorbells import THREAD_DOORBELL_TYPE_ID, CounterWatch
from fulmar.retry import DistinctErrorPrinter, RetryBackoff
from fulmar.semantic_version import major_version, version_text

if TYPE_CHECKING:
    from fulmar.aeron import Aeron, Counter
    from fulmar.publication import ExclusivePublication
    from fulmar.subscription import Image, Subscription

# Beyond every log position: the leader's place in a quorum that it is sure to reach.
ABOVE_ANY_POSITION = 2**63 - 1


def log_line(member_id: int, text: str) -> None:
    """A line of a consensus module's output (its node's consensus.log)."""
    log_lines.stamped(f"member {member_id}", text)


_CLUSTER_KEY = struct.Struct("<i")
_MEMBER_KEY = struct.Struct("<ii")  # cluster id, member id


class ConsensusModuleAgent:
    def __init__(
        self,
        context: ConsensusModuleContext,
        aeron: Aeron,
        archive: AeronArchive,
        recording_log: RecordingLog,
        epoch_ms: Callable[[], int] = clock.epoch_ms,
        record_error: Callable[[str], object] = lambda text: None,
    ) -> None:
        self.context = context
        self.aeron = aeron
        self.archive = archive
        self.recording_log = recording_log
        self.epoch_ms = epoch_ms
        self.record_error = record_error
        self.member_id = context.member_id
        self.role = ClusterRole.FOLLOWER
        self.state = ConsensusModuleState.INIT
        self.leadership_term_id = NULL_VALUE
        self.log_recording_id = NULL_VALUE
        self.log_session_id = NULL_VALUE
        self.term_base_log_position = 0
        self.log_position = 0  # applied by this module so far
        self.append_position = 0
        self.commit_position = 0
        self.next_session_id = 1
        # What the services offer to the cluster, until the log holds it.
        self.service_messages = PendingServiceMessageTracker()
        self.sessions: dict[int, ClusterSession] = {}
        self.pending_sessions: list[ClusterSession] = []
        self.rejected_sessions: list[ClusterSession] = []
        self.redirect_sessions: list[ClusterSession] = []
        # Seed 000: the sessions of tools that are not clients (a backup's
        # BackupQuery, a HeartbeatRequest, a StandbySnapshot): answered once
        # and closed, never in the log, so never given a client session id.
        self._session_events_pending = False  # an OK or NewLeaderEvent still to send (_check_sessions)
        self.timers = TimerService()
        self.pending_service_messages = self.service_messages.pending  # (the same deque)
        self.terminated = False
        self.termination_reason = ""
        # Set with ``terminated`` when the stop was an orderly one (the node's
        # supervisor is told, so that it does not report a death).
        self.orderly_stop: OrderlyStop | None = None
        # The single node's SHUTDOWN or ABORT was asked for by a stop signal
        # (request_shutdown), not by the control toggle's owner (cluster-tool).
        self._stop_signalled = False
        # Where this follower last snapshotted on the leader's SNAPSHOT action:
        # a termination at that very position is the end of a SHUTDOWN.
        self._follower_snapshot_position = NULL_POSITION
        self._now_ns = 0
        self._slow_tick_deadline_ns = 0
        # What the services acknowledged of the module's requests (a snapshot, a stop, a join).
        self.service_acks = ServiceAcks(context.service_count, self._error)
        self._pending_ingress: deque[bytes] = deque()
        self._authenticator = context.authenticator
        # The services sleep until commit-pos moves: they watch it (fulmar.reader_doorbells).
        self._ring_counter_watchers = aeron.conductor.ring_counter_watchers
        # This module watches the archive's rec-pos of the log recording (the one it watches now).
        self._watched_recording_counter_id = NULL_VALUE
        # Whether that watch is on: a steady leader turns it off while its own
        # recording cannot move the commit position (``_watch_own_recording``).
        self._own_recording_watched = True
        self._counter_watch: CounterWatch | None = None  # made at the first watch
        self._egress = EgressPublisher()
        self.log_publisher = LogPublisher()
        self._log_publication: ExclusivePublication | None = None
        self._log_image: Image | None = None
        self._replay_subscription: Subscription | None = None
        self._log_replay_correlation_id = NULL_VALUE
        self._next_service_check_ns = 0
        self._service_heartbeat_since_ms = 0  # no older sign of life counts (set when checks begin or resume)
        self._recording_position_counter_id = NULL_VALUE
        self._recording_position_registration_id = NULL_VALUE
        # The archive's id: its rec-pos counters name it (a dead archive's linger a
        # while).  Asked once, when a rec-pos counter is first looked for.
        self._archive_id: int | None = None
        # An error said once on the console (the mark file's error log counts every one).
        self._print_error = DistinctErrorPrinter(lambda text: self.log_event(f"error: {text}"))
        # A failed election starts again after a back-off, not at once: the
        # registrations that failed it may need a moment (see election_host).
        self._election_backoff = RetryBackoff(max_ns=context.election_timeout_ns)
        self._logged_transitions: tuple[Any, int] = (None, 0)  # (the election, its transitions logged)
        self._snapshot_log_position = NULL_POSITION
        self._termination_position = NULL_POSITION
        self._termination_action: ControlToggle | None = None
        self._state_after_snapshot = ConsensusModuleState.ACTIVE
        # ACTIVE or SUSPENDED: what the last SUSPEND/RESUME this module applied
        # says (appended as leader, replayed from the log, or loaded from a
        # snapshot).  The state the module is in, or returns to after INIT, an
        # election or a snapshot: a suspension outlives them all (seed 004).
        self.running_state = ConsensusModuleState.ACTIVE
        # The leader's SUSPEND/RESUME not yet committed: (log position after it,
        # the running state before it), restored if it steps down before a quorum has it.
        self._uncommitted_actions: deque[tuple[int, ConsensusModuleState]] = deque()
        self._service_check_deadline_ns = 0
        self._termination_ack_id = NULL_VALUE
        self._snapshot_ack_id = NULL_VALUE
        self.recovery_state: Counter | None = None  # what the services recover from (set at launch)
        self.mark_file: Any = None  # the module's mark file (set at launch): the candidate term id lives there
        # A cluster of several members (seed 001): who they are, and what this
        # member knows of them.
        self.members = parse_cluster_members(context.cluster_members) if context.cluster_members.strip() else []
        self.is_multi_member = len(self.members) > 1
        # Who may speak on the consensus stream (fulmar.consensus.member_auth):
        # with the cluster's secret, the members sign and check each member
        # message, in one native context that the agent's publisher and
        # guard and the native consensus threads share (one send counter for
        # the process, one memory of the counters taken from each member).
        self._member_key = context.member_key() if self.is_multi_member else None
        self._member_auth = (
            MemberAuth(
                self.member_id,
                self._member_key,
                [member.id for member in self.members],
                context.leader_heartbeat_timeout_ns // 1_000_000,
            )
            if self._member_key is not None
            else None
        )
        self._refusal_line_due_ms = 0
        self._refusals_unsaid = 0
        self.leader_member_id = NULL_VALUE
        self.notified_commit_position = 0
        self._time_of_last_leader_message_ns = 0
        # When a leader of this member's term or a newer one was last heard
        # (Aeron's timeOfLastLeaderUpdateNs): the election's canvass gives a
        # leader heard lately the heartbeat timeout to answer before standing.
        self.time_of_last_leader_update_ns = 0
        self._time_of_last_append_position_sent_ns = 0
        self._last_append_position_sent = NULL_POSITION
        self._quiet_log_doorbell: Counter | None = None  # quiet_log_doorbell_id
        self._time_of_last_commit_position_sent_ns = 0
        self._last_commit_position_sent = NULL_POSITION
        # What a steady member hands to its native threads (the leader's
        # ingress and commit, the follower's commit and AppendPositions):
        # consensus/native_handovers.py.
        self.handovers = NativeHandovers(self)
        # The others, with what this member (as leader) learns of them.
        self._followers: dict[int, ClusterMember] = {m.id: m for m in self.members if m.id != self.member_id}
        # What the leader appended and may lose if it steps down before a quorum has it.
        self._uncommitted_timers: deque[tuple[int, int]] = deque()
        self._uncommitted_service_messages = self.service_messages.uncommitted  # (the same deque)
        self._uncommitted_closed_sessions: deque[tuple[int, ClusterSession]] = deque()
        self._leader_services_ack_id = NULL_VALUE
        self._leader_services_joined = False
        self._leader_services_deadline_ns = 0
        self._leader_recording_subscription_id = NULL_VALUE
        self._leader_recording_started = False
        self._leader_term_to_record = (NULL_VALUE, NULL_POSITION)
        # A snapshot the leader asked for in the log, taken here too: (position,
        # services' ack id, the module's own snapshot recording id).
        self._follower_snapshot: tuple[int, int, int, int, int] | None = None
        # A cluster-wide stop led by this member: what it waits for.
        self._services_terminated = False
        self._termination_acks: set[int] = set()
        self._termination_deadline_ns = 0
        # Streams: ingress from clients, service control both ways.  A member
        # of several opens its ingress once an election is over (seed 001: no
        # client is served while nobody leads); a member alone has no other.
        self.ingress: Subscription | None = None
        # A refused ingress registration is tried again from the slow tick, backing off to a second.
        self._ingress_backoff = RetryBackoff(initial_ns=context.slow_tick_interval_ns, max_ns=1_000_000_000)
        # Exclusive, as in Aeron: a dead process's publication on the same stream (until
        # the driver times it out) is not shared with, nor can it block, this one.
        self.service_proxy = ServiceProxy(
            aeron.add_exclusive_publication(context.control_channel, context.service_stream_id)
        )
        self.from_services = aeron.add_subscription(context.control_channel, context.consensus_module_stream_id)
        self._service_assembler = FragmentAssembler(self._on_service_message)
        # Decodes the log this member applies (a follower's, a replay), and calls this agent's on_replay_* for it.
        self.log_adapter = LogAdapter(self, error=self._error)
        # Counters (keyed by cluster id, so tools find them).
        key = _CLUSTER_KEY.pack(context.cluster_id)
        self.module_state_counter = self._counter(
            protocol.CONSENSUS_MODULE_STATE_TYPE_ID, "Consensus Module state", key
        )
        self.role_counter = self._counter(protocol.CLUSTER_NODE_ROLE_TYPE_ID, "Cluster node role", key)
        self.control_toggle = self._counter(protocol.CLUSTER_CONTROL_TOGGLE_TYPE_ID, "Cluster control toggle", key)
        self.commit_position_counter = self._counter(protocol.COMMIT_POSITION_TYPE_ID, "Cluster commit-pos:", key)
        self.election_state_counter = self._counter(protocol.ELECTION_STATE_TYPE_ID, "Cluster election state", key)
        self.leadership_term_counter = self._counter(
            protocol.CLUSTER_LEADERSHIP_TERM_ID_TYPE_ID, "Cluster leadership term id", key
        )
        self.error_counter = self._counter(protocol.CLUSTER_ERROR_COUNT_TYPE_ID, "Cluster errors", key)
        self.max_cycle_counter = self._counter(
            protocol.CLUSTER_MAX_CYCLE_TIME_TYPE_ID, "Cluster max cycle time in ns", key
        )
        self.cycle_exceeded_counter = self._counter(
            protocol.CLUSTER_CYCLE_TIME_THRESHOLD_EXCEEDED_TYPE_ID,
            f"Cluster work cycle time exceeded count: threshold={context.cycle_threshold_ns}ns",
            key,
        )
        # Seed 000: measured from one duty cycle to the next, so a stall between
        # cycles (the kind that misses heartbeats) counts; the runner's idle
        # strategy reports its intended sleeps to it (ConsensusModule.run).
        self.duty_cycle_tracker = DutyCycleStallTracker(
            self.max_cycle_counter, self.cycle_exceeded_counter, context.cycle_threshold_ns
        )
        self.snapshot_counter = self._counter(protocol.SNAPSHOT_COUNTER_TYPE_ID, "Cluster snapshot count", key)
        # Actions for this node alone, whatever its role (Aeron uses it for
        # standby snapshots, which a cluster without standbys refuses).
        self.node_control_toggle = self._counter(
            protocol.CLUSTER_NODE_CONTROL_TOGGLE_TYPE_ID, "Cluster node control toggle", key
        )
        self.sessions_counter = self._counter(protocol.CLUSTER_SESSIONS_TYPE_ID, "Cluster sessions", key)
        self.timers_counter = self._counter(protocol.CLUSTER_TIMERS_TYPE_ID, "Cluster timers", key)
        self.invalid_requests_counter = self._counter(
            protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID, "Cluster invalid requests (ignored)", key
        )
        self.standby_snapshot_counter = self._counter(
            protocol.CLUSTER_STANDBY_SNAPSHOT_COUNTER_TYPE_ID, "Cluster standby snapshots received", key
        )
        self.consensus_refused_counter = self._counter(
            protocol.CLUSTER_CONSENSUS_REFUSED_TYPE_ID, "Cluster consensus messages refused (not a member's)", key
        )
        # Each election this module starts, the one at start-up included (Aeron's election count).
        self.election_count_counter = self._counter(
            protocol.CLUSTER_ELECTION_COUNT_TYPE_ID, "Cluster election count", key
        )
        # What each follower last reported it has appended, while this member
        # leads (Aeron keeps it in memory only): tools and the metrics show each
        # follower's lag behind the leader from it.
        self._follower_position_counters = {
            member_id: self._counter(
                protocol.CLUSTER_MEMBER_APPEND_POSITION_TYPE_ID,
                f"Cluster member append position: memberId={member_id}",
                _MEMBER_KEY.pack(context.cluster_id, member_id),
            )
            for member_id in self._followers
        }
        self._follower_positions_shown = dict.fromkeys(self._followers, 0)
        self._show_follower_positions()
        self.leadership_term_counter.set(NULL_VALUE)
        self.commit_position_counter.set(0)
        self.control_toggle.set(ControlToggle.INACTIVE)
        self.node_control_toggle.set(ControlToggle.NEUTRAL)
        self.consensus_publisher: ConsensusPublisher | None = None
        self.consensus_adapter: ConsensusAdapter | None = None
        self._consensus_subscription: Subscription | None = None  # (stream 108: several members, or a named one)
        # Decodes what clients send on the ingress, and calls this agent's on_* for it.
        self.ingress_adapter = IngressAdapter(
            self,
            is_leader=lambda: self.role is ClusterRole.LEADER,
            invalid_requests=self.invalid_requests_counter,
            error=self._error,
        )
        # Capped at each image's max message length: a publisher that never
        # ends a message cannot grow the module's memory (see FragmentAssembler).
        self._ingress_assembler = FragmentAssembler(
            self._on_ingress_message, on_dropped=self.ingress_adapter.on_dropped
        )
        self.backup_sessions = BackupSessions(
            aeron=aeron,
            context=context,
            egress=self._egress,
            recording_log=self.recording_log,
            member_id=self.member_id,
            invalid_requests=self.invalid_requests_counter,
            standby_snapshots=self.standby_snapshot_counter,
            commit_position_counter=self.commit_position_counter,
            is_open=self._takes_backup_requests,
            now_ns=lambda: self._now_ns,
            epoch_ms=self.epoch_ms,
            leader_member_id=lambda: self.leader_member_id if self.is_multi_member else self.member_id,
            cluster_members=lambda: encode_cluster_members(self.members) if self.members else "",
            error=self._error,
            log_event=self.log_event,
        )
        # (The same lists: the agent sends their rejections and disconnects them on close.)
        self.pending_backup_sessions = self.backup_sessions.pending
        self.rejected_backup_sessions = self.backup_sessions.rejected
        self.election: Any
        self.election_count_counter.increment()
        if self.is_multi_member:
            self._open_consensus_streams()
            self.host = NodeElectionHost(self)
            self.election = MemberElection(self, is_startup=True)
        else:
            self.election = SingleNodeElection(self)
            if context.native_commit:
                # A single member commits its own recording: the thread, woken
                # by rec-pos, moves commit-pos without a wake-up of this agent.
                self.handovers.leader_commit.start()
            if self.members:
                # A cluster of one named in a members string still has a
                # consensus endpoint: a ClusterBackup, a heartbeat or a standby
                # snapshot reaches the member there (seed 000).
                self._open_lone_consensus_stream()
            # A member alone has no election to wait for: its ingress opens now
            # (through the ingress thread's doorbell, as a leader's of several).
            self.ingress = aeron.add_subscription(self._ingress_channel(), context.ingress_stream_id)
        self._set_state(ConsensusModuleState.INIT)

    def _counter(self, type_id: int, label: str, key: bytes) -> Counter:
        return self.aeron.add_counter(type_id, f"{label} - clusterId={self.context.cluster_id}", key)

    def _show_follower_positions(self) -> None:
        """Each follower's append position into its counter, where it changed
        (a comparison per follower in the leader's cycle; a store only on news)."""
        shown = self._follower_positions_shown
        for member_id, follower in self._followers.items():
            if shown[member_id] != follower.log_position:
                shown[member_id] = follower.log_position
                self._follower_position_counters[member_id].set(follower.log_position)

    # ------------------------------------------------------------ duty cycle

    def do_work(self, now_ns: int) -> int:
        self._now_ns = now_ns
        # (The time since the last cycle began, less the sleep it meant to take.)
        if self.duty_cycle_tracker.measure_and_update(now_ns) > self.context.leader_heartbeat_timeout_ns // 2:
            self._after_standing_still(now_ns)
        handovers = self.handovers
        # The native threads' steps are taken back where they are in the cycle:
        # the ingress first (nothing else may append to the log meanwhile),
        # the follower's commit before the slow tick (the rest of the cycle
        # reads the log and commit positions), the leader's commit after the
        # services' messages (before the consensus stream is read: the agent
        # reads it only where the thread gave it back); the AppendPositions
        # are decided last, on the cycle's outcome (an election, a new role).
        work = handovers.leader_ingress.take_back(now_ns)
        work += handovers.follower_commit.take_back(now_ns)
        if now_ns >= self._slow_tick_deadline_ns:
            self._slow_tick_deadline_ns = now_ns + self.context.slow_tick_interval_ns
            work += self._slow_tick_work(now_ns)
        elif self.aeron.conductor.has_driver_news():
            # A new image (a client's ingress, the archive's responses) now, not
            # at the next slow tick: has_work woke this cycle for it.
            work += self.aeron.do_work(now_ns)
        work += self._poll_services()
        work += handovers.leader_commit.take_back(now_ns)
        if self.consensus_adapter is not None and self._reads_consensus_stream():
            work += self.consensus_adapter.poll()
        if self.election is not None and self.is_multi_member:
            work += self._multi_member_election_work(now_ns)
        elif self.election is not None:
            try:
                work += self.election.do_work(now_ns)
            except ClusterTerminationError:
                raise
            except FulmarError as error:
                # One member alone has nobody to hand over to: stop, loudly
                # (the supervisor restarts the node), rather than retry forever.
                raise ClusterTerminationError(
                    f"election {self.election.state.name} failed: {type(error).__name__}: {error}"
                ) from error
        elif self.role is ClusterRole.LEADER:
            work += self._leader_work(now_ns)
        elif self.is_multi_member:
            work += self._follower_work(now_ns)
        if handovers.append_position.keeps_reports():
            # The thread reports the recording: the agent need only wake
            # for it while it holds back the log a commit let it apply,
            # and not even then while the commit thread applies the log.
            self._watch_own_recording(
                not handovers.follower_commit.is_armed and self.notified_commit_position > self.append_position
            )
            return work
        if self.role is not ClusterRole.LEADER or self.election is not None:
            self._watch_own_recording(True)  # only a steady leader (or an armed follower) leaves it off
        return work

    def _after_standing_still(self, now_ns: int) -> None:
        """This process did not run for half a heartbeat timeout or more
        (SIGSTOP, a stall): what the other members sent meanwhile waits unread
        in its buffers, so their silence says nothing yet.  A leader gives its
        followers, and a follower its leader, a timeout from now, rather than
        start an election on that silence before reading it: the wait may hold
        a newer leader's word, which this member then follows, where an
        election of its own (on stale canvasses in the same backlog) would
        depose the leader the others elected meanwhile."""
        for follower in self._followers.values():
            follower.time_of_last_append_position_ns = max(follower.time_of_last_append_position_ns, now_ns)
        self._time_of_last_leader_message_ns = max(self._time_of_last_leader_message_ns, now_ns)

    def has_work(self) -> bool:
        """A cheap check before sleeping: is a message already waiting?  It
        asks what do_work reads: a native thread that gave its step back
        (its ring may have come while this agent was awake), and each stream
        this agent reads itself, by the predicates its duty cycle reads them
        by (not those a thread holds)."""
        if self.handovers.has_news():
            return True
        if self.from_services.is_data_available():
            return True
        ingress = self.ingress
        if ingress is not None and self._reads_ingress() and ingress.is_data_available():
            return True
        # A follower's log image holds what is not yet committed: that is no work
        # until the commit position it was notified of moves past what it has
        # read, and the archive has recorded that far (a replay is bounded by its
        # end instead).
        image = self._log_image
        if (
            image is not None
            and self._reads_log()
            and image.is_data_available()
            and (self.election is not None or image.position < self._follower_log_limit(self.append_position))
        ):
            return True
        consensus = self._consensus_subscription
        if consensus is not None and self._reads_consensus_stream() and consensus.is_data_available():
            return True
        if self.aeron.conductor.has_driver_news():
            return True  # an image to add (do_work takes it at once)
        # The archive recorded more of the log: a follower reports it, a leader
        # (a single member too) may commit.
        # (Only while the counter is still the one found: a freed id may be reused.)
        counter_id = self._recording_position_counter_id
        reader = self.aeron.counters_reader
        return (
            self._own_recording_watched
            and counter_id != NULL_VALUE
            and reader.counter_registration_id(counter_id) == self._recording_position_registration_id
            and reader.counter_value(counter_id) > self.append_position
        )

    # What this agent reads itself (do_work and has_work alike): not what a native thread holds.

    def _reads_ingress(self) -> bool:
        """The ingress, while the ingress thread does not hold it: a
        follower's (for its redirects), a leader's while ACTIVE (a leader that
        is not leaves what waits there unread until it is again)."""
        return (
            self.ingress is not None
            and not self.handovers.leader_ingress.is_armed
            and (self.role is not ClusterRole.LEADER or self.state is ConsensusModuleState.ACTIVE)
        )

    def _reads_log(self) -> bool:
        """The log image (a replay, or a follower's live log), while the
        follower's commit thread does not hold it."""
        return self._log_image is not None and not self.handovers.follower_commit.is_armed

    def _follower_log_limit(self, append_position: int) -> int:
        """How far a follower applies its log: what its leader says is
        committed, as far as its own archive has recorded."""
        return min(self.notified_commit_position, append_position)

    def _reads_consensus_stream(self) -> bool:
        """The consensus stream, while neither commit thread holds it (a
        single member's commit thread reads none)."""
        handovers = self.handovers
        return not self.is_multi_member or not (handovers.leader_commit.is_armed or handovers.follower_commit.is_armed)

    def is_steady(self) -> bool:
        """Nothing of its own waits for a next duty cycle: no election or
        snapshot under way, no service message still to append.  Then what a
        next cycle could find is only what arrives, which ``has_work`` sees."""
        return self.election is None and self.state is ConsensusModuleState.ACTIVE and not self.pending_service_messages

    def cluster_time(self) -> int:
        """Cluster time, in its unit (milliseconds since the epoch)."""
        return self.epoch_ms()

    def idle_wait_ns(self, max_wait_ns: int) -> int:
        """How long an idle module may sleep.

        A steady module with nothing of its own in progress sleeps up to
        ``max_wait_ns``, or until its own next duty: the leader's
        CommitPosition heartbeat, the follower's AppendPosition heartbeat or
        the end of its leader's heartbeat timeout; what arrives rings it
        sooner.  Anything in progress that a ring does not announce (an
        election, a snapshot, a client's session being opened or answered, a
        follower catching up, an ingress to reconnect) keeps the slow tick's
        pace.  A cluster timer that falls due sooner (timers fire on the
        module's clock) or the election's own moment (its nomination) ends the
        sleep then."""
        now_ns = self._now_ns
        if self.is_steady() and not self._has_slow_tick_work():
            wait_ns = max_wait_ns
            if self.is_multi_member:
                # (Once due, at the slow tick's pace: a heartbeat the thread
                # could not send yet must not make the module spin.)
                due_ns = self._next_heartbeat_duty_ns() - now_ns
                wait_ns = min(wait_ns, max(due_ns, self.context.slow_tick_interval_ns))
        else:
            wait_ns = min(max_wait_ns, self.context.slow_tick_interval_ns)
        election = self.election
        if election is not None:
            wake_ns = election.wake_deadline_ns()
            if wake_ns is not None:
                return max(1, min(wait_ns, wake_ns - now_ns))
        deadline = self.timers.next_deadline()
        if (
            deadline is None
            or self.role is not ClusterRole.LEADER
            or self.election is not None
            or self.state is not ConsensusModuleState.ACTIVE
        ):
            # Only an ACTIVE leader fires timers: an overdue one would otherwise
            # make every idle wait 1 ns (a suspended leader spinning).
            return max(1, wait_ns)
        return max(1, min(wait_ns, (deadline - self.cluster_time()) * 1_000_000))

    def _has_slow_tick_work(self) -> bool:
        """Work the slow tick does that nothing rings for: sessions still being
        opened, redirected, rejected or told of their open or a new leader, an
        ingress to reconnect, a follower catching up from this leader."""
        if (
            self.pending_sessions
            or self.pending_backup_sessions
            or self.redirect_sessions
            or self.rejected_sessions
            or self.rejected_backup_sessions
            or (self._session_events_pending and self.role is ClusterRole.LEADER)
            or self.ingress is None
        ):
            return True
        return any(follower.catchup_replay_session_id != NULL_VALUE for follower in self._followers.values())

    def _next_heartbeat_duty_ns(self) -> int:
        """When a steady member of several must act on its own clock: a leader
        sends its CommitPosition heartbeat, a follower its AppendPosition
        heartbeat, or starts an election once its leader is silent for the
        heartbeat timeout.  (The native threads' send times are taken at each
        cycle's start: one sent since makes this early, never late.)"""
        interval_ns = self.context.leader_heartbeat_interval_ns
        if self.role is ClusterRole.LEADER:
            return self._time_of_last_commit_position_sent_ns + interval_ns
        return min(
            self._time_of_last_append_position_sent_ns + interval_ns,
            self._time_of_last_leader_message_ns + self.context.leader_heartbeat_timeout_ns,
        )

    def _slow_tick_work(self, now_ns: int) -> int:
        work = self.aeron.do_work(now_ns)
        if not self.archive.proxy.publication.is_connected:
            # The archive holds the log: without it this member can neither
            # record nor replay; it stops (its node restarts it with its archive).
            raise ClusterTerminationError("the archive went away (its control requests have no subscriber)")
        try:
            self.archive.poll_for_signals()
        except FulmarError as error:
            self._error(f"archive: {error}")
            if (
                self._replay_subscription is not None
                and isinstance(error, ArchiveResponseError)
                and error.correlation_id == self._log_replay_correlation_id
            ):
                # The archive could not read this member's own log (a corrupt
                # segment, a failed checksum): what it committed cannot be
                # rebuilt here, so stop at once with the archive's reason
                # rather than wait out the replay timeout or serve less.
                raise ClusterTerminationError(
                    f"the replay of log recording {self.log_recording_id} failed, so this member cannot "
                    f"recover its committed state: {error.archive_message}"
                ) from error
            if self.is_multi_member:
                self.host.on_archive_error(str(error))
        if self.is_multi_member:
            while self.archive.signals:
                self.host.on_recording_signal(self.archive.signals.popleft())
        self._check_service_heartbeats(now_ns)
        if self.ingress is None and self.election is None and self._ingress_backoff.may_attempt(now_ns):
            work += self.connect_ingress(now_ns)
        work += self._process_redirect_and_rejected(now_ns)
        work += self._check_node_control_toggle()
        if self.election is None and self.role is ClusterRole.LEADER:
            work += self._check_control_toggle(now_ns)
            work += self._process_pending_sessions(now_ns)
            work += self.backup_sessions.process_pending(now_ns)
            work += self._check_sessions(now_ns)
        elif self.election is None:
            # Seed 000: a follower answers the backup, heartbeat and standby
            # snapshot sessions too (a backup's answer names the leader).
            work += self.backup_sessions.process_pending(now_ns)
        return work

    def _leader_work(self, now_ns: int) -> int:
        work = 0
        if self.state is ConsensusModuleState.ACTIVE:
            # Only an active leader reads its ingress (Aeron's consensusWork):
            # suspended, or in a snapshot or a stop, every client message,
            # connects and closes too, waits in the ingress in its order.
            work += self.timers.poll(self.cluster_time(), self._on_timer_expired)
            work += self._append_pending_service_messages()
            work += self._poll_ingress()
        if self.is_multi_member:
            work += self._check_follower_snapshot()  # (one replayed in its election)
            work += self._update_quorum_commit_position(now_ns)
            if self.election is not None:
                return work  # stepped down (a newer term or no quorum of followers)
        else:
            work += self._update_single_member_commit()
        work += self._check_snapshot_and_termination(now_ns)
        return work

    # --------------------------------------------------------- positions

    def _find_recording_position_counter(self) -> int:
        """The archive's rec-pos counter of the log recording (as Aeron's
        ``RecordingPos.findCounterIdBySession``): of this member's archive, not of
        a dead one whose counters the driver has yet to free (a restarted archive
        records the same recording and session), the newest if several match."""
        if self._archive_id is None:
            self._archive_id = self.archive.archive_id()
        reader = self.aeron.counters_reader
        found, registration_id = NULL_VALUE, NULL_VALUE
        for counter_id in reader.ids_of_type(RECORDING_POSITION_TYPE_ID):
            recording_id, session_id, archive_id = recording_position_ids(reader.counter_key(counter_id))
            if (recording_id, session_id, archive_id) == (self.log_recording_id, self.log_session_id, self._archive_id):
                registration = reader.counter_registration_id(counter_id)
                if registration > registration_id:
                    found, registration_id = counter_id, registration
        self._recording_position_registration_id = registration_id
        if found != self._watched_recording_counter_id:
            # Woken when the archive records more (it rings the counter's watchers).
            if self._watched_recording_counter_id != NULL_VALUE:
                self._watches().unwatch(self._watched_recording_counter_id)
            self._watched_recording_counter_id = found
            if self._own_recording_watched:
                self._watch_recording_counter(found)
        return found

    def _watches(self) -> CounterWatch:
        if self._counter_watch is None:
            self._counter_watch = self.aeron.conductor.counter_watch()
        return self._counter_watch

    def _watch_recording_counter(self, counter_id: int) -> None:
        if counter_id != NULL_VALUE and not self._watches().watch(counter_id):
            self._print_error(
                f"rec-pos counter {counter_id} has no free watcher slot: "
                "this module notices new recording by its idle timeout"
            )

    def _watch_own_recording(self, wanted: bool) -> None:
        """Be woken by the archive's recording of the log, or not.

        A steady leader of several members commits when a quorum has recorded,
        itself included.  Its own archive records an append within tens of
        microseconds, long before a follower's AppendPosition can arrive, so a
        wake-up for that recording finds nothing to commit: a whole duty cycle
        of CPU, taken from the two cores the round trip's next hops need.  The
        leader therefore watches its rec-pos only while its own recording is
        what holds the commit back.  The watch is set again before the idle
        strategy's ``has_work`` reads rec-pos, so a recording made in between
        is seen there and no wake-up is lost."""
        if wanted is self._own_recording_watched:
            return
        self._own_recording_watched = wanted
        counter_id = self._watched_recording_counter_id
        if counter_id == NULL_VALUE:
            return
        if wanted:
            self._watch_recording_counter(counter_id)
        else:
            self._watches().unwatch(counter_id)

    def _recording_position_counter(self) -> int:
        """The rec-pos counter's id while it is still the one found (Aeron's
        ``ReadableCounter``: a freed counter, or its id reused, is looked up again)."""
        counter_id = self._recording_position_counter_id
        if counter_id != NULL_VALUE:
            reader = self.aeron.counters_reader
            if (
                reader.counter_state(counter_id) == RECORD_ALLOCATED
                and reader.counter_registration_id(counter_id) == self._recording_position_registration_id
            ):
                return counter_id
            self._recording_position_counter_id = counter_id = NULL_VALUE
        if self.log_recording_id != NULL_VALUE and self.log_session_id != NULL_VALUE:
            self._recording_position_counter_id = counter_id = self._find_recording_position_counter()
        return counter_id

    def _update_single_member_commit(self) -> int:
        """The armed commit thread commits what the archive records (its state
        was taken at the cycle's start); else this agent does, woken by rec-pos."""
        if self.handovers.leader_commit.arm():
            self.read_append_position()
            return 0
        self._watch_own_recording(True)
        return self._update_commit_position()

    def _update_commit_position(self) -> int:
        """A single member's quorum is itself: what its archive has recorded is committed."""
        counter_id = self._recording_position_counter()
        if counter_id == NULL_VALUE:
            return 0
        position = self.aeron.counters_reader.counter_value(counter_id)
        if position > self.append_position:
            self.append_position = position
        if self.append_position > self.commit_position:
            self.commit_position = self.append_position
            self.commit_position_counter.set(self.commit_position)
            self._ring_counter_watchers(self.commit_position_counter.id)
            return 1
        return 0

    # ----------------------------------------------------------------- ingress

    def _poll_ingress(self) -> int:
        work = 0
        while self._pending_ingress:
            message = self._pending_ingress[0]
            if not self.ingress_adapter.dispatch(memoryview(message), 0, len(message)):
                return work
            self._pending_ingress.popleft()
            work += 1
        if self.ingress is None or not self._reads_ingress():
            return work
        return work + self.ingress.poll_session_runs(
            self._ingress_assembler.on_fragment, self._on_ingress_session_messages, 64
        )

    def _on_ingress_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        self._take_ingress(buffer, offset, length)

    def _take_ingress(self, buffer: memoryview, offset: int, length: int) -> None:
        if self._pending_ingress or not self.ingress_adapter.dispatch(buffer, offset, length):
            # The log is back pressured: keep the message, in order, for the next cycle.
            self._pending_ingress.append(bytes(buffer[offset : offset + length]))

    def _on_ingress_session_messages(self, messages: SessionMessages) -> None:
        """A run of client messages on the ingress, the hot path: the leader
        appends the valid ones to the log in one call, each with the session
        header ``_on_ingress_session_message`` gives it (this term, the
        session, the cluster time), and keeps in order what back pressure
        turned away.  Anything else takes the per-message path."""
        view = messages.view
        offsets = messages.message_offsets
        lengths = messages.message_lengths
        if self._pending_ingress or self.role is not ClusterRole.LEADER:
            # What waits goes first; a follower's are not for it.
            for offset, length in zip(offsets, lengths):
                self._take_ingress(view, offset, length)
            return
        sessions = self.sessions
        term = self.leadership_term_id
        term_ids = messages.leadership_term_ids
        timestamp = self.cluster_time()
        block = bytearray()
        block_lengths = array("i")
        taken: list[int] = []  # the run's index of each message in the block
        for i, session_id in enumerate(messages.session_ids):
            session = sessions.get(session_id)
            if session is None or session.state is not ClusterSessionState.OPEN or term_ids[i] != term:
                self.invalid_requests_counter.increment()
                continue
            at = len(block)
            block += view[offsets[i] : offsets[i] + lengths[i]]
            SESSION_MESSAGE_FRAME.pack_into(
                block,
                at,
                SESSION_MESSAGE_BLOCK_LENGTH,
                SESSION_MESSAGE_TEMPLATE_ID,
                CLUSTER_SCHEMA_ID,
                CLUSTER_SCHEMA_VERSION,
                term,
                session_id,
                timestamp,
            )
            block_lengths.append(lengths[i])
            taken.append(i)
        if not taken:
            return
        appended = self.log_publisher.append_block(bytes(block), block_lengths)
        now_ns = self._now_ns
        for session_id in {messages.session_ids[i] for i in taken[:appended]}:
            sessions[session_id].time_of_last_activity(now_ns)
        for i in taken[appended:]:
            self._pending_ingress.append(bytes(view[offsets[i] : offsets[i] + lengths[i]]))

    def _check_service_heartbeats(self, now_ns: int) -> None:
        """Once a second, each service's mark file must show activity within
        the service heartbeat timeout (the container writes it every second);
        a dead service stops the module (ClusterTerminationError), as Aeron's
        checkServiceHeartbeats does.  Checked only while the module is up and
        running (not while it recovers or stops), and not right after this
        process itself stood still (SIGSTOP, a long GC-like stall): then the
        services stood still too, and their clocks restart with ours."""
        if now_ns < self._next_service_check_ns:
            return
        stalled = self._next_service_check_ns and now_ns - self._next_service_check_ns > 1_000_000_000
        self._next_service_check_ns = now_ns + 1_000_000_000
        if stalled:
            self._service_heartbeat_since_ms = self.epoch_ms()
            return
        if self.state not in (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED):
            self._service_heartbeat_since_ms = self.epoch_ms()
            return
        now_ms = self.epoch_ms()
        timeout_ms = self.context.service_heartbeat_timeout_ns // 1_000_000
        for service_id in range(self.context.service_count):
            path = self.context.cluster_dir / service_mark_file_name(service_id)
            activity_ms = read_activity_timestamp(path) or 0
            last_seen_ms = max(activity_ms, self._service_heartbeat_since_ms)
            if now_ms - last_seen_ms > timeout_ms:
                raise ClusterTerminationError(
                    f"no heartbeat from service {service_id} for {now_ms - last_seen_ms} ms (timeout {timeout_ms} ms, "
                    f"mark file {path}): the service is gone, so this member stops"
                )

    def on_ingress_session_message(
        self, leadership_term_id: int, cluster_session_id: int, buffer: memoryview, offset: int, length: int
    ) -> bool:
        session = self.sessions.get(cluster_session_id)
        if (
            session is None
            or session.state is not ClusterSessionState.OPEN
            or leadership_term_id != self.leadership_term_id
        ):
            self.invalid_requests_counter.increment()
            return True
        payload = buffer[offset + SESSION_HEADER_LENGTH : offset + length]
        result = self.log_publisher.append_message(self.leadership_term_id, session.id, self.cluster_time(), payload)
        if result <= 0:
            return False
        session.time_of_last_activity(self._now_ns)
        return True

    def on_session_connect(self, message: Any) -> bool:
        session = ClusterSession(
            NULL_VALUE, message.response_stream_id, message.response_channel, message.correlation_id, self._now_ns
        )
        try:
            session.async_connect(self.aeron, self._error)
        except FulmarError as error:
            self._error(f"cannot connect the egress of a connect request ({message.response_channel}): {error}")
            self.invalid_requests_counter.increment()
            return True
        if self.role is not ClusterRole.LEADER:
            # (Never during an election: the ingress is closed then.)
            session.detail = "not the leader"
            self.redirect_sessions.append(session)
            return True
        session.id = self.next_session_id
        self.next_session_id += 1
        if major_version(message.version) != protocol.PROTOCOL_MAJOR_VERSION:
            session.detail = (
                f"invalid client version {version_text(message.version)}, "
                f"cluster is {version_text(protocol.PROTOCOL_SEMANTIC_VERSION)}"
            )
            self.rejected_sessions.append(session)
        elif len(self.sessions) + len(self.pending_sessions) >= self.context.max_concurrent_sessions:
            session.detail = f"concurrent session limit {self.context.max_concurrent_sessions} reached"
            self.rejected_sessions.append(session)
        else:
            self._authenticator.on_connect_request(session.id, bytes(message.encoded_credentials), self.epoch_ms())
            self.pending_sessions.append(session)
        return True

    def on_session_close_request(self, message: Any) -> bool:
        session = self.sessions.get(message.cluster_session_id)
        if session is None or message.leadership_term_id != self.leadership_term_id:
            self.invalid_requests_counter.increment()
            return True
        return self._close_session(session, CloseReason.CLIENT_ACTION, notify=False)

    def on_session_keep_alive(self, message: Any) -> bool:
        session = self.sessions.get(message.cluster_session_id)
        if session is None or message.leadership_term_id != self.leadership_term_id:
            self.invalid_requests_counter.increment()
        else:
            session.time_of_last_activity(self._now_ns)
        return True

    def on_challenge_response(self, message: Any) -> bool:
        for session in self.pending_sessions:
            if session.id == message.cluster_session_id and session.state is ClusterSessionState.CHALLENGED:
                session.time_of_last_activity(self._now_ns)
                # As in Aeron, the answer to the client carries the challenge
                # response's correlation id from now on.
                session.correlation_id = message.correlation_id
                self._authenticator.on_challenge_response(
                    session.id, bytes(message.encoded_credentials), self.epoch_ms()
                )
                return True
        self.invalid_requests_counter.increment()
        return True

    def on_admin_request(self, message: Any) -> bool:
        session = self.sessions.get(message.cluster_session_id)
        if session is None or message.leadership_term_id != self.leadership_term_id or session.publication is None:
            self.invalid_requests_counter.increment()
            return True
        ok = (
            message.request_type_raw == codecs.AdminRequestType.SNAPSHOT
            and self.control_toggle.get() == ControlToggle.NEUTRAL
        )
        if ok:
            self.control_toggle.set(ControlToggle.SNAPSHOT)
        self._egress.admin_response(
            session.publication,
            session.id,
            message.correlation_id,
            message.request_type_raw,
            int(codecs.AdminResponseCode.OK if ok else codecs.AdminResponseCode.ERROR),
            "" if ok else "the cluster cannot take a snapshot now (another action is under way)",
        )
        return True

    # ----------------------------- backup, heartbeat and standby snapshot sessions
    # (consensus/backup_sessions.py; the consensus adapter calls these on the agent)

    def _takes_backup_requests(self) -> bool:
        """Only while no election runs and the module runs, as in Aeron; the
        tool asks again when it hears nothing."""
        return self.election is None and self.state in (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED)

    def on_backup_query(
        self,
        correlation_id: int,
        response_stream_id: int,
        version: int,
        response_channel: str,
        encoded_credentials: bytes,
    ) -> None:
        self.backup_sessions.on_backup_query(
            correlation_id, response_stream_id, version, response_channel, encoded_credentials
        )

    def on_heartbeat_request(
        self, correlation_id: int, response_stream_id: int, response_channel: str, encoded_credentials: bytes
    ) -> None:
        self.backup_sessions.on_heartbeat_request(
            correlation_id, response_stream_id, response_channel, encoded_credentials
        )

    def on_standby_snapshot(
        self,
        correlation_id: int,
        version: int,
        response_stream_id: int,
        snapshots: list[Any],
        response_channel: str,
        encoded_credentials: bytes,
    ) -> None:
        self.backup_sessions.on_standby_snapshot(
            correlation_id, version, response_stream_id, snapshots, response_channel, encoded_credentials
        )

    def on_consensus_challenge_response(
        self, correlation_id: int, cluster_session_id: int, encoded_credentials: bytes
    ) -> None:
        self.backup_sessions.on_consensus_challenge_response(correlation_id, cluster_session_id, encoded_credentials)

    # -------------------------------------------------------------- sessions

    def _process_redirect_and_rejected(self, now_ns: int) -> int:
        work = 0
        for collection, code in (
            (self.redirect_sessions, EventCode.REDIRECT),
            (self.rejected_sessions, None),
            (self.rejected_backup_sessions, None),
        ):
            for session in list(collection):
                if session.state is ClusterSessionState.INVALID:  # the driver refused its egress
                    collection.remove(session)
                    session.close()
                    self.invalid_requests_counter.increment()
                    continue
                if session.publication is not None and session.is_response_publication_connected:
                    event_code = code
                    if event_code is None:
                        event_code = (
                            EventCode.AUTHENTICATION_REJECTED
                            if session.state is ClusterSessionState.REJECTED
                            else EventCode.ERROR
                        )
                    detail = self._leader_detail() if event_code is EventCode.REDIRECT else session.detail
                    leader = self.leader_member_id if self.is_multi_member else self.member_id
                    if self._egress.session_event(
                        session.publication,
                        session.id,
                        session.correlation_id,
                        self.leadership_term_id,
                        leader,
                        int(event_code),
                        detail,
                    ):
                        collection.remove(session)
                        session.close(CloseReason.CLIENT_ACTION)
                        work += 1
                        continue
                if now_ns - session.time_of_last_activity_ns > self.context.session_timeout_ns:
                    collection.remove(session)
                    session.close(CloseReason.TIMEOUT)
        return work

    def _leader_detail(self) -> str:
        """The ingress endpoints as Aeron's clients read them in a REDIRECT or a
        NewLeaderEvent: ``memberId=host:port`` (empty for an IPC ingress)."""
        if self.is_multi_member:
            return ingress_endpoints(self.members)
        endpoint = ChannelUri.parse(self.context.ingress_channel).get("endpoint")
        return f"{self.member_id}={endpoint}" if endpoint else ""

    def _process_pending_sessions(self, now_ns: int) -> int:
        work = 0
        for session in list(self.pending_sessions):
            if session.state is ClusterSessionState.INVALID:  # the driver refused its egress
                self.pending_sessions.remove(session)
                session.close()
                self.invalid_requests_counter.increment()
                continue
            if session.state is ClusterSessionState.CONNECTING and session.is_response_publication_connected:
                session.state = ClusterSessionState.CONNECTED
                self._authenticator.on_connected_session(SessionProxy(session), self.epoch_ms())
                work += 1
            if session.state is ClusterSessionState.CHALLENGED:
                if session.encoded_challenge is not None and session.publication is not None:
                    if self._egress.challenge(
                        session.publication, session.correlation_id, session.id, session.encoded_challenge
                    ):
                        session.encoded_challenge = None
                self._authenticator.on_challenged_session(SessionProxy(session), self.epoch_ms())
            if session.state is ClusterSessionState.AUTHENTICATED:
                if self.log_publisher.append_session_open(self.leadership_term_id, session, self.cluster_time()) > 0:
                    session.state = ClusterSessionState.OPEN
                    session.opened_log_position = self.log_publisher.position
                    session.time_of_last_activity(now_ns)
                    session.has_open_event_pending = True
                    self._session_events_pending = True
                    self.pending_sessions.remove(session)
                    self.sessions[session.id] = session
                    self.sessions_counter.set(len(self.sessions))
                    work += 1
            elif session.state is ClusterSessionState.REJECTED:
                self.pending_sessions.remove(session)
                session.detail = "authentication rejected"
                self.rejected_sessions.append(session)
            elif now_ns - session.time_of_last_activity_ns > self.context.session_timeout_ns:
                self.pending_sessions.remove(session)
                session.close(CloseReason.TIMEOUT)
        return work

    def _check_sessions(self, now_ns: int) -> int:
        work = 0
        timeout = self.context.session_timeout_ns
        # Set again below by a session whose event still waits (its egress not
        # yet connected, or back pressured): the module keeps the slow tick's pace.
        self._session_events_pending = False
        for session in list(self.sessions.values()):
            if session.state is not ClusterSessionState.OPEN:
                continue
            # Suspended, a held message stops the ingress (keepalives wait behind
            # it): as in Aeron, no session times out until RESUME.
            if now_ns - session.time_of_last_activity_ns > timeout and self.state is not ConsensusModuleState.SUSPENDED:
                if self._close_session(session, CloseReason.TIMEOUT, notify=True):
                    work += 1
                continue
            if session.has_open_event_pending and session.publication is not None:
                if self._egress.session_event(
                    session.publication,
                    session.id,
                    session.correlation_id,
                    self.leadership_term_id,
                    self.member_id,
                    int(EventCode.OK),
                    "",
                ):
                    session.has_open_event_pending = False
                    work += 1
            if session.has_new_leader_event_pending and session.publication is not None:
                if self._send_new_leader_event(session):
                    session.has_new_leader_event_pending = False
            if session.has_open_event_pending or session.has_new_leader_event_pending:
                self._session_events_pending = True
        return work

    def _send_new_leader_event(self, session: ClusterSession) -> bool:
        assert session.publication is not None
        message = self._egress.encode(
            codecs.NewLeaderEventEncoder,
            leadership_term_id=self.leadership_term_id,
            cluster_session_id=session.id,
            leader_member_id=self.member_id,
            ingress_endpoints=self._leader_detail(),
        )
        return session.publication.offer(message) > 0

    def _close_session(self, session: ClusterSession, reason: CloseReason, notify: bool) -> bool:
        """Append the SessionCloseEvent; False if the log is back pressured (retry)."""
        if (
            self.log_publisher.append_session_close(
                self.leadership_term_id, session.id, int(reason), self.cluster_time()
            )
            <= 0
        ):
            return False
        if self.is_multi_member:
            self._uncommitted_closed_sessions.append((self.log_publisher.position, session))
        if notify and session.publication is not None:
            detail = "session timed out" if reason is CloseReason.TIMEOUT else "closed by the service"
            self._egress.session_event(
                session.publication,
                session.id,
                session.correlation_id,
                self.leadership_term_id,
                self.member_id,
                int(EventCode.CLOSED),
                detail,
            )
        session.close(reason)
        self.sessions.pop(session.id, None)
        self.sessions_counter.set(len(self.sessions))
        return True

    # ------------------------------------------------------------------ timers

    def _on_timer_expired(self, correlation_id: int) -> bool:
        position = self.log_publisher.append_timer(self.leadership_term_id, correlation_id, self.cluster_time())
        if position <= 0:
            return False
        if self.is_multi_member:
            self._uncommitted_timers.append((position, correlation_id))
        return True

    # ------------------------------------------------------- from the services

    def _poll_services(self) -> int:
        return int(self.from_services.poll(self._service_assembler.on_fragment, 32))

    def _on_service_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        try:
            message_header = codecs.read_header(buffer, offset, length)
            if message_header.template_id == codecs.SessionMessageHeaderEncoder.TEMPLATE_ID:
                self.service_messages.enqueue(bytes(buffer[offset + SESSION_HEADER_LENGTH : offset + length]))
                return
            message = codecs.decode(buffer, offset, length)
        except CodecError as error:
            self._error(f"malformed message from a service ignored: {error}")
            return
        if isinstance(message, codecs.ScheduleTimerDecoder):
            self.timers.schedule(message.correlation_id, message.deadline)
        elif isinstance(message, codecs.CancelTimerDecoder):
            self.timers.cancel(message.correlation_id)
        elif isinstance(message, codecs.ServiceAckDecoder):
            self.service_acks.on_service_ack(message)
        elif isinstance(message, codecs.CloseSessionDecoder):
            session = self.sessions.get(message.cluster_session_id)
            if session is not None and self.role is ClusterRole.LEADER:
                if not self._close_session(session, CloseReason.SERVICE_ACTION, notify=True):
                    session.state = ClusterSessionState.CLOSING  # retried by the slow tick
        else:
            self._error(f"unexpected {type(message).__name__} from a service ignored")
        self.timers_counter.set(len(self.timers))

    def _append_pending_service_messages(self) -> int:
        term = self.leadership_term_id
        work = self.service_messages.append(
            lambda session_id, payload: self.log_publisher.append_message(
                term, session_id, self.cluster_time(), payload
            ),
            track_uncommitted=self.is_multi_member,
        )
        for session in list(self.sessions.values()):
            if session.state is ClusterSessionState.CLOSING:
                self._close_session(session, CloseReason.SERVICE_ACTION, notify=True)
        return work

    # The service session ids are the tracker's; the snapshot writes and the
    # recovery restores them here.
    @property
    def next_service_session_id(self) -> int:
        return self.service_messages.next_service_session_id

    @next_service_session_id.setter
    def next_service_session_id(self, value: int) -> None:
        self.service_messages.next_service_session_id = value

    @property
    def log_service_session_id(self) -> int:
        return self.service_messages.log_service_session_id

    @log_service_session_id.setter
    def log_service_session_id(self, value: int) -> None:
        self.service_messages.log_service_session_id = value

    # The services' acks are the tracker's (the elections, the replay and the stops ask here).

    def next_ack_id(self, join_log: bool = False) -> int:
        """The id of a request the services will acknowledge.  ``join_log``: the
        request is a JoinLog, which supersedes one still unanswered (a service
        joins only the newest log it was sent: it never answers the older)."""
        return self.service_acks.next_ack_id(join_log=join_log)

    def services_acked_partially(self, ack_id: int, missing: list[int]) -> bool:
        """Whether a service other than ``missing`` has yet to acknowledge ``ack_id``."""
        return self.service_acks.acked_partially(ack_id, missing)

    def services_acked(self, ack_id: int, log_position: int | None = None) -> list[Any] | None:
        """The acks of every service for ``ack_id``, once all came."""
        return self.service_acks.acked(ack_id, log_position, self.is_multi_member)

    # ---------------------------------------------------------- log replay

    def on_log_image(self, image: Image | None) -> None:
        self._log_image = image

    def poll_log(self, limit_position: int) -> int:
        """Apply the log image (a replay, or the follower's live log) up to
        ``limit_position``; then, and only then, commit-pos moves to what this
        module has read, so its services (which read up to commit-pos) never
        apply a position before it has (seed 000).  The work done."""
        image = self._log_image
        if image is None:
            return 0
        work = self.log_adapter.poll(image, limit_position)
        position = image.position
        if position > self.log_position:
            self.log_position = position
        if position > self.commit_position:
            self.commit_position = position
            self.commit_position_counter.set(position)
            self._ring_counter_watchers(self.commit_position_counter.id)
            work += 1
        return work

    # What the log says (the log adapter's calls): applied as it was appended.

    def on_replay_session_message(self, cluster_session_id: int) -> None:
        if cluster_session_id < 0:
            # A service message: the log holds it, so the service's re-offer is not appended again.
            self.service_messages.on_log_service_message(cluster_session_id)
            return
        session = self.sessions.get(cluster_session_id)
        if session is not None:
            session.time_of_last_activity(self._now_ns)

    def on_replay_session_open(
        self,
        log_position: int,
        correlation_id: int,
        cluster_session_id: int,
        response_stream_id: int,
        response_channel: str,
        encoded_principal: bytes,
    ) -> None:
        session = ClusterSession(cluster_session_id, response_stream_id, response_channel, correlation_id, self._now_ns)
        session.state = ClusterSessionState.OPEN
        session.encoded_principal = encoded_principal
        session.opened_log_position = log_position
        self.sessions[session.id] = session
        self.next_session_id = max(self.next_session_id, session.id + 1)
        self.sessions_counter.set(len(self.sessions))

    def on_replay_session_close(self, cluster_session_id: int, close_reason_raw: int) -> None:
        closed = self.sessions.pop(cluster_session_id, None)
        if closed is not None:
            closed.close(CloseReason(close_reason_raw))
        self.sessions_counter.set(len(self.sessions))

    def on_replay_timer_event(self, correlation_id: int) -> None:
        self.timers.cancel(correlation_id)

    def on_replay_new_leadership_term_event(self, leadership_term_id: int) -> None:
        self.leadership_term_id = leadership_term_id

    def on_replay_cluster_action(self, log_position: int, action: int, flags: int) -> None:
        if action in (codecs.ClusterAction.SUSPEND, codecs.ClusterAction.RESUME):
            self.on_replay_suspend_or_resume(action == codecs.ClusterAction.SUSPEND)
        elif self.is_multi_member and action == codecs.ClusterAction.SNAPSHOT and flags == CLUSTER_ACTION_FLAGS_DEFAULT:
            # (A standby snapshot is not this member's to take.)
            self._on_follower_snapshot_action(log_position)
        # (one member alone: a replayed snapshot already happened)

    def on_replay_suspend_or_resume(self, suspend: bool) -> None:
        """Seed 004 (Aeron's onReplayClusterAction): a follower applying the
        committed log, or any member replaying its own, takes the state the
        leader had at that position.  In INIT (a start-up replay) the state is
        taken when the election completes; a snapshot or a stop under way is
        not cut short, it returns to this state."""
        self.running_state = ConsensusModuleState.SUSPENDED if suspend else ConsensusModuleState.ACTIVE
        if self.state in (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED):
            self._set_state(self.running_state)

    # ------------------------------------------------------------ leadership

    def start_log_replay(self, from_position: int, to_position: int) -> int:
        """Ask the archive to replay the log recording between the positions;
        returns the replay image's session id."""
        replay_session_id = self.archive.start_replay(
            self.log_recording_id,
            self.context.replay_channel,
            self.context.replay_stream_id,
            from_position,
            to_position - from_position,
        )
        self._log_replay_correlation_id = self.archive.last_correlation_id
        session_id = replay_session_id & 0xFFFF_FFFF
        session_id = session_id - (1 << 32) if session_id >= 1 << 31 else session_id
        channel = ChannelUri.parse(self.context.replay_channel).with_param("session-id", session_id)
        self._log_image = None
        self._replay_subscription = self.aeron.add_subscription(
            str(channel), self.context.replay_stream_id, on_available_image=self.on_log_image
        )
        return session_id

    def close_log_replay(self) -> None:
        if self._replay_subscription is not None:
            self._replay_subscription.close()
        self._replay_subscription = None
        self._log_image = None

    def start_leadership_term(self) -> None:
        """A new term: a log publication that carries on from the recorded log,
        recorded by the archive (a new recording for the first term)."""
        context = self.context
        leadership_term_id = self.leadership_term_id + 1
        channel = ChannelUri.parse(context.log_channel)
        # A UDP log channel (one member configured as the members of a
        # larger cluster are) has no followers to send to: a manual-control
        # publication with no destination, recorded and read through spies
        # (which the publication counts as its receivers: ssc).
        is_udp = channel.media == "udp"
        if is_udp:
            params = {k: v for k, v in channel.params.items() if k not in ("endpoint", "control", "control-mode")}
            channel = ChannelUri("udp", {**params, "control-mode": "manual", "ssc": "true"})
        if self.log_recording_id != NULL_VALUE:
            descriptor = self.archive.list_recording(self.log_recording_id)
            if descriptor is None:
                raise ClusterTerminationError(f"the log recording {self.log_recording_id} is missing from the archive")
            term_length = descriptor.term_buffer_length
            position = self.append_position
            term_id = compute_term_id_from_position(
                position, position_bits_to_shift(term_length), descriptor.initial_term_id
            )
            channel = channel.with_param("term-length", term_length).with_param("mtu", descriptor.mtu_length)
            channel = channel.with_initial_position(descriptor.initial_term_id, term_id, position & (term_length - 1))
        publication = self.aeron.add_exclusive_publication(str(channel), context.log_stream_id)
        self._log_publication = publication
        self.log_publisher.publication = publication
        # Appended in batches (all the ingress a cycle takes): its readers are
        # rung once per cycle, by ConsensusModule.run.
        publication.defer_rings()
        self.log_session_id = publication.session_id
        # The recording names this publication's session: a dead predecessor's
        # log publication (until the driver times it out) must not be recorded.
        # Auto stop: the recording subscription goes with this publication, so
        # the next term (or run) can extend the recording again.
        if is_udp:
            recorded = self.leader_spy_channel().removeprefix("aeron-spy:")
        else:
            recorded = str(ChannelUri.parse(context.log_channel).with_param("session-id", publication.session_id))
        if self.log_recording_id != NULL_VALUE:
            self.archive.extend_recording(
                self.log_recording_id, recorded, context.log_stream_id, SourceLocation.LOCAL, auto_stop=True
            )
        else:
            self.archive.start_recording(recorded, context.log_stream_id, SourceLocation.LOCAL, auto_stop=True)
        expected = RecordingSignal.EXTEND if self.log_recording_id != NULL_VALUE else RecordingSignal.START
        signal = self.archive.wait_for_signal(lambda s: s.signal == expected, 30_000_000_000)
        self.log_recording_id = signal.recording_id
        self._recording_position_counter_id = NULL_VALUE
        self.leadership_term_id = leadership_term_id
        self.leadership_term_counter.set(leadership_term_id)
        self.term_base_log_position = self.append_position
        self.recording_log.append_term(
            self.log_recording_id, self.leadership_term_id, self.term_base_log_position, self.cluster_time()
        )
        self.role = ClusterRole.LEADER
        self.role_counter.set(ClusterRole.LEADER)

    def live_log_channel(self) -> str:
        """Where a lone member's services read its log (IPC, or a spy of its UDP log)."""
        if ChannelUri.parse(self.context.log_channel).media == "udp":
            return self.leader_spy_channel()
        return str(ChannelUri.parse(self.context.log_channel).with_param("session-id", self.log_session_id))

    def on_election_complete(self) -> None:
        self.election = None
        # An election changes who leads, not whether the cluster is suspended:
        # the state is what the log (or the snapshot) says.
        self._set_state(self.running_state)
        self.control_toggle.set(ControlToggle.NEUTRAL)
        for session in self.sessions.values():
            # Sessions known from the log (before a restart): reconnect their
            # egress and tell them who leads now.
            if session.publication is None:
                try:
                    session.async_connect(self.aeron, self._error)
                except FulmarError as error:
                    self._error(f"cannot reconnect session {session.id}: {error}")
                    continue
                session.has_new_leader_event_pending = True
                self._session_events_pending = True
            session.time_of_last_activity(self._now_ns)

    # ------------------------------------------------------- toggles, snapshot

    def _set_state(self, state: ConsensusModuleState) -> None:
        self.state = state
        self.module_state_counter.set(int(state))

    def _check_control_toggle(self, now_ns: int) -> int:
        toggle = self.control_toggle.get()
        if toggle in (ControlToggle.NEUTRAL, ControlToggle.INACTIVE):
            return 0
        action = ControlToggle(toggle) if toggle in ControlToggle._value2member_map_ else None
        if action is None:
            self._error(f"unknown control toggle value {toggle} reset")
            self.control_toggle.set(ControlToggle.NEUTRAL)
            return 1
        running = (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED)
        if action is ControlToggle.SUSPEND and self.state is ConsensusModuleState.ACTIVE:
            if self._append_running_state_action(ClusterAction.SUSPEND, ConsensusModuleState.SUSPENDED):
                self.control_toggle.set(ControlToggle.NEUTRAL)
        elif action is ControlToggle.RESUME and self.state is ConsensusModuleState.SUSPENDED:
            if self._append_running_state_action(ClusterAction.RESUME, ConsensusModuleState.ACTIVE):
                self.control_toggle.set(ControlToggle.NEUTRAL)
                for session in self.sessions.values():
                    # Their keepalives are still in the ingress, read after this
                    # slow tick's session check: a timeout from now, not from before.
                    session.time_of_last_activity(now_ns)
        elif action in (ControlToggle.SUSPEND, ControlToggle.RESUME) and self.state in running:
            self.control_toggle.set(ControlToggle.NEUTRAL)  # already so: nothing to do
        elif action in (ControlToggle.SNAPSHOT, ControlToggle.SHUTDOWN) and self.state in running:
            result, position = self._append_action(ClusterAction.SNAPSHOT)
            if result > 0:
                self._snapshot_log_position = position
                self._state_after_snapshot = self.state
                self._termination_action = action if action is ControlToggle.SHUTDOWN else None
                self._snapshot_ack_id = self.next_ack_id()
                self._set_state(ConsensusModuleState.SNAPSHOT)
        elif action is ControlToggle.ABORT and self.state in running:
            self._begin_termination(ControlToggle.ABORT)
        elif action is ControlToggle.STANDBY_SNAPSHOT and self.state in running:
            # Seed 004: carried in the log as a SNAPSHOT with the standby flag;
            # the members go on (only a standby member snapshots on it), so the
            # toggle is done once the action is appended.
            result, _position = self._append_action(ClusterAction.SNAPSHOT, CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT)
            if result <= 0:
                return 0  # back pressured: the toggle waits for the next tick
            self.control_toggle.set(ControlToggle.NEUTRAL)
        else:
            return 0  # not now (a snapshot or a stop is under way): the toggle waits
        return 1

    def _check_node_control_toggle(self) -> int:
        toggle = self.node_control_toggle.get()
        if toggle in (ControlToggle.NEUTRAL, ControlToggle.INACTIVE):
            return 0
        self._error(f"node control toggle {toggle} refused: this cluster has no standby members")
        self.node_control_toggle.set(ControlToggle.NEUTRAL)
        return 1

    def _append_action(self, action: ClusterAction, flags: int = CLUSTER_ACTION_FLAGS_DEFAULT) -> tuple[int, int]:
        return self.log_publisher.append_cluster_action(
            self.leadership_term_id, self.cluster_time(), int(action), flags
        )

    def _append_running_state_action(self, action: ClusterAction, state: ConsensusModuleState) -> bool:
        """The leader appends SUSPEND or RESUME and acts on it at once (the
        followers when they apply it); False if the log is back pressured."""
        result, position = self._append_action(action)
        if result <= 0:
            return False
        if self.is_multi_member:
            self._uncommitted_actions.append((position, self.running_state))
        self.running_state = state
        self._set_state(state)
        return True

    def _dead_services(self) -> list[int]:
        """Services whose container process is gone (its mark file stale or its pid dead)."""
        dead = []
        now_ms = self.epoch_ms()
        for service_id in range(self.context.service_count):
            liveness = read_liveness(Path(self.context.cluster_dir) / service_mark_file_name(service_id))
            if liveness is None or not liveness.is_active(now_ms):
                dead.append(service_id)
        return dead

    def _check_snapshot_and_termination(self, now_ns: int) -> int:
        # (A leader of several whose services have acknowledged the stop waits
        # for its followers only: its services are gone by then, as they should be.)
        waiting_on_services = not self._services_terminated
        if self.state in (ConsensusModuleState.SNAPSHOT, ConsensusModuleState.TERMINATING) and waiting_on_services:
            # Waiting on the services: one that died will never answer.
            if now_ns >= self._service_check_deadline_ns:
                self._service_check_deadline_ns = now_ns + 250_000_000
                dead = self._dead_services()
                if dead:
                    # A service that acknowledged and then exited is gone too, but its
                    # ack is in the stream, maybe not yet read: read what it sent first.
                    for _ in range(1000):
                        if not self._poll_services():
                            break
                    ack_id = (
                        self._snapshot_ack_id
                        if self.state is ConsensusModuleState.SNAPSHOT
                        else self._termination_ack_id
                    )
                    acked = self.service_acks.received(ack_id)
                    dead = [service_id for service_id in dead if service_id not in acked]
                if dead and self.state is ConsensusModuleState.SNAPSHOT:
                    raise ClusterTerminationError(f"service(s) {dead} died during the snapshot: stopping")
                if dead and not self.services_acked_partially(self._termination_ack_id, dead):
                    self.terminated = True
                    self.termination_reason = (
                        f"stop at log position {self._termination_position} (service(s) {dead} already gone)"
                    )
                    self._set_state(ConsensusModuleState.CLOSED)
                    return 1
        if self.state is ConsensusModuleState.SNAPSHOT:
            if self.commit_position < self._snapshot_log_position:
                return 0
            acks = self.services_acked(self._snapshot_ack_id, self._snapshot_log_position)
            if acks is None:
                return 0
            self._complete_snapshot(acks)
            return 1
        if self.state is ConsensusModuleState.TERMINATING:
            if self.is_multi_member and self.role is ClusterRole.LEADER:
                return self._check_cluster_termination(now_ns)
            acks = self.services_acked(self._termination_ack_id)
            if acks is None:
                return 0
            self.recording_log.commit_log_position(self.leadership_term_id, self._termination_position)
            self.terminated = True
            self.termination_reason = (
                f"{self._termination_action.name if self._termination_action else 'stop'} "
                f"at log position {self._termination_position}"
            )
            self.orderly_stop = OrderlyStop(self._cluster_stop_cause(), self._termination_position)
            self._set_state(ConsensusModuleState.CLOSED)
            return 1
        return 0

    def _cluster_stop_cause(self) -> StopCause:
        """Why the stop this module led (alone, or as the leader of several) happened."""
        if self._stop_signalled:
            return StopCause.STOP_SIGNAL
        if self._termination_action is ControlToggle.ABORT:
            return StopCause.CLUSTER_ABORT
        return StopCause.CLUSTER_SHUTDOWN

    def _complete_snapshot(self, service_acks: list[Any]) -> None:
        position = self._snapshot_log_position
        try:
            recording_id = snapshot.take_consensus_module_snapshot(self, position)
        except FulmarError as error:
            # No snapshot this time (the services' are left unreferenced):
            # say so and carry on as before rather than stay in SNAPSHOT.
            self._error(f"snapshot at log position {position} failed: {type(error).__name__}: {error}")
            self._snapshot_log_position = NULL_POSITION
            self._termination_action = None
            self._set_state(self._state_after_snapshot)
            self.control_toggle.set(ControlToggle.NEUTRAL)
            return
        self._record_snapshot(position, recording_id, service_acks)
        self._snapshot_log_position = NULL_POSITION
        if self._termination_action is ControlToggle.SHUTDOWN:
            self._begin_termination(ControlToggle.SHUTDOWN)
        else:
            self._set_state(self._state_after_snapshot)
            self.control_toggle.set(ControlToggle.NEUTRAL)

    def _record_snapshot(
        self,
        position: int,
        recording_id: int,
        service_acks: list[Any],
        leadership_term_id: int | None = None,
        term_base_log_position: int | None = None,
    ) -> None:
        """The recording log entries of a snapshot: each service's, then the module's."""
        timestamp = self.cluster_time()
        term = self.leadership_term_id if leadership_term_id is None else leadership_term_id
        base = self.term_base_log_position if term_base_log_position is None else term_base_log_position
        for ack in sorted(service_acks, key=lambda a: a.service_id):
            self.recording_log.append_snapshot(ack.relevant_id, term, base, position, timestamp, ack.service_id)
        self.recording_log.append_snapshot(recording_id, term, base, position, timestamp, -1)
        self.snapshot_counter.increment()
        if self.context.log_retention_snapshots:
            self._apply_log_retention()

    def _apply_log_retention(self) -> None:
        """Keep the newest snapshot sets, purge the rest and the log before them
        (a few requests to the node's own archive, after a snapshot only)."""
        log = self.recording_log
        try:
            plan = plan_retention(
                log.entries,
                self.context.service_count,
                self.context.log_retention_snapshots,
                self.archive.list_recording,
                str(log.path),
            )
            if not plan.removed and not plan.purges_log:
                return
            result = apply_retention(self.archive, lambda entry: log.invalidate_entry(entry.entry_index), plan)
        except FulmarError as error:
            self._error(f"log retention: {error}")
            return
        self.log_event(f"log retention: {result.describe()}")
        for problem in result.problems:
            self._error(f"log retention: {problem}")

    def _begin_termination(self, action: ControlToggle) -> None:
        """Services stop at the current log end; the module waits for their acks."""
        assert self._log_publication is not None
        self._termination_action = action
        self._termination_position = self._log_publication.position
        self._termination_ack_id = self.next_ack_id()
        self.service_proxy.termination_position(self._termination_position)
        self._set_state(ConsensusModuleState.TERMINATING)
        if self.is_multi_member:
            # The whole cluster stops at this position: each follower stops its
            # services there and answers with TerminationAck; the leader goes last.
            self._services_terminated = False
            self._termination_acks = set()
            self._termination_deadline_ns = self._now_ns + self.context.termination_timeout_ns
            assert self.consensus_publisher is not None
            for member_id in self._followers:
                self.consensus_publisher.termination_position(
                    member_id, leadership_term_id=self.leadership_term_id, log_position=self._termination_position
                )

    def request_shutdown(self, action: ControlToggle = ControlToggle.SHUTDOWN) -> bool:
        """What a stop signal asks for: SHUTDOWN (a snapshot, then the services
        and the module stop at one log position) or ABORT (the same stop, no
        snapshot).  True once the request is taken (or there is nothing left to
        do); False while it cannot be acted on yet: the caller asks again
        (``ConsensusModule.run`` does, every duty cycle), so a request is never
        dropped.

        - A member of a multi-member cluster stops at once, whatever its role
          or state (the others go on; a restart recovers from the archive).
        - A single node in its election stops at once if its services have not
          joined yet (INIT: nothing has run that needs an orderly stop) or on
          ABORT; while its services replay or join the log, the request waits
          for the election to complete.
        - ACTIVE or SUSPENDED: through the control toggle, as ``cluster-tool
          shutdown``/``abort`` (taken only from NEUTRAL: a toggle an operator
          set goes first).
        - SNAPSHOT: a SHUTDOWN's own snapshot already ends in the stop; any
          other snapshot completes first.
        - TERMINATING or CLOSED: already stopping."""
        if self.is_multi_member:
            # The others go on (a leader's followers elect another); the log is
            # in the archive, so a restart recovers by replay (a snapshot first:
            # ``cluster-tool snapshot``).
            self.terminated = True
            self.termination_reason = f"stopped as {self.role.name.lower()} at commit position {self.commit_position}"
            self.orderly_stop = OrderlyStop(StopCause.STOP_SIGNAL, self.commit_position)
            self._set_state(ConsensusModuleState.CLOSED)
            return True
        state = self.state
        if state in (ConsensusModuleState.TERMINATING, ConsensusModuleState.CLOSED) or self.terminated:
            return True
        if self.election is not None:
            if action is ControlToggle.ABORT or self.election.state is ElectionState.INIT:
                self.terminated = True
                self.termination_reason = (
                    f"{action.name} during the election ({self.election.state.name}): "
                    f"stopped at once at log position {self.log_position}, no snapshot"
                )
                self.orderly_stop = OrderlyStop(StopCause.STOP_SIGNAL, self.log_position)
                self._set_state(ConsensusModuleState.CLOSED)
                return True
            return False
        if state is ConsensusModuleState.SNAPSHOT:
            return self._termination_action is ControlToggle.SHUTDOWN and action is ControlToggle.SHUTDOWN
        if state in (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED):
            if self.control_toggle.get() == action:
                return True  # the toggle's owner (cluster-tool) asked for this very stop first
            if self.control_toggle.compare_and_set(ControlToggle.NEUTRAL, action):
                self._stop_signalled = True
                return True
        return False

    # ------------------------------------------------------------ several members

    @property
    def now_ns(self) -> int:
        return self._now_ns

    def log_event(self, text: str) -> None:
        """A line in the module's output (the node's consensus.log): elections,
        roles, catchups, truncations: what an operator reads after a failover."""
        log_line(self.member_id, text)

    def _open_consensus_streams(self) -> None:
        """Stream 108: a subscription at this member's consensus endpoint and a
        publication to each other member's: a concurrent one, since a
        follower's AppendPositions are appended by a native thread of their
        own (consensus/append_position_sender.py) beside the agent's messages."""
        context = self.context
        base = ChannelUri.parse(context.consensus_channel)
        me = find_member(self.members, self.member_id)
        channel = base.with_param("endpoint", me.consensus_endpoint)
        commit = self.handovers.leader_commit
        if (context.native_commit or context.native_follower_commit) and commit.start():
            assert commit.thread is not None
            # What lands rings the thread; it passes the ring on while not armed.
            channel = channel.with_param("doorbell-id", str(commit.thread.doorbell_id))
        self._consensus_subscription = self.aeron.add_subscription(
            str(channel),
            context.consensus_stream_id,
            on_available_image=self._on_consensus_image_change,
            on_unavailable_image=self._on_consensus_image_change,
        )
        self._consensus_publications = {
            member.id: self.aeron.add_publication(
                str(base.with_param("endpoint", member.consensus_endpoint)), context.consensus_stream_id
            )
            for member in self._followers.values()
        }
        self.consensus_publisher = ConsensusPublisher(self._consensus_publications, signer=self._member_signer())
        self.consensus_adapter = ConsensusAdapter(
            self,
            self._consensus_subscription,
            error_handler=lambda text: self._error(f"consensus stream: {text}"),
            guard=self._consensus_guard(me.consensus_endpoint),
        )

    def _member_signer(self) -> MemberSigner | None:
        if self._member_key is None:
            return None
        return MemberSigner(self.member_id, self._member_key, self.epoch_ms, auth=self._member_auth)

    def _consensus_guard(self, my_endpoint: str) -> ConsensusGuard:
        """What the consensus adapter asks of each member message: a valid
        member trailer with the cluster's secret, else a member's host."""
        if self._member_key is not None:
            verifier = MemberVerifier(
                self.member_id,
                self._member_key,
                [member.id for member in self.members],
                self.context.leader_heartbeat_timeout_ns // 1_000_000,
                self.epoch_ms,
                auth=self._member_auth,
            )
            if not self.context.member_secret:
                self.log_event(
                    "member messages and the log's datagrams are signed with a key derived from the cluster's "
                    "secret, which its clients hold too: set [consensus] member_secret (the same on every member) "
                    "to keep the members' key from them"
                )
            return ConsensusGuard(self._on_consensus_refused, verifier=verifier, source_of=self._consensus_source)
        if not is_loopback(source_host(my_endpoint)):
            self.log_event(
                f"the consensus endpoint {my_endpoint} is open to anyone who can reach it: "
                "without a secret (or with authenticate_members off) this member takes consensus messages "
                "from any process on the members' hosts"
            )
        if not self.context.check_consensus_sources:
            return ConsensusGuard(self._on_consensus_refused, source_of=self._consensus_source)
        hosts = [source_host(member.consensus_endpoint) for member in self.members]
        return ConsensusGuard(
            self._on_consensus_refused, source_filter=SourceFilter(hosts), source_of=self._consensus_source
        )

    def _consensus_source(self, header: Any) -> str | None:
        subscription = self._consensus_subscription
        if header is None or subscription is None:
            return None
        image = subscription.image_by_session_id(header.session_id)
        return image.source_identity if image is not None else None

    def _on_consensus_refused(self, reason: str, source: str | None) -> None:
        """A consensus message no member sent: counted, one distinct entry per
        kind in the error log (a stranger cannot fill it), and a line in the
        module's log at most once a second (with how many went unsaid)."""
        self.consensus_refused_counter.increment()
        self.record_error(f"consensus module: consensus stream: dropped: {reason}")
        now_ms = self.epoch_ms()
        if now_ms < self._refusal_line_due_ms:
            self._refusals_unsaid += 1
            return
        unsaid = f" ({self._refusals_unsaid} more dropped since the last line)" if self._refusals_unsaid else ""
        self._refusals_unsaid = 0
        self._refusal_line_due_ms = now_ms + 1_000
        origin = f" from {source[:80]!r}" if source is not None else ""
        self.log_event(f"consensus stream: dropped a message{origin}: {reason}{unsaid}")

    def _open_lone_consensus_stream(self) -> None:
        """Stream 108 of a cluster of one: a subscription at its consensus
        endpoint whose arrivals ring this agent's own doorbell (its commit
        thread, if any, reads no consensus stream), decoded for the tools'
        requests only."""
        context = self.context
        me = find_member(self.members, self.member_id)
        channel = ChannelUri.parse(context.consensus_channel).with_param("endpoint", me.consensus_endpoint)
        self._consensus_subscription = self.aeron.add_subscription(str(channel), context.consensus_stream_id)
        self.consensus_adapter = ConsensusAdapter(
            LoneMemberConsensusListener(self),
            self._consensus_subscription,
            error_handler=lambda text: self._error(f"consensus stream: {text}"),
        )

    def new_election(self, is_startup: bool, graceful_closed_leader_id: int = NULL_MEMBER_ID) -> Any:
        context = self.context
        timeouts = ElectionTimeouts(
            election_timeout_ns=context.election_timeout_ns,
            election_status_interval_ns=context.election_status_interval_ns,
            startup_canvass_timeout_ns=context.startup_canvass_timeout_ns,
            leader_heartbeat_timeout_ns=context.leader_heartbeat_timeout_ns,
            leader_heartbeat_interval_ns=context.leader_heartbeat_interval_ns,
        )
        entries = self.host.term_entries()
        candidate_term_id = self.mark_file.candidate_term_id if self.mark_file is not None else NULL_VALUE
        assert self.consensus_publisher is not None
        return Election(
            self.member_id,
            [member.id for member in self.members],
            self.host,
            self.consensus_publisher,
            context.election_random(),
            timeouts,
            is_startup,
            entries[-1].leadership_term_id if entries else NULL_VALUE,
            self.read_append_position(),
            context.appointed_leader_id,
            leadership_term_id=self.leadership_term_id,
            candidate_term_id=candidate_term_id,
            app_version=context.app_version,
            state_counter=self.election_state_counter,
            graceful_closed_leader_id=graceful_closed_leader_id,
        )

    def start_election(self, reason: str, graceful_closed_leader_id: int = NULL_MEMBER_ID) -> None:
        """A new election.  ``graceful_closed_leader_id``: the leader whose log
        ended in order (its end of stream): the election does not wait for it
        (Aeron's gracefulClosedLeaderId)."""
        self.handovers.halt()
        self.log_event(
            f"election: {reason} (term {self.leadership_term_id}, "
            f"{'leader' if self.role is ClusterRole.LEADER else 'follower'})"
        )
        self.election_count_counter.increment()
        self.election = MemberElection(self, is_startup=False, graceful_closed_leader_id=graceful_closed_leader_id)

    def _multi_member_election_work(self, now_ns: int) -> int:
        election = self.election
        try:
            work = int(election.do_work(now_ns))
        except ClusterTerminationError:
            raise
        except FulmarError as error:
            self._log_transitions(getattr(election, "election", None))
            # Nothing is lost by starting over (Aeron's Election.handleError): the
            # election only acts on the log through the archive, which keeps what
            # it recorded.  Not at once: what failed it may need a moment, and an
            # election that fails again waits longer (up to an election timeout).
            self._error(f"election {election.state.name} failed: {type(error).__name__}: {error}")
            delay_ns = self._election_backoff.on_failure(now_ns)
            self.election = MemberElection(self, is_startup=False, not_before_ns=now_ns + delay_ns)
            return 1
        inner = getattr(election, "election", None)
        self._log_transitions(inner)
        if inner is not None and self.election is election and not inner.is_closed:
            if inner.state_value in (ElectionState.FOLLOWER_CATCHUP, ElectionState.FOLLOWER_READY):
                work += self._apply_follower_log(self.read_append_position())
        return work

    def _log_transitions(self, inner: Any) -> None:
        """Each transition of the election once, those its handlers made between
        duty cycles (a NewLeadershipTerm's CANVASS -> FOLLOWER_REPLAY) included."""
        if inner is None:
            return
        logged = self._logged_transitions[1] if self._logged_transitions[0] is inner else 0
        new = min(inner.transition_count - logged, len(inner.transitions))
        for _, old_state, new_state, reason in list(inner.transitions)[len(inner.transitions) - new :]:
            self.log_event(f"election {ElectionState(old_state).name} -> {ElectionState(new_state).name}: {reason}")
        self._logged_transitions = (inner, inner.transition_count)

    # -- positions ----------------------------------------------------------------------

    def read_append_position(self) -> int:
        """How far the local log recording reaches, from its archive's rec-pos counter."""
        counter_id = self._recording_position_counter()
        if counter_id != NULL_VALUE:
            position = self.aeron.counters_reader.counter_value(counter_id)
            if position > self.append_position:
                self.append_position = position
        return self.append_position

    def refresh_append_position(self) -> None:
        """Ask the archive (after a replication or a stop) where the log recording ends."""
        self._recording_position_counter_id = NULL_VALUE
        if self.log_recording_id == NULL_VALUE:
            return
        position = self.archive.get_stop_position(self.log_recording_id)
        if position == NULL_POSITION:
            position = self.archive.get_recording_position(self.log_recording_id)
        if position != NULL_POSITION:
            self.append_position = position

    def stop_log_recording(self) -> None:
        """Stop the archive recording the log (leader's spy or follower's image):
        before truncating or extending it the recording must have stopped."""
        self._recording_position_counter_id = NULL_VALUE
        if self.log_recording_id == NULL_VALUE:
            return
        if self.archive.get_stop_position(self.log_recording_id) == NULL_POSITION:
            try:
                self.archive.stop_recording_by_identity(self.log_recording_id)
            except FulmarError as error:
                self.log_event(f"stopping the log recording: {error}")
            deadline = time.monotonic() + 10
            while self.archive.get_stop_position(self.log_recording_id) == NULL_POSITION:
                if time.monotonic() > deadline:
                    raise ClusterTerminationError(f"the archive did not stop the log recording {self.log_recording_id}")
                time.sleep(0.001)
        self.refresh_append_position()

    def notify_commit_position(self, position: int) -> None:
        """A follower learnt the leader's commit position; it commits what it also has."""
        if position > self.notified_commit_position:
            self.notified_commit_position = position
        self._time_of_last_leader_message_ns = self._now_ns

    def _apply_follower_log(self, append_position: int) -> int:
        """Seed 000: the follower's module reads the log (sessions, timers, service
        messages) up to the notified commit position, as far as its archive has
        recorded it (``append_position``, as read for this cycle), and only then
        moves commit-pos, to what it has read: its services, which read the log
        up to commit-pos, never apply a position before their module has.  As
        Aeron's consensusWork: when the poll stops short (its fragment limit, or
        within a fragmented message) commit-pos is the image's position, not the
        notified one."""
        if not self.host.is_log_joined:
            return 0
        return self.poll_log(self._follower_log_limit(append_position))

    def _update_quorum_commit_position(self, now_ns: int) -> int:
        """Seed 000: the commit position is the highest position a quorum of members
        has recorded, once that includes an entry of this term (Raft's rule), and
        (as Aeron's updateLeaderPosition: min(quorumPosition(), appendPosition))
        never past what this leader's own archive has recorded.  Its services
        apply the log up to commit-pos, and a member must hold on disk what it
        applied: two followers whose archives run ahead of a slow leader archive
        make a quorum without it, which the seed's words alone would commit."""
        if self.handovers.leader_commit.arm():
            # The armed thread commits (its state was taken at the cycle's
            # start); the agent shows the followers' positions and asks for
            # the CommitPosition heartbeat when it is due.
            self._show_follower_positions()
            self.handovers.leader_commit.heartbeat(now_ns)
            work = 0
        else:
            work = self._commit_by_agent(now_ns)
        work += self._check_catchups()
        active = 1 + sum(
            1
            for follower in self._followers.values()
            if now_ns - follower.time_of_last_append_position_ns < self.context.leader_heartbeat_timeout_ns
        )
        if active < quorum_threshold(len(self.members)) and self.state is not ConsensusModuleState.TERMINATING:
            self.start_election("inactive follower quorum")
            return work + 1
        return work

    def _commit_by_agent(self, now_ns: int) -> int:
        append_position = self.read_append_position()
        follower_positions = [follower.log_position for follower in self._followers.values()]
        quorum = quorum_position([append_position] + follower_positions)
        commit = min(quorum, append_position)
        # How far the followers alone take the commit once this leader has
        # recorded as much: only beyond its own recording does that recording matter.
        followers_quorum = quorum_position([ABOVE_ANY_POSITION] + follower_positions)
        self._watch_own_recording(
            followers_quorum > append_position
            or self.state is not ConsensusModuleState.ACTIVE
            or self.election is not None
        )
        self._show_follower_positions()
        work = 0
        if commit > self.term_base_log_position and commit > self.commit_position:
            self.commit_position = commit
            self.commit_position_counter.set(commit)
            self._ring_counter_watchers(self.commit_position_counter.id)
            self._sweep_uncommitted(commit)
            work += 1
        if (
            self.commit_position != self._last_commit_position_sent
            or now_ns >= self._time_of_last_commit_position_sent_ns + self.context.leader_heartbeat_interval_ns
        ):
            assert self.consensus_publisher is not None
            for member_id in self._followers:
                self.consensus_publisher.commit_position(
                    member_id,
                    leadership_term_id=self.leadership_term_id,
                    log_position=self.commit_position,
                    leader_member_id=self.member_id,
                )
            self._last_commit_position_sent = self.commit_position
            self._time_of_last_commit_position_sent_ns = now_ns
            work += 1
        return work

    def _on_consensus_image_change(self, image: Image) -> None:
        """A member's publication came or went: the thread reads only the
        images it was armed with (and one that goes is unmapped later)."""
        self.handovers.leader_commit.halt()
        self.handovers.follower_commit.halt()

    def _sweep_uncommitted(self, commit: int) -> None:
        for queue in (
            self._uncommitted_timers,
            self._uncommitted_service_messages,
            self._uncommitted_closed_sessions,
            self._uncommitted_actions,
        ):
            while queue and queue[0][0] <= commit:
                queue.popleft()

    def _on_follower_snapshot_action(self, log_position: int) -> None:
        """Seed 004: a SNAPSHOT action in the log makes every member snapshot at
        its position.  The module's state is taken now (it has applied exactly up
        to the action); the recording log gets the entries once every service has
        acknowledged its own (their acks are counted on every member alike)."""
        # The services apply the log on their own: one may have acknowledged its
        # snapshot already.  The position tells this snapshot's acks apart.
        ack_id = self.service_acks.next_ack_id(any_arrival=True, log_position=log_position)
        try:
            recording_id = snapshot.take_consensus_module_snapshot(self, log_position)
        except FulmarError as error:
            self._error(f"snapshot at log position {log_position} failed: {type(error).__name__}: {error}")
            recording_id = NULL_VALUE
        else:
            self._follower_snapshot_position = log_position
        if self._follower_snapshot is not None:
            # (Its acks never to be asked for: the request is given up.)
            self.service_acks.give_up(self._follower_snapshot[1])
        # The term it is in is the one at the action (a replay's may end in a
        # later term before the services' acks come): its entries name it.
        self._follower_snapshot = (
            log_position,
            ack_id,
            recording_id,
            self.leadership_term_id,
            self.term_base_log_position,
        )
        if self.state in (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED):
            # Seen as the leader's is (cluster-tool, metrics) until its
            # services have taken theirs too (Aeron's onReplayClusterAction).
            self._set_state(ConsensusModuleState.SNAPSHOT)

    def _check_follower_snapshot(self) -> int:
        pending = self._follower_snapshot
        if pending is None:
            return 0
        position, ack_id, recording_id, leadership_term_id, term_base_log_position = pending
        acks = self.services_acked(ack_id, position)
        if acks is None:
            return 0
        self._follower_snapshot = None
        if self.state is ConsensusModuleState.SNAPSHOT:
            self._set_state(self.running_state)  # (not a stop that came meanwhile)
        if recording_id == NULL_VALUE:
            return 1
        self._record_snapshot(position, recording_id, acks, leadership_term_id, term_base_log_position)
        self.log_event(f"snapshot at log position {position}")
        return 1

    def _follower_work(self, now_ns: int) -> int:
        # What the archive recorded is reported first: the leader's commit, and
        # the client's answer, wait on it, while applying the committed log
        # wakes this member's services, which would take the core first.
        #
        # The archive's position is read once per cycle.  A second read (as the
        # log's poll once made) could take in what the archive recorded after the
        # AppendPosition went: the module then holds a position it has not
        # reported, its has_work (the archive's position against the module's)
        # sees nothing new, the archive's ring came while it was awake, and the
        # report waited for the idle timeout: a round trip of 10 ms in about one
        # in a thousand.
        append_position = self.read_append_position()
        work = self._send_append_position(now_ns, append_position)
        # (The armed commit thread applies the log; its state was taken at the cycle's start.)
        applied = self._apply_follower_log(append_position) if self._reads_log() else 0
        image = self._log_image
        if (
            image is not None
            and self.state in (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED)
            and ((applied == 0 and image.is_closed) or self._leader_log_ended(image, append_position))
        ):
            # As Aeron's follower: the leader's log went away under this member
            # (its image timed out or ended) while the leader itself may still
            # send heartbeats.  The archive recorded that image and no other, so
            # nothing after it would ever be recorded or committed here: only an
            # election (a catch-up from the leader and a new log image) brings
            # this member back, rather than it serving stale forever.  A log that
            # ended with the leader's end of stream, all of it recorded, means the
            # leader closed it in order (it stopped): the election need not wait
            # for it (Aeron's gracefulClosedLeaderId).
            end_of_stream = self._leader_log_ended(image, append_position)
            self._error(
                f"log disconnected from leader: {'its end of stream' if end_of_stream else 'its image closed'} "
                f"(log position {self.log_position}, commit position {self.commit_position}, term "
                f"{self.leadership_term_id}, leader {self.leader_member_id})"
            )
            self.start_election(
                f"log disconnected from leader (end of stream: {'yes' if end_of_stream else 'no'})",
                self.leader_member_id if end_of_stream else NULL_MEMBER_ID,
            )
            return 1
        work += applied + self._check_follower_snapshot() + self._check_follower_termination()
        work += self._poll_ingress_as_follower()
        if now_ns - self._time_of_last_leader_message_ns >= self.context.leader_heartbeat_timeout_ns:
            self.start_election("leader heartbeat timeout")
            return work + 1
        self.handovers.follower_commit.arm()
        return work

    @staticmethod
    def _leader_log_ended(image: Image, append_position: int) -> bool:
        """The leader closed its log publication in order: its end of stream
        reached this image and the archive recorded everything before it
        (Aeron's isLogEndOfStreamAt the recording's stop)."""
        return append_position >= image.log.end_of_stream_position

    def _send_append_position(self, now_ns: int, position: int) -> int:
        """AppendPosition to the leader when the recorded position moved, or a
        heartbeat interval after the last; 1 if sent.  Once armed, the native
        thread sends them and the agent only asks it for the heartbeat."""
        handover = self.handovers.append_position
        if handover.arm():
            handover.take_back(now_ns)
            if handover.is_armed:
                return 0
        if (
            position == self._last_append_position_sent
            and now_ns < self._time_of_last_append_position_sent_ns + self.context.leader_heartbeat_interval_ns
        ):
            return 0
        assert self.consensus_publisher is not None
        if not self.consensus_publisher.append_position(
            self.leader_member_id,
            leadership_term_id=self.leadership_term_id,
            log_position=position,
            follower_member_id=self.member_id,
        ):
            return 0
        self._last_append_position_sent = position
        self._time_of_last_append_position_sent_ns = now_ns
        return 1

    def quiet_log_doorbell_id(self) -> int | None:
        """The doorbell a follower's log subscription rings instead of this
        module's, one nobody sleeps on (with the AppendPosition thread on).

        A follower's module has nothing to do when the leader's log lands: it
        applies the log only once it is both committed and recorded, and the
        archive's recording (rec-pos, watched while a commit waits on it) and
        the leader's CommitPosition wake it for that.  Rung by the log, the
        module woke for nothing on every message, one Python wake-up in each
        round trip's way on two shared cores."""
        if not self.context.native_append_position:
            return None
        if self._quiet_log_doorbell is None:
            self._quiet_log_doorbell = self.aeron.add_counter(
                THREAD_DOORBELL_TYPE_ID, f"consensus-quiet-log-doorbell: {self.aeron.client_id}"
            )
        return self._quiet_log_doorbell.id

    def _poll_ingress_as_follower(self) -> int:
        """Followers answer connect requests with a REDIRECT to the leader; session
        messages sent here are not for them (the client learns of the leader)."""
        if self.ingress is None or not self._reads_ingress():
            return 0
        return int(self.ingress.poll(self._ingress_assembler.on_fragment, 16))

    # -- clients across an election (seed 001 INIT) ----------------------------------------

    def close_ingress_and_egress(self) -> None:
        """Election INIT: nobody leads until the election is over, so this member
        takes no client request (its ingress closes: a client's connect finds no
        subscriber, or goes unanswered, and the client asks again) and holds no
        client's egress (a deposed leader lets go of its sessions; the new leader
        connects them again and tells them with NewLeaderEvent).  Connects still
        in progress are dropped: a redirect would name a leader that may be gone,
        and a session not yet open has nothing in the log.  Rejections are final
        whoever leads, so they are still sent."""
        self.handovers.leader_ingress.halt()
        if self.ingress is not None:
            self.ingress.close()
            self.ingress = None
        self._pending_ingress.clear()  # a leader's back-pressured requests: the client hears of the new leader
        for session in self.sessions.values():
            session.disconnect()
        for collection in (self.pending_sessions, self.redirect_sessions):
            for session in collection:
                session.close(CloseReason.CLIENT_ACTION)
            collection.clear()

    def connect_ingress(self, now_ns: int) -> int:
        """Open the ingress once an election is over; a failed registration is
        tried again from the slow tick, backing off to a second, its error
        recorded each time in the same words (the distinct error log counts them)."""
        if self.ingress is not None:
            return 0
        channel = self._ingress_channel()
        try:
            self.ingress = self.aeron.add_subscription(channel, self.context.ingress_stream_id)
        except FulmarError as error:
            self._ingress_backoff.on_failure(now_ns)
            self._error(f"cannot open the ingress {self.context.ingress_channel}: {error}")
            return 0
        self._ingress_backoff.on_success()
        return 1

    def _ingress_channel(self) -> str:
        """The ingress channel, naming the ingress thread's doorbell when there
        is one (started here the first time)."""
        channel = self.context.ingress_channel
        doorbell_id = self.handovers.leader_ingress.doorbell_id()
        if doorbell_id is not None:
            # What lands rings the thread; it passes the ring on while not armed.
            channel = str(ChannelUri.parse(channel).with_param("doorbell-id", str(doorbell_id)))
        return channel

    def arm_leader_ingress(self) -> None:
        """Before this agent sleeps: the ingress to the native thread, if this
        member is a steady, active leader with nothing of the ingress left
        over, until the next cycle takes it back (``take_leader_ingress``)."""
        self.handovers.leader_ingress.arm()

    def take_leader_ingress(self) -> int:
        """What the armed ingress thread did, the ingress the agent's again:
        before anything of this agent reads the ingress or appends to the log
        (the duty cycle, a stop request); nothing to do when not armed."""
        return self.handovers.leader_ingress.take_back(self._now_ns)

    def halt_follower_commit(self) -> None:
        """The log and the consensus stream the agent's again (before the log closes)."""
        self.handovers.follower_commit.halt()

    # -- the leader's log ---------------------------------------------------------------------

    def create_leader_log_publication(self, log_position: int) -> int:
        descriptor = None
        if self.log_recording_id != NULL_VALUE:
            descriptor = self.archive.list_recording(self.log_recording_id)
            if descriptor is None:
                raise ClusterTerminationError(f"the log recording {self.log_recording_id} is missing from the archive")
        channel = leader_log_channel(
            self.context.between_members(self.context.log_channel),
            descriptor.term_buffer_length if descriptor else None,
            descriptor.mtu_length if descriptor else None,
            descriptor.initial_term_id if descriptor else None,
            log_position,
        )
        publication = self.aeron.add_exclusive_publication(channel, self.context.log_stream_id)
        for follower in self._followers.values():
            publication.add_destination(f"aeron:udp?endpoint={follower.log_endpoint}")
        self._log_publication = publication
        self.log_publisher.publication = publication
        # Appended in batches (all the ingress a cycle takes): its readers are
        # rung once per cycle, by ConsensusModule.run.
        publication.defer_rings()
        self.log_session_id = publication.session_id
        self._recording_position_counter_id = NULL_VALUE
        for follower in self._followers.values():
            follower.log_position = NULL_POSITION  # only reports of this term count
        self._leader_services_ack_id = NULL_VALUE
        self._leader_services_joined = False
        return publication.session_id

    def leader_spy_channel(self) -> str:
        return f"aeron-spy:aeron:udp?control-mode=manual|session-id={self.log_session_id}"

    def join_log_as_leader(self, leadership_term_id: int, term_base_log_position: int) -> None:
        """Record the log publication (through a spy), note the term, and let the
        services follow it; nothing is appended before they do.

        The term is the election's again: LEADER_REPLAY ran the old terms'
        NewLeadershipTermEvents through the log adapter, which left the
        last replayed term here, and the event this leader appends next (and
        every message of the term) carries this field (Aeron's joinLogAsLeader)."""
        self.set_leadership_term_id(leadership_term_id)
        recorded = self.leader_spy_channel().removeprefix("aeron-spy:")
        if self.log_recording_id != NULL_VALUE:
            subscription_id = self.archive.extend_recording(
                self.log_recording_id, recorded, self.context.log_stream_id, SourceLocation.LOCAL, auto_stop=True
            )
        else:
            subscription_id = self.archive.start_recording(
                recorded, self.context.log_stream_id, SourceLocation.LOCAL, auto_stop=True
            )
        # The archive says it records (START or EXTEND) once its spy has the
        # image; that comes as a signal, while this module keeps its heartbeats.
        self._leader_recording_subscription_id = subscription_id
        self._leader_recording_started = False
        self._leader_term_to_record = (leadership_term_id, term_base_log_position)
        self._recording_position_counter_id = NULL_VALUE
        self.term_base_log_position = term_base_log_position
        self._leader_services_ack_id = self.next_ack_id(join_log=True)
        self.service_proxy.join_log(
            term_base_log_position,
            NULL_POSITION,
            self.member_id,
            self.log_session_id,
            self.context.log_stream_id,
            False,
            int(ClusterRole.LEADER),
            self.leader_spy_channel(),
        )
        self._leader_services_joined = False
        self._leader_services_deadline_ns = self.now_ns + self.context.service_ack_timeout_ns

    def on_leader_recording_signal(self, event: Any) -> bool:
        """The archive records the leader's log: the term goes into the recording log."""
        if event.subscription_id != self._leader_recording_subscription_id or event.signal not in (
            RecordingSignal.START,
            RecordingSignal.EXTEND,
        ):
            return False
        if self.log_recording_id == NULL_VALUE:
            self.log_recording_id = event.recording_id
        self._leader_recording_started = True
        leadership_term_id, term_base_log_position = self._leader_term_to_record
        if self.recording_log.find_term_entry(leadership_term_id) is None:
            self.recording_log.append_term(
                self.log_recording_id, leadership_term_id, term_base_log_position, self.cluster_time()
            )
        return True

    def append_new_leadership_term_event(self, log_position: int) -> bool:
        if not self._leader_recording_started:
            return False
        if not self._leader_services_joined:
            if self.services_acked(self._leader_services_ack_id, log_position) is None:
                # A leader whose services never join its log would send
                # heartbeats and serve nobody, for good: stop, so that the
                # others elect a leader that serves.
                if self.now_ns > self._leader_services_deadline_ns:
                    raise ClusterTerminationError(
                        f"the services did not acknowledge joining the log as leader at position {log_position} "
                        f"within {self.context.service_ack_timeout_ns // 1_000_000_000} s"
                    )
                return False
            self._leader_services_joined = True
        publisher = self.log_publisher
        return (
            publisher.append_new_leadership_term(
                self.leadership_term_id,
                self.cluster_time(),
                self.term_base_log_position,
                self.member_id,
                self.log_session_id,
                self.context.app_version,
            )
            > 0
        )

    def step_down(self) -> None:
        """Leave the role this member had: a leader closes its log publication (once
        its own archive has what it published, bounded) and forgets what it appended
        that a quorum has not confirmed; its state is then the committed log's."""
        for follower in self._followers.values():
            if follower.catchup_replay_session_id != NULL_VALUE:
                self._stop_catchup_replay(follower)
            follower.log_position = NULL_POSITION
        self._show_follower_positions()
        publication = self._log_publication
        if publication is not None:
            deadline = time.monotonic() + 1.0
            while self.read_append_position() < publication.position and time.monotonic() < deadline:
                self.aeron.do_work()
                time.sleep(0.001)
            publication.close()
            self._log_publication = None
            self.log_publisher.publication = None
            self._restore_uncommitted_state()
            self.log_position = self.commit_position
        self.role = ClusterRole.FOLLOWER
        self.role_counter.set(ClusterRole.FOLLOWER)
        self.close_log_replay()

    def _restore_uncommitted_state(self) -> None:
        commit = self.commit_position
        for session in list(self.sessions.values()):
            if session.opened_log_position > commit:
                session.disconnect()
                del self.sessions[session.id]
        for position, session in self._uncommitted_closed_sessions:
            if position > commit:
                session.state = ClusterSessionState.OPEN
                self.sessions[session.id] = session
        now = self.cluster_time()
        for position, correlation_id in self._uncommitted_timers:
            if position > commit:
                self.timers.schedule(correlation_id, now)
        self.service_messages.restore_uncommitted(commit)
        uncommitted_actions = [before for position, before in self._uncommitted_actions if position > commit]
        if uncommitted_actions:
            # The state as of the commit position: the log the next leader keeps
            # (replayed or applied from here) says whether the action happened.
            self.on_replay_suspend_or_resume(uncommitted_actions[0] is ConsensusModuleState.SUSPENDED)
        for queue in (
            self._uncommitted_timers,
            self._uncommitted_service_messages,
            self._uncommitted_closed_sessions,
            self._uncommitted_actions,
        ):
            queue.clear()
        self.sessions_counter.set(len(self.sessions))
        self.timers_counter.set(len(self.timers))

    # -- catchup served by the leader ---------------------------------------------------------

    def _check_catchups(self) -> int:
        """StopCatchup once a catching-up follower has what the leader published."""
        work = 0
        if self._log_publication is None:
            return 0
        position = self._log_publication.position
        for follower in self._followers.values():
            if follower.catchup_replay_session_id != NULL_VALUE and follower.log_position >= position:
                self._stop_catchup_replay(follower)
                assert self.consensus_publisher is not None
                self.consensus_publisher.stop_catchup(
                    follower.id, leadership_term_id=self.leadership_term_id, follower_member_id=follower.id
                )
                self.log_event(f"member {follower.id} caught up at {follower.log_position}")
                work += 1
        return work

    def _stop_catchup_replay(self, follower: ClusterMember) -> None:
        try:
            self.archive.stop_replay(follower.catchup_replay_session_id)
        except FulmarError as error:
            self.log_event(f"stopping the catchup replay of member {follower.id}: {error}")
        follower.catchup_replay_session_id = NULL_VALUE

    # -- the consensus stream (ConsensusListener) -----------------------------------------

    def _inner_election(self) -> Any:
        election = self.election
        if election is None:
            return None
        if election.election is None:
            return False  # starting: the services have yet to acknowledge
        return election.election

    def on_canvass_position(
        self,
        log_leadership_term_id: int,
        log_position: int,
        leadership_term_id: int,
        follower_member_id: int,
        protocol_version: int,
    ) -> None:
        election = self._inner_election()
        if election is False:
            return
        if election is not None:
            election.on_canvass_position(
                log_leadership_term_id, log_position, leadership_term_id, follower_member_id, protocol_version
            )
        elif leadership_term_id > self.leadership_term_id:
            self.start_election(f"member {follower_member_id} canvasses in a newer term {leadership_term_id}")
        elif self.role is ClusterRole.LEADER:
            follower = self._followers.get(follower_member_id)
            if follower is not None and follower.catchup_replay_session_id != NULL_VALUE:
                # The member starts over (it restarted, or its catchup failed): a replay
                # still running to it is stale, and its next CatchupPosition must not be
                # taken for a repeat of the old one (Aeron's stopExistingCatchupReplay).
                self._stop_catchup_replay(follower)
            self._send_new_leadership_term(follower_member_id, log_leadership_term_id)

    def _send_new_leadership_term(self, to_member_id: int, follower_log_leadership_term_id: int) -> None:
        """A member canvassing after the election (it restarted, or lost the leader):
        where its log stands against this leader's (seed 001)."""
        assert self.consensus_publisher is not None
        next_id, next_base, next_position = next_term_for(
            self.host.term_entries(),
            follower_log_leadership_term_id,
            self.leadership_term_id,
            self.term_base_log_position,
        )
        self.consensus_publisher.new_leadership_term(
            to_member_id,
            log_leadership_term_id=follower_log_leadership_term_id,
            next_leadership_term_id=next_id,
            next_term_base_log_position=next_base,
            next_log_position=next_position,
            leadership_term_id=self.leadership_term_id,
            term_base_log_position=self.term_base_log_position,
            log_position=self.read_append_position(),
            leader_recording_id=self.log_recording_id,
            timestamp=self.cluster_time(),
            leader_member_id=self.member_id,
            log_session_id=self.log_session_id,
            app_version=self.context.app_version,
            is_startup=False,
        )

    def on_request_vote(
        self,
        log_leadership_term_id: int,
        log_position: int,
        candidate_term_id: int,
        candidate_member_id: int,
        protocol_version: int,
    ) -> None:
        election = self._inner_election()
        if election is None and candidate_term_id > self.leadership_term_id:
            self.start_election(f"member {candidate_member_id} asks for votes in term {candidate_term_id}")
            election = self.election.start_now()
        if election:
            election.on_request_vote(
                log_leadership_term_id, log_position, candidate_term_id, candidate_member_id, protocol_version
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
        election = self._inner_election()
        if election:
            election.on_vote(
                candidate_term_id, log_leadership_term_id, log_position, candidate_member_id, follower_member_id, vote
            )

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
        if leadership_term_id >= self.leadership_term_id:
            self.time_of_last_leader_update_ns = self._now_ns
        election = self._inner_election()
        if election is None:
            if leadership_term_id > self.leadership_term_id:
                self.start_election(f"member {leader_member_id} leads a newer term {leadership_term_id}")
                election = self.election.start_now()
            elif leadership_term_id == self.leadership_term_id and leader_member_id == self.leader_member_id:
                self._time_of_last_leader_message_ns = self._now_ns
                # The leader of our term is still in its election (LEADER_READY
                # waits for a fresh AppendPosition from us): send one now.
                self._time_of_last_append_position_sent_ns = 0
        if election:
            election.on_new_leadership_term(
                log_leadership_term_id,
                next_leadership_term_id,
                next_term_base_log_position,
                next_log_position,
                leadership_term_id,
                term_base_log_position,
                log_position,
                leader_recording_id,
                timestamp,
                leader_member_id,
                log_session_id,
                app_version,
                is_startup,
            )

    def on_append_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, flags: int
    ) -> None:
        election = self._inner_election()
        if election:
            election.on_append_position(leadership_term_id, log_position, follower_member_id, flags)
        elif election is None and self.role is ClusterRole.LEADER and leadership_term_id == self.leadership_term_id:
            follower = self._followers.get(follower_member_id)
            if follower is not None:
                follower.log_position = max(follower.log_position, log_position)
                follower.time_of_last_append_position_ns = self._now_ns

    def on_commit_position(self, leadership_term_id: int, log_position: int, leader_member_id: int) -> None:
        if leadership_term_id >= self.leadership_term_id:
            self.time_of_last_leader_update_ns = self._now_ns
        election = self._inner_election()
        if election is None and leadership_term_id > self.leadership_term_id:
            self.start_election(f"member {leader_member_id} commits in a newer term {leadership_term_id}")
            election = self.election.start_now()
        if election:
            election.on_commit_position(leadership_term_id, log_position, leader_member_id)
        elif (
            election is None
            and self.role is ClusterRole.FOLLOWER
            and leadership_term_id == self.leadership_term_id
            and leader_member_id == self.leader_member_id
        ):
            self.notify_commit_position(log_position)

    def on_catchup_position(
        self, leadership_term_id: int, log_position: int, follower_member_id: int, catchup_endpoint: str
    ) -> None:
        """Seed 001: replay this leader's log recording from the follower's position
        to its catchup endpoint, under the live log's session id (replay merge)."""
        if (
            self.role is not ClusterRole.LEADER
            or leadership_term_id != self.leadership_term_id
            or not self._leader_services_joined
        ):
            return  # not (yet) leading this term: the follower asks again shortly
        follower = self._followers.get(follower_member_id)
        if follower is None or follower.catchup_replay_session_id != NULL_VALUE:
            return  # not a member, or already replaying to it (a repeated request)
        # No linger (as Aeron's catchup channel): a stopped catchup replay's
        # publication keeps the log's session id on this endpoint until it is
        # freed, and the follower's next catchup needs it at once.
        channel = self.context.between_members(
            f"aeron:udp?endpoint={catchup_endpoint}|session-id={self.log_session_id}|linger=0"
        )
        try:
            follower.catchup_replay_session_id = self.archive.start_replay(
                self.log_recording_id, channel, self.context.log_stream_id, log_position
            )
        except FulmarError as error:
            self._error(f"catchup of member {follower_member_id} from {log_position}: {error}")
            return
        follower.time_of_last_append_position_ns = self._now_ns
        self.log_event(f"member {follower_member_id} catches up from {log_position} (replay to {catchup_endpoint})")

    def on_stop_catchup(self, leadership_term_id: int, follower_member_id: int) -> None:
        election = self._inner_election()
        if election:
            election.on_stop_catchup(leadership_term_id, follower_member_id)

    def on_termination_position(self, leadership_term_id: int, log_position: int) -> None:
        """The leader stops the cluster at ``log_position`` (after a snapshot, for a
        SHUTDOWN): this follower's services stop there, then it says so and stops."""
        if (
            self.election is not None
            or self.role is not ClusterRole.FOLLOWER
            or leadership_term_id != self.leadership_term_id
            or self.state is ConsensusModuleState.TERMINATING
        ):
            return
        self._termination_position = log_position
        self._termination_ack_id = self.next_ack_id()
        self.service_proxy.termination_position(log_position)
        self._set_state(ConsensusModuleState.TERMINATING)
        self.log_event(f"the leader stops the cluster at log position {log_position}")

    def _check_follower_termination(self) -> int:
        if self.state is not ConsensusModuleState.TERMINATING or self.log_position < self._termination_position:
            return 0
        if self.services_acked(self._termination_ack_id) is None:
            return 0
        assert self.consensus_publisher is not None
        self.consensus_publisher.termination_ack(
            self.leader_member_id,
            leadership_term_id=self.leadership_term_id,
            log_position=self._termination_position,
            member_id=self.member_id,
        )
        self.terminated = True
        self.termination_reason = f"stopped by the leader at log position {self._termination_position}"
        # The leader's TerminationPosition does not say SHUTDOWN or ABORT: a
        # SHUTDOWN stops right where it snapshotted, so a snapshot taken here
        # at that very position says which.
        shutdown = self._follower_snapshot_position == self._termination_position
        cause = StopCause.CLUSTER_SHUTDOWN if shutdown else StopCause.CLUSTER_TERMINATION
        self.orderly_stop = OrderlyStop(cause, self._termination_position)
        self._set_state(ConsensusModuleState.CLOSED)
        return 1

    def on_termination_ack(self, leadership_term_id: int, log_position: int, member_id: int) -> None:
        if (
            self.state is ConsensusModuleState.TERMINATING
            and self.role is ClusterRole.LEADER
            and log_position == self._termination_position
        ):
            self._termination_acks.add(member_id)

    def _check_cluster_termination(self, now_ns: int) -> int:
        """The leader stops once its services have and every follower acknowledged
        (or the termination timeout passed: a follower that is down cannot)."""
        if not self._services_terminated:
            if self.services_acked(self._termination_ack_id) is None:
                return 0
            self._services_terminated = True
        followers = set(self._followers)
        if not followers <= self._termination_acks and now_ns < self._termination_deadline_ns:
            return 0
        missing = sorted(followers - self._termination_acks)
        self.recording_log.commit_log_position(self.leadership_term_id, self._termination_position)
        self.terminated = True
        action = self._termination_action.name if self._termination_action else "stop"
        self.termination_reason = f"{action} of the cluster at log position {self._termination_position}" + (
            f" (no acknowledgement from members {missing})" if missing else ""
        )
        self.orderly_stop = OrderlyStop(self._cluster_stop_cause(), self._termination_position)
        self._set_state(ConsensusModuleState.CLOSED)
        return 1

    # -- what the election tells the node -------------------------------------------------------

    def persist_candidate_term_id(self, candidate_term_id: int) -> None:
        if self.mark_file is not None and candidate_term_id > self.mark_file.candidate_term_id:
            self.mark_file.candidate_term_id = candidate_term_id

    def set_role(self, role: ClusterRole) -> None:
        self.role = role
        self.role_counter.set(int(role))

    def set_leadership_term_id(self, leadership_term_id: int) -> None:
        self.leadership_term_id = leadership_term_id
        self.leadership_term_counter.set(leadership_term_id)

    def on_multi_member_election_complete(
        self, role: ClusterRole, leader_member_id: int, leadership_term_id: int
    ) -> None:
        self._election_backoff.on_success()
        self.leader_member_id = leader_member_id
        self.set_leadership_term_id(leadership_term_id)
        self.set_role(role)
        self._time_of_last_leader_message_ns = self._now_ns
        self._last_append_position_sent = NULL_POSITION
        self.log_event(
            f"election complete: {role.name} of term {leadership_term_id} (leader member "
            f"{leader_member_id}), log at {self.read_append_position()}"
        )
        if role is ClusterRole.LEADER:
            self.term_base_log_position = self.election.election.term_base_log_position
            for follower in self._followers.values():
                follower.time_of_last_append_position_ns = self._now_ns  # each has a timeout from now
            self.on_election_complete()
            for session in self.sessions.values():
                session.has_new_leader_event_pending = True  # a new term: clients learn its id
            if self.sessions:
                self._session_events_pending = True
        else:
            self.term_base_log_position = self.election.election.term_base_log_position
            self.election = None
            self._set_state(self.running_state)  # as the log says (seed 004), not ACTIVE by default
            for session in self.sessions.values():
                session.disconnect()  # the leader answers clients, not a follower
        # Clients are served again: by this leader, or redirected to it.
        self.connect_ingress(self._now_ns)

    # ----------------------------------------------------------------- misc

    def _error(self, text: str) -> None:
        """An error: counted, recorded in the mark file's distinct error log (which
        counts repeats and their times), and said on the console once per distinct
        text, so a failure that repeats cannot flood the node's consensus.log."""
        self.error_counter.increment()
        self.record_error(f"consensus module: {text}")
        if self.is_multi_member:
            self._print_error(text)

    report_error = _error

    def close(self) -> None:
        self.handovers.close()
        for session in (
            list(self.sessions.values())
            + self.pending_sessions
            + self.rejected_sessions
            + self.redirect_sessions
            + self.pending_backup_sessions
            + self.rejected_backup_sessions
        ):
            session.disconnect()
        self.close_log_replay()
        if self._log_publication is not None:
            self._log_publication.close()
        if self.ingress is not None:
            self.ingress.close()
        for resource in (self.from_services, self.service_proxy.publication):
            resource.close()
