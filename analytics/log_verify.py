"""The recorded cluster log checked against the invariants of the Raft log it
is (``cluster-tool verify-log``).

Each member's log is the archive recording its ``recording.log`` names (the
recording id of its TERM entries); the segment files are decoded with the
analytics decoder (:mod:`fulmar.analytics.log_decoder`, the C walk that
reassembles fragments) and compared byte for byte with the other members'.
Files are only read: a stopped cluster's (the normal use, after a run) or a
running one's, whose last frames are still being written.

What each check guarantees when it passes (each violation names its check,
its member and the log position it was found at):

``term-event``
    The NewLeadershipTermEvent that opens each leadership term carries that
    term.  Every event in the log has the leadershipTermId of the recording
    log's TERM entry whose range holds its position, that term's base as its
    termBaseLogPosition, and a logPosition within its term's first message
    (Aeron's leader, and fulmar's since, write the end of the event there;
    fulmar's before wrote the term's base: both lie in it).  Each term that holds anything begins with its
    event: the leader appends nothing else during an election, and the event
    is what ends it (``consensus/agent.py`` ``append_new_leadership_term_event``,
    called from LEADER_READY; ingress, timers, service messages and cluster
    actions wait for the election to close), so only padding may precede it
    (the event did not fit in the rest of a term buffer and went to the
    next).  Catches a leader that writes the previous term's id into the new
    term's event, and a term whose event is missing or misplaced.
``term-order``
    Terms never decrease along the log: the events' leadershipTermIds rise
    strictly, and every other message (SessionMessageHeader, SessionOpen-
    and SessionCloseEvent, TimerEvent, ClusterActionRequest: the leader
    stamps each with its current term, seed 004) carries the term it lies in.
``recording-log``
    ``recording.log`` describes the log: its TERM entries have distinct term
    ids and, in term order, non-decreasing bases; a term's logPosition, once
    set, is the next term's base (or, for the last term, a termination
    position inside the log); no term begins beyond the log's end; each
    snapshot entry names a term it lies in (its base that term's base, its
    position between that base and the next term's) and a position inside
    the log; and the recording it names is a valid recording of the log
    stream in the archive.  The recording log is what a restart recovers
    from: these are the facts recovery and elections rely on.
``agreement``
    Members hold the same log where Raft says they must.  Two members'
    logs are compared wherever (a) both members' own files prove the
    position committed (below the lower of their two commit positions: a
    snapshot's position, or the last term's logPosition after an orderly
    stop, each taken only once the services had applied the log there,
    which they do only up to the commit position); committed entries are
    identical on every member that holds them (Raft's state machine
    safety); and (b) both recording logs put the position in the same term
    with the same base: one leader appends each term, so every copy of it
    is that leader's (Raft's log matching).  Nothing else is compared:
    members may differ in an uncommitted tail that a later term truncated
    or replaced (a member that was down keeps its stale tail until it
    rejoins, even below the cluster's commit position, so a commit position
    only one of the two members knows is not enough).  Where two members
    disagree on where a term begins, that is reported too.
``log-damaged``
    The log decodes: no hole or malformed frame below where the recording
    stops, and every message is one a leader appends.

The comparison is of bytes, not decoded messages: bytes are stronger (frame
headers, fragmentation, every payload byte, messages the decoder does not
look into) and cheap (a memcmp per term, frame by frame only where two terms
differ).  Three parts of a recorded frame are not the log's content and are
left out: a frame's session id field (the archive stores a checksum there
when recording with checksums, per archive; a replay for catch-up or
replication gives a new session), the alignment bytes after a frame's
length, and a padding frame's body (only its header is sent; the body is
whatever lay in that member's term buffer).

Not violations: a running archive's last frames (a recording that is still
open is read up to the position its writes have reached, the catalog's
recorded position; an open recording of an archive that is not running up
to its last complete frame, as the archive's own recovery would), a
fragmented message cut off at the end, and terms before a purged log's
start.  A member whose files cannot be read at all (no archive or cluster
directory, no or a corrupt catalog or recording log) is reported as
unreadable, apart from the violations.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fulmar._native import ffi, lib
from fulmar.archive.catalog import CATALOG_FILE_NAME, NULL_POSITION, Catalog, RecordingDescriptor
from fulmar.archive.errors import ArchiveError, describe_os_error
from fulmar.archive.segment import scan_complete_frames, segment_file_base_position, segment_file_name
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.log_rebuild import log_recordings
from fulmar.consensus.protocol import LOG_STREAM_ID
from fulmar.consensus.recording_log import RECORDING_LOG_FILE_NAME, Entry, RecordingLogError, decode_entries
from fulmar.errors import CodecError
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH, FrameType, align

from .log_decoder import CorruptRegion, DecodedBatch, DecodeStats, decode_segment, recording_segments

CHECK_TERM_EVENT = "term-event"
CHECK_TERM_ORDER = "term-order"
CHECK_RECORDING_LOG = "recording-log"
CHECK_AGREEMENT = "agreement"
CHECK_LOG_DAMAGED = "log-damaged"

NEW_LEADERSHIP_TERM_EVENT = codecs.NewLeadershipTermEventDecoder.TEMPLATE_ID
# The messages a leader appends to the log, each stamped with its term (seed 004).
LOG_TEMPLATES: dict[int, str] = {
    decoder.TEMPLATE_ID: decoder.NAME
    for decoder in (
        codecs.SessionMessageHeaderDecoder,
        codecs.SessionOpenEventDecoder,
        codecs.SessionCloseEventDecoder,
        codecs.TimerEventDecoder,
        codecs.ClusterActionRequestDecoder,
        codecs.NewLeadershipTermEventDecoder,
    )
}
_LOG_TEMPLATE_IDS = np.array(sorted(LOG_TEMPLATES), np.int32)

# frame_length i32, version u8, flags u8, type u16, term_offset i32, session_id i32,
# stream_id i32, term_id i32, reserved_value i64
_FRAME_HEADER = struct.Struct("<iBBHiiiiq")
_HEADER_FIELDS = (
    "frame length",
    "version",
    "flags",
    "type",
    "term offset",
    None,
    "stream id",
    "term id",
    "reserved value",
)
_PAD = int(FrameType.PAD)
_DATA = int(FrameType.DATA)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which check, on which member, where in the log."""

    check: str
    member: str
    position: int | None
    message: str
    other_member: str | None = None

    def text(self) -> str:
        where = f" at {self.position}" if self.position is not None else ""
        members = f"{self.member}/{self.other_member}" if self.other_member else self.member
        return f"[{self.check}] {members}{where}: {self.message}"

    def document(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "member": self.member,
            "other_member": self.other_member,
            "position": self.position,
            "message": self.message,
        }


