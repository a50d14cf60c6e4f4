"""The clustered service container's agent.

It loads the service's snapshot (told by the consensus module's recovery
state counter), starts the service, then follows the consensus module's
instructions on the service stream (104): JoinLog (a log replay, or the live
log), ServiceTerminationPosition, requests for an acknowledgement.  The log
is polled bounded by the commit position counter, so the service never sees
a message that is not committed.  What the service sends back (timers,
session closes, messages into the cluster, acknowledgements) goes to the
consensus module on stream 105.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulmar.aeron import RegistrationError
from fulmar.archive.client import AeronArchive
from fulmar.channel_uri import WAKE_ON_DATA_PARAM, ChannelUri
from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.consensus.mark_file import read_liveness
from fulmar.consensus.protocol import (
    CLUSTER_ACTION_FLAGS_DEFAULT,
    CLUSTER_SCHEMA_ID,
    SESSION_MESSAGE_BLOCK_LENGTH,
    SESSION_MESSAGE_FRAME,
    SESSION_MESSAGE_TEMPLATE_ID,
    cluster_action_flags,
    session_message_frame,
)
from fulmar.consensus.snapshot import (
    SERVICE_SNAPSHOT_TYPE_ID,
    SnapshotError,
    SnapshotWriter,
    decode_snapshot,
    read_snapshot,
)
from fulmar.errors import FulmarError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header, SessionMessages
from fulmar.log_writer import ADMIN_ACTION
from fulmar.retry import RetryBackoff
from fulmar.service.clustered_service import ClientSession, CloseReason, ClusteredService, Role
from fulmar.service.context import ServiceContext
from fulmar.service.errors import ServiceErrorHandler

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.publication import Publication
    from fulmar.subscription import Image, Subscription

NULL_POSITION = -1
_SESSION_HEADER_LENGTH = codecs.HEADER_LENGTH + codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH
_RECOVERY_HEAD = struct.Struct("<qqqiii")


class ServiceTerminated(FulmarError):
    """The service reached its termination position (an orderly stop)."""


class StoppedBeforeStart(FulmarError):
    """A stop was asked for while the service waited, at its start, for a consensus module there is not."""


_CLIENT_HEARTBEAT_TYPE_ID = 11
# A live client's heartbeat counter is refreshed every keepalive (at most a
# quarter of the driver's client timeout): older than this, the client is dead.
_HEARTBEAT_FRESH_MS = 3_000


def _live_clients(reader: Any) -> set[int]:
    """Client ids whose heartbeat counter the driver still holds and that kept alive lately."""
    now_ms = time.time_ns() // 1_000_000
    alive = set()
    for counter in reader:
        if counter.type_id == _CLIENT_HEARTBEAT_TYPE_ID:
            if now_ms - reader.counter_value(counter.counter_id) < _HEARTBEAT_FRESH_MS:
                alive.add(int.from_bytes(counter.key[:8], "little", signed=True))
    return alive


class ClientSessionHandle:
    """A client session in the service (``ClientSession``)."""

    def __init__(
        self,
        agent: ClusteredServiceAgent,
        session_id: int,
        response_stream_id: int,
        response_channel: str,
        encoded_principal: bytes,
    ) -> None:
        self._agent = agent
        self.id = session_id
        self.response_stream_id = response_stream_id
        self.response_channel = response_channel
        self.encoded_principal = encoded_principal
        self.publication: Publication | None = None

    def connect(self, aeron: Aeron) -> None:
        if self.publication is None:
            self.publication = aeron.add_publication(self.response_channel, self.response_stream_id)
            # Replies of a cycle's messages go out together: the container rings once per cycle.
            self.publication.defer_rings()

    def disconnect(self) -> None:
        if self.publication is not None:
            self.publication.close()
            self.publication = None

    def offer(self, payload: bytes | bytearray | memoryview) -> int:
        if self._agent.role is not Role.LEADER:
            return 1  # followers' replies are not sent: the leader's are
        if self.publication is None:
            return -1
        # One bytes object: the publication's native fast path takes it whole.
        message = session_message_frame(self._agent.leadership_term_id, self.id, self._agent.time) + payload
        result = self.publication.offer(message)
        if result == ADMIN_ACTION:
            result = self.publication.offer(message)
        return int(result)

    def close(self) -> bool:
        return self._agent.close_client_session(self.id)

    def __repr__(self) -> str:
        return f"ClientSession(id={self.id})"


class _SnapshotImage:
    def __init__(self, messages: list[bytes]) -> None:
        self._messages = messages

    def messages(self) -> Iterator[bytes]:
        return iter(self._messages)


class ClusteredServiceAgent:
    def __init__(
        self,
        context: ServiceContext,
        aeron: Aeron,
        archive: AeronArchive,
        service: ClusteredService,
        record_error: Callable[[str], object] = lambda text: None,
    ) -> None:
        self.context = context
        self.aeron = aeron
        self.archive = archive
        self.service = service
        self.record_error = record_error
        # Every exception of the service's callbacks goes through it (on_service_error).
        self.errors = ServiceErrorHandler(context.service_id, context.on_service_error, record_error)
        self.service_id = context.service_id
        self.member_id = context.member_id
        self.consensus_module_pid: int | None = None  # the module this service follows (found at start)
        self._stop_requested: Callable[[], bool] = lambda: False  # during start (see start)
        self.role = Role.FOLLOWER
        self.log_applied_ns = 0  # (time.monotonic_ns) when a duty cycle last applied log
        self._batching_commits = False  # see pause_ns
        self.leadership_term_id = protocol.NULL_VALUE
        self.time = 0
        self.log_position = 0
        self.sessions: dict[int, ClientSessionHandle] = {}
        self.terminated = False
        self._ack_id = 0
        self._buffer = bytearray(64 * 1024)
        # Exclusive (see the consensus module): never shared with a dead predecessor.
        self._to_module = aeron.add_exclusive_publication(context.control_channel, context.consensus_module_stream_id)
        self._from_module = aeron.add_subscription(context.control_channel, context.service_stream_id)
        self._control_assembler = FragmentAssembler(self._on_control_message)
        self._log_assembler = FragmentAssembler(self._on_log_message)
        self._session_header = codecs.SessionMessageHeaderDecoder()  # reused for every log message
        self._commit_counter_id = protocol.NULL_VALUE
        self._commit_watched = False  # is this container rung when commit-pos moves
        self._active_log: Any = None
        self._join_retry = RetryBackoff()
        self._log_subscription: Subscription | None = None
        self._log_image: Image | None = None
        self._max_log_position = NULL_POSITION
        self._termination_position = NULL_POSITION
        self.idle_strategy: Any = None  # the container's, for Cluster.idle

    # -------------------------------------------------------------- start

    # The snapshot the service started from (None: the log's start), at log position self.log_position.
    snapshot_recording_id: int | None = None

    def start(self, deadline_s: float = 30.0, stop_requested: Callable[[], bool] = lambda: False) -> None:
        """Load the snapshot the consensus module says to, start the service, acknowledge.

        A stop asked for meanwhile (``stop_requested``) ends the wait for the
        consensus module once there is no live one (StoppedBeforeStart): as in
        the run, the service waits for its module's orderly stop, not for a
        module that is gone or never came."""
        deadline = time.monotonic() + deadline_s
        self._stop_requested = stop_requested
        self._await_consensus_module(deadline)
        recovery = self._await_counter(protocol.RECOVERY_STATE_TYPE_ID, deadline, "the recovery state counter")
        self._commit_counter_id = self._await_counter(
            protocol.COMMIT_POSITION_TYPE_ID, deadline, "the commit position counter"
        )
        # The module rings commit-pos's watchers when it moves it: this
        # service then wakes for what it may apply, not for every append.
        self._commit_watched = self.aeron.conductor.counter_watch().watch(self._commit_counter_id)
        if not self._commit_watched:
            self.record_error(
                f"service {self.service_id}: commit-pos counter {self._commit_counter_id} has no free "
                "watcher slot: this service notices commits by its idle timeout and the log's data"
            )
        key = self.aeron.counters_reader.counter_key(recovery)
        term_id, log_position, timestamp, _, _, count = _RECOVERY_HEAD.unpack_from(key, 0)
        snapshot_ids = [struct.unpack_from("<q", key, _RECOVERY_HEAD.size + 8 * i)[0] for i in range(count)]
        self.leadership_term_id = term_id
        self.log_position = log_position
        self.time = timestamp
        snapshot = None
        if self.service_id < len(snapshot_ids) and snapshot_ids[self.service_id] != protocol.NULL_VALUE:
            self.snapshot_recording_id = snapshot_ids[self.service_id]
            snapshot = self._load_snapshot(self.snapshot_recording_id)
        try:
            self.service.on_start(self, snapshot)
        except Exception as error:
            # Whatever on_service_error says: a service that did not start, or
            # did not load its snapshot, holds a state the log does not continue
            # from, and would apply the rest of it differently from the others.
            self.errors.fail("on_start", error, log_position, "a service that did not start cannot go on")
        self._ack(log_position)

    def _await_consensus_module(self, deadline: float) -> None:
        """Wait for this node's consensus module to be up: its mark file ready
        and its process alive.  After a crash the dead module's counters linger
        in the driver for a while; only once the live module has published its
        own (it signals ready after creating them) can the newest be trusted."""
        path = Path(self.context.cluster_dir) / "cluster-mark.dat"
        while True:
            self.aeron.do_work()
            # Only the head of the file: a restarting module recreates it
            # (truncated, then zero-filled) while this reads.
            liveness = read_liveness(path)
            if liveness is not None and liveness.is_ready and liveness.is_active(time.time_ns() // 1_000_000):
                self.consensus_module_pid = liveness.pid
                return
            if self._stop_requested() and not (
                liveness is not None and liveness.is_active(time.time_ns() // 1_000_000)
            ):
                raise StoppedBeforeStart("before it started (no live consensus module)")
            if time.monotonic() > deadline:
                raise FulmarError(f"service {self.service_id}: no live consensus module has claimed {path}")
            time.sleep(0.005)

    def _await_counter(self, type_id: int, deadline: float, what: str) -> int:
        """The cluster's counter of ``type_id`` held by a live consensus module.

        After a crash the dead module's counters stay until the driver times
        its client out, so a counter only counts if its owner's client
        heartbeat is fresh, and the newest such counter wins."""
        cluster_key = struct.pack("<i", self.context.cluster_id)
        key_offset = 28 if type_id == protocol.RECOVERY_STATE_TYPE_ID else 0  # where the cluster id sits
        while True:
            self.aeron.do_work()
            reader = self.aeron.counters_reader
            alive = _live_clients(reader)
            best, best_registration = protocol.NULL_VALUE, -1
            for counter in reader:
                if counter.type_id != type_id or counter.key[key_offset : key_offset + 4] != cluster_key:
                    continue
                if reader.counter_owner_id(counter.counter_id) not in alive:
                    continue
                registration = reader.counter_registration_id(counter.counter_id)
                if registration > best_registration:
                    best, best_registration = counter.counter_id, registration
            if best != protocol.NULL_VALUE:
                return best
            if self._stop_requested():
                liveness = read_liveness(Path(self.context.cluster_dir) / "cluster-mark.dat")
                if (
                    liveness is None
                    or liveness.pid != self.consensus_module_pid
                    or not liveness.is_active(time.time_ns() // 1_000_000)
                ):
                    raise StoppedBeforeStart("before it started (its consensus module is gone)")
            if time.monotonic() > deadline:
                raise FulmarError(
                    f"service {self.service_id}: no {what} for cluster {self.context.cluster_id} "
                    "(is the consensus module running?)"
                )
            time.sleep(0.005)

    def _load_snapshot(self, recording_id: int) -> _SnapshotImage:
        messages = read_snapshot(
            self.aeron, self.archive, recording_id, self.context.replay_channel, self.context.replay_stream_id
        )
        user: list[bytes] = []
        for record in decode_snapshot(messages, SERVICE_SNAPSHOT_TYPE_ID):
            if isinstance(record, codecs.ClientSessionDecoder):
                self.sessions[record.cluster_session_id] = ClientSessionHandle(
                    self,
                    record.cluster_session_id,
                    record.response_stream_id,
                    record.response_channel,
                    bytes(record.encoded_principal),
                )
            elif isinstance(record, bytes):
                user.append(record)
            elif not isinstance(record, codecs.SnapshotMarkerDecoder):
                raise SnapshotError(f"unexpected {type(record).__name__} in service snapshot {recording_id}")
        return _SnapshotImage(user)

    # ---------------------------------------------------------- duty cycle

    def has_work(self) -> bool:
        """A cheap check before sleeping: a control message, or committed log to apply?"""
        if self._from_module.is_data_available():
            return True
        if self.aeron.conductor.has_driver_news():
            return True  # an image to add: the container runs the client conductor at once
        image = self._log_image
        if image is None or not image.is_data_available():
            return False
        return self.aeron.counters_reader.counter_value(self._commit_counter_id) > image.position

    def idle_wait_ns(self, max_wait_ns: int) -> int:
        """How long the idle container may sleep: ``max_wait_ns`` while it
        follows its log, the slow tick's pace while a join (its image, a retry
        after a refusal) or its termination is awaited, or while commit-pos
        has no watcher slot for it (commits are then noticed by the wait)."""
        if self._active_log is not None or self._termination_position != NULL_POSITION or not self._commit_watched:
            return min(max_wait_ns, self.context.slow_tick_interval_ns)
        return max_wait_ns

    def do_work(self, now_ns: int) -> int:
        work = self._from_module.poll(self._control_assembler.on_fragment, 16)
        if self._active_log is not None and self._log_image is None and self._join_retry.may_attempt(now_ns):
            try:
                work += self._join_active_log()
            except RegistrationError as error:
                # The module's log subscription this one names went before it
                # could be added (an election began meanwhile and closed it):
                # try again after a back-off; the module's next JoinLog, for the
                # log it opens then, replaces this one.
                self.record_error(
                    f"service {self.service_id}: joining the log at position {self._active_log.log_position}: {error}"
                )
                self._join_retry.on_failure(now_ns)
            else:
                self._join_retry.on_success()
        applied = self._poll_log()
        if applied:
            if now_ns - self.log_applied_ns < self.context.follower_apply_interval_ns:
                self._batching_commits = True  # commits come faster than the interval
            self.log_applied_ns = now_ns
        try:
            work += applied + self.service.do_background_work(now_ns)
        except Exception as error:
            # Not from the log (it must not change replicated state): going on is safe.
            self.errors.on_callback_error("do_background_work", error, self.log_position)
            work += applied
        return work

    def pause_ns(self, now_ns: int) -> int:
        """How long a container with nothing to do sleeps off its doorbell
        before it waits on it again.  A service that does not lead, once
        commits come faster than its follower apply interval, waits out the
        rest of the interval after each pass (a commit's ring meanwhile finds
        nobody asleep, and costs its module no wake-up call), and goes back
        to its doorbell after a pass that found nothing; one whose commits
        come slower waits on its doorbell at once (0), as any leader's does:
        a pause after each of them would only add a wake-up."""
        if not self._batching_commits:
            return 0
        if self.role is not Role.LEADER:
            remaining = self.log_applied_ns + self.context.follower_apply_interval_ns - now_ns
            if remaining > 0:
                return remaining
        self._batching_commits = False
        return 0

    def _on_control_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        try:
            message = codecs.decode(buffer, offset, length)
        except CodecError as error:
            self.record_error(f"service {self.service_id}: malformed control message ignored: {error}")
            return
        if isinstance(message, codecs.JoinLogDecoder):
            # Stop where the new log starts; join it once the current image is done.
            self._max_log_position = message.log_position
            self._active_log = message
            self._join_retry.on_success()  # a new log: no back-off from the last one
            if self._log_image is None and self._log_subscription is not None:
                # A join still waiting for its image (that log ended before it
                # came, its election gave it up): its subscription names the old
                # log's channel, where the new log's image never comes.
                self._log_subscription.close()
                self._log_subscription = None
        elif isinstance(message, codecs.ServiceTerminationPositionDecoder):
            self._termination_position = message.log_position
        elif isinstance(message, codecs.RequestServiceAckDecoder):
            self._ack(message.log_position)

    def _join_active_log(self) -> int:
        log = self._active_log
        if self._log_subscription is None:
            channel = ChannelUri.parse(log.log_channel)
            if channel.get("session-id") is None:
                channel = channel.with_param("session-id", log.log_session_id)
            if self._commit_watched:
                # The log is read up to the commit position, and its module rings
                # this container whenever that moves (never before the log holds
                # it): data landing beyond it would wake it for nothing.
                channel = channel.with_param(WAKE_ON_DATA_PARAM, False)
            self._log_subscription = self.aeron.add_subscription(str(channel), log.log_stream_id)
        image = self._log_subscription.image_by_session_id(log.log_session_id)
        if image is None:
            self.aeron.do_work()
            return 0
        self._log_image = image
        self._max_log_position = log.max_log_position
        self._active_log = None
        role = Role(log.role) if log.role in (0, 1, 2) else Role.FOLLOWER
        # As Aeron's joinActiveLog: the leader's service shares its sessions'
        # egress with the module (also when it leads again after letting go of
        # them); any other holds none.
        for session in self.sessions.values():
            if role is Role.LEADER:
                session.connect(self.aeron)
            else:
                session.disconnect()
        self._set_role(role)
        self._ack(log.log_position)
        return 1

    def _set_role(self, role: Role) -> None:
        if role is not self.role:
            self.role = role
            try:
                self.service.on_role_change(role)
            except Exception as error:
                self.errors.on_callback_error("on_role_change", error, self.log_position)

    def _poll_log(self) -> int:
        image = self._log_image
        if image is None:
            return self._check_termination()
        limit = self.aeron.counters_reader.counter_value(self._commit_counter_id)
        if self._max_log_position != NULL_POSITION:
            limit = min(limit, self._max_log_position)
        work = image.bounded_poll_session_runs(
            self._log_assembler.on_fragment, self._on_log_session_messages, limit, 32
        )
        if image.position > self.log_position:
            self.log_position = image.position
        if (self._max_log_position != NULL_POSITION and image.position >= self._max_log_position) or image.is_closed:
            # The replay is done (or the log went away): leave it for the next JoinLog.
            if self._log_subscription is not None:
                self._log_subscription.close()
            self._log_subscription = None
            self._log_image = None
            if image.is_closed:
                # The module closed the log (its election began, seed 001 INIT): until
                # a JoinLog says otherwise this member leads nobody, so the clients'
                # egress goes, as in Aeron's closeLog; the new leader reaches them.
                for session in self.sessions.values():
                    session.disconnect()
                self._set_role(Role.FOLLOWER)
        return work + self._check_termination()

    def _check_termination(self) -> int:
        if self._termination_position != NULL_POSITION and self.log_position >= self._termination_position:
            try:
                self.service.on_terminate(self)
            except Exception as error:
                self.errors.on_callback_error("on_terminate", error, self.log_position)
            self._ack(self._termination_position)
            self.terminated = True
            self._termination_position = NULL_POSITION
            return 1
        return 0

    # ------------------------------------------------------------- the log

    def _on_log_session_messages(self, messages: SessionMessages) -> None:
        """The hot path: a run of client (and service) messages, each handed
        to the service with its session, as ``_on_log_message`` would.  A
        message whose handler raises is the only one of the run it costs."""
        on_session_message = self.service.on_session_message
        sessions = self.sessions
        view = messages.view
        timestamps = messages.timestamps
        end_positions = messages.end_positions
        offsets = messages.message_offsets
        lengths = messages.message_lengths
        for i, session_id in enumerate(messages.session_ids):
            self.log_position = end_positions[i]
            timestamp = self.time = timestamps[i]
            try:
                on_session_message(
                    sessions.get(session_id),
                    timestamp,
                    view,
                    offsets[i] + _SESSION_HEADER_LENGTH,
                    lengths[i] - _SESSION_HEADER_LENGTH,
                )
            except Exception as error:
                self.errors.on_callback_error("on_session_message", error, self.log_position)

    def _on_log_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        self.log_position = header.position
        if length >= _SESSION_HEADER_LENGTH:
            # The hot path, a client's message: its frame unpacked in one go.
            block_length, template, schema, _version, _term_id, session_id, timestamp = (
                SESSION_MESSAGE_FRAME.unpack_from(buffer, offset)
            )
            if (
                template == SESSION_MESSAGE_TEMPLATE_ID
                and schema == CLUSTER_SCHEMA_ID
                and block_length == SESSION_MESSAGE_BLOCK_LENGTH
            ):
                self.time = timestamp
                self._session_message(self.sessions.get(session_id), timestamp, buffer, offset, length)
                return
        try:
            message_header = codecs.read_header(buffer, offset, length)
            if message_header.template_id == codecs.SessionMessageHeaderEncoder.TEMPLATE_ID:
                session_header = self._session_header.wrap_and_apply_header(buffer, offset, length)
                self.time = session_header.timestamp
                session = self.sessions.get(session_header.cluster_session_id)
                self._session_message(session, session_header.timestamp, buffer, offset, length)
                return
            message = codecs.decode(buffer, offset, length)
        except CodecError as error:
            self.record_error(f"service {self.service_id}: malformed log message at {header.position}: {error}")
            return
        if isinstance(message, codecs.SessionOpenEventDecoder):
            self.time = message.timestamp
            session = ClientSessionHandle(
                self,
                message.cluster_session_id,
                message.response_stream_id,
                message.response_channel,
                bytes(message.encoded_principal),
            )
            self.sessions[session.id] = session
            if self.role is Role.LEADER:
                session.connect(self.aeron)
            try:
                self.service.on_session_open(session, message.timestamp)
            except Exception as error:
                self.errors.on_callback_error("on_session_open", error, self.log_position)
        elif isinstance(message, codecs.SessionCloseEventDecoder):
            self.time = message.timestamp
            closed = self.sessions.pop(message.cluster_session_id, None)
            if closed is not None:
                closed.disconnect()
                try:
                    self.service.on_session_close(closed, message.timestamp, CloseReason(message.close_reason_raw))
                except Exception as error:
                    self.errors.on_callback_error("on_session_close", error, self.log_position)
        elif isinstance(message, codecs.TimerEventDecoder):
            self.time = message.timestamp
            try:
                self.service.on_timer_event(message.correlation_id, message.timestamp)
            except Exception as error:
                self.errors.on_callback_error("on_timer_event", error, self.log_position)
        elif isinstance(message, codecs.ClusterActionRequestDecoder):
            self.time = message.timestamp
            # Seed 004: a SNAPSHOT flagged for standby members is not this
            # member's to take (Aeron's shouldSnapshot; no standby runs here).
            if (
                message.action_raw == codecs.ClusterAction.SNAPSHOT
                and cluster_action_flags(message) == CLUSTER_ACTION_FLAGS_DEFAULT
            ):
                recording_id = self._take_snapshot(message.log_position, message.leadership_term_id)
                self._ack(message.log_position, recording_id)
        elif isinstance(message, codecs.NewLeadershipTermEventDecoder):
            self.time = message.timestamp
            self.leadership_term_id = message.leadership_term_id
            try:
                self.service.on_new_leadership_term_event(
                    message.leadership_term_id,
                    message.log_position,
                    message.timestamp,
                    message.term_base_log_position,
                    message.leader_member_id,
                    message.log_session_id,
                    message.app_version,
                )
            except Exception as error:
                self.errors.on_callback_error("on_new_leadership_term_event", error, self.log_position)

    def _session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        """The message of the session header at ``offset`` to the service."""
        try:
            self.service.on_session_message(
                session, timestamp, buffer, offset + _SESSION_HEADER_LENGTH, length - _SESSION_HEADER_LENGTH
            )
        except Exception as error:
            self.errors.on_callback_error("on_session_message", error, self.log_position)

    def _take_snapshot(self, log_position: int, leadership_term_id: int) -> int:
        writer = SnapshotWriter(
            self.aeron, self.archive, self.context.snapshot_channel, self.context.snapshot_stream_id
        )
        writer.marker(SERVICE_SNAPSHOT_TYPE_ID, log_position, leadership_term_id, codecs.SnapshotMark.BEGIN)
        for session in sorted(self.sessions.values(), key=lambda s: s.id):
            writer.encode(
                codecs.ClientSessionEncoder,
                cluster_session_id=session.id,
                response_stream_id=session.response_stream_id,
                response_channel=session.response_channel,
                encoded_principal=session.encoded_principal,
            )
        try:
            self.service.on_take_snapshot(writer)
        except Exception as error:
            # Whatever on_service_error says: a snapshot without all of the
            # state would be loaded later as if it were whole, and the member
            # (or one that copies it) would then differ from the others.
            self.errors.fail("on_take_snapshot", error, log_position, "a snapshot must hold the whole state")
        writer.marker(SERVICE_SNAPSHOT_TYPE_ID, log_position, leadership_term_id, codecs.SnapshotMark.END)
        return writer.close()

    # ------------------------------------------- the Cluster handle (service API)

    @property
    def cluster_time(self) -> int:
        return self.time

    def client_sessions(self) -> list[ClientSession]:
        return list(self.sessions.values())

    def get_client_session(self, cluster_session_id: int) -> ClientSession | None:
        return self.sessions.get(cluster_session_id)

    def close_client_session(self, cluster_session_id: int) -> bool:
        if cluster_session_id not in self.sessions:
            return False
        return self._send(codecs.CloseSessionEncoder, cluster_session_id=cluster_session_id)

    def schedule_timer(self, correlation_id: int, deadline: int) -> bool:
        return self._send(codecs.ScheduleTimerEncoder, correlation_id=correlation_id, deadline=deadline)

    def cancel_timer(self, correlation_id: int) -> bool:
        return self._send(codecs.CancelTimerEncoder, correlation_id=correlation_id)

    def idle(self, work_count: int = 0) -> None:
        if self.idle_strategy is not None:
            self.idle_strategy.idle(work_count)
        elif not work_count:
            time.sleep(0.0001)

    def offer(self, payload: bytes | bytearray | memoryview) -> bool:
        header = bytearray(_SESSION_HEADER_LENGTH)
        codecs.SessionMessageHeaderEncoder.encode(
            header,
            0,
            leadership_term_id=self.leadership_term_id,
            cluster_session_id=self.service_id,
            timestamp=self.time,
        )
        return self._offer_parts([header, payload])

    # --------------------------------------------------------------- plumbing

    def _ack(self, log_position: int, relevant_id: int = protocol.NULL_VALUE) -> None:
        ack_id = self._ack_id
        self._ack_id += 1
        if not self._send(
            codecs.ServiceAckEncoder,
            log_position=log_position,
            timestamp=self.time,
            ack_id=ack_id,
            relevant_id=relevant_id,
            service_id=self.service_id,
        ):
            raise FulmarError(f"service {self.service_id}: could not acknowledge position {log_position}")

    def _send(self, encoder: Any, **fields: Any) -> bool:
        length = encoder.encode(self._buffer, 0, **fields)
        return self._offer_parts([bytes(self._buffer[:length])])

    def _offer_parts(self, parts: list[Any]) -> bool:
        """To the consensus module, waiting out back pressure (bounded): what a
        service sends must not be lost."""
        deadline = time.monotonic() + 10
        while True:
            result = self._to_module.offer_parts(parts)
            if result > 0:
                return True
            if time.monotonic() > deadline:
                self.record_error(f"service {self.service_id}: the consensus module took nothing for 10 s ({result})")
                return False
            self.aeron.do_work()
            if result != ADMIN_ACTION:
                time.sleep(0.0001)

    def close(self) -> None:
        for session in self.sessions.values():
            session.disconnect()
        if self._log_subscription is not None:
            self._log_subscription.close()
        self._to_module.close()
        self._from_module.close()
