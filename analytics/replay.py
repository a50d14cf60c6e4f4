"""Offline replay: the state a service would have at a log position, and an
audit of a snapshot against it.

A service's behaviour on the log is written as a pure function
``apply(state, message) -> state``; ``message`` is a row of the
``fulmar-log`` source (``message.message_type``, ``.payload``,
``.timestamp``, ``.cluster_session_id``, ``.correlation_id``, ...), in log
order.  Spark decodes the log's segments in parallel, filters what comes
after the position and sorts; the fold itself is sequential, as the
service's own is (a replicated state machine is exactly that fold), and
runs on the driver as the rows stream in partition by partition
(``toLocalIterator``).

:func:`audit_snapshot` takes a member's latest service snapshot (from its
cluster directory's ``recording.log`` and its archive), turns the service's
own snapshot records into a state with ``load_snapshot(records)``, replays
the log up to the snapshot's log position and compares the two (through
``view`` when the replay keeps more than the snapshot does).

A log whose start was purged (``cluster-tool purge-log``) holds only what
follows the member's oldest kept snapshot: its replay starts from a snapshot
instead of the initial state.  ``resume(snapshot_state, sessions)`` turns
what ``load_snapshot`` made of the service's records, and the client
sessions the container had open (its own records in the same snapshot), into
``apply``'s state; :func:`replay_from_snapshot` folds the log after it, and
an audit of the newest snapshot starts from the one before it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fulmar.codecs.generated import cluster as cluster_codecs
from fulmar.consensus.recording_log import RECORDING_LOG_FILE_NAME, Entry, decode_entries
from fulmar.errors import FulmarError
from fulmar.service.state_machine import handle_request

from .log_decoder import UNKNOWN_TYPE, find_log_segments, read_log

Apply = Callable[[Any, Any], Any]
# resume(snapshot_state, open client sessions) -> apply's state at the snapshot
Resume = Callable[[Any, frozenset[int]], Any]


class ReplayError(FulmarError):
    """The replay or audit cannot be done as asked (no snapshot, a log that starts later...)."""


@dataclass
class ReplayResult:
    state: Any
    position: int  # every message whose next_position is at or below this was applied
    messages: int


def replay_state(
    spark: Any,
    archive_dir: str | os.PathLike[str],
    apply: Apply,
    initial: Any,
    position: int | None = None,
    *,
    recording_id: int | None = None,
    start: tuple[int, Any] | None = None,
) -> ReplayResult:
    """Fold ``apply`` over the log of ``archive_dir`` up to ``position`` (the
    whole log when None), from ``initial``, or from ``start`` = (log position,
    state): a snapshot's, with the messages after it."""
    from pyspark.sql import functions as F

    # Which recording, and where it starts, the catalog says: no decoding needed.
    segments = find_log_segments([archive_dir], recording_ids=None if recording_id is None else [recording_id])
    recordings = sorted({s.recording_id for s in segments})
    if len(recordings) > 1:
        raise ReplayError(
            f"{archive_dir} holds {len(recordings)} log recordings ({recordings}); pick one with recording_id"
        )
    starts = min((s.position(s.start_offset) for s in segments), default=0)
    from_position = 0 if start is None else start[0]
    if starts > from_position:
        raise ReplayError(
            f"the log in {archive_dir} starts at position {starts}, not {from_position}: its state "
            "before that is in a snapshot (replay from one: replay_from_snapshot, or cluster-tool "
            "replay --from-snapshot)"
        )
    reader = spark.read.format("fulmar-log")
    if recording_id is not None:
        reader = reader.option("recordingIds", str(recording_id))
    if from_position:
        reader = reader.option("fromPosition", str(from_position))
    log = reader.load(os.path.abspath(archive_dir))
    if position is not None:
        log = log.filter(F.col("next_position") <= position)
    if from_position:
        log = log.filter(F.col("log_position") >= from_position)
    state = initial if start is None else start[1]
    count = 0
    last = from_position
    for message in log.orderBy("log_position").toLocalIterator():
        state = apply(state, message)
        count += 1
        last = message.next_position
    return ReplayResult(state, last if position is None else position, count)


class _ReplayClock:
    """What a command may read of the cluster in a replay: the log's time."""

    def __init__(self) -> None:
        self.time = 0


