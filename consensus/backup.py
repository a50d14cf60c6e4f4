"""ClusterBackup: a copy of a cluster's log and snapshots kept off the cluster
(Aeron's ClusterBackup and ClusterBackupAgent).

A backup is a process of its own beside a media driver and an archive of its
own.  It is not a member: it never votes and the cluster does not wait for
it.  Its duty cycle walks Aeron's states:

- BACKUP_QUERY: a BackupQuery on a member's consensus endpoint (stream 108),
  the answer on the backup's own consensus endpoint.  A member that does not
  answer within the response timeout is passed over for the next one; an
  answer from a member that is not the log source wanted (the leader, by
  default) sends the next query to the leader it names.
- SNAPSHOT_RETRIEVE: each snapshot the answer lists and the backup lacks is
  replicated from the member's archive into the backup's (ReplicateRequest2).
- LIVE_LOG_RECORD: the backup's archive records the backup's catchup endpoint
  (a new recording, or the one it has, extended).
- LIVE_LOG_REPLAY: the member's archive replays its log recording to that
  endpoint from where the backup's copy ends, bounded by the member's commit
  position counter (BoundedReplayRequest), so the copy never holds an entry
  the cluster did not commit.
- UPDATE_RECORDING_LOG: the backup's own ``recording.log`` gets the terms and
  snapshots, so a member can be restored from the backup's directories.
- BACKING_UP: the copy follows the live log; at each backup interval it asks
  again (new snapshots; a new leader: the copy is reset and follows it).
- RESET_BACKUP: after an error, a stall, a lost log source or a new leader,
  everything is let go and, after a cool-down, it queries again.

Counters (Aeron's type ids): the state (208), the live log position (209),
the next query deadline in epoch ms (210), errors (211), snapshots retrieved
(240).  Differences from Aeron, on purpose: the default backup interval is 5 s
(Aeron's is an hour; a query costs a member one short-lived session), the
cool-down is 1 s (30 s), and the log source is the leader by default (Aeron's
default is any member); ``log_source`` takes ``leader``, ``follower`` or
``any``.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulmar import log_lines
from fulmar.aeron import Aeron
from fulmar.agent import DUTY_CYCLE_ERROR_MAX_BACKOFF_NS
from fulmar.archive import protocol as archive_protocol
from fulmar.archive.client import AeronArchive, RecordingSignal, RecordingSignalEvent, SourceLocation
from fulmar.archive.protocol import RECORDING_POSITION_TYPE_ID, recording_position_ids
from fulmar.channel_uri import ChannelUri
from fulmar.clock import epoch_ms
from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.codecs.generated.cluster_mark import ClusterComponentType
from fulmar.consensus import protocol
from fulmar.consensus.cluster_member import ClusterMember, find_member, parse_cluster_members
from fulmar.consensus.mark_file import ClusterMarkFile
from fulmar.consensus.recording_log import (
    CONSENSUS_MODULE_SERVICE_ID,
    RecordingLog,
    Snapshot,
)
from fulmar.errors import FulmarError
from fulmar.idle import DoorbellIdleStrategy
from fulmar.permissions import make_directory
from fulmar.retry import RetryBackoff
from fulmar.stop_signals import StopKind, StopSignalHandlers, StopSignals

if TYPE_CHECKING:
    from fulmar.publication import ExclusivePublication

NULL_VALUE = protocol.NULL_VALUE
NULL_POSITION = protocol.NULL_POSITION
NULL_LENGTH = -1

CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID = 209
CLUSTER_BACKUP_QUERY_DEADLINE_TYPE_ID = 210
CLUSTER_BACKUP_ERROR_COUNT_TYPE_ID = 211
CLUSTER_BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID = 240

SLOW_TICK_INTERVAL_NS = 10_000_000
# A member's archive answers within the backup response timeout (at least
# this), or the backup starts over: its requests block the backup's duty
# cycle, which has nothing else to serve meanwhile.
CLUSTER_ARCHIVE_MESSAGE_TIMEOUT_MIN_NS = 1_000_000_000


class ClusterBackupState(IntEnum):
    """Aeron's ClusterBackup.State, with its codes (the state counter's values)."""

    BACKUP_QUERY = 0
    SNAPSHOT_RETRIEVE = 1
    LIVE_LOG_RECORD = 2
    LIVE_LOG_REPLAY = 3
    UPDATE_RECORDING_LOG = 4
    BACKING_UP = 5
    RESET_BACKUP = 6
    CLOSED = 7


LOG_SOURCES = ("leader", "follower", "any")


class ClusterBackupError(FulmarError):
    """Something the backup cannot go on from without starting over."""


@dataclass
class ClusterBackupContext:
    cluster_dir: Path
    driver_dir: Path | None = None
    # The members' consensus endpoints to query (host:port, comma separated).
    cluster_consensus_endpoints: str = ""
    # Where members answer this backup (host:port, on the consensus channel).
    consensus_endpoint: str = "127.0.0.1:0"
    consensus_channel: str = "aeron:udp?term-length=64k"
    consensus_stream_id: int = protocol.CONSENSUS_STREAM_ID
    # Where the log source's archive replays the log to (host:port).
    catchup_endpoint: str = "127.0.0.1:0"
    catchup_channel: str = "aeron:udp"
    log_stream_id: int = protocol.LOG_STREAM_ID
    # This backup's own archive.
    archive_control_channel: str = archive_protocol.LOCAL_CONTROL_CHANNEL
    archive_control_stream_id: int = archive_protocol.CONTROL_STREAM_ID
    archive_response_stream_id: int = 122
    # A member's archive: its control channel's endpoint comes from the members string.
    cluster_archive_control_channel: str = "aeron:udp"
    cluster_archive_response_channel: str = "aeron:udp?endpoint=127.0.0.1:0"
    cluster_archive_response_stream_id: int = 123
    # Where this backup's archive receives a snapshot replicated from a member's.
    replication_channel: str = "aeron:udp?endpoint=127.0.0.1:0"
    cluster_id: int = 0
    log_source: str = "leader"
    backup_interval_ns: int = 5_000_000_000
    backup_response_timeout_ns: int = 2_000_000_000
    backup_progress_timeout_ns: int = 10_000_000_000
    cool_down_interval_ns: int = 1_000_000_000
    encoded_credentials: bytes = b""
    # What the backup presents to the members' archives (the snapshots'
    # replication, the live log's replay); None: ``encoded_credentials``.
    archive_credentials: bytes | None = None
    # The longest an idle backup sleeps while BACKING_UP (its archive records
    # the live log; what it does itself is seconds apart); in every other
    # state it keeps the slow tick's pace (SLOW_TICK_INTERVAL_NS).
    idle_max_wait_ns: int = 100_000_000
    mark_file_liveness_timeout_ms: int = 10_000
    # Testing hook: called with each state change (old, new).
    on_state_change: Callable[[ClusterBackupState, ClusterBackupState], None] | None = field(default=None, repr=False)


def _endpoint_channel(channel: str, endpoint: str, **params: str) -> str:
    uri = ChannelUri.parse(channel).with_param("endpoint", endpoint)
    for key, value in params.items():
        uri = uri.with_param(key.replace("_", "-"), value)
    return str(uri)


class SnapshotRetrieval:
    """One snapshot recording replicated from a member's archive into this
    backup's, followed through the backup archive's recording signals."""

    def __init__(self, snapshot: Snapshot, replication_id: int, correlation_id: int, source_stop_position: int) -> None:
        self.snapshot = snapshot
        self.replication_id = replication_id
        self.correlation_id = correlation_id  # the request's: the archive's signals carry it
        self.source_stop_position = source_stop_position
        self.recording_id = NULL_VALUE
        self.ended = False

    def on_signal(self, event: RecordingSignalEvent) -> None:
        if (
            self.recording_id == NULL_VALUE
            and event.correlation_id == self.correlation_id
            and event.signal in (RecordingSignal.REPLICATE, RecordingSignal.START)
        ):
            self.recording_id = event.recording_id
        if event.recording_id == self.recording_id and event.signal in (
            RecordingSignal.REPLICATE_END,
            RecordingSignal.STOP,
        ):
            self.ended = True


class ClusterBackupAgent:
    """The backup's duty cycle (see the module's docstring)."""

    def __init__(
        self,
        context: ClusterBackupContext,
        aeron: Aeron,
        archive: AeronArchive,
        recording_log: RecordingLog,
        record_error: Callable[[str], object],
        log_event: Callable[[str], None],
    ) -> None:
        if context.log_source not in LOG_SOURCES:
            raise ValueError(f"log source {context.log_source!r} is not one of {', '.join(LOG_SOURCES)}")
        endpoints = [e.strip() for e in context.cluster_consensus_endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ValueError("a cluster backup needs the members' consensus endpoints")
        self.context = context
        self.aeron = aeron
        self.archive = archive
        self.recording_log = recording_log
        self._record_error = record_error
        self.log_event = log_event
        self.endpoints = endpoints
        self._endpoint_index = random.randrange(len(endpoints))
        self._next_endpoint: str | None = None  # a member named as the one to ask next
        key = protocol_key(context.cluster_id)
        self.state_counter = aeron.add_counter(
            protocol.CLUSTER_BACKUP_STATE_TYPE_ID, f"ClusterBackup state - clusterId={context.cluster_id}", key
        )
        self.live_log_position_counter = aeron.add_counter(
            CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID,
            f"ClusterBackup live log position - clusterId={context.cluster_id}",
            key,
        )
        self.next_query_deadline_counter = aeron.add_counter(
            CLUSTER_BACKUP_QUERY_DEADLINE_TYPE_ID,
            f"ClusterBackup next query deadline in ms - clusterId={context.cluster_id}",
            key,
        )
        self.error_counter = aeron.add_counter(
            CLUSTER_BACKUP_ERROR_COUNT_TYPE_ID, f"ClusterBackup errors - clusterId={context.cluster_id}", key
        )
        self.snapshot_retrieve_counter = aeron.add_counter(
            CLUSTER_BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID,
            f"ClusterBackup snapshot retrieve count - clusterId={context.cluster_id}",
            key,
        )
        self.consensus_subscription = aeron.add_subscription(
            _endpoint_channel(context.consensus_channel, context.consensus_endpoint), context.consensus_stream_id
        )
        self.response_channel = ""  # the consensus endpoint as the members must use it (its port resolved)
        self.state = ClusterBackupState.BACKUP_QUERY
        self.state_counter.set(int(self.state))
        self._publication: ExclusivePublication | None = None
        self._publication_endpoint = ""
        self._buffer = bytearray(4096)
        self.correlation_id = NULL_VALUE
        self._now_ns = 0
        self._slow_tick_deadline_ns = 0
        self._time_of_last_query_ns = 0
        self._time_of_last_progress_ns = time.monotonic_ns()  # (the duty cycle's clock)
        self._cool_down_deadline_ns = NULL_VALUE
        # What the last answer said.
        self.cluster_members: list[ClusterMember] = []
        self.log_supplier: ClusterMember | None = None
        self.leader_member_id = NULL_VALUE
        self.cluster_log_recording_id = NULL_VALUE
        self._leader_commit_counter_id = NULL_VALUE
        self._leader_log_entry: tuple[int, int] | None = None  # (leadership term id, term base position)
        self._leader_last_term_entry: tuple[int, int] | None = None
        self._snapshots_to_retrieve: list[Snapshot] = []
        self._snapshots_retrieved: list[Snapshot] = []
        self._retrieval: SnapshotRetrieval | None = None
        self.cluster_archive: AeronArchive | None = None
        # The live log.
        self._live_log_session_id = NULL_VALUE
        self._live_log_recording_subscription_id = NULL_VALUE
        self._live_log_replay_session_id = NULL_VALUE
        self.live_log_recording_id = NULL_VALUE
        self._live_log_counter_id = NULL_VALUE
        self._archive_id: int | None = None
        self.closed = False
        self._routine_query = False
        self.next_query_deadline_counter.set(0)

    # ------------------------------------------------------------ duty cycle

    def do_work(self, now_ns: int) -> int:
        self._now_ns = now_ns
        work = 0
        if now_ns >= self._slow_tick_deadline_ns:
            self._slow_tick_deadline_ns = now_ns + SLOW_TICK_INTERVAL_NS
            work += self._slow_tick()
        work += self.consensus_subscription.poll(self._on_fragment, 10)
        state = self.state
        try:
            if self._live_log_counter_id != NULL_VALUE and not self._live_log_counter_alive():
                # In every state, as Aeron resets when the counter becomes
                # unavailable: a backup querying at its interval keeps the
                # recording it follows, and an answer from the same leader
                # would otherwise have it wait for that recording's counter
                # for good (the whole cluster went down while it queried).
                self.log_event(
                    f"the live log recording {self.live_log_recording_id} stopped "
                    f"at {self.live_log_position_counter.get()} in {state.name}: starting over"
                )
                self._live_log_counter_id = NULL_VALUE
                self._set_state(ClusterBackupState.RESET_BACKUP)
                return work + 1
            if state is ClusterBackupState.BACKUP_QUERY:
                work += self._backup_query()
            elif state is ClusterBackupState.SNAPSHOT_RETRIEVE:
                work += self._snapshot_retrieve()
            elif state is ClusterBackupState.LIVE_LOG_RECORD:
                work += self._live_log_record()
            elif state is ClusterBackupState.LIVE_LOG_REPLAY:
                work += self._live_log_replay()
            elif state is ClusterBackupState.UPDATE_RECORDING_LOG:
                work += self._update_recording_log()
            elif state is ClusterBackupState.BACKING_UP:
                work += self._backing_up()
            elif state is ClusterBackupState.RESET_BACKUP:
                work += self._reset_backup()
            if (
                self._live_log_counter_id == NULL_VALUE
                and self.state is not ClusterBackupState.RESET_BACKUP
                and now_ns > self._time_of_last_progress_ns + self.context.backup_progress_timeout_ns
            ):
                self._error(
                    f"no progress in {self.state.name} for "
                    f"{self.context.backup_progress_timeout_ns // 1_000_000} ms: starting over"
                )
                self._set_state(ClusterBackupState.RESET_BACKUP)
        except FulmarError as error:
            # A member's archive refused or went away, a replication failed:
            # start over (after the cool-down) rather than stop.
            self._error(f"{state.name}: {error}")
            self._set_state(ClusterBackupState.RESET_BACKUP)
            work += 1
        return work

    def idle_wait_ns(self, max_wait_ns: int, now_ms: int) -> int:
        """How long the idle backup may sleep.  BACKING_UP: up to ``max_wait_ns``
        or until its next query, whichever is sooner (the live log's position
        is mirrored into its counter at that pace).  Any other state, or a query
        overdue: the slow tick's pace, for the answers, replications and
        recording signals it is waiting on, which no ring announces."""
        slow = min(max_wait_ns, SLOW_TICK_INTERVAL_NS)
        if self.state is not ClusterBackupState.BACKING_UP:
            return slow
        until_query_ns = (self.next_query_deadline_counter.get() - now_ms) * 1_000_000
        return max(slow, min(max_wait_ns, until_query_ns))

    def _slow_tick(self) -> int:
        work = self.aeron.do_work(self._now_ns)
        if not self.archive.proxy.publication.is_connected:
            raise ClusterBackupError("this backup's archive went away (its control requests have no subscriber)")
        try:
            self.archive.poll_for_signals()
        except FulmarError as error:
            self._error(f"backup archive: {error}")
            if self.state in (
                ClusterBackupState.SNAPSHOT_RETRIEVE,
                ClusterBackupState.LIVE_LOG_RECORD,
                ClusterBackupState.LIVE_LOG_REPLAY,
            ):
                self._set_state(ClusterBackupState.RESET_BACKUP)
        while self.archive.signals:
            event = self.archive.signals.popleft()
            if self._retrieval is not None:
                self._retrieval.on_signal(event)
        return work

    def _error(self, text: str) -> None:
        self.error_counter.increment()
        self._record_error(f"cluster backup: {text}")

    def _set_state(self, new_state: ClusterBackupState) -> None:
        if new_state is not self.state:
            old = self.state
            # The query at each interval that changes nothing goes unsaid: the
            # log shows what the backup did, not that it asked.
            if old is ClusterBackupState.BACKING_UP and new_state is ClusterBackupState.BACKUP_QUERY:
                self._routine_query = True
            elif new_state in (ClusterBackupState.SNAPSHOT_RETRIEVE, ClusterBackupState.RESET_BACKUP):
                self._routine_query = False
            if not self._routine_query:
                self.log_event(f"backup {old.name} -> {new_state.name}")
            if new_state is ClusterBackupState.BACKING_UP:
                self._routine_query = False
            self.state = new_state
            self.state_counter.set(int(new_state))
            if self.context.on_state_change is not None:
                self.context.on_state_change(old, new_state)
        self.correlation_id = NULL_VALUE

    # --------------------------------------------------------- the query

    def _current_endpoint(self) -> str:
        return self.endpoints[self._endpoint_index % len(self.endpoints)]

    def _next_publication(self) -> None:
        """Aim the consensus publication at the next member (or at the one an
        answer named)."""
        if self._next_endpoint is not None:
            endpoint, self._next_endpoint = self._next_endpoint, None
        else:
            self._endpoint_index = (self._endpoint_index + 1) % len(self.endpoints)
            endpoint = self._current_endpoint()
        self._close_publication()
        self._publication = self.aeron.add_exclusive_publication(
            _endpoint_channel(self.context.consensus_channel, endpoint), self.context.consensus_stream_id
        )
        self._publication_endpoint = endpoint

    def _close_publication(self) -> None:
        if self._publication is not None:
            self._publication.close()
            self._publication = None

    def _resolved_response_channel(self) -> str | None:
        if not self.response_channel:
            endpoint = self.context.consensus_endpoint
            if endpoint.endswith(":0"):
                resolved = self.consensus_subscription.resolved_endpoint
                if resolved is None:
                    return None
                endpoint = resolved
            self.response_channel = _endpoint_channel(self.context.consensus_channel, endpoint)
        return self.response_channel

    def _backup_query(self) -> int:
        now_ns = self._now_ns
        if self._publication is None or now_ns > self._time_of_last_query_ns + self.context.backup_response_timeout_ns:
            if self._publication is not None:
                self.log_event(
                    f"no answer from {self._publication_endpoint} within "
                    f"{self.context.backup_response_timeout_ns // 1_000_000} ms: asking the next member"
                )
            self._next_publication()
            self.correlation_id = NULL_VALUE
            self._time_of_last_query_ns = now_ns
            self._time_of_last_progress_ns = now_ns
            return 1
        if self.correlation_id == NULL_VALUE and self._publication.is_connected:
            response_channel = self._resolved_response_channel()
            if response_channel is None:
                return 0
            correlation_id = self.aeron.next_correlation_id()
            length = codecs.BackupQueryEncoder.encode(
                self._buffer,
                0,
                correlation_id=correlation_id,
                response_stream_id=self.context.consensus_stream_id,
                version=protocol.PROTOCOL_SEMANTIC_VERSION,
                response_channel=response_channel,
                encoded_credentials=self.context.encoded_credentials,
            )
            if self._publication.offer(bytes(self._buffer[:length])) > 0:
                self.correlation_id = correlation_id
                self._time_of_last_query_ns = now_ns
                return 1
        return 0

    def _on_fragment(self, buffer: Any, offset: int, length: int, header: Any) -> None:
        try:
            message = codecs.decode(bytes(buffer[offset : offset + length]))
        except CodecError as error:
            self._error(f"an answer on the consensus endpoint could not be decoded: {error}")
            return
        if isinstance(message, codecs.BackupResponseDecoder):
            self._on_backup_response(message)
        elif isinstance(message, codecs.ChallengeDecoder):
            self._on_challenge(message)
        elif isinstance(message, codecs.SessionEventDecoder):
            self._on_session_event(message)

    def _on_challenge(self, challenge: Any) -> None:
        if self._publication is None:
            return
        correlation_id = self.aeron.next_correlation_id()
        length = codecs.ChallengeResponseEncoder.encode(
            self._buffer,
            0,
            correlation_id=correlation_id,
            cluster_session_id=challenge.cluster_session_id,
            encoded_credentials=self.context.encoded_credentials,
        )
        if self._publication.offer(bytes(self._buffer[:length])) > 0:
            self.correlation_id = correlation_id

    def _on_session_event(self, event: Any) -> None:
        if event.correlation_id != self.correlation_id or self.correlation_id == NULL_VALUE:
            return
        code = event.code_raw
        if code in (codecs.EventCode.ERROR, codecs.EventCode.AUTHENTICATION_REJECTED):
            self._error(
                f"member at {self._publication_endpoint} refused the backup query: "
                f"{codecs.EventCode(code).name}: {event.detail}"
            )
            self._set_state(ClusterBackupState.RESET_BACKUP)
        elif code == codecs.EventCode.REDIRECT:
            self._set_state(ClusterBackupState.RESET_BACKUP)

    def _acceptable_source(self, leader_member_id: int, member_id: int) -> bool:
        source = self.context.log_source
        if source == "leader":
            return member_id == leader_member_id
        if source == "follower":
            return member_id != leader_member_id
        return True

    def _on_backup_response(self, response: Any) -> None:
        if self.state is not ClusterBackupState.BACKUP_QUERY or response.correlation_id != self.correlation_id:
            return
        member_id = response.member_id
        leader_member_id = response.leader_member_id
        try:
            members = parse_cluster_members(response.cluster_members)
        except FulmarError as error:
            self._error(f"member {member_id}'s answer names no usable members: {error}")
            self._set_state(ClusterBackupState.RESET_BACKUP)
            return
        if member_id == -(2**31) or member_id == NULL_VALUE:
            self._error("an answer without its member id: asking another member")
            self._set_state(ClusterBackupState.RESET_BACKUP)
            return
        if not self._acceptable_source(leader_member_id, member_id):
            # Ask the member that is: the leader the answer names (or the next one).
            if self.context.log_source == "leader":
                leader = find_member(members, leader_member_id)
                if leader is not None:
                    self._next_endpoint = leader.consensus_endpoint
            else:
                self._next_endpoint = None
            self.log_event(
                f"member {member_id} answered; it is not the log source wanted "
                f"({self.context.log_source}; the leader is member {leader_member_id})"
                + (": starting over" if self.log_supplier is not None else "")
            )
            if self.log_supplier is not None:
                self._set_state(ClusterBackupState.RESET_BACKUP)
            else:
                self._next_publication()
                self._time_of_last_query_ns = self._now_ns
                self.correlation_id = NULL_VALUE
            return
        if self.log_supplier is not None and self.log_supplier.id != member_id:
            self.log_event(f"the log source is now member {member_id} (was {self.log_supplier.id}): starting over")
            self._next_endpoint = self._publication_endpoint
            self._set_state(ClusterBackupState.RESET_BACKUP)
            return
        supplier = find_member(members, member_id)
        if supplier is None:
            self._error(f"member {member_id} is not in the members it sent ({response.cluster_members})")
            self._set_state(ClusterBackupState.RESET_BACKUP)
            return
        for snapshot in response.snapshots:
            latest = self.recording_log.get_latest_snapshot(snapshot.service_id)
            if latest is not None and latest.log_position == snapshot.log_position:
                continue
            self._snapshots_to_retrieve.append(
                Snapshot(
                    snapshot.recording_id,
                    snapshot.leadership_term_id,
                    snapshot.term_base_log_position,
                    snapshot.log_position,
                    snapshot.timestamp,
                    snapshot.service_id,
                )
            )
        if self.log_supplier is None or response.log_recording_id != self.cluster_log_recording_id:
            self.cluster_log_recording_id = response.log_recording_id
            self._leader_log_entry = (response.log_leadership_term_id, response.log_term_base_log_position)
        last_term = self.recording_log.find_last_term()
        if last_term is None or last_term.leadership_term_id != response.last_leadership_term_id:
            self._leader_last_term_entry = (response.last_leadership_term_id, response.last_term_base_log_position)
        self._leader_commit_counter_id = response.commit_position_counter_id
        self.cluster_members = members
        self.leader_member_id = leader_member_id
        self.log_supplier = supplier
        self._time_of_last_progress_ns = self._now_ns
        self._set_state(
            ClusterBackupState.SNAPSHOT_RETRIEVE if self._snapshots_to_retrieve else ClusterBackupState.LIVE_LOG_RECORD
        )

    # ----------------------------------------------------- a member's archive

    def _cluster_archive(self) -> AeronArchive:
        if self.cluster_archive is None:
            assert self.log_supplier is not None
            context = self.context
            self.cluster_archive = AeronArchive.connect(
                self.aeron,
                control_request_channel=_endpoint_channel(
                    context.cluster_archive_control_channel, self.log_supplier.archive_endpoint
                ),
                control_request_stream_id=archive_protocol.CONTROL_STREAM_ID,
                control_response_channel=context.cluster_archive_response_channel,
                control_response_stream_id=context.cluster_archive_response_stream_id,
                message_timeout_ns=max(CLUSTER_ARCHIVE_MESSAGE_TIMEOUT_MIN_NS, context.backup_response_timeout_ns),
                credentials=self._archive_credentials(),
            )
        return self.cluster_archive

    def _archive_credentials(self) -> bytes:
        credentials = self.context.archive_credentials
        return self.context.encoded_credentials if credentials is None else credentials

    def _source_control_channel(self) -> str:
        assert self.log_supplier is not None
        return _endpoint_channel(self.context.cluster_archive_control_channel, self.log_supplier.archive_endpoint)

    # ------------------------------------------------------------ snapshots

    def _snapshot_retrieve(self) -> int:
        self._time_of_last_progress_ns = self._now_ns
        retrieval = self._retrieval
        if retrieval is None:
            if not self._snapshots_to_retrieve:
                self._set_state(ClusterBackupState.LIVE_LOG_RECORD)
                return 1
            snapshot = self._snapshots_to_retrieve[0]
            source = self._cluster_archive().list_recording(snapshot.recording_id)
            if source is None or source.stop_position == NULL_POSITION:
                raise ClusterBackupError(
                    f"snapshot recording {snapshot.recording_id} is not a whole recording "
                    f"in member {self.log_supplier.id if self.log_supplier else '?'}'s archive"
                )
            replication_id = self.archive.replicate(
                snapshot.recording_id,
                self._source_control_channel(),
                archive_protocol.CONTROL_STREAM_ID,
                replication_channel=self.context.replication_channel,
                encoded_credentials=self._archive_credentials(),  # this backup's archive presents them
            )
            self._retrieval = SnapshotRetrieval(
                snapshot, replication_id, self.archive.last_correlation_id, source.stop_position
            )
            return 1
        if not retrieval.ended or retrieval.recording_id == NULL_VALUE:
            return 0
        stop = self.archive.get_stop_position(retrieval.recording_id)
        if stop != retrieval.source_stop_position:
            raise ClusterBackupError(
                f"snapshot recording {retrieval.snapshot.recording_id} was replicated to "
                f"{stop} of {retrieval.source_stop_position} bytes"
            )
        snapshot = retrieval.snapshot
        self._snapshots_retrieved.append(
            Snapshot(
                retrieval.recording_id,
                snapshot.leadership_term_id,
                snapshot.term_base_log_position,
                snapshot.log_position,
                snapshot.timestamp,
                snapshot.service_id,
            )
        )
        self.log_event(
            f"snapshot of service {snapshot.service_id} at log position {snapshot.log_position} "
            f"retrieved: recording {retrieval.recording_id}"
        )
        self._snapshots_to_retrieve.pop(0)
        self._retrieval = None
        return 1

    # ------------------------------------------------------------ the live log

    def _live_log_record(self) -> int:
        self._time_of_last_progress_ns = self._now_ns
        if self._live_log_recording_subscription_id == NULL_VALUE:
            if self._live_log_session_id == NULL_VALUE:
                self._live_log_session_id = random.randrange(1, 2**31 - 1)
            channel = _endpoint_channel(
                self.context.catchup_channel, self.context.catchup_endpoint, session_id=str(self._live_log_session_id)
            )
            last_term = self.recording_log.find_last_term()
            if last_term is None:
                self._live_log_recording_subscription_id = self.archive.start_recording(
                    channel, self.context.log_stream_id, SourceLocation.REMOTE, auto_stop=True
                )
            else:
                self._live_log_recording_subscription_id = self.archive.extend_recording(
                    last_term.recording_id, channel, self.context.log_stream_id, SourceLocation.REMOTE, auto_stop=True
                )
        self._set_state(ClusterBackupState.LIVE_LOG_REPLAY)
        return 1

    def _replay_start_position(self) -> int:
        last_term = self.recording_log.find_last_term()
        if last_term is not None:
            return self.archive.get_stop_position(last_term.recording_id)
        return NULL_POSITION  # the whole log, from where the member's recording starts

    def _live_log_replay(self) -> int:
        if self._live_log_replay_session_id == NULL_VALUE:
            channel = _endpoint_channel(
                self.context.catchup_channel, self.context.catchup_endpoint, session_id=str(self._live_log_session_id)
            )
            start = self._replay_start_position()
            self._live_log_replay_session_id = self._cluster_archive().start_replay(
                self.cluster_log_recording_id,
                channel,
                self.context.log_stream_id,
                start,
                NULL_LENGTH,
                limit_counter_id=self._leader_commit_counter_id,
            )
            self.log_event(
                f"member {self.log_supplier.id if self.log_supplier else '?'} replays its log recording "
                f"{self.cluster_log_recording_id} from {start if start != NULL_POSITION else 'its start'}"
                f" to {self.context.catchup_endpoint}"
            )
            self._time_of_last_progress_ns = self._now_ns
            return 1
        counter_id, recording_id = self._find_live_log_counter()
        if counter_id == NULL_VALUE:
            return 0
        self._live_log_counter_id = counter_id
        self.live_log_recording_id = recording_id
        self.live_log_position_counter.set(self.aeron.counters_reader.counter_value(counter_id))
        self._time_of_last_progress_ns = self._now_ns
        self._set_state(ClusterBackupState.UPDATE_RECORDING_LOG)
        return 1

    def _find_live_log_counter(self) -> tuple[int, int]:
        """The backup archive's rec-pos counter of the live log recording (by
        its session id), and the recording's id."""
        if self._archive_id is None:
            self._archive_id = self.archive.archive_id()
        reader = self.aeron.counters_reader
        for counter_id in reader.ids_of_type(RECORDING_POSITION_TYPE_ID):
            recording_id, session_id, archive_id = recording_position_ids(reader.counter_key(counter_id))
            if session_id == self._live_log_session_id and archive_id == self._archive_id:
                return counter_id, recording_id
        return NULL_VALUE, NULL_VALUE

    # -------------------------------------------------------- recording.log

    def _update_recording_log(self) -> int:
        """Aeron's updateRecordingLog: the log source's first and last terms
        (as far as this backup does not know them) and the snapshots retrieved."""
        log = self.recording_log
        snapshot_term = self._snapshots_retrieved[0].leadership_term_id if self._snapshots_retrieved else NULL_VALUE
        timestamp = int(time.time() * 1000)
        updated = False
        if self._leader_log_entry is not None:
            term_id, term_base = self._leader_log_entry
            if log.is_unknown(term_id) and term_id <= snapshot_term:
                log.append_term(self.live_log_recording_id, term_id, term_base, timestamp)
                updated = True
            self._leader_log_entry = None
        for snapshot in sorted(self._snapshots_retrieved, key=lambda s: s.service_id, reverse=True):
            log.append_snapshot(
                snapshot.recording_id,
                snapshot.leadership_term_id,
                snapshot.term_base_log_position,
                snapshot.log_position,
                snapshot.timestamp,
                snapshot.service_id,
            )
            updated = True
        if self._leader_last_term_entry is not None:
            term_id, term_base = self._leader_last_term_entry
            if log.is_unknown(term_id):
                log.append_term(self.live_log_recording_id, term_id, term_base, timestamp)
                updated = True
            self._leader_last_term_entry = None
        if self._snapshots_retrieved:
            self.snapshot_retrieve_counter.increment()
        if updated:
            self.log_event(
                "recording.log updated: "
                + "; ".join(
                    f"{entry.type_name} term {entry.leadership_term_id} at "
                    f"{entry.term_base_log_position if entry.is_valid_term else entry.log_position}"
                    for entry in log.entries[-4:]
                )
            )
        self._snapshots_retrieved.clear()
        self._snapshots_to_retrieve.clear()
        self._time_of_last_progress_ns = self._now_ns
        self.next_query_deadline_counter.set(int(time.time() * 1000) + self.context.backup_interval_ns // 1_000_000)
        self._set_state(ClusterBackupState.BACKING_UP)
        return 1

    def _backing_up(self) -> int:
        work = 0
        now_ms = int(time.time() * 1000)
        if now_ms > self.next_query_deadline_counter.get():
            # The same member first, on the same publication: its answer says
            # whether it still leads (no answer: the next member is asked).
            self._time_of_last_query_ns = self._now_ns
            self._time_of_last_progress_ns = self._now_ns
            self._set_state(ClusterBackupState.BACKUP_QUERY)
            work += 1
        if self._live_log_counter_id != NULL_VALUE:
            # (do_work found it alive this cycle.)
            position = self.aeron.counters_reader.counter_value(self._live_log_counter_id)
            if position > self.live_log_position_counter.get():
                self.live_log_position_counter.set(position)
                work += 1
        return work

    def _live_log_counter_alive(self) -> bool:
        counter_id, recording_id = self._find_live_log_counter()
        return counter_id == self._live_log_counter_id and recording_id == self.live_log_recording_id

    # ---------------------------------------------------------------- reset

    def _reset_backup(self) -> int:
        self._time_of_last_progress_ns = self._now_ns
        if self._cool_down_deadline_ns == NULL_VALUE:
            self._cool_down_deadline_ns = self._now_ns + self.context.cool_down_interval_ns
            self._reset()
            return 1
        if self._now_ns > self._cool_down_deadline_ns:
            self._cool_down_deadline_ns = NULL_VALUE
            self._time_of_last_query_ns = self._now_ns
            self._set_state(ClusterBackupState.BACKUP_QUERY)
            return 1
        return 0

    def _reset(self) -> None:
        self.cluster_members = []
        self.log_supplier = None
        self._leader_log_entry = None
        self._leader_last_term_entry = None
        self._snapshots_to_retrieve.clear()
        self._snapshots_retrieved.clear()
        if self._retrieval is not None:
            self._stop_retrieval()
        self._stop_replay()
        self._stop_recording()
        self._live_log_counter_id = NULL_VALUE
        self.live_log_recording_id = NULL_VALUE
        self._live_log_session_id = NULL_VALUE
        self._close_publication()
        if self.cluster_archive is not None:
            try:
                self.cluster_archive.close()
            except FulmarError:
                pass  # its archive is gone: nothing to close there
            self.cluster_archive = None

    def _stop_retrieval(self) -> None:
        assert self._retrieval is not None
        if not self._retrieval.ended:
            try:
                self.archive.stop_replication(self._retrieval.replication_id)
            except FulmarError as error:
                self._error(f"stopping a snapshot replication: {error}")
        self._retrieval = None

    def _stop_replay(self) -> None:
        if self._live_log_replay_session_id != NULL_VALUE:
            # (A dead member's archive cannot be told, and need not be.)
            if self.cluster_archive is not None and self.cluster_archive.proxy.publication.is_connected:
                try:
                    self.cluster_archive.stop_replay(self._live_log_replay_session_id)
                except FulmarError as error:
                    self._error(f"stopping the log replay: {error}")
            self._live_log_replay_session_id = NULL_VALUE

    def _stop_recording(self) -> None:
        if self._live_log_recording_subscription_id != NULL_VALUE:
            try:
                self.archive.stop_recording_subscription(self._live_log_recording_subscription_id)
            except FulmarError:
                pass  # an auto-stop recording whose image ended is gone already
            self._live_log_recording_subscription_id = NULL_VALUE
            # The recording must have stopped before it is extended again.
            recording_id = self.live_log_recording_id
            if recording_id == NULL_VALUE:
                last_term = self.recording_log.find_last_term()
                recording_id = last_term.recording_id if last_term is not None else NULL_VALUE
            if recording_id != NULL_VALUE:
                deadline = time.monotonic() + 10
                while self.archive.get_stop_position(recording_id) == NULL_POSITION:
                    if time.monotonic() > deadline:
                        raise ClusterBackupError(f"the archive did not stop the live log recording {recording_id}")
                    self.aeron.do_work(time.monotonic_ns())
                    time.sleep(0.001)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._reset()
        except FulmarError as error:
            self._error(f"closing: {error}")
        self._set_state(ClusterBackupState.CLOSED)
        self.consensus_subscription.close()
        # (A member that copied a snapshot this way goes on in this process: its
        # counters must not outlive the copy and show it as a backup.)
        for counter in (
            self.state_counter,
            self.live_log_position_counter,
            self.next_query_deadline_counter,
            self.error_counter,
            self.snapshot_retrieve_counter,
        ):
            counter.close()


def log_line(text: str) -> None:
    """A line in the backup's output (its backup.log): its states, what it
    retrieved, whom it follows."""
    log_lines.stamped("backup", text)


class ClusterBackup:
    """The backup process: its mark file (a BACKUP's ``cluster-mark.dat``, which
    a consensus module may take over when a member is restored from this
    directory), its driver's client, its archive's client, ``recording.log``
    and the agent's duty cycle."""

    def __init__(
        self,
        context: ClusterBackupContext,
        aeron: Aeron,
        archive: AeronArchive,
        mark_file: ClusterMarkFile,
        recording_log: RecordingLog,
        agent: ClusterBackupAgent,
    ) -> None:
        self.context = context
        self.aeron = aeron
        self.archive = archive
        self.mark_file = mark_file
        self.recording_log = recording_log
        self.agent = agent
        self.stop_requested = False
        self._closed = False

    @classmethod
    def launch(cls, context: ClusterBackupContext) -> ClusterBackup:
        cluster_dir = Path(context.cluster_dir)
        make_directory(cluster_dir)
        aeron = Aeron.connect(context.driver_dir, use_conductor_thread=False)
        mark_file = archive = recording_log = None
        try:
            mark_file = ClusterMarkFile.create(
                cluster_dir,
                ClusterComponentType.BACKUP,
                pid=os.getpid(),
                member_id=NULL_VALUE,
                cluster_id=context.cluster_id,
                now_ms=epoch_ms(),
                aeron_directory=str(aeron.directory),
                liveness_timeout_ms=context.mark_file_liveness_timeout_ms,
            )
            archive = AeronArchive.connect(
                aeron,
                control_request_channel=context.archive_control_channel,
                control_request_stream_id=context.archive_control_stream_id,
                control_response_channel="aeron:ipc?term-length=64k",
                control_response_stream_id=context.archive_response_stream_id,
                credentials=context.encoded_credentials
                if context.archive_credentials is None
                else context.archive_credentials,
            )
            recording_log = RecordingLog.open(cluster_dir)
            error_log = mark_file.error_log(epoch_ms)
            agent = ClusterBackupAgent(context, aeron, archive, recording_log, error_log.record, log_line)
            mark_file.signal_ready()
        except BaseException:
            for resource in (recording_log, archive, mark_file):
                if resource is not None:
                    resource.close()
            aeron.close()
            raise
        return cls(context, aeron, archive, mark_file, recording_log, agent)

    def run(self) -> str:
        agent = self.agent
        idle = DoorbellIdleStrategy(self.aeron.conductor.data_doorbell, self.context.idle_max_wait_ns)
        next_mark_ms = 0
        failures = RetryBackoff(max_ns=DUTY_CYCLE_ERROR_MAX_BACKOFF_NS)
        while not self.stop_requested:
            now_ns = time.monotonic_ns()
            try:
                work = agent.do_work(now_ns)
            except ClusterBackupError:
                raise
            except Exception as error:  # a bug: record it, start over, keep running
                agent._error(f"{type(error).__name__}: {error}")
                agent._set_state(ClusterBackupState.RESET_BACKUP)
                idle.pause(failures.on_failure(now_ns))
                continue
            failures.on_success()
            now_ms = epoch_ms()
            if now_ms >= next_mark_ms:
                self.mark_file.update_activity_timestamp(now_ms)
                next_mark_ms = now_ms + 1000
            if self.aeron.is_closed:
                raise ClusterBackupError("the media driver went away")
            if not work:
                idle.max_wait_ns = agent.idle_wait_ns(self.context.idle_max_wait_ns, now_ms)
            idle.idle(work)
        return "stopped on request"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.agent.close()
            self.archive.close()
        finally:
            self.recording_log.close()
            self.mark_file.close()
            self.aeron.close()


def run_cluster_backup(context: ClusterBackupContext, on_ready: Callable[[ClusterBackup], None] | None = None) -> str:
    """Launch, back up until a stop signal, close; why it stopped."""
    running: list[ClusterBackup] = []

    def on_stop(kind: StopKind | None, signum: int) -> None:
        if kind is not None:
            for backup in running:
                backup.stop_requested = True

    rule = StopSignals()
    with StopSignalHandlers(rule, on_stop, time.monotonic_ns):
        backup = ClusterBackup.launch(context)
        try:
            running.append(backup)
            if rule.requested is not None:
                backup.stop_requested = True
            if on_ready is not None:
                on_ready(backup)
            return backup.run()
        finally:
            running.clear()
            backup.close()


def protocol_key(cluster_id: int) -> bytes:
    """A cluster counter's key: the cluster id (little-endian int32), as the members' counters have,
    so that tools find a backup's counters by the cluster id as they find a member's."""
    return int(cluster_id).to_bytes(4, "little", signed=True)


__all__ = [
    "CONSENSUS_MODULE_SERVICE_ID",
    "ClusterBackup",
    "ClusterBackupAgent",
    "ClusterBackupContext",
    "ClusterBackupError",
    "ClusterBackupState",
    "run_cluster_backup",
]
