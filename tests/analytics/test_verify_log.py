"""``cluster-tool verify-log`` (fulmar.analytics.log_verify): the checker's
functions on synthetic inputs, then the command on the logs a real 3-member
cluster recorded (tests/support/analytics.py: traffic, a snapshot, the leader
killed so that a second term begins, an orderly stop), as recorded and with
each invariant broken in a copy of one member's files."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from fulmar.analytics.log_decoder import read_log
from fulmar.analytics.log_verify import (
    CHECK_AGREEMENT,
    CHECK_LOG_DAMAGED,
    CHECK_RECORDING_LOG,
    CHECK_TERM_EVENT,
    CHECK_TERM_ORDER,
    MemberFiles,
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
    verify_members,
)
from fulmar.archive.catalog import NULL_POSITION, Catalog, RecordingDescriptor
from fulmar.archive.segment import segment_file_base_position, segment_file_name
from fulmar.cli import cluster_tool
from fulmar.cli.verify_log_commands import EXIT_UNREADABLE, EXIT_VIOLATIONS
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.recording_log import ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_TERM, Entry, decode_entries
from fulmar.logbuffer import to_int32
from support.analytics import RecordedLog, record_counter_cluster
from support.cluster import copy_sparse
from support.log_reference import BEGIN, DATA, END, FRAME, HEADER_LENGTH, PAD, write_messages

NLTE = codecs.NewLeadershipTermEventDecoder.TEMPLATE_ID
SESSION_MESSAGE = codecs.SessionMessageHeaderDecoder.TEMPLATE_ID
TIMER = codecs.TimerEventDecoder.TEMPLATE_ID
SCHEMA = codecs.SCHEMA_ID
# Where a message's fields start in its first frame: the frame header, then the SBE header.
MESSAGE_BODY = HEADER_LENGTH + codecs.HEADER_LENGTH
TERM_BASE_FIELD = 24  # NewLeadershipTermEvent.termBaseLogPosition (leadershipTermId is at 0 in every log message)
ENTRY_RECORDING_ID, ENTRY_TERM_BASE, ENTRY_LOG_POSITION = 0, 16, 24  # recording.log record fields
I64 = struct.Struct("<q")


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


# ----------------------------------------------------------------------------- a real cluster's logs


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedLog]:
    base = tmp_path_factory.mktemp("verify-log")
    try:
        yield record_counter_cluster(base, increments=30)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def base(recorded: RecordedLog, tmp_path: Path) -> Path:
    """A copy of the recorded members' files for one test to break."""
    copy = tmp_path / "cluster"
    shutil.copytree(recorded.base, copy, copy_function=copy_sparse)
    return copy


def verify(base: Path) -> tuple[int, str, dict[str, Any]]:
    """verify-log on ``base``: exit code, text output, JSON document."""
    text = CliRunner().invoke(cluster_tool.main, ["verify-log", "--dir", str(base)])
    document = CliRunner().invoke(cluster_tool.main, ["verify-log", "--dir", str(base), "--json"])
    assert text.exit_code == document.exit_code, (text.output, document.output)
    return text.exit_code, text.output, json.loads(document.output)


def violations_of(document: dict[str, Any]) -> set[tuple[str, str, str | None, int | None]]:
    return {(v["check"], v["member"], v["other_member"], v["position"]) for v in document["violations"]}


def recording_of(base: Path, member: int) -> RecordingDescriptor:
    entries = decode_entries((base / f"node{member}" / "cluster" / "recording.log").read_bytes()).entries
    recording_id = next(e.recording_id for e in entries if e.is_valid_term)
    catalog = Catalog.open_read_only(base / f"node{member}" / "archive")
    try:
        descriptor = catalog.descriptor(recording_id)
    finally:
        catalog.close()
    assert descriptor is not None
    return descriptor


