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
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fulmar.consensus.recording_log import RECORDING_LOG_FILE_NAME, Entry, decode_entries
from fulmar.errors import FulmarError

from .log_decoder import UNKNOWN_TYPE, find_log_segments, read_log

Apply = Callable[[Any, Any], Any]


class ReplayError(FulmarError):
    """The replay or audit cannot be done as asked (no snapshot, a log that starts later...)."""


@dataclass
class ReplayResult:
    state: Any
    position: int  # every message whose next_position is at or below this was applied
    messages: int


def replay_state(spark: Any, archive_dir: str | os.PathLike[str], apply: Apply, initial: Any,
                 position: int | None = None, *, recording_id: int | None = None) -> ReplayResult:
    """Fold ``apply`` over the log of ``archive_dir`` up to ``position`` (the whole log when None)."""
    from pyspark.sql import functions as F

    # Which recording, and where it starts, the catalog says: no decoding needed.
    segments = find_log_segments([archive_dir], recording_ids=None if recording_id is None else [recording_id])
    recordings = sorted({s.recording_id for s in segments})
    if len(recordings) > 1:
        raise ReplayError(f"{archive_dir} holds {len(recordings)} log recordings ({recordings}); "
                          "pick one with recording_id")
    starts = min((s.position(s.start_offset) for s in segments), default=0)
    if starts > 0:
        raise ReplayError(f"the log in {archive_dir} starts at position {starts}, not 0: its state before that "
                          "is in an earlier snapshot, which this replay does not load")
    reader = spark.read.format("fulmar-log")
    if recording_id is not None:
        reader = reader.option("recordingIds", str(recording_id))
    log = reader.load(os.path.abspath(archive_dir))
    if position is not None:
        log = log.filter(F.col("next_position") <= position)
    state = initial
    count = 0
    last = 0
    for message in log.orderBy("log_position").toLocalIterator():
        state = apply(state, message)
        count += 1
        last = message.next_position
    return ReplayResult(state, last if position is None else position, count)


def _recording_log_entries(cluster_dir: str | os.PathLike[str]) -> list[Entry]:
    """The entries of ``recording.log``, read only (never repaired)."""
    path = Path(cluster_dir) / RECORDING_LOG_FILE_NAME
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ReplayError(f"cannot read {path}: {error.strerror or error}") from None
    return decode_entries(data, str(path)).entries


def latest_service_snapshot(cluster_dir: str | os.PathLike[str], service_id: int = 0,
                            max_position: int | None = None, entries: list[Entry] | None = None) -> Entry:
    """The service's newest valid snapshot entry in ``recording.log``."""
    entries = _recording_log_entries(cluster_dir) if entries is None else entries
    snapshots = [e for e in entries
                 if e.is_valid_snapshot and e.service_id == service_id
                 and (max_position is None or e.log_position <= max_position)]
    if not snapshots:
        where = "" if max_position is None else f" at or below position {max_position}"
        path = Path(cluster_dir) / RECORDING_LOG_FILE_NAME
        raise ReplayError(f"{path} has no snapshot of service {service_id}{where}")
    return max(snapshots, key=lambda e: (e.log_position, e.entry_index))


def snapshot_records(archive_dir: str | os.PathLike[str], recording_id: int) -> list[bytes]:
    """The service's own records in a snapshot recording: every message but
    the cluster schema's (the begin and end markers and the container's
    client-session records), in order."""
    records: list[bytes] = []
    for batch in read_log(os.fspath(archive_dir), {"recordingIds": str(recording_id)}):
        for message_type, payload in zip(batch.column("message_type").to_pylist(), batch.column("payload").to_pylist()):
            if message_type == UNKNOWN_TYPE:  # not the cluster schema's: the service's own
                records.append(payload)
    return records


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
        head = (f"snapshot recording {self.snapshot.recording_id} at log position {self.snapshot.log_position} "
                f"(term {self.snapshot.leadership_term_id}); replayed {self.messages} log messages")
        if self.matches:
            return f"{head}: the states match: {self.snapshot_state!r}"
        return f"{head}: the states DIFFER\n  snapshot: {self.snapshot_state!r}\n  replayed: {self.replayed_state!r}"


def audit_snapshot(spark: Any, archive_dir: str | os.PathLike[str], cluster_dir: str | os.PathLike[str],
                   apply: Apply, initial: Any, load_snapshot: Callable[[list[bytes]], Any], *,
                   view: Callable[[Any], Any] = lambda state: state, service_id: int = 0,
                   max_position: int | None = None) -> AuditResult:
    """Compare the member's latest service snapshot with the log replayed up to its position."""
    entries = _recording_log_entries(cluster_dir)
    entry = latest_service_snapshot(cluster_dir, service_id, max_position, entries)
    snapshot_state = load_snapshot(snapshot_records(archive_dir, entry.recording_id))
    # The member's log recording is the one its TERM entries name.
    term_recordings = {e.recording_id for e in entries if e.is_valid_term}
    recording_id = min(term_recordings) if len(term_recordings) == 1 else None
    result = replay_state(spark, archive_dir, apply, initial, entry.log_position, recording_id=recording_id)
    return AuditResult(entry, snapshot_state, view(result.state), result.messages)
