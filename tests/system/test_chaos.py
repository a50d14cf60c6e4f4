"""The chaos suite (tests/support/chaos.py): a short run of every fault on 3 members
and a 5-member run (marked slow: ``make test-slow``; ``make chaos`` runs
campaigns of them), and, in ``make test``, the checks they rely on, shown to
catch what they are meant to catch."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from fulmar.codecs.generated import cluster as codecs
from fulmar.frames import FrameType
from support.chaos import (
    NEMESES_3,
    NEMESES_5,
    ChaosConfig,
    FaultEvent,
    History,
    Op,
    _availability,
    check_log_against_history,
    log_requests,
    run_chaos,
)

ARTIFACTS = Path(os.environ.get("CHAOS_ARTIFACTS", Path(__file__).resolve().parents[2] / "chaos-artifacts"))


def _seed() -> int:
    """CHAOS_SEED replays a schedule; otherwise a fresh one each run (printed on failure)."""
    return int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 31))


def _run(config: ChaosConfig, kinds: tuple[str, ...]) -> None:
    report = run_chaos(config)
    summary = report.summary()
    print(summary)
    assert not report.anomalies, summary
    assert report.linearizable is True, summary
    assert report.backup_matches is True, summary  # a backup followed the log through every fault
    assert {e["kind"] for e in report.events} == set(kinds), summary  # at least one whole round
    assert report.operations.get("ok", 0) > 100 * config.seconds / 60, summary
    # Every fault was healed and the cluster had a leader again afterwards.
    assert all(e["healed_s"] is not None and e["recovered_s"] is not None for e in report.events), summary


@pytest.mark.slow
def test_chaos_three_members_every_fault() -> None:
    """Three members under every kind of fault in turn: nothing acknowledged is
    lost, nothing applied twice, the history is linearizable, and every
    member ends with the same log and the same state."""
    _run(ChaosConfig(members=3, seconds=20, seed=_seed(), clients=4, artifacts=ARTIFACTS), NEMESES_3)


@pytest.mark.slow
def test_chaos_five_members() -> None:
    _run(ChaosConfig(members=5, seconds=90, seed=_seed(), clients=5, artifacts=ARTIFACTS), NEMESES_5)


# ----------------------------------------------------------------------------- the checks


def _session_message(payload: bytes, session_id: int = 7) -> tuple[int, int, bytes]:
    message = bytearray(32)
    codecs.SessionMessageHeaderEncoder.encode(
        message, 0, leadership_term_id=0, cluster_session_id=session_id, timestamp=1
    )
    return (int(FrameType.DATA), 0xC0, bytes(message) + payload)


def _session_close() -> tuple[int, int, bytes]:
    message = bytearray(64)
    length = codecs.SessionCloseEventEncoder.encode(
        message, 0, leadership_term_id=0, cluster_session_id=7, timestamp=1, close_reason=0
    )
    return (int(FrameType.DATA), 0xC0, bytes(message[:length]))


def _ok(op_id: str, op: str, key: str, reply: dict, value: int | None = None, expected: int | None = None) -> Op:
    return Op(
        op_id,
        0,
        op,
        key,
        invoke=1,
        value=value,
        expected=expected,
        complete=2,
        outcome="ok",
        reply={"id": op_id, **reply},
    )


def test_log_requests_reads_session_messages_and_reassembles_fragments() -> None:
    put = b'{"op":"put","key":"a","value":1,"id":"0-1"}'
    frames = [
        _session_message(put),
        _session_close(),
        (int(FrameType.PAD), 0xC0, b""),
    ]
    # The same kind of request split over three fragments (BEGIN, middle, END).
    whole = _session_message(b'{"op":"get","key":"a","id":"0-2"}')[2]
    frames += [
        (int(FrameType.DATA), 0x80, whole[:20]),
        (int(FrameType.DATA), 0x00, whole[20:40]),
        (int(FrameType.DATA), 0x40, whole[40:]),
    ]
    frames.append(_session_message(b"not json"))
    requests, problems = log_requests(frames)
    assert [r.request["id"] for r in requests] == ["0-1", "0-2"]
    assert problems == ["a session message in the log that no chaos client sent: b'not json'"]


def _log(*requests: str) -> list:
    found, problems = log_requests([_session_message(r.encode()) for r in requests])
    assert not problems
    return found


def test_a_clean_log_and_history_pass_and_give_the_state() -> None:
    log = _log(
        '{"op":"put","key":"a","value":1,"id":"0-1"}',
        '{"op":"cas","key":"a","expected":1,"value":2,"id":"1-1"}',
        '{"op":"get","key":"a","id":"0-2"}',
    )
    ops = {
        o.id: o
        for o in [
            _ok("0-1", "put", "a", {"ok": True, "previous": None}, value=1),
            _ok("1-1", "cas", "a", {"ok": True, "value": 2}, value=2, expected=1),
            _ok("0-2", "get", "a", {"ok": True, "value": 2}),
        ]
    }
    anomalies, state = check_log_against_history(log, ops)
    assert anomalies == [] and state == {"a": 2}


def test_a_lost_acknowledged_write_is_caught() -> None:
    log = _log('{"op":"put","key":"a","value":1,"id":"0-1"}')
    ops = {
        o.id: o
        for o in [
            _ok("0-1", "put", "a", {"ok": True, "previous": None}, value=1),
            _ok("0-2", "put", "a", {"ok": True, "previous": 1}, value=2),
        ]
    }
    anomalies, _ = check_log_against_history(log, ops)
    assert anomalies == ["acknowledged write 0-2 (put a=2) is not in the log: lost"]


def test_a_write_applied_twice_is_caught() -> None:
    put = '{"op":"put","key":"a","value":1,"id":"0-1"}'
    ops = {"0-1": _ok("0-1", "put", "a", {"ok": True, "previous": None}, value=1)}
    anomalies, _ = check_log_against_history(_log(put, put), ops)
    assert anomalies == ["request 0-1 is in the log twice (applied twice), again at #1"]


def test_a_request_never_offered_or_never_sent_in_the_log_is_caught() -> None:
    never_offered = Op("0-1", 0, "put", "a", invoke=1, value=1, outcome="fail")
    anomalies, _ = check_log_against_history(
        _log('{"op":"put","key":"a","value":1,"id":"0-1"}', '{"op":"get","key":"a","id":"9-9"}'), {"0-1": never_offered}
    )
    assert anomalies == [
        "request 0-1 is in the log but was never offered",
        "request 9-9 is in the log but no client sent it",
    ]


def test_an_answer_the_log_does_not_give_is_caught() -> None:
    log = _log('{"op":"put","key":"a","value":1,"id":"0-1"}', '{"op":"get","key":"a","id":"0-2"}')
    ops = {
        o.id: o
        for o in [
            _ok("0-1", "put", "a", {"ok": True, "previous": None}, value=1),
            _ok("0-2", "get", "a", {"ok": True, "value": None}),
        ]
    }  # a stale read
    anomalies, _ = check_log_against_history(log, ops)
    assert len(anomalies) == 1 and anomalies[0].startswith("request 0-2 was answered")


def test_unknown_operations_may_or_may_not_be_in_the_log() -> None:
    unknown_in = Op("0-1", 0, "put", "a", invoke=1, value=1, outcome="unknown")
    unknown_out = Op("0-2", 0, "put", "a", invoke=3, value=2, outcome="unknown")
    anomalies, state = check_log_against_history(
        _log('{"op":"put","key":"a","value":1,"id":"0-1"}'), {"0-1": unknown_in, "0-2": unknown_out}
    )
    assert anomalies == [] and state == {"a": 1}


def test_a_late_reply_completes_its_operation_and_a_stray_one_is_reported() -> None:
    history = History()
    op = Op("0-1", 0, "put", "a", invoke=time.monotonic_ns(), value=1)
    history.invoke(op)
    history.give_up(op, "unknown")
    history.on_reply(b'{"id":"0-1","ok":true,"previous":null}')
    assert (op.outcome, op.late, op.reply) == ("ok", True, {"id": "0-1", "ok": True, "previous": None})
    history.on_reply(b'{"id":"0-1","ok":true,"previous":null}')
    history.on_reply(b'{"id":"5-5","ok":true}')
    history.on_reply(b'{"ok":false,"error":"malformed request: x"}')
    assert len(history.strange_replies) == 3


def test_availability_separates_faulted_from_healthy_seconds() -> None:
    started = 0
    # One answer every 100 ms for 10 s, except from 3 s to 6 s (a fault from 3 s, healed at 5 s, leader at 6 s).
    ops = [
        Op(
            f"0-{i}",
            0,
            "get",
            "a",
            invoke=i * 100_000_000,
            complete=i * 100_000_000 + 1,
            outcome="ok",
            reply={"ok": True, "value": None},
        )
        for i in range(100)
        if not 30 <= i < 60
    ]
    events = [FaultEvent("isolate", [0], "cut off", start_s=3.0, healed_s=5.0, recovered_s=6.0)]
    figures = _availability(ops, events, started, 10)
    assert figures["seconds_with_ok_healthy"] == 1.0
    assert figures["seconds_with_ok_faulted"] == pytest.approx(1 / 4)  # seconds 3, 4, 5, 6: only 6 answered
    assert figures["longest_gap_s"] == pytest.approx(3.1, abs=0.01)
    assert figures["ok_per_s_healthy"] == pytest.approx(10)
    assert (figures["recovery_median_s"], figures["recovery_max_s"]) == (1.0, 1.0)
    assert events[0].longest_wait_s == pytest.approx(3.0, abs=0.01)  # from the fault (3 s) to the answer at 6 s