def messages_of(base: Path, member: int, message_type: str) -> list[dict[str, Any]]:
    archive = base / f"node{member}" / "archive"
    return [row for batch in read_log(str(archive), {"messageTypes": message_type}) for row in batch.to_pylist()]


def patch_log(base: Path, member: int, position: int, data: bytes) -> None:
    """Overwrite bytes of a member's log recording at a log position."""
    d = recording_of(base, member)
    segment_base = segment_file_base_position(d.start_position, position, d.term_buffer_length, d.segment_file_length)
    with open(base / f"node{member}" / "archive" / segment_file_name(d.recording_id, segment_base), "r+b") as file:
        file.seek(position - segment_base)
        file.write(data)


def recording_log_entries(base: Path, member: int) -> list[Entry]:
    return decode_entries((base / f"node{member}" / "cluster" / "recording.log").read_bytes()).entries


def patch_entry(base: Path, member: int, entry: Entry, field_offset: int, value: int) -> None:
    with open(base / f"node{member}" / "cluster" / "recording.log", "r+b") as file:
        file.seek(entry.file_offset + field_offset)
        file.write(I64.pack(value))


@pytest.mark.system
@pytest.mark.system
def test_a_stopped_cluster_after_a_failover_passes(recorded: RecordedLog, base: Path) -> None:
    code, output, document = verify(base)
    assert code == 0, output
    assert document["ok"] and document["violations"] == [] and document["unreadable"] == []
    terms = [term_id for term_id, _ in recorded.terms]
    assert len(set(terms)) >= 2, f"the scenario made one term only: {recorded.terms}"
    for m in range(3):
        assert f"node{m}: log recording" in output
    members = {m["member"]: m for m in document["members"]}
    assert sorted(members) == ["node0", "node1", "node2"]
    for log in members.values():
        assert [t["leadership_term_id"] for t in log["terms"]] == sorted(set(terms))
        assert len(log["term_events"]) == len(set(terms))
        assert log["end_position"] >= recorded.commit_position
    # Every pair compared over the whole log (its two terms are the same on every member).
    assert len(document["comparisons"]) == 3
    for comparison in document["comparisons"]:
        assert comparison["bytes_compared"] == members["node0"]["end_position"], comparison
    assert f"{terms[-1]}@" in output and "ok: every check passed" in output


@pytest.mark.system
def test_a_term_event_carrying_the_previous_term(base: Path) -> None:
    """The whole-cluster restart bug, written into one member's log: the
    event that opens the second term carries the first term's id."""
    events = messages_of(base, 1, "NewLeadershipTermEvent")
    first, second = events[0], events[-1]
    position = second["log_position"]
    patch_log(base, 1, position + MESSAGE_BODY, I64.pack(first["leadership_term_id"]))
    code, output, document = verify(base)
    assert code == EXIT_VIOLATIONS, output
    found = violations_of(document)
    assert (CHECK_TERM_EVENT, "node1", None, position) in found
    assert (CHECK_TERM_ORDER, "node1", None, position) in found
    assert (CHECK_AGREEMENT, "node0", "node1", position) in found
    assert (CHECK_AGREEMENT, "node1", "node2", position) in found
    assert not [v for v in found if v[0] != CHECK_AGREEMENT and v[1] != "node1"], found
    assert f"node1 at {position}" in output


@pytest.mark.system
def test_a_term_event_with_another_base(base: Path) -> None:
    position = messages_of(base, 2, "NewLeadershipTermEvent")[-1]["log_position"]
    patch_log(base, 2, position + MESSAGE_BODY + TERM_BASE_FIELD, I64.pack(position + 4096))
    code, output, document = verify(base)
    assert code == EXIT_VIOLATIONS, output
    assert (CHECK_TERM_EVENT, "node2", None, position) in violations_of(document)