@dataclass(frozen=True)
class UnreadableMember:
    member: str
    reason: str


@dataclass(frozen=True)
class MemberFiles:
    """Where one member keeps what is checked."""

    name: str
    cluster_dir: Path
    archive_dir: Path | None  # None: not known (no archive/ beside the cluster directory)
    archive_running: bool = False  # an archive owns archive_dir now: an open recording is still being written


@dataclass(frozen=True)
class Term:
    """A valid TERM entry of ``recording.log`` and the range of the log it names."""

    leadership_term_id: int
    base: int
    log_position: int  # as recorded: NULL_POSITION while the term is open
    end: int | None  # the next term's base (term id order); None for the last term


@dataclass(frozen=True)
class TermEvent:
    """A NewLeadershipTermEvent read from the log."""

    position: int  # where its frame starts
    next_position: int  # after its frame
    leadership_term_id: int
    log_position: int
    term_base_log_position: int


@dataclass(frozen=True)
class FirstMessage:
    """The first message the log holds in a term's range."""

    position: int
    template_id: int
    schema_id: int


@dataclass
class MemberLog:
    """What one member's files say: its terms and snapshots, and its log as read."""

    name: str
    archive_dir: Path
    recording: RecordingDescriptor
    start_position: int
    end_position: int  # where reading stopped: the stop position, or (open) what is known written
    stop_known: bool  # end_position is where the recording stopped
    terms: list[Term]
    snapshots: list[Entry]
    term_events: list[TermEvent] = field(default_factory=list)
    messages: int = 0
    commit_position: int = 0  # the highest position this member's own files prove committed
    commit_source: str = ""

    @property
    def term_length(self) -> int:
        return self.recording.term_buffer_length

    def term(self, leadership_term_id: int) -> Term | None:
        for term in self.terms:
            if term.leadership_term_id == leadership_term_id:
                return term
        return None

    def document(self) -> dict[str, Any]:
        return {
            "member": self.name,
            "archive_dir": str(self.archive_dir),
            "recording_id": self.recording.recording_id,
            "start_position": self.start_position,
            "end_position": self.end_position,
            "stopped": self.stop_known,
            "messages": self.messages,
            "terms": [
                {
                    "leadership_term_id": t.leadership_term_id,
                    "base": t.base,
                    "end": t.end,
                    "log_position": None if t.log_position == NULL_POSITION else t.log_position,
                }
                for t in self.terms
            ],
            "term_events": [e.position for e in self.term_events],
            "snapshot_positions": sorted({s.log_position for s in self.snapshots}),
            "commit_position": self.commit_position,
            "commit_source": self.commit_source,
        }

    def text(self) -> str:
        terms = ", ".join(
            f"{t.leadership_term_id}@{t.base}..{t.end if t.end is not None else self.end_position}" for t in self.terms
        )
        snapshots = ", ".join(str(p) for p in sorted({s.log_position for s in self.snapshots})) or "none"
        events = ", ".join(str(e.position) for e in self.term_events) or "none"
        state = "stopped" if self.stop_known else "open, read to what is written"
        return (
            f"{self.name}: log recording {self.recording.recording_id}, positions {self.start_position}.."
            f"{self.end_position} ({state}), {self.messages} messages, NewLeadershipTermEvents at {events}; "
            f"terms (id@base..end) {terms}; snapshots at {snapshots}; "
            f"committed to {self.commit_position} ({self.commit_source})"
        )


@dataclass(frozen=True)
class Comparison:
    """Two members' logs compared over ``ranges`` (merged [low, high) pairs)."""

    member: str
    other_member: str
    ranges: tuple[tuple[int, int], ...]
    bytes_compared: int

    def document(self) -> dict[str, Any]:
        return {
            "members": [self.member, self.other_member],
            "ranges": [list(r) for r in self.ranges],
            "bytes_compared": self.bytes_compared,
        }


@dataclass
class LogVerification:
    """The outcome: what was checked, every violation, what could not be read."""

    members: list[MemberLog] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    unreadable: list[UnreadableMember] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations and not self.unreadable

    def document(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "members": [m.document() for m in self.members],
            "comparisons": [c.document() for c in self.comparisons],
            "bytes_compared": sum(c.bytes_compared for c in self.comparisons),
            "violations": [v.document() for v in self.violations],
            "unreadable": [{"member": u.member, "reason": u.reason} for u in self.unreadable],
            "notes": self.notes,
        }


