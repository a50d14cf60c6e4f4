"""The log checker (fulmar.analytics.log_verify): its functions on synthetic inputs."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from log_reference import HEADER_LENGTH, PAD, write_messages
from fulmar.analytics.log_verify import (
    CHECK_AGREEMENT,
    CHECK_LOG_DAMAGED,
    CHECK_RECORDING_LOG,
    CHECK_TERM_EVENT,
    CHECK_TERM_ORDER,
    MemberLog,
    MessageTermCheck,
    RecordedBytes,
    Term,
    TermEvent,
    Violation,
    agreement_ranges,
    check_recording_log,
    check_term_events,
    commit_evidence,
    first_difference,
    term_ranges,
)
from fulmar.archive.catalog import NULL_POSITION, RecordingDescriptor
from fulmar.archive.segment import segment_file_name
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.recording_log import ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_TERM, Entry

NLTE = codecs.NewLeadershipTermEventDecoder.TEMPLATE_ID
SESSION_MESSAGE = codecs.SessionMessageHeaderDecoder.TEMPLATE_ID
TIMER = codecs.TimerEventDecoder.TEMPLATE_ID
SCHEMA = codecs.SCHEMA_ID


# ----------------------------------------------------------------------------- synthetic inputs


def term(term_id: int, base: int, end: int | None, log_position: int = NULL_POSITION) -> Term:
    return Term(term_id, base, log_position, end)


def entry(index: int, term_id: int, base: int, log_position: int = NULL_POSITION, **fields: Any) -> Entry:
    values: dict[str, Any] = dict(
        entry_index=index,
        recording_id=0,
        leadership_term_id=term_id,
        term_base_log_position=base,
        log_position=log_position,
        timestamp=0,
        service_id=-1,
        entry_type=ENTRY_TYPE_TERM,
    )
    values.update(fields)
    return Entry(**values)


def snapshot(term_id: int, base: int, position: int) -> Entry:
    return entry(9, term_id, base, position, entry_type=ENTRY_TYPE_SNAPSHOT, recording_id=5)


def found(violations: list[Violation]) -> set[tuple[str, str, int | None]]:
    return {(v.check, v.member, v.position) for v in violations}


def test_term_ranges_end_each_term_at_the_next_and_find_what_contradicts_that() -> None:
    # A skipped term id (a failed candidacy) leaves the earlier term's end unset: not a violation.
    terms, violations = term_ranges("n", [entry(0, 0, 0), entry(1, 2, 500), entry(2, 3, 900)])
    assert violations == []
    assert [(t.leadership_term_id, t.base, t.end) for t in terms] == [(0, 0, 500), (2, 500, 900), (3, 900, None)]
    # Caught: a term id twice, a base below the previous term's, an end that is not the next base.
    _, violations = term_ranges(
        "n", [entry(0, 0, 0, 640), entry(1, 1, 600), entry(2, 1, 700), entry(3, 2, 500), entry(4, 3, 900)]
    )
    assert found(violations) == {
        (CHECK_RECORDING_LOG, "n", 700),  # two TERM entries for term 1
        (CHECK_RECORDING_LOG, "n", 640),  # term 0 ends at 640, term 1 begins at 600
        (CHECK_RECORDING_LOG, "n", 500),  # term 2 begins before term 1
    }
    # Invalid entries (truncated terms) are not the log's.
    terms, violations = term_ranges("n", [entry(0, 0, 0), entry(1, 1, 600, is_valid=False)])
    assert violations == [] and [t.end for t in terms] == [None]


def test_check_recording_log_places_snapshots_and_ends_in_the_log() -> None:
    terms = [term(0, 0, 1000, 1000), term(1, 1000, None)]
    ok = check_recording_log("n", terms, [snapshot(0, 0, 1000), snapshot(1, 1000, 1500)], 0, 2000, True)
    assert ok == []
    violations = check_recording_log(
        "n",
        terms,
        [
            snapshot(0, 0, 1200),  # beyond its term's end
            snapshot(1, 64, 1500),  # another base than its term's
            snapshot(4, 1000, 1600),  # a term recording.log does not have
            snapshot(1, 1000, 2100),  # beyond the log's end
        ],
        0,
        2000,
        True,
    )
    assert found(violations) == {
        (CHECK_RECORDING_LOG, "n", 1200),
        (CHECK_RECORDING_LOG, "n", 1500),
        (CHECK_RECORDING_LOG, "n", 1600),
        (CHECK_RECORDING_LOG, "n", 2100),
    }
    # A term that begins beyond a stopped log's end, and a termination position beyond it.
    violations = check_recording_log("n", [term(0, 0, 2500), term(1, 2500, None, 2600)], [], 0, 2000, True)
    assert found(violations) == {(CHECK_RECORDING_LOG, "n", 2500), (CHECK_RECORDING_LOG, "n", 2600)}
    # An open recording is read only as far as it is written: beyond that is not a violation.
    assert (
        check_recording_log("n", [term(0, 0, 2500), term(1, 2500, None)], [snapshot(1, 2500, 2600)], 0, 2000, False)
        == []
    )
    # A snapshot before a purged log's start cannot be recovered from.
    assert found(check_recording_log("n", terms, [snapshot(0, 0, 512)], 1024, 2000, True)) == {
        (CHECK_RECORDING_LOG, "n", 512)
    }


def test_commit_evidence_is_a_snapshot_or_a_termination_position_never_a_term_end() -> None:
    # Term 0's end was set when term 1 began: that proves nothing committed.
    assert commit_evidence([term(0, 0, 800, 800), term(1, 800, None)], [], 0)[0] == 0
    assert commit_evidence([term(0, 0, 800, 800), term(1, 800, None)], [snapshot(0, 0, 640)], 0)[0] == 640
    # The last term's logPosition is set only at an orderly stop.
    assert commit_evidence([term(0, 0, 800, 800), term(1, 800, None, 960)], [snapshot(0, 0, 640)], 0)[0] == 960


def scan(terms: list[Term], messages: list[tuple[int, int, int]], events: list[TermEvent]) -> MessageTermCheck:
    """(position, template id, leadershipTermId) messages of one batch through the message check."""
    check = MessageTermCheck("n", terms)
    positions = np.array([m[0] for m in messages], np.int64)
    templates = np.array([m[1] for m in messages], np.int32)
    check.add(
        positions, templates, np.full(len(messages), SCHEMA, np.int32), np.array([m[2] for m in messages]), events
    )
    return check


def event(position: int, term_id: int, base: int | None = None, log_position: int | None = None) -> TermEvent:
    base = position if base is None else base
    return TermEvent(position, position + 96, term_id, base if log_position is None else log_position, base)


def term_event_violations(
    terms: list[Term], messages: list[tuple[int, int, int]], events: list[TermEvent], end: int
) -> set[tuple[str, str, int | None]]:
    check = scan(terms, messages, events)
    violations = check.violations() + check_term_events("n", terms, events, check.first_messages, 0, end, 65536)
    return found(violations)


def test_a_term_event_that_carries_the_previous_term_is_caught() -> None:
    # The bug of a whole-cluster restart: the event appended for term 2 carries term 1.
    terms = [term(0, 0, 1024), term(1, 1024, 2048), term(2, 2048, None)]
    events = [event(0, 0), event(1024, 1), event(2048, 1)]
    messages = [(0, NLTE, 0), (96, SESSION_MESSAGE, 0), (1024, NLTE, 1), (1120, SESSION_MESSAGE, 1)]
    messages += [(2048, NLTE, 1), (2144, SESSION_MESSAGE, 2)]
    assert term_event_violations(terms, messages, events, 3000) == {
        (CHECK_TERM_EVENT, "n", 2048),  # the event's term is not its range's
        (CHECK_TERM_ORDER, "n", 2048),  # the events' terms do not rise
    }
    # As it should be: nothing.
    events[2] = event(2048, 2)
    messages[4] = (2048, NLTE, 2)
    assert term_event_violations(terms, messages, events, 3000) == set()


def test_each_term_must_open_with_its_own_term_event() -> None:
    terms = [term(0, 0, 1024), term(1, 1024, 4096), term(2, 4096, None)]
    events = [event(0, 0), event(1024, 1, base=1000), event(4096, 2, log_position=9999)]
    messages = [(0, NLTE, 0), (96, SESSION_MESSAGE, 0), (1024, NLTE, 1), (4096, NLTE, 2)]
    # termBaseLogPosition another than the term's base; logPosition outside the event.
    assert term_event_violations(terms, messages, events, 5000) == {
        (CHECK_TERM_EVENT, "n", 1024),
        (CHECK_TERM_EVENT, "n", 4096),
    }
    # A term whose first message is not its event (it lies later, or nowhere).
    events = [event(0, 0), event(1120, 1, base=1024)]
    messages = [(0, NLTE, 0), (1024, SESSION_MESSAGE, 1), (1120, NLTE, 1)]
    assert (CHECK_TERM_EVENT, "n", 1024) in term_event_violations(
        terms[:2] + [term(2, 4096, None)], messages, events, 4096
    )
    # A term with bytes but no message at all, before the next term: its event is missing.
    events = [event(0, 0), event(4096, 2)]
    messages = [(0, NLTE, 0), (4096, NLTE, 2)]
    assert term_event_violations(terms, messages, events, 5000) == {(CHECK_TERM_EVENT, "n", 1024)}
    # The last term with nothing read yet (an election just ended), and an empty term: fine.
    assert (
        term_event_violations(
            [term(0, 0, 1024), term(1, 1024, 1024), term(2, 1024, None)], [(0, NLTE, 0)], [event(0, 0)], 1024
        )
        == set()
    )


def test_a_term_event_may_follow_padding_to_the_next_term_buffer_only() -> None:
    term_length = 65536
    terms = [term(0, 0, 65500), term(1, 65500, None)]
    # The event did not fit in the rest of the term buffer: padding, then the event at the next one.
    events = [event(0, 0), event(term_length, 1, base=65500)]
    messages = [(0, NLTE, 0), (term_length, NLTE, 1)]
    check = scan(terms, messages, events)
    assert check_term_events("n", terms, events, check.first_messages, 0, 70000, term_length) == []
    # Anywhere else after the base, it is misplaced.
    terms = [term(0, 0, 1024), term(1, 1024, None)]
    events = [event(0, 0), event(1056, 1, base=1024)]
    check = scan(terms, [(0, NLTE, 0), (1056, NLTE, 1)], events)
    assert found(check_term_events("n", terms, events, check.first_messages, 0, 2000, term_length)) == {
        (CHECK_TERM_EVENT, "n", 1056)
    }


def test_every_message_must_carry_the_term_it_lies_in() -> None:
    terms = [term(0, 0, 1024), term(2, 1024, None)]
    messages = [(0, NLTE, 0), (96, TIMER, 0), (1024, NLTE, 2)] + [(1120 + 96 * i, SESSION_MESSAGE, 0) for i in range(5)]
    check = scan(terms, messages, [event(0, 0), event(1024, 2)])
    violations = check.violations()
    # One violation per term and carried term, at the first such message, with the count.
    assert found(violations) == {(CHECK_TERM_ORDER, "n", 1120)}
    assert "5 messages in term 2" in violations[0].message
    # A message of a kind no leader appends (a flipped template id, another schema).
    check = MessageTermCheck("n", terms)
    check.add(np.array([0, 96]), np.array([NLTE, 77], np.int32), np.array([SCHEMA, SCHEMA], np.int32), np.array([0, 0]))
    assert found(check.violations()) == {(CHECK_LOG_DAMAGED, "n", 96)}


def member(name: str, terms: list[Term], end: int, commit: int, start: int = 0) -> MemberLog:
    descriptor = RecordingDescriptor(0, 0, 0, 0, 0, start, end, 0, 1 << 27, 1 << 22, 1408, 7, 100, "", "", "")
    log = MemberLog(name, Path("/nonexistent"), descriptor, start, end, True, terms, [])
    log.commit_position = commit
    return log


def test_agreement_leaves_out_an_uncommitted_tail_a_later_term_replaced() -> None:
    # a led term 0 and died with entries 1000..1500 nobody else got; b went on in term 1 from 1000.
    a = member("a", [term(0, 0, None)], 1500, 800)
    b = member("b", [term(0, 0, 1000), term(1, 1000, None)], 2000, 1800)
    ranges, violations = agreement_ranges(a, b)
    assert violations == []
    # Term 0 on both up to where b's term 1 begins; committed only below the lower commit position.
    assert sorted((low, high) for low, high, _ in ranges) == [(0, 800), (0, 1000)]
    # Members that disagree on where a term begins.
    c = member("c", [term(0, 0, 960), term(1, 960, None)], 2000, 1800)
    _, violations = agreement_ranges(b, c)
    assert found(violations) == {(CHECK_AGREEMENT, "b", 960)}


def synthetic_recording(directory: Path, data: bytes, term_length: int) -> RecordedBytes:
    directory.mkdir()
    (directory / segment_file_name(5, 0)).write_bytes(data)
    descriptor = RecordingDescriptor(5, 0, 0, 0, 0, 0, len(data), 0, len(data), term_length, 1408, 7, 100, "", "", "")
    return RecordedBytes(directory, descriptor)


def frames_of(data: bytes, term_length: int) -> list[tuple[int, int, int]]:
    """(position, frame length, type) of every frame of a synthetic segment."""
    out, position = [], 0
    while position < len(data):
        length, _, _, frame_type = struct.unpack_from("<iBBH", data, position)
        if length == 0:
            position = (position // term_length + 1) * term_length
            continue
        out.append((position, length, frame_type))
        position += (length + 31) & ~31
    return out


def test_the_byte_comparison_passes_over_what_is_not_the_logs_content(tmp_path: Path) -> None:
    term_length = 65536
    messages = [bytes([i % 251]) * 3001 for i in range(40)]  # 3033-byte frames: a padding frame ends term 0
    data = write_messages(messages, term_length, 4000, 2)
    frames = frames_of(data, term_length)
    pad = next(f for f in frames if f[2] == PAD)
    assert pad[1] > HEADER_LENGTH * 2
    other = bytearray(data)
    other[pad[0] + HEADER_LENGTH : pad[0] + pad[1]] = b"\xee" * (pad[1] - HEADER_LENGTH)  # the padding's body
    other[frames[3][0] + 12 : frames[3][0] + 16] = b"\x01\x02\x03\x04"  # a session id (a checksum, a replay's session)
    other[frames[5][0] + frames[5][1]] = 0x7F  # an alignment byte after the frame's length
    a = synthetic_recording(tmp_path / "a", data, term_length)
    b = synthetic_recording(tmp_path / "b", bytes(other), term_length)
    end = frames[-1][0] + ((frames[-1][1] + 31) & ~31)
    try:
        assert first_difference(a, b, 0, end) == (None, end)
        # One payload byte of one message: found at that frame, and only there.
        other[frames[7][0] + HEADER_LENGTH + 100] ^= 0x01
        b.close()
        (tmp_path / "b" / segment_file_name(5, 0)).write_bytes(bytes(other))
        difference, compared = first_difference(a, b, 0, end)
        assert difference is not None and difference.position == frames[7][0] and compared == frames[7][0]
        assert "payload byte 100" in difference.detail
        # A frame header field that is content (the padding's length).
        other[frames[7][0] + HEADER_LENGTH + 100] ^= 0x01
        struct.pack_into("<i", other, pad[0], pad[1] - 32)
        b.close()
        (tmp_path / "b" / segment_file_name(5, 0)).write_bytes(bytes(other))
        difference, _ = first_difference(a, b, 0, end)
        assert difference is not None and difference.position == pad[0]
    finally:
        a.close()
        b.close()
