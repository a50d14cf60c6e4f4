"""A cluster's archives refuse strangers (issue 48).

Three members on 127.0.0.1 started with one secret (``--authenticator-secret``
for the consensus modules and the archives).  A member's archive control
endpoint is a UDP port anyone who can reach the machine can send to.  Before
the archive authenticated its control sessions a stranger's AeronArchive
there could list the recordings, replay the whole log to itself, stop the
log's recording, truncate or purge the snapshots the members recover from.
Each attack below is made three ways: with no credentials, with wrong ones,
and with raw requests on a session the archive challenged and on another
client's (authenticated) session.  Each must be refused and counted, leave
the log recording recording and the snapshots whole, and the cluster serving.

Checked against the code before the change: with the archives started
without the secret (what every archive was before), each attack test fails
at its first step, a stranger without credentials being served (the list of
recordings, a replay of the log, the log recording stopped, a snapshot
truncated or purged).

Then the members, which replicate from each other's archives over the same
UDP endpoints, still do: a member that missed a leadership term replicates
it from the leader's archive and catches up; and a cluster backup with the
secret retrieves the snapshots and follows the live log.

One cluster for all of them (module scope): the attacks come first, then the
backup, then the restart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.archive import protocol as archive_protocol
from fulmar.archive.client import AeronArchive, ArchiveResponseError
from fulmar.archive.protocol import NULL_POSITION, ArchiveErrorCode
from fulmar.cli import archive_tool, cluster_commands
from fulmar.cnc import CncFile
from fulmar.codecs.generated import archive as codecs
from fulmar.consensus import protocol as cluster_protocol
from fulmar.consensus.backup import CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID, ClusterBackupState
from fulmar.consensus.client import ClusterClient
from fulmar.consensus.recording_log import RecordingLog
from fulmar.counters import CountersReader
from support.archive import RawControlClient
from support.backup import Backup
from support.cluster import FAST_ELECTION_ARGS, LocalCluster
from support.driver import free_udp_port, wait_for
from support.multi_node import member_view, wait_for_commit, wait_for_leader

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

SECRET = "cluster-s3cret"
COUNTER_SERVICE = "fulmar.service.samples:CounterService"
SNAPSHOT_STREAM_ID = 107


@dataclass
class Targets:
    member: int  # whose archive is attacked (the leader's: the one the others replicate from)
    log_recording_id: int
    snapshot_recording_ids: list[int]  # the module's and the service's


@dataclass
class Secured:
    cluster: LocalCluster
    client: ClusterClient
    stranger: Aeron  # a client of a driver of its own, as on another machine
    targets: Targets
    _member_aerons: dict[int, Aeron] = field(default_factory=dict)
    # Per member, the refusals its archive owes: a challenged session a
    # stranger left unanswered is refused at the archive's connect deadline
    # (5 s after its ConnectRequest), not when the stranger goes.
    refusals_due: dict[int, int] = field(default_factory=dict)

    def wait_for_refusals_due(self) -> None:
        for member, count in self.refusals_due.items():
            wait_for(lambda: self.refused(member) >= count, 15, f"member {member}'s archive to refuse what it owes")

    def insider(self, member: int) -> AeronArchive:
        """A client of the member's archive over its local IPC channel (open:
        it takes the node's own driver files)."""
        if member not in self._member_aerons:
            self._member_aerons[member] = self.cluster.connect(member)
        return AeronArchive.connect(self._member_aerons[member], control_response_stream_id=25)

    def refused(self, member: int) -> int:
        with CncFile.open(self.cluster.driver_dir(member)) as cnc:
            reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
            (value,) = [
                reader.counter_value(c.counter_id)
                for c in reader
                if c.type_id == archive_protocol.ARCHIVE_REFUSED_CONTROL_SESSIONS_TYPE_ID
            ]
            return value

    def archive_errors(self, member: int) -> dict[str, int]:
        found = archive_tool.archive_errors_document(self.cluster.archive_dir(member))["errors"]
        return {error["text"]: error["observation_count"] for error in found}


def _targets(cluster: LocalCluster, leader: int) -> Targets:
    log = RecordingLog.open(cluster.cluster_dir(leader), create=False)
    try:
        log_recording_id = log.find_last_term_recording_id()
        snapshots = sorted({e.recording_id for e in log.entries if e.is_valid_snapshot})
    finally:
        log.close()
    assert len(snapshots) == 2, f"a snapshot of the module and of the service: {snapshots}"
    return Targets(leader, log_recording_id, snapshots)


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    with LocalCluster(
        3,
        COUNTER_SERVICE,
        extra_consensus_args=FAST_ELECTION_ARGS,
        secret=SECRET,
    ) as cluster:
        cluster.start()
        leader = wait_for_leader(cluster, 30).member
        client = cluster.connect_client(credentials=SECRET.encode())
        for _ in range(20):
            client.request(b"+", timeout_s=10)
        print(cluster_commands.cluster_operate(cluster.base, "snapshot", 30))
        client.request(b"+", timeout_s=10)
        yield Secured(cluster, client, cluster.connect(), _targets(cluster, leader))