# --------------------------------------------------------------------------- check 3: the recording log


def term_ranges(member: str, entries: Sequence[Entry]) -> tuple[list[Term], list[Violation]]:
    """The valid TERM entries in term id order, each with its range's end;
    and what is wrong with them on their own: a term id twice, a base below
    an earlier term's, a logPosition that is not the next term's base."""
    violations: list[Violation] = []
    valid = sorted((e for e in entries if e.is_valid_term), key=lambda e: (e.leadership_term_id, e.entry_index))
    unique: list[Entry] = []
    for entry in valid:
        if unique and unique[-1].leadership_term_id == entry.leadership_term_id:
            violations.append(
                Violation(
                    CHECK_RECORDING_LOG,
                    member,
                    entry.term_base_log_position,
                    f"two valid TERM entries for term {entry.leadership_term_id} (indexes "
                    f"{unique[-1].entry_index} and {entry.entry_index})",
                )
            )
            continue
        unique.append(entry)
    terms: list[Term] = []
    for index, entry in enumerate(unique):
        following = unique[index + 1] if index + 1 < len(unique) else None
        end = following.term_base_log_position if following is not None else None
        terms.append(Term(entry.leadership_term_id, entry.term_base_log_position, entry.log_position, end))
        if following is not None and following.term_base_log_position < entry.term_base_log_position:
            violations.append(
                Violation(
                    CHECK_RECORDING_LOG,
                    member,
                    following.term_base_log_position,
                    f"term {following.leadership_term_id} begins at {following.term_base_log_position}, before "
                    f"term {entry.leadership_term_id}'s base {entry.term_base_log_position}",
                )
            )
        if following is not None and entry.log_position not in (NULL_POSITION, following.term_base_log_position):
            violations.append(
                Violation(
                    CHECK_RECORDING_LOG,
                    member,
                    entry.log_position,
                    f"term {entry.leadership_term_id} ends at logPosition {entry.log_position}, but the next term "
                    f"{following.leadership_term_id} begins at {following.term_base_log_position}",
                )
            )
    return terms, violations


def terms_in_order(terms: Sequence[Term]) -> bool:
    """Whether the terms' bases never decrease (what attributing positions to terms needs)."""
    return all(a.base <= b.base for a, b in zip(terms, terms[1:]))


def check_recording_log(
    member: str,
    terms: Sequence[Term],
    snapshots: Sequence[Entry],
    start_position: int,
    end_position: int,
    stop_known: bool,
) -> list[Violation]:
    """The recording log's positions against the log's extent: terms that
    begin beyond its end, a termination position outside it, snapshots
    outside their term or the log.  Beyond the end of an open recording
    nothing is a violation (what is written there is not read yet)."""
    violations: list[Violation] = []

    def add(position: int, message: str) -> None:
        violations.append(Violation(CHECK_RECORDING_LOG, member, position, message))

    if stop_known:
        for term in terms:
            if term.base > end_position:
                add(
                    term.base,
                    f"term {term.leadership_term_id} begins at {term.base}, beyond the log's end {end_position}",
                )
        last = terms[-1] if terms else None
        if last is not None and last.log_position != NULL_POSITION and last.log_position > end_position:
            add(
                last.log_position,
                f"the last term {last.leadership_term_id} ends at logPosition {last.log_position}, beyond the log's "
                f"end {end_position}",
            )
    by_id = {t.leadership_term_id: t for t in terms}
    for snapshot in snapshots:
        position = snapshot.log_position
        what = f"the snapshot (service {snapshot.service_id}) at {position}"
        named = by_id.get(snapshot.leadership_term_id)
        if named is None:
            add(position, f"{what} names term {snapshot.leadership_term_id}, which has no valid TERM entry")
        else:
            if snapshot.term_base_log_position != named.base:
                add(
                    position,
                    f"{what} names term {named.leadership_term_id} with base {snapshot.term_base_log_position}, "
                    f"but that term begins at {named.base}",
                )
            if position < named.base or (named.end is not None and position > named.end):
                end = named.end if named.end is not None else "the log's end"
                add(position, f"{what} lies outside its term {named.leadership_term_id} ({named.base}..{end})")
        if position < start_position:
            add(position, f"{what} lies before the log's start {start_position}: the log after it is gone")
        if stop_known and position > end_position:
            add(position, f"{what} lies beyond the log's end {end_position}")
    return violations


def commit_evidence(terms: Sequence[Term], snapshots: Sequence[Entry], start_position: int) -> tuple[int, str]:
    """The highest position the member's own files prove committed, and how:
    a snapshot is taken only at a position its services have applied, and the
    last term gets a logPosition only at an orderly stop, once the services
    applied the log there (``commit_log_position`` of the termination
    position); services apply only what is committed.  A term's end set when
    the next term began proves nothing (a new leader's base is not yet
    committed when a follower records it), so it is not taken."""
    position, source = start_position, "nothing proves more: no snapshot, no termination position"
    for snapshot in snapshots:
        if snapshot.log_position > position:
            position, source = snapshot.log_position, f"snapshot at {snapshot.log_position}"
    last = terms[-1] if terms else None
    if last is not None and last.log_position != NULL_POSITION and last.log_position > position:
        position, source = (
            last.log_position,
            f"termination position {last.log_position} of term {last.leadership_term_id}",
        )
    return position, source