@pytest.mark.system
def test_a_client_message_changed_in_the_committed_prefix(recorded: RecordedLog, base: Path) -> None:
    """One byte of one client message on one member, below every member's
    snapshot (so committed): the byte comparison alone sees it."""
    committed = min(recorded.snapshot_positions(m)[-1] for m in range(3))
    message = [r for r in messages_of(base, 2, "SessionMessageHeader") if r["next_position"] <= committed][10]
    position = message["log_position"]
    patch_log(base, 2, position + HEADER_LENGTH + 32, bytes([message["payload"][0] ^ 0xFF]))
    code, output, document = verify(base)
    assert code == EXIT_VIOLATIONS, output
    assert violations_of(document) == {
        (CHECK_AGREEMENT, "node0", "node2", position),
        (CHECK_AGREEMENT, "node1", "node2", position),
    }
    assert "committed on both" in output


@pytest.mark.system
def test_a_client_message_carrying_another_term(base: Path) -> None:
    events = messages_of(base, 0, "NewLeadershipTermEvent")
    later = [r for r in messages_of(base, 0, "SessionMessageHeader") if r["log_position"] > events[-1]["log_position"]]
    position = later[3]["log_position"]
    patch_log(base, 0, position + MESSAGE_BODY, I64.pack(events[0]["leadership_term_id"]))
    code, output, document = verify(base)
    assert code == EXIT_VIOLATIONS, output
    assert (CHECK_TERM_ORDER, "node0", None, position) in violations_of(document)


@pytest.mark.system
def test_a_recording_log_term_with_a_wrong_base(base: Path) -> None:
    """node0's recording.log says its last term begins one message later
    than it does: the log's event then lies in the term before, the term
    opens with another message, and the members disagree on its base."""
    entries = recording_log_entries(base, 0)
    terms = sorted((e for e in entries if e.is_valid_term), key=lambda e: e.leadership_term_id)
    last = terms[-1]
    event_position = last.term_base_log_position
    wrong = next(
        r["log_position"] for r in messages_of(base, 0, "SessionMessageHeader") if r["log_position"] > event_position
    )
    patch_entry(base, 0, last, ENTRY_TERM_BASE, wrong)
    code, output, document = verify(base)
    assert code == EXIT_VIOLATIONS, output
    found = violations_of(document)
    assert (CHECK_TERM_EVENT, "node0", None, event_position) in found  # its event is in the term before
    assert (CHECK_TERM_EVENT, "node0", None, wrong) in found  # the term opens with a client message
    assert (CHECK_AGREEMENT, "node0", "node1", event_position) in found  # the other members' base
    if terms[-2].log_position != NULL_POSITION:  # consecutive term ids: the term before ends at the old base
        assert (CHECK_RECORDING_LOG, "node0", None, event_position) in found


@pytest.mark.system
def test_a_snapshot_entry_beyond_the_log(base: Path) -> None:
    entries = recording_log_entries(base, 2)
    end = recording_of(base, 2).stop_position
    module_snapshot = next(e for e in entries if e.is_valid_snapshot and e.service_id == -1)
    patch_entry(base, 2, module_snapshot, ENTRY_LOG_POSITION, end + 4096)
    code, output, document = verify(base)
    assert code == EXIT_VIOLATIONS, output
    assert (CHECK_RECORDING_LOG, "node2", None, end + 4096) in violations_of(document)


@pytest.mark.system
def test_a_recording_log_that_names_a_snapshot_recording(base: Path) -> None:
    entries = recording_log_entries(base, 1)
    snapshot_recording = next(e.recording_id for e in entries if e.is_valid_snapshot)
    for e in entries:
        if e.entry_type == ENTRY_TYPE_TERM:
            patch_entry(base, 1, e, ENTRY_RECORDING_ID, snapshot_recording)
    code, output, document = verify(base)
    assert code == EXIT_VIOLATIONS, output
    assert (CHECK_RECORDING_LOG, "node1", None, None) in violations_of(document)
    assert "stream 107" in output
    # The other two are still checked against each other.
    assert [c["members"] for c in document["comparisons"]] == [["node0", "node2"]]


