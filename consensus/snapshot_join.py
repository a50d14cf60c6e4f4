"""A blank member joining a cluster whose log was purged.

A member with nothing (no recording log entry, no log recording) normally
joins by replicating the leader's whole log from position 0 and replaying
it.  Once retention (``fulmar.consensus.log_retention``) has purged the log
before a snapshot, position 0 is gone: the member needs the leader's snapshot
and the log after it, before its services start (they load their snapshots
when they start, from the recovery state the consensus module publishes).

So at launch, before the recovery plan, a blank member of a cluster of
several asks the other members' archives (their archive endpoints, which
answer whatever state the members' elections are in) where their log
recordings start.  If one starts after position 0 the log was purged, and the
member copies what a cluster backup copies (``ClusterBackupAgent`` run in this
process on the member's own archive, recording log and endpoints): the
leader's newest snapshot set and its log, into the member's archive and
``recording.log``.  Once the copy reaches the snapshot's position it stops,
and the launch goes on as for a member restored from a backup: the snapshot
is loaded, the log after it replayed, and the election catches up the rest.
If every member that answers has its log from 0, or none has a log (a new
cluster), nothing is copied and the member joins as before.

This is fulmar's: Aeron's members replicate the leader's log from their own
position and leave a purged log to the operator (ClusterTool's
seed-recording-log-from-snapshot and a ClusterBackup's copy).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fulmar.archive import protocol as archive_protocol
from fulmar.archive.client import AeronArchive
from fulmar.consensus.backup import ClusterBackupAgent, ClusterBackupContext, ClusterBackupState
from fulmar.consensus.cluster_member import ClusterMember, parse_cluster_members
from fulmar.consensus.log_rebuild import log_recordings
from fulmar.consensus.recording_log import RecordingLog
from fulmar.errors import FulmarError
from fulmar.idle import DoorbellIdleStrategy
from fulmar.security import secret_of

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.consensus.context import ConsensusModuleContext

# How long a member's archive may take to answer the question (it is on the
# same network and answers at once when it runs; one that does not answer is
# a member that is down, which cannot be the leader either).
PEER_ARCHIVE_TIMEOUT_NS = 1_000_000_000
PEER_ARCHIVE_RESPONSE_STREAM_ID = 124


class SnapshotJoinError(FulmarError):
    """The blank member could not copy the leader's snapshot and log."""


@dataclass(frozen=True)
class PeerLog:
    member_id: int
    start_position: int | None  # None: the member's archive holds no log recording
    answered: bool = True


def is_blank(recording_log: RecordingLog, archive: AeronArchive, log_stream_id: int) -> bool:
    """Nothing to recover from: no recording log entry and no log recording."""
    if recording_log.entries:
        return False
    return not log_recordings(archive.list_recordings(), log_stream_id)


def _host(endpoint: str) -> str:
    return endpoint.rsplit(":", 1)[0]


def peer_log_starts(
    aeron: Aeron,
    me: ClusterMember,
    peers: list[ClusterMember],
    log_stream_id: int,
    timeout_ns: int = PEER_ARCHIVE_TIMEOUT_NS,
    credentials: bytes = b"",
) -> list[PeerLog]:
    """Where each other member's log recording starts, from its archive
    (presenting ``credentials``)."""
    found = []
    for peer in peers:
        try:
            with AeronArchive.connect(
                aeron,
                control_request_channel=f"aeron:udp?endpoint={peer.archive_endpoint}",
                control_request_stream_id=archive_protocol.CONTROL_STREAM_ID,
                control_response_channel=f"aeron:udp?endpoint={_host(me.archive_endpoint)}:0",
                control_response_stream_id=PEER_ARCHIVE_RESPONSE_STREAM_ID,
                message_timeout_ns=timeout_ns,
                credentials=credentials,
            ) as archive:
                recordings = log_recordings(archive.list_recordings(), log_stream_id)
        except FulmarError:
            found.append(PeerLog(peer.id, None, answered=False))
            continue
        latest = max(recordings, key=lambda d: d.recording_id) if recordings else None
        found.append(PeerLog(peer.id, latest.start_position if latest is not None else None))
    return found


