"""StateMachine's dispatch, errors, exactly-once records and snapshots, in
one process: requests go straight to ``on_message`` as the container would
hand them over, and replies are read from a fake session."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from fulmar.analytics.replay import _StateMachineFold
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus.snapshot import SERVICE_SNAPSHOT_TYPE_ID, SnapshotWriter, decode_snapshot
from fulmar.service.call_protocol import (
    REPLY_HEADER,
    ReplyStatus,
    RequestKind,
    encode_request,
    pack,
    unpack,
)
from fulmar.service.clustered_service import ClusteredService
from fulmar.service.state_machine import (
    SNAPSHOT_CHUNK_MAGIC,
    SnapshotFormatError,
    StateMachine,
    command,
)
from support.state_machine_services import Bank, Journal


@dataclass
class FakeSession:
    id: int = 7
    sent: list[bytes] = field(default_factory=list)

    def offer(self, payload: bytes | bytearray | memoryview) -> int:
        self.sent.append(bytes(payload))
        return 1


@dataclass
class FakeCluster:
    time: int = 1_000


@dataclass
class FakeSnapshotPublication:
    max_message_length: int = 1024
    messages: list[bytes] = field(default_factory=list)

    def offer(self, message: bytes | bytearray | memoryview) -> None:
        assert len(message) <= self.max_message_length, "a snapshot message longer than the publication takes"
        self.messages.append(bytes(message))


class FakeSnapshotImage:
    def __init__(self, messages: list[bytes]) -> None:
        self._messages = messages

    def messages(self) -> Any:
        return iter(self._messages)


@dataclass
class Reply:
    status: ReplyStatus
    sequence: int
    value: Any


class Caller:
    """One client of a started machine: registers, numbers its calls."""

    def __init__(self, machine: StateMachine, cluster: FakeCluster, session: FakeSession | None = None) -> None:
        self.machine = machine
        self.cluster = cluster
        self.session = session or FakeSession()
        self.client_id = os.urandom(16)
        self.sequence = 0

    def send(self, payload: bytes, session: FakeSession | None = None) -> Reply | None:
        session = session or self.session
        before = len(session.sent)
        self.machine.on_message(session, self.cluster.time, payload)  # type: ignore[arg-type]  # a fake session
        assert len(session.sent) <= before + 1, "more than one reply to one request"
        if len(session.sent) == before:
            return None
        reply = session.sent[-1]
        status, _, _, sequence = REPLY_HEADER.unpack_from(reply)
        return Reply(ReplyStatus(status), sequence, unpack(reply[REPLY_HEADER.size :]))

    def register(self) -> Reply | None:
        return self.send(encode_request(RequestKind.REGISTER, self.client_id, 0, 0))

    def call_message(self, name: str, *args: Any, sequence: int | None = None, lowest: int | None = None) -> bytes:
        if sequence is None:
            self.sequence += 1
            sequence = self.sequence
        body = pack([name, list(args)])
        return encode_request(RequestKind.CALL, self.client_id, sequence, sequence if lowest is None else lowest, body)

    def call(self, name: str, *args: Any, **options: Any) -> Reply:
        reply = self.send(self.call_message(name, *args, **options))
        assert reply is not None
        return reply


def started(machine: StateMachine, snapshot: list[bytes] | None = None) -> tuple[StateMachine, FakeCluster]:
    cluster = FakeCluster()
    machine.on_start(cluster, None if snapshot is None else FakeSnapshotImage(snapshot))  # type: ignore[arg-type]
    return machine, cluster


def registered(machine: StateMachine) -> Caller:
    machine, cluster = started(machine)
    caller = Caller(machine, cluster)
    reply = caller.register()
    assert reply is not None and reply.status is ReplyStatus.REGISTERED
    assert reply.value == [caller.client_id, machine.client_expiry_ms]
    return caller


class CountingJournal(Journal):
    """Counts how often each command body ran (outside the state: not snapshotted)."""

    runs = 0

    @command
    def append(self, entry: Any) -> int:
        type(self).runs += 1
        return super().append(entry)

    @command
    def fails_after_check(self, entry: Any) -> None:
        type(self).runs += 1
        if entry == "bad":
            raise KeyError(entry)
        self.entries.append(entry)

    @command
    def returns_a_set(self) -> Any:
        self.counter += 100
        return {1, 2}

    @command
    def raises_type_error(self, value: Any) -> int:
        return value + 1  # a str argument raises TypeError inside the command

    def helper(self) -> int:  # not a command
        return 1


# ---------------------------------------------------------------------------- dispatch


def test_a_command_runs_and_its_result_comes_back() -> None:
    caller = registered(Bank())
    assert caller.call("deposit", "alice", 10) == Reply(ReplyStatus.OK, 1, 10)
    assert caller.call("deposit", "alice", 5) == Reply(ReplyStatus.OK, 2, 15)
    assert caller.call("balance", "alice") == Reply(ReplyStatus.OK, 3, 15)
    assert caller.machine.balances == {"alice": 15}  # type: ignore[attr-defined]


def test_tuples_cross_as_lists_and_maps_take_int_keys() -> None:
    class Echo(StateMachine):
        @command
        def echo(self, value: Any) -> Any:
            return value

    caller = registered(Echo())
    assert caller.call("echo", (1, "a", b"b")).value == [1, "a", b"b"]
    assert caller.call("echo", {1: None, "x": 2.5}).value == {1: None, "x": 2.5}


def test_a_raising_command_answers_its_type_and_message_and_the_service_goes_on() -> None:
    caller = registered(Bank())
    caller.call("deposit", "alice", 10)
    reply = caller.call("transfer", "alice", "bob", 50)
    assert reply.status is ReplyStatus.RAISED
    assert reply.value == ["support.state_machine_services.Overdraft", "alice has 10, cannot send 50"]
    assert caller.call("deposit", "alice", -1).value == ["ValueError", "a deposit must be positive, not -1"]
    # Checked before changing: the refused transfer changed nothing, and the next call runs.
    assert caller.machine.balances == {"alice": 10}  # type: ignore[attr-defined]
    assert caller.call("transfer", "alice", "bob", 4).status is ReplyStatus.OK
    assert caller.machine.balances == {"alice": 6, "bob": 4}  # type: ignore[attr-defined]


def test_an_unknown_name_and_a_method_not_marked_are_unknown_commands() -> None:
    caller = registered(CountingJournal())
    for name in ("no_such", "helper", "snapshot_state", "on_start", "__init__"):
        reply = caller.call(name)
        assert reply.status is ReplyStatus.UNKNOWN_COMMAND, name
        assert reply.value[0] == "UnknownCommand"
        assert f"no command {name!r}" in reply.value[1] and "append" in reply.value[1]


def test_arguments_that_do_not_fit_are_bad_arguments_and_nothing_runs() -> None:
    caller = registered(CountingJournal())
    CountingJournal.runs = 0
    reply = caller.call("append")
    assert reply.status is ReplyStatus.BAD_ARGUMENTS and reply.value[0] == "TypeError"
    assert "append()" in reply.value[1]
    assert caller.call("append", 1, 2).status is ReplyStatus.BAD_ARGUMENTS
    assert CountingJournal.runs == 0 and caller.machine.entries == []  # type: ignore[attr-defined]
    # A TypeError raised inside a command whose arguments fit is the command's own.
    reply = caller.call("raises_type_error", "text")
    assert reply.status is ReplyStatus.RAISED and reply.value[0] == "TypeError"


def test_an_unencodable_result_is_the_callers_error_and_the_change_stays() -> None:
    caller = registered(CountingJournal())
    reply = caller.call("returns_a_set")
    assert reply.status is ReplyStatus.UNENCODABLE_RESULT
    assert reply.value[0] == "TypeError" and "the command was applied" in reply.value[1]
    assert caller.machine.counter == 100  # type: ignore[attr-defined]
    # It is recorded like any answer: a resend does not run the command again.
    assert caller.call("returns_a_set", sequence=1).status is ReplyStatus.UNENCODABLE_RESULT
    assert caller.machine.counter == 100  # type: ignore[attr-defined]


def test_malformed_requests_get_bad_request_and_the_service_goes_on() -> None:
    caller = registered(Journal())
    assert caller.send(b"\x02\x01").status is ReplyStatus.BAD_REQUEST  # type: ignore[union-attr]
    wrong_version = bytearray(caller.call_message("increment"))
    wrong_version[1] = 99
    assert caller.send(bytes(wrong_version)).status is ReplyStatus.BAD_REQUEST  # type: ignore[union-attr]
    not_msgpack = encode_request(RequestKind.CALL, caller.client_id, 10, 10, b"\xc1\xc1")
    assert caller.send(not_msgpack).status is ReplyStatus.BAD_REQUEST  # type: ignore[union-attr]
    not_a_call = encode_request(RequestKind.CALL, caller.client_id, 11, 11, pack({"name": "increment"}))
    assert caller.send(not_a_call).status is ReplyStatus.BAD_REQUEST  # type: ignore[union-attr]
    unknown_kind = encode_request(9, caller.client_id, 12, 12)  # type: ignore[arg-type]
    assert caller.send(unknown_kind).status is ReplyStatus.BAD_REQUEST  # type: ignore[union-attr]
    assert caller.call("increment", sequence=13).value == 1


def test_messages_the_service_offered_itself_are_ignored() -> None:
    machine, cluster = started(Journal())
    machine.on_message(None, cluster.time, b"anything")
    assert machine.counter == 0  # type: ignore[attr-defined]


def test_commands_are_inherited_and_an_override_must_be_marked_again() -> None:
    class Base(StateMachine):
        @command
        def a(self) -> str:
            return "base a"

        @command
        def b(self) -> str:
            return "base b"

    class Derived(Base):
        @command
        def a(self) -> str:
            return "derived a"

        def b(self) -> str:  # replaced by a plain method: no longer a command
            return "derived b"

    caller = registered(Derived())
    assert caller.call("a").value == "derived a"
    assert caller.call("b").status is ReplyStatus.UNKNOWN_COMMAND
    assert sorted(Derived._commands) == ["a"] and sorted(Base._commands) == ["a", "b"]


def test_cluster_time_is_the_logs_timestamp() -> None:
    class Clock(StateMachine):
        @command
        def now(self) -> int:
            return self.cluster_time

    caller = registered(Clock())
    caller.cluster.time = 123_456
    assert caller.call("now").value == 123_456


def test_a_state_machine_subclass_need_not_call_the_base_init() -> None:
    class NoSuper(StateMachine):
        def __init__(self) -> None:
            self.value = 1  # no super().__init__()

        @command
        def get(self) -> int:
            return self.value

    assert registered(NoSuper()).call("get").value == 1


def test_a_plain_clustered_service_gets_each_message_as_bytes_in_on_message() -> None:
    class Plain(ClusteredService):
        def __init__(self) -> None:
            self.got: list[tuple[Any, int, bytes]] = []

        def on_message(self, session: Any, timestamp: int, payload: bytes) -> None:
            self.got.append((session, timestamp, payload))

    service = Plain()
    log = bytearray(b"....hello....")
    service.on_session_message("session", 5, memoryview(log), 4, 5)  # type: ignore[arg-type]
    log[4:9] = b"XXXXX"  # the log's buffer is reused: the payload must be a copy
    assert service.got == [("session", 5, b"hello")] and type(service.got[0][2]) is bytes


# ---------------------------------------------------------------------------- exactly once


def test_a_resent_call_is_answered_from_the_record_on_any_session_and_not_applied_again() -> None:
    caller = registered(CountingJournal())
    CountingJournal.runs = 0
    first = caller.call_message("append", "x")
    assert caller.send(first) == Reply(ReplyStatus.OK, 1, 0)
    original = caller.session.sent[-1]
    new_session = FakeSession(id=8)
    assert caller.send(first, session=new_session) == Reply(ReplyStatus.OK, 1, 0)
    assert new_session.sent == [original]  # the same bytes, to the session that resent it
    assert CountingJournal.runs == 1 and caller.machine.entries == ["x"]  # type: ignore[attr-defined]


def test_a_call_that_raised_is_recorded_too() -> None:
    caller = registered(CountingJournal())
    CountingJournal.runs = 0
    message = caller.call_message("fails_after_check", "bad")
    assert caller.send(message).status is ReplyStatus.RAISED  # type: ignore[union-attr]
    assert caller.send(message).value == ["KeyError", "'bad'"]  # type: ignore[union-attr]
    assert CountingJournal.runs == 1


def test_out_of_order_calls_each_apply_once() -> None:
    caller = registered(CountingJournal())
    CountingJournal.runs = 0
    messages = {n: caller.call_message("append", n, sequence=n, lowest=1) for n in (1, 2, 3)}
    for n in (3, 1, 3, 2, 1):
        caller.send(messages[n])
    assert CountingJournal.runs == 3 and caller.machine.entries == [3, 1, 2]  # type: ignore[attr-defined]


def test_the_lowest_unanswered_drops_the_records_below_it_and_such_calls_are_not_applied() -> None:
    caller = registered(CountingJournal())
    record = caller.machine._fulmar.clients.records[caller.client_id]
    old = [caller.call_message("append", n, sequence=n, lowest=1) for n in (1, 2, 3)]
    for message in old:
        caller.send(message)
    assert sorted(record.replies) == [1, 2, 3]
    caller.call("append", 4, sequence=4, lowest=3)
    assert sorted(record.replies) == [3, 4] and record.lowest_unanswered == 3
    # A copy of call 1 still on its way (the client waits for it no more): not applied again.
    CountingJournal.runs = 0
    reply = caller.send(old[0])
    assert reply is not None and reply.status is ReplyStatus.FORGOTTEN and reply.sequence == 1
    assert CountingJournal.runs == 0 and caller.machine.entries == [1, 2, 3, 4]  # type: ignore[attr-defined]
    # A stale, lower value (from a resent call) does not bring anything back.
    caller.send(old[2])
    assert record.lowest_unanswered == 3 and sorted(record.replies) == [3, 4]
    # A touch carries the lowest unanswered too, and gets no answer.
    touch = encode_request(RequestKind.TOUCH, caller.client_id, 0, 5)
    assert caller.send(touch) is None
    assert record.replies == {} and record.lowest_unanswered == 5


def test_read_only_results_are_not_kept() -> None:
    caller = registered(Journal())
    caller.call("increment", lowest=1)
    caller.call("read", lowest=1)
    assert sorted(caller.machine._fulmar.clients.records[caller.client_id].replies) == [1]


def test_a_client_never_registered_gets_expired_and_nothing_is_applied() -> None:
    machine, cluster = started(CountingJournal())
    stranger = Caller(machine, cluster)
    reply = stranger.call("append", "x")
    assert reply.status is ReplyStatus.EXPIRED and reply.value[0] == "ClientExpired"
    assert machine.entries == []  # type: ignore[attr-defined]
    assert stranger.send(encode_request(RequestKind.TOUCH, stranger.client_id, 0, 1)) is None


def test_a_client_not_heard_from_for_the_expiry_is_forgotten_and_its_resend_is_not_applied() -> None:
    caller = registered(CountingJournal())
    expiry = caller.machine.client_expiry_ms
    message = caller.call_message("append", "x")
    caller.send(message)
    caller.cluster.time += expiry  # heard from exactly expiry ago: still remembered
    assert caller.send(message) == Reply(ReplyStatus.OK, 1, 0)
    caller.cluster.time += expiry + 1
    reply = caller.send(message)
    assert reply is not None and reply.status is ReplyStatus.EXPIRED and reply.sequence == 1
    assert caller.machine.entries == ["x"]  # type: ignore[attr-defined]
    assert caller.client_id not in caller.machine._fulmar.clients.records
    # Registering again (as the client does, with a new id) works.
    caller.client_id = os.urandom(16)
    assert caller.register().status is ReplyStatus.REGISTERED  # type: ignore[union-attr]
    assert caller.call("append", "y").value == 1


def test_touches_keep_a_client_remembered() -> None:
    caller = registered(Journal())
    expiry = caller.machine.client_expiry_ms
    for _ in range(5):
        caller.cluster.time += expiry - 1
        caller.send(encode_request(RequestKind.TOUCH, caller.client_id, 0, 1))
    assert caller.call("increment").status is ReplyStatus.OK


def test_the_sweep_frees_dead_records_by_cluster_time_only() -> None:
    machine, cluster = started(Journal())
    gone, alive = Caller(machine, cluster), Caller(machine, cluster)
    gone.register()
    table = machine._fulmar.clients
    cluster.time += table.expiry_ms // 2
    alive.register()
    cluster.time += table.expiry_ms // 2 + 1  # gone: silent for expiry + 1; alive: for half of it
    alive.call("increment")  # any message sweeps when a sweep is due
    assert set(table.records) == {alive.client_id}
    assert table.next_sweep_ms == cluster.time + table.expiry_ms // 4


# ---------------------------------------------------------------------------- snapshots


def take_snapshot(machine: StateMachine, max_message_length: int = 1024) -> list[bytes]:
    publication = FakeSnapshotPublication(max_message_length)
    machine.on_take_snapshot(publication)
    return publication.messages


def test_the_snapshot_round_trip_keeps_the_state_and_the_records() -> None:
    caller = registered(CountingJournal())
    for n in range(50):
        caller.call("append", f"entry {n} " * 20)  # ~10 KiB of state
    caller.call("increment")
    answered = caller.call_message("append", "last")
    caller.send(answered)
    messages = take_snapshot(caller.machine)
    # Split to fit: every message within the publication's max length, more than one.
    assert len(messages) > 5 and all(len(m) <= 1024 for m in messages)
    restored, cluster = started(CountingJournal(), messages)
    cluster.time = caller.cluster.time
    assert restored.entries == caller.machine.entries and restored.counter == 1  # type: ignore[attr-defined]
    assert "_fulmar" not in pickle.loads(b"".join(m[len(SNAPSHOT_CHUNK_MAGIC) :] for m in messages))[2]
    # The record came along: the resent call is answered, not applied again.
    CountingJournal.runs = 0
    again = Caller(restored, cluster)
    again.client_id = caller.client_id
    assert again.send(answered) == Reply(ReplyStatus.OK, 52, 50)
    assert CountingJournal.runs == 0 and len(restored.entries) == 51  # type: ignore[attr-defined]
    # So did the sweep's schedule and the lowest unanswered.
    table, original = restored._fulmar.clients, caller.machine._fulmar.clients
    assert table.next_sweep_ms == original.next_sweep_ms
    assert {k: (r.last_heard_ms, r.lowest_unanswered, r.replies) for k, r in table.records.items()} == {
        k: (r.last_heard_ms, r.lowest_unanswered, r.replies) for k, r in original.records.items()
    }


def test_overridden_hooks_save_the_users_state_and_the_base_saves_the_records() -> None:
    class Custom(StateMachine):
        def __init__(self) -> None:
            self.total = 0
            self.cache = "not kept"

        def snapshot_state(self) -> Any:
            return self.total

        def restore_state(self, state: Any) -> None:
            self.total = state

        @command
        def add(self, amount: int) -> int:
            self.total += amount
            return self.total

    caller = registered(Custom())
    message = caller.call_message("add", 5)
    caller.send(message)
    caller.machine.cache = "changed"  # type: ignore[attr-defined]
    restored, cluster = started(Custom(), take_snapshot(caller.machine))
    assert restored.total == 5 and restored.cache == "not kept"  # type: ignore[attr-defined]
    again = Caller(restored, cluster)
    again.client_id = caller.client_id
    assert again.send(message) == Reply(ReplyStatus.OK, 1, 5)
    assert restored.total == 5  # type: ignore[attr-defined]


def test_snapshot_messages_never_pass_for_cluster_codecs() -> None:
    """The container decodes every snapshot message as a cluster codec first
    and hands over only those that do not decode: a chunk that did would be
    taken for a session record and lost from the state."""
    caller = registered(Journal())
    for n in range(300):
        caller.call("append", n)  # chunk boundaries at many byte values
    messages = take_snapshot(caller.machine, max_message_length=200)
    marker = bytearray(64)
    length = codecs.SnapshotMarkerEncoder.encode(
        marker, 0, type_id=SERVICE_SNAPSHOT_TYPE_ID, log_position=0, leadership_term_id=0, index=0,
        mark=int(codecs.SnapshotMark.BEGIN), time_unit=0, app_version=0,
    )  # fmt: skip
    end = bytearray(marker)
    codecs.SnapshotMarkerEncoder.encode(
        end, 0, type_id=SERVICE_SNAPSHOT_TYPE_ID, log_position=0, leadership_term_id=0, index=0,
        mark=int(codecs.SnapshotMark.END), time_unit=0, app_version=0,
    )  # fmt: skip
    records = list(decode_snapshot([bytes(marker[:length]), *messages, bytes(end[:length])], SERVICE_SNAPSHOT_TYPE_ID))
    assert records[1:] == messages  # (the END marker is checked, not yielded)


def test_the_snapshot_writer_tells_its_max_message_length() -> None:
    assert isinstance(SnapshotWriter.max_message_length, property)


def test_a_snapshot_of_something_else_is_refused() -> None:
    with pytest.raises(SnapshotFormatError, match="not a StateMachine's"):
        started(Journal(), [b"\x00" * 16])
    with pytest.raises(SnapshotFormatError, match="no StateMachine state"):
        started(Journal(), [])
    with pytest.raises(SnapshotFormatError, match="format 2"):
        started(Journal(), [SNAPSHOT_CHUNK_MAGIC + pickle.dumps((2, (0, []), {}))])


# ---------------------------------------------------------------------------- offline replay


@dataclass
class LogRow:
    """The fields of a ``fulmar-log`` row the replay of a StateMachine reads."""

    message_type: str
    cluster_session_id: int
    timestamp: int = 0
    payload: bytes = b""


class StampedJournal(Journal):
    @command
    def stamp(self) -> int:
        self.entries.append(self.cluster_time)
        return self.cluster_time


def test_an_offline_replay_applies_the_logs_calls_as_the_container_did() -> None:
    # The fold replay_state_machine runs over the log's rows (Spark only decodes and orders them).
    client_id = os.urandom(16)

    def call(sequence: int, name: str, *args: Any) -> bytes:
        return encode_request(RequestKind.CALL, client_id, sequence, sequence, pack([name, list(args)]))

    rows = [
        LogRow("SessionOpenEvent", 1),
        LogRow("SessionMessageHeader", 1, 10, encode_request(RequestKind.REGISTER, client_id, 0, 0)),
        LogRow("SessionMessageHeader", 1, 11, call(1, "increment")),
        LogRow("SessionMessageHeader", 1, 12, call(2, "append", "a")),
        LogRow("NewLeadershipTermEvent", 0, 13),
        # A failover: the client resends call 2 on a new session, then goes on.
        LogRow("SessionOpenEvent", 2),
        LogRow("SessionMessageHeader", 2, 14, call(2, "append", "a")),
        LogRow("SessionMessageHeader", 2, 15, call(3, "stamp")),
        LogRow("SessionCloseEvent", 1),
        # A session the container no longer knows: its message is not applied.
        LogRow("SessionMessageHeader", 1, 16, call(4, "increment")),
        LogRow("SessionMessageHeader", 2, 17, call(5, "nothing")),  # unknown: answered, nothing applied
    ]
    fold = _StateMachineFold(StampedJournal())
    for row in rows:
        assert fold.apply(row) is fold
    machine = fold.machine
    # Applied twice, call 2 would leave ["a", "a"]; a closed session's call applied would make it 2.
    assert (machine.entries, machine.counter) == (["a", 15], 1)
    assert fold.sessions == {2}