# --------------------------------------------------------------------------- checks 1 and 2: the log's messages


class MessageTermCheck:
    """Every message of a member's log against the term its recording log puts
    it in, batch by batch in log order (numpy over the decoder's columns).
    Gathers what checks 1 and 2 need: the NewLeadershipTermEvents, the first
    message of each term's range, and the messages that carry another term."""

    def __init__(self, member: str, terms: Sequence[Term]) -> None:
        self.member = member
        self.terms = list(terms)
        self._bases = np.array([t.base for t in terms], np.int64)
        self._term_ids = np.array([t.leadership_term_id for t in terms], np.int64)
        self.messages = 0
        self.term_events: list[TermEvent] = []
        self.first_messages: dict[int, FirstMessage] = {}  # term index -> first message in its range
        # (term index or -1, carried term id) -> (count, first position, first template id)
        self._wrong_term: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._unknown_count = 0  # messages of a kind no leader appends
        self._first_unknown: tuple[int, int, int] | None = None  # (position, schema id, template id)
        self._undecodable: list[Violation] = []  # NewLeadershipTermEvents the codec refuses

    def term_index(self, positions: np.ndarray) -> np.ndarray:
        """The index of the term whose range holds each position; -1 before the first term."""
        return np.searchsorted(self._bases, positions, side="right") - 1

    def add(
        self,
        positions: np.ndarray,
        template_ids: np.ndarray,
        schema_ids: np.ndarray,
        term_ids: np.ndarray,
        term_events: Iterable[TermEvent] = (),
    ) -> None:
        """One batch of decoded messages (int64 positions where each message's
        first frame starts, its template and schema ids and leadershipTermId),
        in log order, with the NewLeadershipTermEvents among them."""
        count = len(positions)
        if count == 0:
            return
        self.messages += count
        self.term_events.extend(term_events)
        carries_term = (schema_ids == codecs.SCHEMA_ID) & np.isin(template_ids, _LOG_TEMPLATE_IDS)
        unknown = ~carries_term
        if unknown.any():
            self._unknown_count += int(unknown.sum())
            if self._first_unknown is None:
                first = int(np.argmax(unknown))
                self._first_unknown = (int(positions[first]), int(schema_ids[first]), int(template_ids[first]))
        index = self.term_index(positions)
        # The first message of each term's range (positions rise, so do the indexes).
        seen, first_rows = np.unique(index, return_index=True)
        for term_index, row in zip(seen.tolist(), first_rows.tolist()):
            if term_index >= 0 and term_index not in self.first_messages:
                self.first_messages[term_index] = FirstMessage(
                    int(positions[row]), int(template_ids[row]), int(schema_ids[row])
                )
        # The events are checked on their own (check 1); every other message must carry its range's term.
        if len(self._term_ids):
            expected = np.where(index >= 0, self._term_ids[np.maximum(index, 0)], -1)
        else:
            expected = np.full(count, -1, np.int64)
        wrong = carries_term & (template_ids != NEW_LEADERSHIP_TERM_EVENT) & ((index < 0) | (term_ids != expected))
        if wrong.any():
            rows = np.flatnonzero(wrong)
            for term_index, carried, position, template in zip(
                index[rows].tolist(), term_ids[rows].tolist(), positions[rows].tolist(), template_ids[rows].tolist()
            ):
                key = (term_index, carried)
                found = self._wrong_term.get(key)
                self._wrong_term[key] = (1, position, template) if found is None else (found[0] + 1, found[1], found[2])

    def add_batch(self, batch: DecodedBatch) -> None:
        """A batch from :func:`fulmar.analytics.log_decoder.decode_segment`."""
        columns = batch.columns
        base = batch.segment.segment_base
        positions = columns["offset"] + base
        next_positions = columns["next_offset"] + base
        template_ids = columns["template_id"]
        schema_ids = columns["schema_id"]
        events = []
        for row in np.flatnonzero((schema_ids == codecs.SCHEMA_ID) & (template_ids == NEW_LEADERSHIP_TERM_EVENT)):
            start, end = int(batch.payload_offsets[row]), int(batch.payload_offsets[row + 1])
            position = int(positions[row])
            try:
                events.append(decode_term_event(batch.payload[start:end], position, int(next_positions[row])))
            except CodecError as error:
                text = f"a NewLeadershipTermEvent that does not decode: {error}"
                self._undecodable.append(Violation(CHECK_LOG_DAMAGED, self.member, position, text))
        self.add(positions, template_ids, schema_ids, columns["leadership_term_id"], events)

    def violations(self) -> list[Violation]:
        found = list(self._undecodable)
        for (term_index, carried), (count, position, template) in sorted(
            self._wrong_term.items(), key=lambda i: i[1][1]
        ):
            messages = f"{count} message{'' if count == 1 else 's'}"
            carry = "carries" if count == 1 else "carry"
            first = f"the first a {LOG_TEMPLATES.get(template, template)} at {position}"
            if term_index < 0:
                first_term = self.terms[0] if self.terms else None
                where = (
                    f"before the first term's base {first_term.base} (term {first_term.leadership_term_id})"
                    if first_term is not None
                    else "where recording.log names no term"
                )
                text = (
                    f"{messages} carrying leadershipTermId {carried} {'lies' if count == 1 else 'lie'} {where}; {first}"
                )
            else:
                term = self.terms[term_index]
                text = (
                    f"{messages} in term {term.leadership_term_id} (from {term.base}) {carry} leadershipTermId "
                    f"{carried}; {first}"
                )
            found.append(Violation(CHECK_TERM_ORDER, self.member, position, text))
        if self._first_unknown is not None:
            position, schema, template = self._first_unknown
            count = self._unknown_count
            found.append(
                Violation(
                    CHECK_LOG_DAMAGED,
                    self.member,
                    position,
                    f"{count} message{'' if count == 1 else 's'} of a kind no leader appends, the first of schema "
                    f"{schema} template {template}",
                )
            )
        return found