def remove_archive(node: Path) -> str:
    shutil.rmtree(node / "archive")
    return str(node / "archive")


def corrupt_catalog(node: Path) -> str:
    path = node / "archive" / "archive.catalog"
    with open(path, "r+b") as file:
        file.seek(64 + 40)  # inside the first recording's descriptor: its lengths no longer add up
        file.write(b"\xff" * 64)
    return str(path)


def corrupt_recording_log(node: Path) -> str:
    path = node / "cluster" / "recording.log"
    with open(path, "r+b") as file:
        file.seek(64 + 16)  # the second entry's base, far beyond its end: not a torn tail, a plausible entry follows
        file.write(I64.pack(1 << 40))
    return str(path)


@pytest.mark.parametrize("damage", [remove_archive, corrupt_catalog, corrupt_recording_log])
@pytest.mark.system
def test_a_member_whose_files_cannot_be_read(base: Path, damage: Any) -> None:
    """Reported by name, not a traceback, with its own exit code; the others are checked as ever."""
    named = damage(base / "node2")
    code, output, document = verify(base)
    assert code == EXIT_UNREADABLE, output
    assert document["violations"] == []
    assert [u["member"] for u in document["unreadable"]] == ["node2"]
    assert f"UNREADABLE node2: {named}" in output and "Traceback" not in output
    assert [c["members"] for c in document["comparisons"]] == [["node0", "node1"]]
    assert document["comparisons"][0]["bytes_compared"] > 0


@pytest.mark.system
def test_a_segment_file_cut_short(base: Path) -> None:
    """A log that stops being there below the recording's stop position is damage, at that position."""
    d = recording_of(base, 1)
    cut = d.stop_position // 2
    os.truncate(base / "node1" / "archive" / segment_file_name(d.recording_id, 0), cut)
    code, output, document = verify(base)
    assert code == EXIT_VIOLATIONS, output
    assert (CHECK_LOG_DAMAGED, "node1", None, cut) in violations_of(document)
    assert "Traceback" not in output


@pytest.mark.system
def test_an_open_recording_with_a_torn_last_frame(base: Path) -> None:
    """node1's log recording as an archive that died while recording leaves
    it: open (no stop position), a recorded position behind its end, and a
    torn frame after the last whole one (a header, its payload never
    written).  Not a violation: it is read to its last complete frame, as
    the archive's recovery would; with the archive running, to the recorded
    position."""
    d = recording_of(base, 1)
    end = d.stop_position
    events = messages_of(base, 1, "NewLeadershipTermEvent")
    recorded = events[-1]["next_position"]
    catalog = Catalog.open(base / "node1" / "archive", create=False)
    try:
        catalog.update_stop_position(d.recording_id, NULL_POSITION)
        catalog.update_recorded_position(d.recording_id, recorded)
    finally:
        catalog.close()
    # A plausible header (its term, offset and stream), the session id field
    # not the checksum of what follows (nothing: the payload was never written).
    term_id = to_int32(d.initial_term_id + end // d.term_buffer_length)
    torn = FRAME.pack(HEADER_LENGTH + 64, 0, BEGIN | END, DATA, end % d.term_buffer_length, 99, d.stream_id, term_id, 0)
    patch_log(base, 1, end, torn)
    code, output, document = verify(base)
    assert code == 0, output
    assert "node1: log recording" in output and "is open" in output
    node1 = next(m for m in document["members"] if m["member"] == "node1")
    assert node1["end_position"] == end and not node1["stopped"]
    # With its archive running, only what its writes are known to have reached is read.
    members = [
        MemberFiles(f"node{m}", base / f"node{m}" / "cluster", base / f"node{m}" / "archive", archive_running=m == 1)
        for m in range(3)
    ]
    result = verify_members(members)
    assert result.ok, [v.text() for v in result.violations]
    assert next(m for m in result.members if m.name == "node1").end_position == recorded
