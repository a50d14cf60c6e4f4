"""The sessions of tools that are not clients (seed 000's pendingBackupSessions):
a ClusterBackup's BackupQuery, a HeartbeatRequest, a StandbySnapshot.  Each is
answered once on its response channel, once connected and authenticated, and
closed; never in the log, so never given a client session id (their ids count
down from ``BACKUP_SESSION_ID_FIRST``).

Aeron keeps this in ConsensusModuleAgent; here it is its own object, told what
it needs of the module through its constructor.  The agent owns the module's
state (whether an election runs, the leader, the members): this reads it
through the callables it is given."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fulmar.consensus import protocol
from fulmar.consensus.cluster_session import ClusterSession, ClusterSessionAction, ClusterSessionState, SessionProxy
from fulmar.consensus.protocol import CloseReason
from fulmar.consensus.recording_log import RecordingLogError
from fulmar.errors import FulmarError
from fulmar.semantic_version import major_version, version_text

if TYPE_CHECKING:
    from fulmar.aeron import Aeron, Counter
    from fulmar.consensus.context import ConsensusModuleContext
    from fulmar.consensus.publishers import EgressPublisher
    from fulmar.consensus.recording_log import RecordingLog
    from fulmar.publication import Publication

# Backup, heartbeat and standby snapshot sessions count down from here: an
# authenticator tells them apart, and none is a client's (those are >= 1).
BACKUP_SESSION_ID_FIRST = -2


class BackupSessions:
    def __init__(
        self,
        *,
        aeron: Aeron,
        context: ConsensusModuleContext,
        egress: EgressPublisher,
        recording_log: RecordingLog,
        member_id: int,
        invalid_requests: Counter,
        standby_snapshots: Counter,
        commit_position_counter: Counter,
        is_open: Callable[[], bool],
        now_ns: Callable[[], int],
        epoch_ms: Callable[[], int],
        leader_member_id: Callable[[], int],
        cluster_members: Callable[[], str],
        error: Callable[[str], None],
        log_event: Callable[[str], None],
    ) -> None:
        """``is_open``: whether the module takes such requests now (no election
        runs, and it is ACTIVE or SUSPENDED); ``cluster_members``: the members
        as a BackupResponse lists them."""
        self._aeron = aeron
        self._context = context
        self._authenticator = context.authenticator
        self._egress = egress
        self._recording_log = recording_log
        self._member_id = member_id
        self._invalid_requests = invalid_requests
        self._standby_snapshots = standby_snapshots
        self._commit_position_counter = commit_position_counter
        self._is_open = is_open
        self._now_ns = now_ns
        self._epoch_ms = epoch_ms
        self._leader_member_id = leader_member_id
        self._cluster_members = cluster_members
        self._error = error
        self._log_event = log_event
        self.pending: list[ClusterSession] = []
        self.rejected: list[ClusterSession] = []  # (sent their rejection by the agent with the clients')
        self._next_session_id = BACKUP_SESSION_ID_FIRST

    def _new_session(
        self, action: ClusterSessionAction, correlation_id: int, response_stream_id: int, response_channel: str
    ) -> ClusterSession | None:
        """A session for a tool's one request (Aeron's onBackupQuery and the
        like): only while no election runs and the module runs, as in Aeron;
        the tool asks again when it hears nothing."""
        if not self._is_open():
            return None
        if len(self.pending) + len(self.rejected) >= self._context.max_concurrent_sessions:
            # A flood of requests gets no more response publications than clients could.
            self._invalid_requests.increment()
            return None
        session = ClusterSession(
            self._next_session_id, response_stream_id, response_channel, correlation_id, self._now_ns(), action
        )
        self._next_session_id -= 1
        try:
            session.async_connect(self._aeron, self._error)
        except FulmarError as error:
            self._error(f"cannot connect the response channel of a {action.name} request ({response_channel}): {error}")
            self._invalid_requests.increment()
            return None
        return session

    def _admit(self, session: ClusterSession, version: int | None, encoded_credentials: bytes) -> None:
        if version is not None and major_version(version) != protocol.PROTOCOL_MAJOR_VERSION:
            session.detail = (
                f"invalid client version {version_text(version)}, "
                f"cluster is {version_text(protocol.PROTOCOL_SEMANTIC_VERSION)}"
            )
            self.rejected.append(session)
            return
        self._authenticator.on_connect_request(session.id, encoded_credentials, self._epoch_ms())
        self.pending.append(session)

    def on_backup_query(
        self,
        correlation_id: int,
        response_stream_id: int,
        version: int,
        response_channel: str,
        encoded_credentials: bytes,
    ) -> None:
        session = self._new_session(ClusterSessionAction.BACKUP, correlation_id, response_stream_id, response_channel)
        if session is not None:
            self._admit(session, version, encoded_credentials)

    def on_heartbeat_request(
        self, correlation_id: int, response_stream_id: int, response_channel: str, encoded_credentials: bytes
    ) -> None:
        session = self._new_session(
            ClusterSessionAction.HEARTBEAT, correlation_id, response_stream_id, response_channel
        )
        if session is not None:
            self._admit(session, None, encoded_credentials)  # (the request has no version)

    def on_standby_snapshot(
        self,
        correlation_id: int,
        version: int,
        response_stream_id: int,
        snapshots: list[Any],
        response_channel: str,
        encoded_credentials: bytes,
    ) -> None:
        if not self._context.accept_standby_snapshots:
            # Aeron's default too: another node's snapshots are not taken into
            # this member's recording log unless it is configured to.
            self._invalid_requests.increment()
            self._error(
                "a StandbySnapshot was refused: this member does not accept standby snapshots "
                "(accept_standby_snapshots is off)"
            )
            return
        session = self._new_session(
            ClusterSessionAction.STANDBY_SNAPSHOT, correlation_id, response_stream_id, response_channel
        )
        if session is not None:
            session.request_input = snapshots
            self._admit(session, version, encoded_credentials)

    def on_consensus_challenge_response(
        self, correlation_id: int, cluster_session_id: int, encoded_credentials: bytes
    ) -> None:
        for session in self.pending:
            if session.id == cluster_session_id and session.state is ClusterSessionState.CHALLENGED:
                session.time_of_last_activity(self._now_ns())
                session.correlation_id = correlation_id
                self._authenticator.on_challenge_response(session.id, encoded_credentials, self._epoch_ms())
                return
        self._invalid_requests.increment()

    def process_pending(self, now_ns: int) -> int:
        """Seed 000's pendingBackupSessions: once a session's response channel is
        connected and its tool authenticated, answer its one request and close it."""
        work = 0
        for session in list(self.pending):
            if session.state is ClusterSessionState.INVALID:  # the driver refused its response publication
                self.pending.remove(session)
                session.close()
                self._invalid_requests.increment()
                continue
            if now_ns - session.time_of_last_activity_ns > self._context.session_timeout_ns:
                self.pending.remove(session)
                session.close(CloseReason.TIMEOUT)
                continue
            if session.state is ClusterSessionState.CONNECTING and session.is_response_publication_connected:
                session.state = ClusterSessionState.CONNECTED
                self._authenticator.on_connected_session(SessionProxy(session), self._epoch_ms())
                work += 1
            if session.state is ClusterSessionState.CHALLENGED:
                if session.encoded_challenge is not None and session.publication is not None:
                    if self._egress.challenge(
                        session.publication, session.correlation_id, session.id, session.encoded_challenge
                    ):
                        session.encoded_challenge = None
                self._authenticator.on_challenged_session(SessionProxy(session), self._epoch_ms())
            if session.state is ClusterSessionState.AUTHENTICATED:
                if self._answer(session):
                    self.pending.remove(session)
                    session.close(CloseReason.CLIENT_ACTION)
                    work += 1
            elif session.state is ClusterSessionState.REJECTED:
                self.pending.remove(session)
                session.detail = "authentication rejected"
                self.rejected.append(session)
        return work

    def _answer(self, session: ClusterSession) -> bool:
        """The answer to an authenticated session's request; False to try again
        on the next slow tick (its response publication is back pressured)."""
        publication = session.publication
        if publication is None:
            return False
        if session.action is ClusterSessionAction.HEARTBEAT:
            return self._egress.heartbeat_response(publication, session.correlation_id)
        if session.action is ClusterSessionAction.STANDBY_SNAPSHOT:
            recorded = 0
            for entry in session.request_input:
                try:
                    self._recording_log.append_standby_snapshot(
                        entry.recording_id,
                        entry.leadership_term_id,
                        entry.term_base_log_position,
                        entry.log_position,
                        entry.timestamp,
                        entry.service_id,
                        entry.archive_endpoint,
                    )
                    recorded += 1
                except RecordingLogError as error:  # a tool's bad entry: refused, the rest kept
                    self._invalid_requests.increment()
                    self._error(f"a standby snapshot entry was refused: {error}")
            self._standby_snapshots.increment()
            self._log_event(f"standby snapshots: {recorded} of {len(session.request_input)} entries recorded")
            return True
        return self._send_backup_response(session, publication)

    def _send_backup_response(self, session: ClusterSession, publication: Publication) -> bool:
        """BackupResponse (Aeron's ConsensusPublisher.backupResponse): where this
        member's log is recorded, its newest complete set of snapshots, the
        members and the leader, from the recording log (no archive round trip
        on the duty cycle)."""
        last_term = self._recording_log.find_last_term()
        if last_term is None:
            return False  # nothing recorded yet: the backup asks again
        snapshots = [
            {
                "recording_id": snapshot.recording_id,
                "leadership_term_id": snapshot.leadership_term_id,
                "term_base_log_position": snapshot.term_base_log_position,
                "log_position": snapshot.log_position,
                "timestamp": snapshot.timestamp,
                "service_id": snapshot.service_id,
            }
            for snapshot in self._recording_log.latest_snapshot_set(self._context.service_count)
        ]
        leader = self._leader_member_id()
        members = self._cluster_members()
        return self._egress.backup_response(
            publication,
            session.correlation_id,
            log_recording_id=last_term.recording_id,
            # (Aeron's from its recovery plan's log, which is the last term too
            # when the plan is fresh; this one always is.)
            log_leadership_term_id=last_term.leadership_term_id,
            log_term_base_log_position=last_term.term_base_log_position,
            last_leadership_term_id=last_term.leadership_term_id,
            last_term_base_log_position=last_term.term_base_log_position,
            commit_position_counter_id=self._commit_position_counter.id,
            leader_member_id=leader,
            member_id=self._member_id,
            snapshots=snapshots,
            cluster_members=members,
        )