def decode_term_event(message: bytes, position: int, next_position: int) -> TermEvent:
    """A NewLeadershipTermEvent's fields from its whole SBE message."""
    decoded = codecs.decode(message, 0, len(message))
    if not isinstance(decoded, codecs.NewLeadershipTermEventDecoder):
        raise CodecError(f"template {decoded.TEMPLATE_ID}, not a NewLeadershipTermEvent")
    return TermEvent(
        position,
        next_position,
        decoded.leadership_term_id,
        decoded.log_position,
        decoded.term_base_log_position,
    )


def check_term_events(
    member: str,
    terms: Sequence[Term],
    term_events: Sequence[TermEvent],
    first_messages: dict[int, FirstMessage],
    start_position: int,
    end_position: int,
    term_length: int,
) -> list[Violation]:
    """Check 1 (each term opens with its own NewLeadershipTermEvent, and each
    event carries the term it lies in) and the first half of check 2 (the
    events' terms rise strictly along the log)."""
    violations: list[Violation] = []
    bases = [t.base for t in terms]
    known = {t.leadership_term_id for t in terms}

    def add(check: str, position: int, message: str) -> None:
        violations.append(Violation(check, member, position, message))

    previous: TermEvent | None = None
    for event in term_events:
        if previous is not None and event.leadership_term_id <= previous.leadership_term_id:
            add(
                CHECK_TERM_ORDER,
                event.position,
                f"the NewLeadershipTermEvent carries leadershipTermId {event.leadership_term_id}, not above the "
                f"previous event's {previous.leadership_term_id} (at {previous.position})",
            )
        previous = event
        index = _term_index(bases, event.position)
        if index < 0:
            add(
                CHECK_TERM_EVENT,
                event.position,
                f"a NewLeadershipTermEvent of term {event.leadership_term_id} before the first term's base "
                f"{bases[0] if bases else '(recording.log names no term)'}",
            )
            continue
        term = terms[index]
        if event.leadership_term_id != term.leadership_term_id:
            unknown = (
                "" if event.leadership_term_id in known else f" (recording.log has no term {event.leadership_term_id})"
            )
            add(
                CHECK_TERM_EVENT,
                event.position,
                f"the NewLeadershipTermEvent carries leadershipTermId {event.leadership_term_id}, but recording.log "
                f"puts position {event.position} in term {term.leadership_term_id} (from {term.base}){unknown}",
            )
        if event.term_base_log_position != term.base:
            add(
                CHECK_TERM_EVENT,
                event.position,
                f"the NewLeadershipTermEvent says termBaseLogPosition {event.term_base_log_position}, but term "
                f"{term.leadership_term_id} begins at {term.base} in recording.log",
            )
        if not term.base <= event.log_position <= event.next_position:
            add(
                CHECK_TERM_EVENT,
                event.position,
                f"the NewLeadershipTermEvent says logPosition {event.log_position}, outside its term's first "
                f"message ({term.base}..{event.next_position})",
            )
    events_at = {event.position: event for event in term_events}
    for index, term in enumerate(terms):
        range_end = term.end if term.end is not None else end_position
        if term.base < start_position or term.base >= min(range_end, end_position):
            continue  # before a purged log's start; an empty term; or beyond what is read
        first = first_messages.get(index)
        name = f"term {term.leadership_term_id}"
        if first is None:
            if term.end is not None and term.end <= end_position:
                add(
                    CHECK_TERM_EVENT,
                    term.base,
                    f"{name} ({term.base}..{term.end}) holds no message: its NewLeadershipTermEvent is missing",
                )
            continue
        if first.position not in events_at:
            kind = LOG_TEMPLATES.get(first.template_id, "message") if first.schema_id == codecs.SCHEMA_ID else "message"
            add(
                CHECK_TERM_EVENT,
                first.position,
                f"{name} begins at {term.base} with a {kind}, not its NewLeadershipTermEvent",
            )
            continue
        # Only padding may come first, and padding runs to the end of a term buffer.
        allowed = {term.base}
        if term.base % term_length:
            allowed.add((term.base // term_length + 1) * term_length)
        if first.position not in allowed:
            add(
                CHECK_TERM_EVENT,
                first.position,
                f"{name}'s NewLeadershipTermEvent is at {first.position}, not at its base {term.base} (nor after "
                f"padding to the next term buffer)",
            )
    return violations


def _term_index(bases: Sequence[int], position: int) -> int:
    """As :meth:`MessageTermCheck.term_index`, for one position."""
    return int(np.searchsorted(np.array(bases, np.int64), position, side="right")) - 1


# --------------------------------------------------------------------------- check 4: agreement


def agreement_ranges(a: MemberLog, b: MemberLog) -> tuple[list[tuple[int, int, str]], list[Violation]]:
    """Where members ``a`` and ``b`` must hold the same bytes, each range
    with why: below both members' commit positions, and where both recording
    logs put the position in the same term with the same base (see the
    module's docstring).  Also a violation for each term the two put at
    different bases."""
    low = max(a.start_position, b.start_position)
    high = min(a.end_position, b.end_position)
    ranges: list[tuple[int, int, str]] = []
    violations: list[Violation] = []
    committed = min(a.commit_position, b.commit_position, high)
    if committed > low:
        ranges.append((low, committed, f"committed on both (below {committed})"))
    for term in a.terms:
        other = b.term(term.leadership_term_id)
        if other is None:
            continue
        if other.base != term.base:
            violations.append(
                Violation(
                    CHECK_AGREEMENT,
                    a.name,
                    min(term.base, other.base),
                    f"term {term.leadership_term_id} begins at {term.base} on {a.name}, at {other.base} on {b.name}",
                    b.name,
                )
            )
            continue
        ends = [e for e in (term.end, other.end) if e is not None]
        term_high = min([high, *ends])
        term_low = max(low, term.base)
        if term_high > term_low:
            ranges.append((term_low, term_high, f"term {term.leadership_term_id} on both"))
    return ranges, violations


def merge_ranges(ranges: Iterable[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """The ranges' union, as sorted, disjoint [low, high) pairs."""
    merged: list[tuple[int, int]] = []
    for low, high, _ in sorted(ranges):
        if merged and low <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


class RecordedBytes:
    """A member's log recording as bytes, segment file by segment file
    (mapped read-only on first use)."""

    def __init__(self, archive_dir: Path, descriptor: RecordingDescriptor) -> None:
        self.archive_dir = archive_dir
        self.descriptor = descriptor
        self._maps: dict[int, mmap.mmap] = {}

    def segment(self, position: int) -> tuple[mmap.mmap, int]:
        """The mapped segment that holds ``position`` and the position of its first byte."""
        d = self.descriptor
        base = segment_file_base_position(d.start_position, position, d.term_buffer_length, d.segment_file_length)
        memory = self._maps.get(base)
        if memory is None:
            path = self.archive_dir / segment_file_name(d.recording_id, base)
            try:
                with open(path, "rb") as file:
                    size = os.fstat(file.fileno()).st_size
                    if size == 0:
                        raise ArchiveError(f"{path}: the segment file is empty")
                    memory = mmap.mmap(file.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ)
            except FileNotFoundError:
                raise ArchiveError(f"{path}: the segment file is missing (position {position})") from None
            except OSError as error:
                raise ArchiveError(f"{path}: {describe_os_error(error)}") from None
            self._maps[base] = memory
        return memory, base

    def close(self) -> None:
        for memory in self._maps.values():
            memory.close()
        self._maps.clear()


@dataclass(frozen=True)
class Difference:
    position: int
    detail: str


def first_difference(a: RecordedBytes, b: RecordedBytes, low: int, high: int) -> tuple[Difference | None, int]:
    """The first frame in [low, high) whose content differs between the two
    recordings (``low`` a frame boundary of both), and the bytes compared up
    to it.  Terms are compared whole; only a term that differs is walked,
    frame by frame from its first differing byte, so that what is not
    content (session id field, alignment, padding bodies) can be passed."""
    term_length = a.descriptor.term_buffer_length
    compared = 0
    position = low
    while position < high:
        chunk_end = min(high, (position // term_length + 1) * term_length)
        memory_a, base_a = a.segment(position)
        memory_b, base_b = b.segment(position)
        start_a, start_b, length = position - base_a, position - base_b, chunk_end - position
        if start_a + length > len(memory_a) or start_b + length > len(memory_b):
            short = a if start_a + length > len(memory_a) else b
            return Difference(position, f"the segment file of {short.archive_dir} ends before {chunk_end}"), compared
        offset = 0  # in the chunk; always a frame boundary of both
        while offset < length:
            if memory_a[start_a + offset : start_a + length] == memory_b[start_b + offset : start_b + length]:
                break
            differing = offset + _first_differing_byte(
                memory_a, start_a + offset, memory_b, start_b + offset, length - offset
            )
            frame = _frame_start(memory_a, start_a, offset, differing)
            detail, aligned = _frame_difference(memory_a, start_a + frame, memory_b, start_b + frame, length - frame)
            if detail is not None:
                return Difference(position + frame, detail), compared + frame
            offset = frame + aligned  # only what is not content differs: on past this frame
        compared += length
        position = chunk_end
    return None, compared


def _first_differing_byte(a: mmap.mmap, start_a: int, b: mmap.mmap, start_b: int, length: int) -> int:
    """The offset of the first byte that differs (there is one), by halving."""
    low, high = 0, length
    while high - low > 64:
        middle = (low + high) // 2
        if a[start_a + low : start_a + middle] == b[start_b + low : start_b + middle]:
            low = middle
        else:
            high = middle
    for offset in range(low, high):
        if a[start_a + offset] != b[start_b + offset]:
            return offset
    raise AssertionError("the ranges were equal")  # pragma: no cover - only called on unequal ranges


def _frame_start(memory: mmap.mmap, chunk_start: int, offset: int, differing: int) -> int:
    """The chunk offset of the frame that holds chunk offset ``differing``
    (frames from ``offset`` to it are alike on both members), walked in C."""
    pointer = ffi.from_buffer(memory)
    try:
        return int(lib.fulmar_term_block_scan(pointer, chunk_start + offset, chunk_start + differing)) - chunk_start
    finally:
        ffi.release(pointer)


def _frame_difference(a: mmap.mmap, at_a: int, b: mmap.mmap, at_b: int, room: int) -> tuple[str | None, int]:
    """What differs in the content of the frames at ``at_a`` and ``at_b``
    (None if only what is not content does), and the frame's aligned length."""
    if room < HEADER_LENGTH:
        return f"{room} bytes differ after the last frame", room
    header_a = _FRAME_HEADER.unpack_from(a, at_a)
    header_b = _FRAME_HEADER.unpack_from(b, at_b)
    for name, value_a, value_b in zip(_HEADER_FIELDS, header_a, header_b):
        if name is not None and value_a != value_b:
            return f"the frames' {name} differs: {value_a} and {value_b}", room
    frame_length, frame_type = header_a[0], header_a[3]
    if frame_length < HEADER_LENGTH:
        return f"no frame there (frame length {frame_length} on both), and the bytes after differ", room
    aligned = min(align(frame_length, FRAME_ALIGNMENT), room)
    if frame_type == _DATA:
        end = min(frame_length, room)
        payload_a, payload_b = a[at_a + HEADER_LENGTH : at_a + end], b[at_b + HEADER_LENGTH : at_b + end]
        if payload_a != payload_b:
            index = next(i for i, (x, y) in enumerate(zip(payload_a, payload_b)) if x != y)
            return (
                f"the frames' payloads differ at payload byte {index} (0x{payload_a[index]:02x} and "
                f"0x{payload_b[index]:02x})",
                aligned,
            )
    elif frame_type != _PAD:
        raw_a, raw_b = a[at_a : at_a + aligned], b[at_b : at_b + aligned]
        if raw_a != raw_b:
            return f"the frames (type {frame_type}, neither DATA nor PAD) differ", aligned
    return None, aligned


def compare_members(a: MemberLog, b: MemberLog) -> tuple[Comparison, list[Violation]]:
    """Check 4 for one pair: the ranges :func:`agreement_ranges` gives, compared byte for byte."""
    ranges, violations = agreement_ranges(a, b)
    merged = merge_ranges(ranges)
    if a.term_length != b.term_length:
        violations.append(
            Violation(
                CHECK_AGREEMENT,
                a.name,
                None,
                f"the log recordings have different term lengths ({a.term_length} and {b.term_length}): one leader "
                f"wrote every term; not compared",
                b.name,
            )
        )
        return Comparison(a.name, b.name, (), 0), violations
    bytes_a, bytes_b = RecordedBytes(a.archive_dir, a.recording), RecordedBytes(b.archive_dir, b.recording)
    compared = 0
    try:
        for low, high in merged:
            try:
                difference, count = first_difference(bytes_a, bytes_b, low, high)
            except ArchiveError as error:
                violations.append(
                    Violation(CHECK_AGREEMENT, a.name, low, f"cannot compare {low}..{high}: {error}", b.name)
                )
                continue
            compared += count
            if difference is not None:
                why = [reason for low_, high_, reason in ranges if low_ <= difference.position < high_]
                violations.append(
                    Violation(
                        CHECK_AGREEMENT,
                        a.name,
                        difference.position,
                        f"the logs differ ({difference.detail}) where they must agree: {', '.join(why)}",
                        b.name,
                    )
                )
    finally:
        bytes_a.close()
        bytes_b.close()
    return Comparison(a.name, b.name, tuple(merged), compared), violations


# --------------------------------------------------------------------------- reading a member


class _Unreadable(Exception):
    """A member's files cannot be read at all; the message says which and why."""


def read_entries(cluster_dir: Path) -> tuple[list[Entry], str | None]:
    """``recording.log``'s entries and, if its end is torn (a module writing
    now, or a crash mid-append), what was dropped; read, never repaired."""
    path = cluster_dir / RECORDING_LOG_FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _Unreadable(f"{path}: no recording log") from None
    except OSError as error:
        raise _Unreadable(f"{path}: cannot read the recording log: {describe_os_error(error)}") from None
    try:
        result = decode_entries(data, str(path))
    except RecordingLogError as error:
        raise _Unreadable(str(error)) from None
    return result.entries, result.torn_tail


def readable_end(
    archive_dir: Path, descriptor: RecordingDescriptor, recorded_position: int, archive_running: bool
) -> int:
    """Where reading a recording stops: its stop position; while it is open,
    the catalog's recorded position (every segment write below it has
    returned) when the archive runs, else the last complete frame, as the
    archive's recovery would find it."""
    if descriptor.stop_position != NULL_POSITION:
        return descriptor.stop_position
    known = recorded_position if recorded_position >= descriptor.start_position else descriptor.start_position
    if archive_running:
        return known
    return scan_complete_frames(archive_dir, descriptor, known)


def read_member(files: MemberFiles, log_stream_id: int) -> tuple[MemberLog | None, list[Violation], list[str]]:
    """One member's files, read and checked on their own (checks 1 to 3 and
    the decode); None for the log when there is none to compare.  Raises
    ``_Unreadable`` when the files cannot be read at all."""
    name = files.name
    if not files.cluster_dir.is_dir():
        raise _Unreadable(f"{files.cluster_dir}: no cluster directory")
    if files.archive_dir is None:
        raise _Unreadable(f"{files.cluster_dir}: no archive directory beside it (a node's cluster/ and archive/)")
    if not files.archive_dir.is_dir():
        raise _Unreadable(f"{files.archive_dir}: no archive directory")
    entries, torn_tail = read_entries(files.cluster_dir)
    notes = [f"{name}: recording.log has a torn end (left as it is): {torn_tail}"] if torn_tail else []
    try:
        catalog = Catalog.open_read_only(files.archive_dir)
    except ArchiveError as error:  # it names the catalog and what is wrong
        raise _Unreadable(str(error)) from None
    except (CodecError, ValueError) as error:
        raise _Unreadable(f"{files.archive_dir / CATALOG_FILE_NAME}: corrupt catalog: {error}") from None
    try:
        descriptors = log_recordings(catalog.recordings(), log_stream_id)
        terms, violations = term_ranges(name, entries)
        if not terms:
            if descriptors:
                ids = ", ".join(str(d.recording_id) for d in descriptors)
                violations.append(
                    Violation(
                        CHECK_RECORDING_LOG,
                        name,
                        None,
                        f"recording.log has no valid TERM entry, but the archive holds log recording(s) {ids} of "
                        f"stream {log_stream_id}",
                    )
                )
            else:
                notes.append(f"{name}: no term in recording.log and no log recording: nothing to check")
            return None, violations, notes
        recording_id = next(e.recording_id for e in entries if e.is_valid_term)
        descriptor = catalog.descriptor(recording_id)
        recorded = catalog.recorded_position(recording_id) if descriptor is not None else NULL_POSITION
    finally:
        catalog.close()
    others = [d.recording_id for d in descriptors if d.recording_id != recording_id]
    if others:
        notes.append(
            f"{name}: the archive holds log stream recording(s) {', '.join(map(str, others))} that recording.log "
            f"does not name (a misplaced recording not yet purged?); not checked"
        )
    if descriptor is None or descriptor.stream_id != log_stream_id:
        what = (
            "which the archive's catalog does not hold as a valid recording"
            if descriptor is None
            else f"which is a recording of stream {descriptor.stream_id}, not the log's {log_stream_id}"
        )
        violations.append(
            Violation(CHECK_RECORDING_LOG, name, None, f"recording.log names recording {recording_id}, {what}")
        )
        return None, violations, notes
    snapshots = [e for e in entries if e.is_valid_snapshot]
    try:
        end = readable_end(files.archive_dir, descriptor, recorded, files.archive_running)
    except ArchiveError as error:
        raise _Unreadable(
            f"{files.archive_dir}: cannot find where log recording {recording_id} ends: {error}"
        ) from None
    stop_known = descriptor.stop_position != NULL_POSITION
    if not stop_known:
        archive = "its archive runs" if files.archive_running else "its archive does not run"
        notes.append(f"{name}: log recording {recording_id} is open ({archive}): read to {end}, not beyond")
    log = MemberLog(name, files.archive_dir, descriptor, descriptor.start_position, end, stop_known, terms, snapshots)
    log.commit_position, log.commit_source = commit_evidence(terms, snapshots, log.start_position)
    log.commit_position = min(log.commit_position, end)
    violations += check_recording_log(name, terms, snapshots, log.start_position, end, stop_known)
    if not terms_in_order(terms):
        notes.append(f"{name}: recording.log's term bases decrease: its messages are not checked against terms")
        return log, violations, notes
    scan = MessageTermCheck(name, terms)
    stats = DecodeStats()
    try:
        for segment in recording_segments(str(files.archive_dir), descriptor, end, None, None):
            for batch in decode_segment(segment, permissive=True, stats=stats):
                if isinstance(batch, CorruptRegion):
                    position = segment.position(batch.file_offset)
                    violations.append(Violation(CHECK_LOG_DAMAGED, name, position, batch.what))
                else:
                    scan.add_batch(batch)
    except OSError as error:  # (a missing segment is a corrupt region; this is one that cannot be read)
        raise _Unreadable(
            f"{files.archive_dir}: cannot read log recording {recording_id}: {describe_os_error(error)}"
        ) from None
    if stats.incomplete_tail:
        notes.append(f"{name}: a fragmented message is cut off at the log's end (still being written)")
    log.term_events = scan.term_events
    log.messages = scan.messages
    violations += scan.violations()
    violations += check_term_events(
        name, terms, scan.term_events, scan.first_messages, log.start_position, end, log.term_length
    )
    before = sum(1 for t in terms if t.base < log.start_position)
    if before:
        notes.append(
            f"{name}: {before} term(s) begin before the log's start {log.start_position} (purged): how they "
            f"open is not checked"
        )
    return log, violations, notes


# --------------------------------------------------------------------------- the whole check


def verify_members(members: Sequence[MemberFiles], *, log_stream_id: int = LOG_STREAM_ID) -> LogVerification:
    """Every check over these members' files (see the module's docstring):
    each member's own, then each pair's agreement."""
    result = LogVerification()
    for files in members:
        try:
            log, violations, notes = read_member(files, log_stream_id)
        except _Unreadable as error:
            result.unreadable.append(UnreadableMember(files.name, str(error)))
            continue
        result.violations += violations
        result.notes += notes
        if log is not None:
            result.members.append(log)
    for index, a in enumerate(result.members):
        for b in result.members[index + 1 :]:
            comparison, violations = compare_members(a, b)
            result.comparisons.append(comparison)
            result.violations += violations
    if len(result.members) < 2:
        result.notes.append("fewer than two members' logs were read: no agreement check")
    result.violations.sort(key=lambda v: (v.member, v.other_member or "", -1 if v.position is None else v.position))
    return result