def join_from_snapshot_if_purged(
    context: ConsensusModuleContext,
    aeron: Aeron,
    archive: AeronArchive,
    recording_log: RecordingLog,
    log_event: Callable[[str], None],
    record_error: Callable[[str], object],
    timeout_ns: int = 60_000_000_000,
) -> bool:
    """At launch: a blank member copies the leader's snapshot and log when the
    cluster's log was purged (see the module's docstring).  True if it did."""
    if not context.cluster_members or not is_blank(recording_log, archive, context.log_stream_id):
        return False
    members = parse_cluster_members(context.cluster_members)
    me = next(m for m in members if m.id == context.member_id)
    peers = [m for m in members if m.id != context.member_id]
    if not peers:
        return False
    starts = peer_log_starts(aeron, me, peers, context.log_stream_id, credentials=context.archive_client_credentials())
    purged = [p for p in starts if p.start_position is not None and p.start_position > 0]
    said = ", ".join(
        f"member {p.member_id}: "
        + ("no answer" if not p.answered else "no log" if p.start_position is None else f"log from {p.start_position}")
        for p in starts
    )
    if not purged:
        log_event(
            f"blank member: the other members' logs ({said}) start at 0 or are empty: "
            "joining by replicating the leader's log"
        )
        return False
    log_event(
        f"blank member: the cluster's log was purged ({said}): copying the leader's snapshot and the log "
        "after it before the services start"
    )
    copy_snapshot_and_log(context, aeron, archive, recording_log, me, peers, log_event, record_error, timeout_ns)
    return True


def copy_snapshot_and_log(
    context: ConsensusModuleContext,
    aeron: Aeron,
    archive: AeronArchive,
    recording_log: RecordingLog,
    me: ClusterMember,
    peers: list[ClusterMember],
    log_event: Callable[[str], None],
    record_error: Callable[[str], object],
    timeout_ns: int,
) -> None:
    """Run a cluster backup's copy into this member until its log reaches the
    newest snapshot it retrieved, then stop it (the recording ends there)."""
    endpoints = [peer.consensus_endpoint for peer in peers]
    random.shuffle(endpoints)
    backup_context = ClusterBackupContext(
        cluster_dir=Path(context.cluster_dir),
        driver_dir=context.driver_dir,
        cluster_consensus_endpoints=",".join(endpoints),
        consensus_endpoint=me.consensus_endpoint,
        consensus_channel=context.consensus_channel,
        consensus_stream_id=context.consensus_stream_id,
        catchup_endpoint=me.catchup_endpoint,
        log_stream_id=context.log_stream_id,
        archive_control_channel=context.archive_control_channel,
        archive_control_stream_id=context.archive_control_stream_id,
        cluster_archive_control_channel=context.archive_remote_control_channel,
        cluster_archive_response_channel=f"aeron:udp?endpoint={_host(me.archive_endpoint)}:0",
        cluster_archive_response_stream_id=PEER_ARCHIVE_RESPONSE_STREAM_ID,
        replication_channel=context.replication_channel,
        cluster_id=context.cluster_id,
        log_source="leader",
        backup_response_timeout_ns=PEER_ARCHIVE_TIMEOUT_NS,
        cool_down_interval_ns=200_000_000,
        encoded_credentials=_credentials(context),
        archive_credentials=context.archive_client_credentials(),
        # (The backup's pace: it polls peers and replications that no ring announces.)
        idle_max_wait_ns=context.slow_tick_interval_ns,
    )
    agent = ClusterBackupAgent(
        backup_context, aeron, archive, recording_log, record_error, lambda text: log_event(f"snapshot join: {text}")
    )
    idle = DoorbellIdleStrategy(aeron.conductor.data_doorbell, context.slow_tick_interval_ns)
    progress: tuple[object, ...] = ()
    deadline_ns = time.monotonic_ns() + timeout_ns
    try:
        while True:
            now_ns = time.monotonic_ns()
            work = agent.do_work(now_ns)
            position = agent.live_log_position_counter.get()
            if agent.state is ClusterBackupState.BACKING_UP and position >= _newest_snapshot_position(recording_log):
                break
            seen = (agent.state, position, len(recording_log.entries))
            if seen != progress:
                progress, deadline_ns = seen, now_ns + timeout_ns
            elif now_ns > deadline_ns:
                why = (
                    " no member answered as the leader: a cluster without a leader cannot give a blank member "
                    "its snapshot, and a blank member cannot vote before it has one"
                    if agent.state in (ClusterBackupState.BACKUP_QUERY, ClusterBackupState.RESET_BACKUP)
                    else ""
                )
                raise SnapshotJoinError(
                    f"no progress copying the leader's snapshot and log for {timeout_ns // 1_000_000_000} s "
                    f"(state {agent.state.name}, live log position {position}):{why or ' see cluster-tool errors'}"
                )
            if aeron.is_closed:
                raise SnapshotJoinError("the media driver went away")
            idle.idle(work)
    finally:
        agent.close()
    log_event(
        f"snapshot join: copied the snapshot at log position {_newest_snapshot_position(recording_log)} "
        f"and the log to {position}"
    )


def _credentials(context: ConsensusModuleContext) -> bytes:
    """What the members' authenticator wants of this member's query: the
    cluster's secret, when it has one (every member is configured with it)."""
    return secret_of(context.authenticator)


def _newest_snapshot_position(recording_log: RecordingLog) -> int:
    positions = [entry.log_position for entry in recording_log.entries if entry.is_valid_snapshot]
    return max(positions) if positions else 2**63 - 1  # none yet: not there
