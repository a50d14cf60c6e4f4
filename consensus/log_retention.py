"""Log retention: a member's log and snapshots before the snapshots it keeps
are let go, so that its disk does not fill up.

A member recovers from its newest complete snapshot set (the consensus
module's and every service's, at one log position) and the log after it
(seed 002), so the log before the oldest snapshot set it keeps is never read
again by that member.  Retention keeps the newest ``keep_snapshots`` sets and:

- invalidates the recording log's entries of every older snapshot, then
  deletes those snapshot recordings from the archive (the entries first: a
  stop between the two leaves a recording nothing names, never an entry that
  names a recording that is gone);
- purges the log recording's segment files before the segment that holds the
  oldest kept set's log position (Aeron's PurgeSegments: the log recording's
  start moves to that segment's first byte).

Aeron has the pieces (``AeronArchive.purgeSegments``, ``RecordingLog``'s
invalidation) but leaves the policy to the operator; fulmar runs it from
``cluster-tool purge-log`` and, with ``--log-retention-snapshots N``, after
every snapshot a consensus module takes.  A member that was away while its
leader's log was purged cannot replicate what is no longer there: a blank
member joins from the leader's snapshot (``fulmar.consensus.snapshot_join``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fulmar.archive.segment import segment_file_base_position
from fulmar.consensus.recording_log import CONSENSUS_MODULE_SERVICE_ID, Entry
from fulmar.errors import FulmarError

if TYPE_CHECKING:
    from fulmar.archive.catalog import RecordingDescriptor
    from fulmar.archive.client import AeronArchive


class LogRetentionError(FulmarError):
    """Retention cannot be planned or applied as asked; the message says why."""


@dataclass(frozen=True)
class SnapshotSet:
    """The snapshots taken at one log position: the consensus module's and each service's."""

    leadership_term_id: int
    log_position: int
    entries: tuple[Entry, ...]  # the consensus module's first, then the services' by id


@dataclass
class RetentionPlan:
    kept: list[SnapshotSet]  # newest first
    removed: list[Entry]  # snapshot entries of older sets (and of incomplete sets older than the kept ones)
    log_recording_id: int
    log_start_position: int  # where the log recording starts now
    new_log_start_position: int  # where it will start (the same: nothing to purge)

    @property
    def purges_log(self) -> bool:
        return self.new_log_start_position > self.log_start_position


@dataclass
class RetentionResult:
    plan: RetentionPlan
    segments_deleted: int = 0
    snapshots_deleted: list[int] = field(default_factory=list)  # recording ids
    problems: list[str] = field(default_factory=list)  # what could not be done, and why

    def describe(self) -> str:
        plan = self.plan
        kept = ", ".join(f"{s.log_position} (term {s.leadership_term_id})" for s in plan.kept) or "none"
        log = (
            f"log recording {plan.log_recording_id} now starts at {plan.new_log_start_position} "
            f"(was {plan.log_start_position}; {self.segments_deleted} segment file(s) deleted)"
            if plan.purges_log
            else f"log recording {plan.log_recording_id} starts at {plan.log_start_position}: nothing to purge"
        )
        text = (
            f"kept {len(plan.kept)} snapshot set(s) at log position(s) {kept}; "
            f"deleted {len(self.snapshots_deleted)} older snapshot recording(s); {log}"
        )
        if self.problems:
            text += "; not done: " + "; ".join(self.problems)
        return text


def snapshot_sets(entries: Sequence[Entry], service_count: int) -> list[SnapshotSet]:
    """Complete snapshot sets, newest first: a valid consensus module snapshot
    with a valid snapshot of every service ``0..service_count-1`` at the same
    term and log position (the latest entry of each wins, as in recovery)."""
    by_point: dict[tuple[int, int], dict[int, Entry]] = {}
    for entry in entries:
        if entry.is_valid_snapshot:
            by_point.setdefault((entry.leadership_term_id, entry.log_position), {})[entry.service_id] = entry
    sets = []
    wanted = [CONSENSUS_MODULE_SERVICE_ID, *range(service_count)]
    for (term_id, position), found in by_point.items():
        if all(service_id in found for service_id in wanted):
            sets.append(SnapshotSet(term_id, position, tuple(found[s] for s in wanted)))
    sets.sort(key=lambda s: (s.log_position, s.leadership_term_id), reverse=True)
    return sets


def last_term(entries: Sequence[Entry]) -> Entry | None:
    """The newest valid TERM entry (the log recording a member recovers from)."""
    terms = [entry for entry in entries if entry.is_valid_term]
    return max(terms, key=lambda e: (e.leadership_term_id, e.entry_index)) if terms else None


def plan_retention(
    entries: Sequence[Entry],
    service_count: int,
    keep_snapshots: int,
    describe_recording: Callable[[int], RecordingDescriptor | None],
    where: str = "recording.log",
) -> RetentionPlan:
    """What keeping the newest ``keep_snapshots`` snapshot sets lets go of, from
    a member's recording log ``entries``.  ``describe_recording`` gives the
    archive's descriptor of a recording (its start position, term and segment
    lengths); ``where`` names the recording log in messages."""
    if keep_snapshots < 1:
        raise LogRetentionError(
            f"keep at least one snapshot set (asked to keep {keep_snapshots}): the log before "
            "a member's newest snapshot is what it recovers from without one"
        )
    term = last_term(entries)
    if term is None:
        raise LogRetentionError(f"{where} has no leadership term: there is no log to purge")
    descriptor = describe_recording(term.recording_id)
    if descriptor is None:
        raise LogRetentionError(f"the archive has no log recording {term.recording_id} (named by {where})")
    kept = snapshot_sets(entries, service_count)[:keep_snapshots]
    start = descriptor.start_position
    new_start = start
    removed: list[Entry] = []
    if kept:
        oldest = kept[-1].log_position
        base = segment_file_base_position(start, oldest, descriptor.term_buffer_length, descriptor.segment_file_length)
        new_start = max(start, base)
        kept_entries = {entry.entry_index for snapshot_set in kept for entry in snapshot_set.entries}
        removed = [
            entry
            for entry in entries
            if entry.is_valid_snapshot and entry.entry_index not in kept_entries and entry.log_position < oldest
        ]
    return RetentionPlan(kept, removed, term.recording_id, start, new_start)


def apply_retention(
    archive: AeronArchive, invalidate: Callable[[Entry], object], plan: RetentionPlan
) -> RetentionResult:
    """Carry out ``plan`` through the member's archive; ``invalidate`` marks a
    recording log entry invalid.  What the archive refuses (a replay still
    reading the segments, say) is reported in ``problems``: the recording log
    only loses entries whose recordings are then deleted, and the log only
    what lies before the oldest snapshot set kept."""
    result = RetentionResult(plan)
    for entry in plan.removed:
        invalidate(entry)
    for entry in plan.removed:
        try:
            archive.purge_recording(entry.recording_id)
        except FulmarError as error:
            result.problems.append(f"snapshot recording {entry.recording_id}: {error}")
        else:
            result.snapshots_deleted.append(entry.recording_id)
    if plan.purges_log:
        try:
            result.segments_deleted = archive.purge_segments(plan.log_recording_id, plan.new_log_start_position)
        except FulmarError as error:
            result.problems.append(f"log recording {plan.log_recording_id} from {plan.new_log_start_position}: {error}")
            plan.new_log_start_position = plan.log_start_position
    return result