# ------------------------------------------------------------------------- the attacks


def _replay_log(archive: AeronArchive, targets: Targets) -> Any:
    return archive.replay(targets.log_recording_id, f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}", 1001)


ATTACKS: dict[str, Callable[[AeronArchive, Targets], Any]] = {
    "list_recordings": lambda archive, targets: archive.list_recordings(),
    "replay_log": _replay_log,
    "truncate_snapshot": lambda archive, targets: archive.truncate_recording(targets.snapshot_recording_ids[0], 0),
    "purge_snapshot": lambda archive, targets: archive.purge_recording(targets.snapshot_recording_ids[1]),
    "stop_log_recording": lambda archive, targets: archive.stop_recording_by_identity(targets.log_recording_id),
}


def _raw_request(attack: str, targets: Targets, session_id: int, correlation_id: int) -> tuple[Any, dict[str, Any]]:
    """The attack as one raw request naming ``session_id``."""
    common: dict[str, Any] = dict(control_session_id=session_id, correlation_id=correlation_id)
    if attack == "list_recordings":
        return codecs.ListRecordingsRequestEncoder, dict(common, from_recording_id=0, record_count=100)
    if attack == "replay_log":
        return codecs.ReplayRequestEncoder, dict(
            common,
            recording_id=targets.log_recording_id,
            position=0,
            length=-1,
            replay_stream_id=1001,
            file_io_max_length=-1,
            replay_token=-1,
            replay_channel=f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}",
        )
    if attack == "truncate_snapshot":
        return codecs.TruncateRecordingRequestEncoder, dict(
            common, recording_id=targets.snapshot_recording_ids[0], position=0
        )
    if attack == "purge_snapshot":
        return codecs.PurgeRecordingRequestEncoder, dict(common, recording_id=targets.snapshot_recording_ids[1])
    assert attack == "stop_log_recording"
    return codecs.StopRecordingByIdentityRequestEncoder, dict(common, recording_id=targets.log_recording_id)


def _stranger_connect(secured: Secured, credentials: bytes | None, attack: str) -> ArchiveResponseError:
    """A stranger's AeronArchive on the member's UDP control endpoint: the
    refusal it gets.  Served instead, it makes its attack, and the test fails
    saying what it was given."""
    targets = secured.targets
    try:
        archive = AeronArchive.connect(
            secured.stranger,
            control_request_channel=secured.cluster.archive_control_channel(targets.member),
            control_response_channel="aeron:udp?endpoint=127.0.0.1:0",
            message_timeout_ns=5_000_000_000,
            credentials=credentials,
        )
    except ArchiveResponseError as refused:
        return refused
    with archive:
        outcome = ATTACKS[attack](archive, targets)
    pytest.fail(f"a stranger with credentials {credentials!r} was served {attack}: {outcome!r}")