class _StateMachineFold:
    """A StateMachine fed the log as its container would feed it: the calls of
    the sessions open at each point, with the log's timestamps."""

    def __init__(self, machine: Any) -> None:
        self.machine = machine
        self.clock = _ReplayClock()
        machine._fulmar.cluster = self.clock  # cluster_time reads its .time
        self.sessions: set[int] = set()

    def apply(self, message: Any) -> _StateMachineFold:
        kind = message.message_type
        if kind == "SessionOpenEvent":
            self.sessions.add(message.cluster_session_id)
        elif kind == "SessionCloseEvent":
            self.sessions.discard(message.cluster_session_id)
        elif kind == "SessionMessageHeader" and message.cluster_session_id in self.sessions:
            self.clock.time = message.timestamp
            handle_request(self.machine, message.timestamp, bytes(message.payload))  # the reply goes nowhere
        return self


def replay_state_machine(
    spark: Any,
    archive_dir: str | os.PathLike[str],
    machine_class: type,
    position: int | None = None,
    *,
    recording_id: int | None = None,
) -> ReplayResult:
    """A ``StateMachine`` subclass's state at ``position`` (the whole log when
    None) of the log in ``archive_dir``: a new instance, every call of the
    log applied to it in order, exactly as the members applied them (a
    resent call answered from the record, not applied again).  The result's
    ``state`` is the instance.  A command may read ``self.cluster_time``;
    anything else of ``self.cluster`` is not there offline."""
    result = replay_state(
        spark,
        archive_dir,
        lambda fold, message: fold.apply(message),
        _StateMachineFold(machine_class()),
        position,
        recording_id=recording_id,
    )
    return ReplayResult(result.state.machine, result.position, result.messages)


def _recording_log_entries(cluster_dir: str | os.PathLike[str]) -> list[Entry]:
    """The entries of ``recording.log``, read only (never repaired)."""
    path = Path(cluster_dir) / RECORDING_LOG_FILE_NAME
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ReplayError(f"cannot read {path}: {error.strerror or error}") from None
    return decode_entries(data, str(path)).entries


def latest_service_snapshot(
    cluster_dir: str | os.PathLike[str],
    service_id: int = 0,
    max_position: int | None = None,
    entries: list[Entry] | None = None,
) -> Entry:
    """The service's newest valid snapshot entry in ``recording.log``."""
    entries = _recording_log_entries(cluster_dir) if entries is None else entries
    snapshots = [
        e
        for e in entries
        if e.is_valid_snapshot
        and e.service_id == service_id
        and (max_position is None or e.log_position <= max_position)
    ]
    if not snapshots:
        where = "" if max_position is None else f" at or below position {max_position}"
        path = Path(cluster_dir) / RECORDING_LOG_FILE_NAME
        raise ReplayError(f"{path} has no snapshot of service {service_id}{where}")
    return max(snapshots, key=lambda e: (e.log_position, e.entry_index))


def snapshot_records(archive_dir: str | os.PathLike[str], recording_id: int) -> list[bytes]:
    """The service's own records in a snapshot recording: every message but
    the cluster schema's (the begin and end markers and the container's
    client-session records), in order."""
    return _snapshot_contents(archive_dir, recording_id)[0]


def snapshot_sessions(archive_dir: str | os.PathLike[str], recording_id: int) -> frozenset[int]:
    """The client sessions the service container had open when it took the
    snapshot (its ClientSession records)."""
    return _snapshot_contents(archive_dir, recording_id)[1]


def _snapshot_contents(archive_dir: str | os.PathLike[str], recording_id: int) -> tuple[list[bytes], frozenset[int]]:
    records: list[bytes] = []
    sessions: set[int] = set()
    for batch in read_log(os.fspath(archive_dir), {"recordingIds": str(recording_id)}):
        for message_type, payload in zip(batch.column("message_type").to_pylist(), batch.column("payload").to_pylist()):
            if message_type == UNKNOWN_TYPE:  # not the cluster schema's: the service's own
                records.append(payload)
            elif message_type == "ClientSession":
                session = cluster_codecs.decode(payload)
                assert isinstance(session, cluster_codecs.ClientSessionDecoder)
                sessions.add(session.cluster_session_id)
    return records, frozenset(sessions)


