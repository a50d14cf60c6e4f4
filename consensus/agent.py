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
from pathlib import Path
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from fulmar.archive.client import AeronArchive, RecordingSignal, SourceLocation
from fulmar.channel_uri import ChannelUri
from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.consensus.cluster_session import ClusterSession, ClusterSessionAction, ClusterSessionState, SessionProxy
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.protocol import NULL_POSITION, NULL_VALUE, CloseReason, ClusterAction, EventCode
from fulmar.consensus.publishers import SESSION_HEADER_LENGTH, EgressPublisher, LogPublisher, ServiceProxy
from fulmar.consensus.recording_log import RecordingLog
from fulmar.consensus.timer_service import TimerService
from fulmar.errors import FulmarError
from fulmar.semantic_version import major_version
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header
from fulmar.logbuffer import compute_term_id_from_position, position_bits_to_shift

if TYPE_CHECKING:
    from fulmar.aeron import Aeron, Counter
    from fulmar.publication import ExclusivePublication
    from fulmar.subscription import Image, Subscription

# Service session ids (for messages a service offers to the cluster) count up
# from here, far below any client session id.
SERVICE_SESSION_ID_BASE = -(2**63) + 1


class ConsensusModuleState(IntEnum):
    INIT = 0
    ACTIVE = 1
    SUSPENDED = 2
    SNAPSHOT = 3
    QUITTING = 4
    TERMINATING = 5
    CLOSED = 6