def _state(secured: Secured) -> tuple[int, int, list[tuple[int, int, int]]]:
    """The log recording's stop position (NULL_POSITION: still recording) and
    live position, and each snapshot recording's id, start and stop."""
    targets = secured.targets
    with secured.insider(targets.member) as archive:
        stop = archive.get_stop_position(targets.log_recording_id)
        live = archive.get_recording_position(targets.log_recording_id)
        snapshots = []
        for recording_id in targets.snapshot_recording_ids:
            descriptor = archive.list_recording(recording_id)
            assert descriptor is not None, f"snapshot recording {recording_id} is gone"
            snapshots.append((recording_id, descriptor.start_position, descriptor.stop_position))
    return stop, live, snapshots


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_stranger_on_a_members_archive_endpoint_is_refused(secured: Secured, attack: str) -> None:
    """A stranger (no credentials, wrong ones, raw requests on a challenged
    session or on the member's own authenticated one) tries ``attack`` on the
    leader's archive: refused every time, counted, nothing changed, the
    cluster serving on.  Before the change the first attempt was served."""
    targets = secured.targets
    stop_before, live_before, snapshots_before = _state(secured)
    assert stop_before == NULL_POSITION and live_before > 0
    refused_before = secured.refused(targets.member)

    for credentials in (None, b"wrong", b"admin:" + SECRET.encode()[:-1]):
        refusal = _stranger_connect(secured, credentials, attack)
        assert refusal.error_code == ArchiveErrorCode.AUTHENTICATION_REJECTED, refusal
        assert refusal.archive_message == "authentication rejected"

    # Raw requests: on the session the archive challenged (an old
    # ConnectRequest, which cannot carry credentials), and on the member's
    # own authenticated session, named by a stranger who learnt its id.
    raw = RawControlClient(secured.stranger, secured.cluster.archive_control_channel(targets.member))
    insider = secured.insider(targets.member)
    try:
        raw.connect(None)
        challenge = raw.next(5, "the archive's answer to a ConnectRequest")
        assert isinstance(challenge, codecs.ChallengeDecoder), f"served without credentials: {challenge}"
        for index, session_id in enumerate((challenge.control_session_id, insider.control_session_id)):
            encoder, fields = _raw_request(attack, targets, session_id, 1000 + index)
            raw.send(encoder, **fields)
        assert raw.quiet_for(0.5) == [], "a raw request was answered"
        insider.poll_for_signals()  # the insider's session answered nothing it did not ask for
        assert not [
            s for s in insider.signals if s.recording_id in (targets.log_recording_id, *targets.snapshot_recording_ids)
        ]
    finally:
        raw.close()
        insider.close()

    # What the archive had refused before this test, once the earlier tests'
    # challenged sessions are counted; this test's three, then the raw
    # session it challenged (the fourth, at its connect deadline).
    owed = secured.refusals_due.get(targets.member, refused_before)
    wait_for(
        lambda: secured.refused(targets.member) >= owed + 3,
        10,
        "the three refusals to be counted",
    )
    secured.refusals_due[targets.member] = owed + 4
    errors = secured.archive_errors(targets.member)
    assert errors.get("archive: control session refused: authentication rejected", 0) >= 3
    assert any("belongs to another client's stream" in text for text in errors), errors
    stop_after, live_after, snapshots_after = _state(secured)
    assert stop_after == NULL_POSITION, "the log recording was stopped"
    assert live_after >= live_before
    assert snapshots_after == snapshots_before
    # The cluster serves on, and its log is still recorded: the leader's
    # recording moves with the next write.
    secured.client.request(b"+", timeout_s=10)
    wait_for(lambda: _state(secured)[1] > live_after, 10, "the leader's log recording to move on")


# ------------------------------------------------------------------------- the members still work


def test_a_backup_with_the_secret_retrieves_the_snapshots_and_follows_the_live_log(secured: Secured) -> None:
    cluster = secured.cluster
    backup = Backup(cluster, credentials=SECRET)
    try:
        wait_for(
            lambda: backup.counter(cluster_protocol.CLUSTER_BACKUP_STATE_TYPE_ID) == ClusterBackupState.BACKING_UP,
            30,
            f"the backup to be BACKING_UP: {backup.output()[-2000:]}",
        )
        secured.client.request(b"+", timeout_s=10)
        leader = wait_for_leader(cluster, 10).member
        position = member_view(cluster, leader).commit_position
        assert position is not None
        wait_for(
            lambda: backup.counter(CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID) >= position,
            20,
            f"the backup's live log to reach {position}: {backup.output()[-2000:]}",
        )
        # Its own archive took the snapshots from the leader's, presenting the secret.
        aeron = Aeron.connect(backup.driver_dir)
        try:
            with AeronArchive.connect(aeron, control_response_stream_id=26) as archive:
                snapshots = [r for r in archive.list_recordings() if r.stream_id == SNAPSHOT_STREAM_ID]
        finally:
            aeron.close()
        assert len(snapshots) == 2
    finally:
        backup.close()


def test_a_member_that_missed_a_term_replicates_it_from_the_leaders_archive_and_catches_up(
    secured: Secured,
) -> None:
    cluster = secured.cluster
    first = wait_for_leader(cluster, 10)
    absent = next(m for m in range(3) if m != first.member)
    cluster.kill_member(absent)
    for _ in range(10):
        secured.client.request(b"+", timeout_s=10)  # the term goes on without it
    # A new leadership term: the leader's module and service die and come back.
    cluster.kill_process(first.member, "consensus")
    cluster.kill_process(first.member, "service")
    cluster.start_process(first.member, "consensus")
    cluster.start_process(first.member, "service")
    leader = wait_for_leader(cluster, 30, min_term=(first.leadership_term_id or 0) + 1)
    client = cluster.connect_client(credentials=SECRET.encode())
    for _ in range(10):
        client.request(b"+", timeout_s=10)
    # (The strangers' challenged sessions are dropped and counted by now.)
    secured.wait_for_refusals_due()
    refused_before = [secured.refused(m) for m in range(3) if m != absent]
    cluster.start_member(absent)
    client.request(b"+", timeout_s=10)
    position = member_view(cluster, leader.member).commit_position
    assert position is not None
    wait_for_commit(cluster, [0, 1, 2], position, 30)
    text = cluster.log_path(absent, "consensus").read_text()
    assert "replicating the log from member" in text
    assert "FOLLOWER_LOG_REPLICATION" in text
    # Its archive presented the secret to the leader's: nobody was refused.
    refused_after = [secured.refused(m) for m in range(3) if m != absent]
    assert refused_after == refused_before, {m: secured.archive_errors(m) for m in range(3) if m != absent}