def snapshot_start(
    archive_dir: str | os.PathLike[str], entry: Entry, load_snapshot: Callable[[list[bytes]], Any], resume: Resume
) -> tuple[int, Any]:
    """(log position, state) a replay starts from at the service snapshot ``entry``."""
    records, sessions = _snapshot_contents(archive_dir, entry.recording_id)
    return entry.log_position, resume(load_snapshot(records), sessions)


def _member_log_recording(entries: list[Entry]) -> int | None:
    """The member's log recording: the one its TERM entries name."""
    term_recordings = {e.recording_id for e in entries if e.is_valid_term}
    return min(term_recordings) if len(term_recordings) == 1 else None


def replay_from_snapshot(
    spark: Any,
    archive_dir: str | os.PathLike[str],
    cluster_dir: str | os.PathLike[str],
    apply: Apply,
    load_snapshot: Callable[[list[bytes]], Any],
    resume: Resume,
    position: int | None = None,
    *,
    service_id: int = 0,
) -> ReplayResult:
    """The state at ``position`` (the end of the log when None), replayed from
    the member's newest service snapshot at or below it: what a purged log
    still allows, and faster than a replay of the whole log."""
    entries = _recording_log_entries(cluster_dir)
    entry = latest_service_snapshot(cluster_dir, service_id, position, entries)
    return replay_state(
        spark,
        archive_dir,
        apply,
        None,
        position,
        recording_id=_member_log_recording(entries),
        start=snapshot_start(archive_dir, entry, load_snapshot, resume),
    )


@dataclass
class AuditResult:
    snapshot: Entry
    snapshot_state: Any
    replayed_state: Any
    messages: int

    @property
    def matches(self) -> bool:
        return bool(self.snapshot_state == self.replayed_state)

    def describe(self) -> str:
        head = (
            f"snapshot recording {self.snapshot.recording_id} at log position {self.snapshot.log_position} "
            f"(term {self.snapshot.leadership_term_id}); replayed {self.messages} log messages"
        )
        if self.matches:
            return f"{head}: the states match: {self.snapshot_state!r}"
        return f"{head}: the states DIFFER\n  snapshot: {self.snapshot_state!r}\n  replayed: {self.replayed_state!r}"


def audit_snapshot(
    spark: Any,
    archive_dir: str | os.PathLike[str],
    cluster_dir: str | os.PathLike[str],
    apply: Apply,
    initial: Any,
    load_snapshot: Callable[[list[bytes]], Any],
    *,
    view: Callable[[Any], Any] = lambda state: state,
    service_id: int = 0,
    max_position: int | None = None,
    resume: Resume | None = None,
) -> AuditResult:
    """Compare the member's latest service snapshot with the log replayed up to
    its position: from the start of the log, or, once the log before it was
    purged, from the snapshot before it (which ``resume`` turns into a state)."""
    entries = _recording_log_entries(cluster_dir)
    entry = latest_service_snapshot(cluster_dir, service_id, max_position, entries)
    snapshot_state = load_snapshot(snapshot_records(archive_dir, entry.recording_id))
    recording_id = _member_log_recording(entries)
    segments = find_log_segments([archive_dir], recording_ids=None if recording_id is None else [recording_id])
    log_start = min((s.position(s.start_offset) for s in segments), default=0)
    start = None
    if log_start > 0:
        earlier = [
            e
            for e in entries
            if e.is_valid_snapshot and e.service_id == service_id and log_start <= e.log_position < entry.log_position
        ]
        if not earlier:
            raise ReplayError(
                f"the log in {archive_dir} starts at {log_start}: nothing before the snapshot at "
                f"{entry.log_position} is kept to replay it from (keep two snapshot sets to audit "
                "one: cluster-tool purge-log --keep-snapshots 2)"
            )
        if resume is None:
            raise ReplayError(
                f"the log in {archive_dir} starts at {log_start}: the audit replays from the "
                "snapshot before, which needs resume(snapshot_state, sessions)"
            )
        base = max(earlier, key=lambda e: (e.log_position, e.entry_index))
        start = snapshot_start(archive_dir, base, load_snapshot, resume)
    result = replay_state(
        spark, archive_dir, apply, initial, entry.log_position, recording_id=recording_id, start=start
    )
    return AuditResult(entry, snapshot_state, view(result.state), result.messages)