class ClusterRole(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2


class ControlToggle(IntEnum):
    """The cluster control toggle counter's values (Aeron's ClusterControl.ToggleState)."""

    INACTIVE = 0
    NEUTRAL = 1
    SUSPEND = 2
    RESUME = 3
    SNAPSHOT = 4
    SHUTDOWN = 5
    ABORT = 6
    STANDBY_SNAPSHOT = 7


class ElectionState(IntEnum):
    INIT = 0
    CANVASS = 1
    NOMINATE = 2
    CANDIDATE_BALLOT = 3
    FOLLOWER_BALLOT = 4
    LEADER_LOG_REPLICATION = 5
    LEADER_REPLAY = 6
    LEADER_INIT = 7
    LEADER_READY = 8
    FOLLOWER_LOG_REPLICATION = 9
    FOLLOWER_REPLAY = 10
    FOLLOWER_CATCHUP_INIT = 11
    FOLLOWER_CATCHUP_AWAIT = 12
    FOLLOWER_CATCHUP = 13
    FOLLOWER_LOG_INIT = 14
    FOLLOWER_LOG_AWAIT = 15
    FOLLOWER_READY = 16
    CLOSED = 17


class ClusterTerminationError(FulmarError):
    """The module stops: a SHUTDOWN/ABORT completed, or a step it cannot do without failed."""


_CLUSTER_KEY = struct.Struct("<i")


class ConsensusModuleAgent:
    def __init__(
        self,
        context: ConsensusModuleContext,
        aeron: "Aeron",
        archive: AeronArchive,
        recording_log: RecordingLog,
        epoch_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
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
        self.next_service_session_id = SERVICE_SESSION_ID_BASE
        self.log_service_session_id = SERVICE_SESSION_ID_BASE - 1
        self.sessions: dict[int, ClusterSession] = {}
        self.pending_sessions: list[ClusterSession] = []
        self.rejected_sessions: list[ClusterSession] = []
        self.redirect_sessions: list[ClusterSession] = []
        self.timers = TimerService()
        self.pending_service_messages: deque[tuple[int, bytes]] = deque()
        self.terminated = False
        self.termination_reason = ""
        self._now_ns = 0
        self._slow_tick_deadline_ns = 0
        self._service_acks: dict[int, dict[int, Any]] = {}
        self._expected_ack_id = 0
        self._pending_ingress: deque[bytes] = deque()
        self._ingress_control_only = False  # suspended: session messages wait in the ingress
        self._authenticator = context.authenticator
        self._wake = aeron.conductor.data_doorbell.ring
        self._egress = EgressPublisher()
        self.log_publisher = LogPublisher()
        self._log_publication: "ExclusivePublication | None" = None
        self._log_image: "Image | None" = None
        self._replay_subscription: "Subscription | None" = None
        self._recording_position_counter_id = NULL_VALUE
        self._snapshot_log_position = NULL_POSITION
        self._termination_position = NULL_POSITION
        self._termination_action: ControlToggle | None = None
        self._state_after_snapshot = ConsensusModuleState.ACTIVE
        self._service_check_deadline_ns = 0
        self._termination_ack_id = NULL_VALUE
        self._snapshot_ack_id = NULL_VALUE
        self._max_cycle_ns = 0
        self.recovery_state: "Counter | None" = None  # what the services recover from (set at launch)
        # Streams: ingress from clients, service control both ways.
        self.ingress = aeron.add_subscription(context.ingress_channel, context.ingress_stream_id)
        # Exclusive, as in Aeron: a dead process's publication on the same stream (until
        # the driver times it out) is not shared with, nor can it block, this one.
        self.service_proxy = ServiceProxy(
            aeron.add_exclusive_publication(context.control_channel, context.service_stream_id))
        self.from_services = aeron.add_subscription(context.control_channel, context.consensus_module_stream_id)
        self._ingress_assembler = FragmentAssembler(self._on_ingress_message)
        self._service_assembler = FragmentAssembler(self._on_service_message)
        self._log_assembler = FragmentAssembler(self._on_log_message)
        # One flyweight for every session message (ingress and log): no decoder per message.
        self._session_header = codecs.SessionMessageHeaderDecoder()
        # Counters (keyed by cluster id, so tools find them).
        key = _CLUSTER_KEY.pack(context.cluster_id)
        self.module_state_counter = self._counter(protocol.CONSENSUS_MODULE_STATE_TYPE_ID, "Consensus Module state", key)
        self.role_counter = self._counter(protocol.CLUSTER_NODE_ROLE_TYPE_ID, "Cluster node role", key)
        self.control_toggle = self._counter(protocol.CLUSTER_CONTROL_TOGGLE_TYPE_ID, "Cluster control toggle", key)
        self.commit_position_counter = self._counter(protocol.COMMIT_POSITION_TYPE_ID, "Cluster commit-pos:", key)
        self.election_state_counter = self._counter(protocol.ELECTION_STATE_TYPE_ID, "Cluster election state", key)
        self.leadership_term_counter = self._counter(
            protocol.CLUSTER_LEADERSHIP_TERM_ID_TYPE_ID, "Cluster leadership term id", key)
        self.error_counter = self._counter(protocol.CLUSTER_ERROR_COUNT_TYPE_ID, "Cluster errors", key)
        self.max_cycle_counter = self._counter(protocol.CLUSTER_MAX_CYCLE_TIME_TYPE_ID, "Cluster max cycle time in ns", key)
        self.cycle_exceeded_counter = self._counter(
            protocol.CLUSTER_CYCLE_TIME_THRESHOLD_EXCEEDED_TYPE_ID,
            f"Cluster work cycle time exceeded count: threshold={context.cycle_threshold_ns}ns", key)
        self.snapshot_counter = self._counter(protocol.SNAPSHOT_COUNTER_TYPE_ID, "Cluster snapshot count", key)
        # Actions for this node alone, whatever its role (Aeron uses it for
        # standby snapshots, which a cluster without standbys refuses).
        self.node_control_toggle = self._counter(
            protocol.CLUSTER_NODE_CONTROL_TOGGLE_TYPE_ID, "Cluster node control toggle", key)
        self.sessions_counter = self._counter(protocol.CLUSTER_SESSIONS_TYPE_ID, "Cluster sessions", key)
        self.timers_counter = self._counter(protocol.CLUSTER_TIMERS_TYPE_ID, "Cluster timers", key)
        self.invalid_requests_counter = self._counter(
            protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID, "Cluster invalid requests (ignored)", key)
        self.leadership_term_counter.set(NULL_VALUE)
        self.commit_position_counter.set(0)
        self.control_toggle.set(ControlToggle.INACTIVE)
        self.node_control_toggle.set(ControlToggle.NEUTRAL)
        self.election = SingleNodeElection(self)
        self._set_state(ConsensusModuleState.INIT)

    def _counter(self, type_id: int, label: str, key: bytes) -> "Counter":
        return self.aeron.add_counter(type_id, f"{label} - clusterId={self.context.cluster_id}", key)

    # ------------------------------------------------------------ duty cycle

    def do_work(self, now_ns: int) -> int:
        self._now_ns = now_ns
        work = 0
        if now_ns >= self._slow_tick_deadline_ns:
            self._slow_tick_deadline_ns = now_ns + self.context.slow_tick_interval_ns
            work += self._slow_tick_work(now_ns)
        work += self._poll_services()
        if self.election is not None:
            try:
                work += self.election.do_work(now_ns)
            except ClusterTerminationError:
                raise
            except FulmarError as error:
                # One member alone has nobody to hand over to: stop, loudly
                # (the supervisor restarts the node), rather than retry forever.
                raise ClusterTerminationError(
                    f"election {self.election.state.name} failed: {type(error).__name__}: {error}") from error
        elif self.role is ClusterRole.LEADER:
            work += self._leader_work(now_ns)
        self._track_cycle(now_ns)
        return work

    def _track_cycle(self, started_ns: int) -> None:
        took = time.monotonic_ns() - started_ns
        if took > self._max_cycle_ns:
            self._max_cycle_ns = took
            self.max_cycle_counter.set(took)
        if took > self.context.cycle_threshold_ns:
            self.cycle_exceeded_counter.increment()

    def has_work(self) -> bool:
        """A cheap check before sleeping: is a message already waiting?"""
        image = self._log_image
        return (self.ingress.is_data_available() or self.from_services.is_data_available()
                or (image is not None and image.is_data_available()))

    def cluster_time(self) -> int:
        """Cluster time, in its unit (milliseconds since the epoch)."""
        return self.epoch_ms()

    def _slow_tick_work(self, now_ns: int) -> int:
        work = self.aeron.do_work(now_ns)
        try:
            self.archive.poll_for_signals()
        except FulmarError as error:
            self._error(f"archive: {error}")
        work += self._process_redirect_and_rejected(now_ns)
        work += self._check_node_control_toggle()
        if self.election is None and self.role is ClusterRole.LEADER:
            work += self._check_control_toggle(now_ns)
            work += self._process_pending_sessions(now_ns)
            work += self._check_sessions(now_ns)
        return work

    def _leader_work(self, now_ns: int) -> int:
        work = 0
        if self.state is ConsensusModuleState.ACTIVE:
            work += self.timers.poll(self.cluster_time(), self._on_timer_expired)
            work += self._append_pending_service_messages()
            work += self._poll_ingress()
        elif self.state is ConsensusModuleState.SUSPENDED:
            work += self._poll_ingress(session_control_only=True)
        work += self._update_commit_position()
        work += self._check_snapshot_and_termination(now_ns)
        return work

    # --------------------------------------------------------- positions

    def _find_recording_position_counter(self) -> int:
        reader = self.aeron.counters_reader
        for counter in reader:
            # rec-pos key: recording id, then the recorded image's session id.
            if (counter.type_id == 100
                    and int.from_bytes(counter.key[:8], "little", signed=True) == self.log_recording_id
                    and int.from_bytes(counter.key[8:12], "little", signed=True) == self.log_session_id):
                return counter.counter_id
        return NULL_VALUE

    def _update_commit_position(self) -> int:
        """A single member's quorum is itself: what its archive has recorded is committed."""
        if self._recording_position_counter_id == NULL_VALUE:
            self._recording_position_counter_id = self._find_recording_position_counter()
            if self._recording_position_counter_id == NULL_VALUE:
                return 0
        position = self.aeron.counters_reader.counter_value(self._recording_position_counter_id)
        if position > self.append_position:
            self.append_position = position
        if self.append_position > self.commit_position:
            self.commit_position = self.append_position
            self.commit_position_counter.set(self.commit_position)
            # The services sleep on the data doorbell: a counter write rings
            # nothing by itself (a ring costs a fence when nobody waits).
            self._wake()
            return 1
        return 0

    # ----------------------------------------------------------------- ingress

    def _poll_ingress(self, session_control_only: bool = False) -> int:
        self._ingress_control_only = session_control_only
        work = 0
        while self._pending_ingress:
            message = self._pending_ingress[0]
            if not self._dispatch_ingress(memoryview(message), 0, len(message)):
                return work
            self._pending_ingress.popleft()
            work += 1
        return work + self.ingress.poll(self._ingress_assembler.on_fragment, 64)

    def _on_ingress_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        if self._pending_ingress or not self._dispatch_ingress(buffer, offset, length):
            # The log is back pressured: keep the message, in order, for the next cycle.
            self._pending_ingress.append(bytes(buffer[offset : offset + length]))

    def _dispatch_ingress(self, buffer: memoryview, offset: int, length: int) -> bool:
        """Act on one ingress message; False to be retried (log back pressure)."""
        try:
            header = codecs.read_header(buffer, offset, length)
        except CodecError:
            self.invalid_requests_counter.increment()
            return True
        template = header.template_id
        if template == codecs.SessionMessageHeaderEncoder.TEMPLATE_ID:
            if self._ingress_control_only:
                return False  # suspended: messages wait in the ingress
            try:
                session_header = self._session_header.wrap_and_apply_header(buffer, offset, length)
            except CodecError:
                self.invalid_requests_counter.increment()
                return True
            return self._on_ingress_session_message(session_header, buffer, offset, length)
        try:
            message = codecs.decode(buffer, offset, length)
        except CodecError:
            self.invalid_requests_counter.increment()
            return True
        handler = _INGRESS_HANDLERS.get(template)
        if handler is None:
            self.invalid_requests_counter.increment()
            return True
        return handler(self, message)

    def _on_ingress_session_message(self, message: Any, buffer: memoryview, offset: int, length: int) -> bool:
        session = self.sessions.get(message.cluster_session_id)
        if (session is None or session.state is not ClusterSessionState.OPEN
                or message.leadership_term_id != self.leadership_term_id):
            self.invalid_requests_counter.increment()
            return True
        payload = buffer[offset + SESSION_HEADER_LENGTH : offset + length]
        result = self.log_publisher.append_message(
            self.leadership_term_id, session.id, self.cluster_time(), payload)
        if result <= 0:
            return False
        session.time_of_last_activity(self._now_ns)
        return True

    def on_session_connect(self, message: Any) -> bool:
        session = ClusterSession(NULL_VALUE, message.response_stream_id, message.response_channel,
                                 message.correlation_id, self._now_ns)
        try:
            session.connect(self.aeron)
        except FulmarError as error:
            self._error(f"cannot connect the egress of a connect request ({message.response_channel}): {error}")
            self.invalid_requests_counter.increment()
            return True
        if self.role is not ClusterRole.LEADER or self.election is not None:
            session.detail = "not the leader" if self.election is None else "election in progress"
            self.redirect_sessions.append(session)
            return True
        session.id = self.next_session_id
        self.next_session_id += 1
        if major_version(message.version) != protocol.PROTOCOL_MAJOR_VERSION:
            session.detail = (f"invalid client version {protocol.version_text(message.version)}, "
                              f"cluster is {protocol.version_text(protocol.PROTOCOL_SEMANTIC_VERSION)}")
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
                self._authenticator.on_challenge_response(session.id, bytes(message.encoded_credentials),
                                                          self.epoch_ms())
                return True
        self.invalid_requests_counter.increment()
        return True

    def on_admin_request(self, message: Any) -> bool:
        session = self.sessions.get(message.cluster_session_id)
        if session is None or message.leadership_term_id != self.leadership_term_id or session.publication is None:
            self.invalid_requests_counter.increment()
            return True
        ok = message.request_type_raw == codecs.AdminRequestType.SNAPSHOT and self.control_toggle.get() == ControlToggle.NEUTRAL
        if ok:
            self.control_toggle.set(ControlToggle.SNAPSHOT)
        self._egress.admin_response(
            session.publication, session.id, message.correlation_id, message.request_type_raw,
            int(codecs.AdminResponseCode.OK if ok else codecs.AdminResponseCode.ERROR),
            "" if ok else "the cluster cannot take a snapshot now (another action is under way)")
        return True

    # -------------------------------------------------------------- sessions

    def _process_redirect_and_rejected(self, now_ns: int) -> int:
        work = 0
        for collection, code in ((self.redirect_sessions, EventCode.REDIRECT), (self.rejected_sessions, None)):
            for session in list(collection):
                if session.publication is not None and session.is_response_publication_connected:
                    event_code = code
                    if event_code is None:
                        event_code = (EventCode.AUTHENTICATION_REJECTED if session.state is ClusterSessionState.REJECTED
                                      else EventCode.ERROR)
                    detail = self._leader_detail() if event_code is EventCode.REDIRECT else session.detail
                    if self._egress.session_event(session.publication, session.id, session.correlation_id,
                                                  self.leadership_term_id, self.member_id, int(event_code), detail):
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
        endpoint = ChannelUri.parse(self.context.ingress_channel).get("endpoint")
        return f"{self.member_id}={endpoint}" if endpoint else ""

    def _process_pending_sessions(self, now_ns: int) -> int:
        work = 0
        for session in list(self.pending_sessions):
            if session.state is ClusterSessionState.CONNECTING and session.is_response_publication_connected:
                session.state = ClusterSessionState.CONNECTED
                self._authenticator.on_connected_session(SessionProxy(session), self.epoch_ms())
                work += 1
            if session.state is ClusterSessionState.CHALLENGED:
                if session.encoded_challenge is not None and session.publication is not None:
                    if self._egress.challenge(session.publication, session.correlation_id, session.id,
                                              session.encoded_challenge):
                        session.encoded_challenge = None
                self._authenticator.on_challenged_session(SessionProxy(session), self.epoch_ms())
            if session.state is ClusterSessionState.AUTHENTICATED:
                if self.log_publisher.append_session_open(self.leadership_term_id, session, self.cluster_time()) > 0:
                    session.state = ClusterSessionState.OPEN
                    session.opened_log_position = self.log_publisher.position
                    session.time_of_last_activity(now_ns)
                    session.has_open_event_pending = True
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
        for session in list(self.sessions.values()):
            if session.state is not ClusterSessionState.OPEN:
                continue
            if now_ns - session.time_of_last_activity_ns > timeout:
                if self._close_session(session, CloseReason.TIMEOUT, notify=True):
                    work += 1
                continue
            if session.has_open_event_pending and session.publication is not None:
                if self._egress.session_event(session.publication, session.id, session.correlation_id,
                                              self.leadership_term_id, self.member_id, int(EventCode.OK), ""):
                    session.has_open_event_pending = False
                    work += 1
            if session.has_new_leader_event_pending and session.publication is not None:
                if self._send_new_leader_event(session):
                    session.has_new_leader_event_pending = False
        return work

    def _send_new_leader_event(self, session: ClusterSession) -> bool:
        assert session.publication is not None
        message = self._egress.encode(
            codecs.NewLeaderEventEncoder, leadership_term_id=self.leadership_term_id, cluster_session_id=session.id,
            leader_member_id=self.member_id, ingress_endpoints=self._leader_detail())
        return session.publication.offer(message) > 0

    def _close_session(self, session: ClusterSession, reason: CloseReason, notify: bool) -> bool:
        """Append the SessionCloseEvent; False if the log is back pressured (retry)."""
        if self.log_publisher.append_session_close(self.leadership_term_id, session.id, int(reason),
                                                   self.cluster_time()) <= 0:
            return False
        if notify and session.publication is not None:
            detail = "session timed out" if reason is CloseReason.TIMEOUT else "closed by the service"
            self._egress.session_event(session.publication, session.id, session.correlation_id,
                                       self.leadership_term_id, self.member_id, int(EventCode.CLOSED), detail)
        session.close(reason)
        self.sessions.pop(session.id, None)
        self.sessions_counter.set(len(self.sessions))
        return True

    # ------------------------------------------------------------------ timers

    def _on_timer_expired(self, correlation_id: int) -> bool:
        return self.log_publisher.append_timer(self.leadership_term_id, correlation_id, self.cluster_time()) > 0

    # ------------------------------------------------------- from the services

    def _poll_services(self) -> int:
        return int(self.from_services.poll(self._service_assembler.on_fragment, 32))

    def _on_service_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        try:
            message_header = codecs.read_header(buffer, offset, length)
            if message_header.template_id == codecs.SessionMessageHeaderEncoder.TEMPLATE_ID:
                self._enqueue_service_message(bytes(buffer[offset + SESSION_HEADER_LENGTH : offset + length]))
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
            self._service_acks.setdefault(message.ack_id, {})[message.service_id] = message
        elif isinstance(message, codecs.CloseSessionDecoder):
            session = self.sessions.get(message.cluster_session_id)
            if session is not None and self.role is ClusterRole.LEADER:
                if not self._close_session(session, CloseReason.SERVICE_ACTION, notify=True):
                    session.state = ClusterSessionState.CLOSING  # retried by the slow tick
        else:
            self._error(f"unexpected {type(message).__name__} from a service ignored")
        self.timers_counter.set(len(self.timers))

    def _enqueue_service_message(self, payload: bytes) -> None:
        """A service offered a message to the cluster: it gets the next service
        session id.  During a replay the same messages come again; those the
        log already holds are dropped when the log shows them."""
        self.next_service_session_id += 1
        session_id = self.next_service_session_id
        if session_id > self.log_service_session_id:
            self.pending_service_messages.append((session_id, payload))

    def _append_pending_service_messages(self) -> int:
        work = 0
        while self.pending_service_messages:
            session_id, payload = self.pending_service_messages[0]
            if session_id <= self.log_service_session_id:
                self.pending_service_messages.popleft()
                continue
            if self.log_publisher.append_message(self.leadership_term_id, session_id, self.cluster_time(), payload) <= 0:
                break
            self.log_service_session_id = session_id
            self.pending_service_messages.popleft()
            work += 1
        for session in list(self.sessions.values()):
            if session.state is ClusterSessionState.CLOSING:
                self._close_session(session, CloseReason.SERVICE_ACTION, notify=True)
        return work

    def next_ack_id(self) -> int:
        ack_id = self._expected_ack_id
        self._expected_ack_id += 1
        return ack_id

    def services_acked_partially(self, ack_id: int, missing: list[int]) -> bool:
        """Whether a service other than ``missing`` has yet to acknowledge ``ack_id``."""
        acks = self._service_acks.get(ack_id, {})
        return any(service_id not in acks and service_id not in missing
                   for service_id in range(self.context.service_count))

    def services_acked(self, ack_id: int, log_position: int | None = None) -> list[Any] | None:
        """The acks of every service for ``ack_id``, once all came."""
        acks = self._service_acks.get(ack_id, {})
        if len(acks) < self.context.service_count:
            return None
        if log_position is not None:
            for ack in acks.values():
                if ack.log_position != log_position:
                    raise ClusterTerminationError(
                        f"service {ack.service_id} acknowledged position {ack.log_position}, expected {log_position}")
        del self._service_acks[ack_id]
        return list(acks.values())

    # ---------------------------------------------------------- log replay

    def on_log_image(self, image: "Image") -> None:
        self._log_image = image

    def poll_log(self, limit_position: int) -> int:
        """Apply the log (a replay) up to ``limit_position``, moving the commit position with it."""
        image = self._log_image
        if image is None:
            return 0
        count = image.bounded_poll(self._log_assembler.on_fragment, limit_position, 64)
        position = image.position
        if position > self.log_position:
            self.log_position = position
            if position > self.commit_position:
                self.commit_position = position
                self.commit_position_counter.set(position)
        return count

    def _on_log_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        try:
            message_header = codecs.read_header(buffer, offset, length)
            if message_header.template_id == codecs.SessionMessageHeaderEncoder.TEMPLATE_ID:
                session_header = self._session_header.wrap_and_apply_header(buffer, offset, length)
                self._on_replay_session_message(session_header.cluster_session_id, session_header.timestamp)
                return
            message = codecs.decode(buffer, offset, length)
        except CodecError as error:
            self._error(f"malformed log message at position {header.position}: {error}")
            return
        if isinstance(message, codecs.SessionOpenEventDecoder):
            session = ClusterSession(message.cluster_session_id, message.response_stream_id,
                                     message.response_channel, message.correlation_id, self._now_ns)
            session.state = ClusterSessionState.OPEN
            session.encoded_principal = bytes(message.encoded_principal)
            session.opened_log_position = header.position
            self.sessions[session.id] = session
            self.next_session_id = max(self.next_session_id, session.id + 1)
        elif isinstance(message, codecs.SessionCloseEventDecoder):
            closed = self.sessions.pop(message.cluster_session_id, None)
            if closed is not None:
                closed.close(CloseReason(message.close_reason_raw))
        elif isinstance(message, codecs.TimerEventDecoder):
            self.timers.cancel(message.correlation_id)
        elif isinstance(message, codecs.NewLeadershipTermEventDecoder):
            self.leadership_term_id = message.leadership_term_id
        elif isinstance(message, codecs.ClusterActionRequestDecoder):
            pass  # a replayed snapshot or suspension already happened
        self.sessions_counter.set(len(self.sessions))

    def _on_replay_session_message(self, cluster_session_id: int, timestamp: int) -> None:
        if cluster_session_id < 0:
            # A service message: the log holds it, so the service's re-offer is not appended again.
            if cluster_session_id > self.log_service_session_id:
                self.log_service_session_id = cluster_session_id
            while self.pending_service_messages and self.pending_service_messages[0][0] <= cluster_session_id:
                self.pending_service_messages.popleft()
            return
        session = self.sessions.get(cluster_session_id)
        if session is not None:
            session.time_of_last_activity(self._now_ns)

    # ------------------------------------------------------------ leadership

    def start_log_replay(self, from_position: int, to_position: int) -> int:
        """Ask the archive to replay the log recording between the positions;
        returns the replay image's session id."""
        replay_session_id = self.archive.start_replay(
            self.log_recording_id, self.context.replay_channel, self.context.replay_stream_id,
            from_position, to_position - from_position)
        session_id = replay_session_id & 0xFFFF_FFFF
        session_id = session_id - (1 << 32) if session_id >= 1 << 31 else session_id
        channel = ChannelUri.parse(self.context.replay_channel).with_param("session-id", session_id)
        self._log_image = None
        self._replay_subscription = self.aeron.add_subscription(
            str(channel), self.context.replay_stream_id, on_available_image=self.on_log_image)
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
        if self.log_recording_id != NULL_VALUE:
            descriptor = self.archive.list_recording(self.log_recording_id)
            if descriptor is None:
                raise ClusterTerminationError(f"the log recording {self.log_recording_id} is missing from the archive")
            term_length = descriptor.term_buffer_length
            position = self.append_position
            term_id = compute_term_id_from_position(position, position_bits_to_shift(term_length),
                                                    descriptor.initial_term_id)
            channel = channel.with_param("term-length", term_length).with_param("mtu", descriptor.mtu_length)
            channel = channel.with_initial_position(descriptor.initial_term_id, term_id, position & (term_length - 1))
        publication = self.aeron.add_exclusive_publication(str(channel), context.log_stream_id)
        self._log_publication = publication
        self.log_publisher.publication = publication
        self.log_session_id = publication.session_id
        # The recording names this publication's session: a dead predecessor's
        # log publication (until the driver times it out) must not be recorded.
        # Auto stop: the recording subscription goes with this publication, so
        # the next term (or run) can extend the recording again.
        recorded = str(ChannelUri.parse(context.log_channel).with_param("session-id", publication.session_id))
        if self.log_recording_id != NULL_VALUE:
            self.archive.extend_recording(self.log_recording_id, recorded, context.log_stream_id,
                                          SourceLocation.LOCAL, auto_stop=True)
        else:
            self.archive.start_recording(recorded, context.log_stream_id, SourceLocation.LOCAL, auto_stop=True)
        expected = RecordingSignal.EXTEND if self.log_recording_id != NULL_VALUE else RecordingSignal.START
        signal = self.archive.wait_for_signal(lambda s: s.signal == expected, 30_000_000_000)
        self.log_recording_id = signal.recording_id
        self._recording_position_counter_id = NULL_VALUE
        self.leadership_term_id = leadership_term_id
        self.leadership_term_counter.set(leadership_term_id)
        self.term_base_log_position = self.append_position
        self.recording_log.append_term(self.log_recording_id, self.leadership_term_id,
                                       self.term_base_log_position, self.cluster_time())
        self.role = ClusterRole.LEADER
        self.role_counter.set(ClusterRole.LEADER)

    def live_log_channel(self) -> str:
        return str(ChannelUri.parse(self.context.log_channel).with_param("session-id", self.log_session_id))

    def on_election_complete(self) -> None:
        self.election = None  # type: ignore[assignment]
        self._set_state(ConsensusModuleState.ACTIVE)
        self.control_toggle.set(ControlToggle.NEUTRAL)
        for session in self.sessions.values():
            # Sessions known from the log (before a restart): reconnect their
            # egress and tell them who leads now.
            if session.publication is None:
                try:
                    session.connect(self.aeron)
                except FulmarError as error:
                    self._error(f"cannot reconnect session {session.id}: {error}")
                    continue
                session.has_new_leader_event_pending = True
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
            if self._append_action(ClusterAction.SUSPEND)[0] > 0:
                self._set_state(ConsensusModuleState.SUSPENDED)
                self.control_toggle.set(ControlToggle.NEUTRAL)
        elif action is ControlToggle.RESUME and self.state is ConsensusModuleState.SUSPENDED:
            if self._append_action(ClusterAction.RESUME)[0] > 0:
                self._set_state(ConsensusModuleState.ACTIVE)
                self.control_toggle.set(ControlToggle.NEUTRAL)
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
        elif action is ControlToggle.STANDBY_SNAPSHOT:
            self.control_toggle.set(ControlToggle.NEUTRAL)  # no standby members here
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

    def _append_action(self, action: ClusterAction) -> tuple[int, int]:
        return self.log_publisher.append_cluster_action(self.leadership_term_id, self.cluster_time(), int(action))

    def _dead_services(self) -> list[int]:
        """Services whose container process is gone (its mark file stale or its pid dead)."""
        from fulmar.consensus.mark_file import read_cluster_mark_file, service_mark_file_name

        dead = []
        now_ms = self.epoch_ms()
        for service_id in range(self.context.service_count):
            path = Path(self.context.cluster_dir) / service_mark_file_name(service_id)
            try:
                if read_cluster_mark_file(path).is_active(now_ms):
                    continue
            except FulmarError:
                pass
            dead.append(service_id)
        return dead

    def _check_snapshot_and_termination(self, now_ns: int) -> int:
        if self.state in (ConsensusModuleState.SNAPSHOT, ConsensusModuleState.TERMINATING):
            # Waiting on the services: one that died will never answer.
            if now_ns >= self._service_check_deadline_ns:
                self._service_check_deadline_ns = now_ns + 250_000_000
                dead = self._dead_services()
                if dead and self.state is ConsensusModuleState.SNAPSHOT:
                    raise ClusterTerminationError(f"service(s) {dead} died during the snapshot: stopping")
                if dead and not self.services_acked_partially(self._termination_ack_id, dead):
                    self.terminated = True
                    self.termination_reason = f"stop at log position {self._termination_position} " \
                                              f"(service(s) {dead} already gone)"
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
            acks = self.services_acked(self._termination_ack_id)
            if acks is None:
                return 0
            self.recording_log.commit_log_position(self.leadership_term_id, self._termination_position)
            self.terminated = True
            self.termination_reason = f"{self._termination_action.name if self._termination_action else 'stop'} " \
                                      f"at log position {self._termination_position}"
            self._set_state(ConsensusModuleState.CLOSED)
            return 1
        return 0

    def _complete_snapshot(self, service_acks: list[Any]) -> None:
        from fulmar.consensus.snapshot import take_consensus_module_snapshot

        position = self._snapshot_log_position
        try:
            recording_id = take_consensus_module_snapshot(self, position)
        except FulmarError as error:
            # No snapshot this time (the services' are left unreferenced):
            # say so and carry on as before rather than stay in SNAPSHOT.
            self._error(f"snapshot at log position {position} failed: {type(error).__name__}: {error}")
            self._snapshot_log_position = NULL_POSITION
            self._termination_action = None
            self._set_state(self._state_after_snapshot)
            self.control_toggle.set(ControlToggle.NEUTRAL)
            return
        timestamp = self.cluster_time()
        for ack in sorted(service_acks, key=lambda a: a.service_id):
            self.recording_log.append_snapshot(ack.relevant_id, self.leadership_term_id, self.term_base_log_position,
                                               position, timestamp, ack.service_id)
        self.recording_log.append_snapshot(recording_id, self.leadership_term_id, self.term_base_log_position,
                                           position, timestamp, -1)
        self.snapshot_counter.increment()
        self._snapshot_log_position = NULL_POSITION
        if self._termination_action is ControlToggle.SHUTDOWN:
            self._begin_termination(ControlToggle.SHUTDOWN)
        else:
            self._set_state(self._state_after_snapshot)
            self.control_toggle.set(ControlToggle.NEUTRAL)

    def _begin_termination(self, action: ControlToggle) -> None:
        """Services stop at the current log end; the module waits for their acks."""
        assert self._log_publication is not None
        self._termination_action = action
        self._termination_position = self._log_publication.position
        self._termination_ack_id = self.next_ack_id()
        self.service_proxy.termination_position(self._termination_position)
        self._set_state(ConsensusModuleState.TERMINATING)

    def request_shutdown(self, action: ControlToggle = ControlToggle.SHUTDOWN) -> None:
        """What SIGTERM asks for: a snapshot and an orderly stop (or ABORT: no snapshot)."""
        if self.state in (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED, ConsensusModuleState.SNAPSHOT):
            self.control_toggle.set(action)  # (during a snapshot it is acted on after it)

    # ----------------------------------------------------------------- misc

    def _error(self, text: str) -> None:
        self.error_counter.increment()
        self.record_error(f"consensus module: {text}")

    def close(self) -> None:
        for session in list(self.sessions.values()) + self.pending_sessions + self.rejected_sessions + self.redirect_sessions:
            session.disconnect()
        self.close_log_replay()
        if self._log_publication is not None:
            self._log_publication.close()
        for resource in (self.ingress, self.from_services, self.service_proxy.publication):
            resource.close()


_INGRESS_HANDLERS: dict[int, Callable[[ConsensusModuleAgent, Any], bool]] = {
    codecs.SessionConnectRequestEncoder.TEMPLATE_ID: ConsensusModuleAgent.on_session_connect,
    codecs.SessionCloseRequestEncoder.TEMPLATE_ID: ConsensusModuleAgent.on_session_close_request,
    codecs.SessionKeepAliveEncoder.TEMPLATE_ID: ConsensusModuleAgent.on_session_keep_alive,
    codecs.ChallengeResponseEncoder.TEMPLATE_ID: ConsensusModuleAgent.on_challenge_response,
    codecs.AdminRequestEncoder.TEMPLATE_ID: ConsensusModuleAgent.on_admin_request,
}


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
        self._replay_to = NULL_POSITION
        self._joined = False

    def set_state(self, state: ElectionState, now_ns: int) -> None:
        self.state = state
        self.agent.election_state_counter.set(int(state))
        self.deadline_ns = now_ns + self.agent.context.service_ack_timeout_ns
        self._joined = False

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
        if agent.log_position >= agent.append_position:
            self.set_state(ElectionState.LEADER_INIT, now_ns)
            return 1
        if not self._joined:
            session_id = agent.start_log_replay(agent.log_position, agent.append_position)
            self._ack_id = agent.next_ack_id()
            agent.service_proxy.join_log(agent.log_position, agent.append_position, agent.member_id, session_id,
                                         agent.context.replay_stream_id, False, int(ClusterRole.FOLLOWER),
                                         agent.context.replay_channel)
            self._joined = True
            self._services_ready = False
            return 1
        if not self._services_ready:
            if agent.services_acked(self._ack_id, agent.log_position) is None:
                self._check_deadline(now_ns, "waiting for the services to join the log replay")
                return 0
            self._services_ready = True
        work = agent.poll_log(agent.append_position)
        if agent.log_position >= agent.append_position:
            agent.close_log_replay()
            self.set_state(ElectionState.LEADER_INIT, now_ns)
            return 1
        if not work:
            self._check_deadline(now_ns, f"replaying the log (at {agent.log_position} of {agent.append_position})")
        else:
            self.deadline_ns = now_ns + agent.context.service_ack_timeout_ns
        return work

    def leader_init(self, now_ns: int) -> int:
        agent = self.agent
        if not self._joined:
            agent.start_leadership_term()
            self._ack_id = agent.next_ack_id()
            agent.service_proxy.join_log(agent.append_position, NULL_POSITION, agent.member_id, agent.log_session_id,
                                         agent.context.log_stream_id, False, int(ClusterRole.LEADER),
                                         agent.live_log_channel())
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
        if publisher.append_new_leadership_term(agent.leadership_term_id, publisher.position, agent.cluster_time(),
                                                agent.term_base_log_position, agent.member_id, agent.log_session_id,
                                                agent.context.app_version) <= 0:
            self._check_deadline(now_ns, "appending the NewLeadershipTermEvent")
            return 0
        self.set_state(ElectionState.CLOSED, now_ns)
        agent.on_election_complete()
        return 1

    def closed(self, now_ns: int) -> int:
        return 0

