"""A replicated state machine written as methods: ``StateMachine`` and ``@command``.

::

    class Bank(StateMachine):
        def __init__(self) -> None:
            self.balances: dict[str, int] = {}

        @command
        def deposit(self, account: str, amount: int) -> int:
            self.balances[account] = self.balances.get(account, 0) + amount
            return self.balances[account]

        @command(read_only=True)
        def balance(self, account: str) -> int:
            return self.balances.get(account, 0)

A client calls ``client.call("deposit", "alice", 10)`` (``fulmar.connect``)
and gets ``10`` back.  Every member applies every call, in log order, exactly
once, whatever failovers and reconnects the client went through.

What a command must do:

- **Be deterministic.**  Every member runs it on the same state in the same
  order and must reach the same state and result: read the time from
  ``self.cluster_time`` (the log's timestamp, ms since the epoch), never from
  the wall clock, and use no randomness, no files, no sockets, nothing that
  differs between members.
- **Check, then change.**  An exception a command raises goes back to the
  caller (``CommandError`` with the exception's type name and message) and
  the service goes on, but nothing is rolled back: raise before changing
  anything.  A result msgpack cannot encode is the caller's error too
  (``ResultEncodingError``), and the command's changes then stay made.
- **Take and return what msgpack carries**: None, bool, int (64-bit), float,
  str, bytes, and lists and dicts of them; a tuple goes as a list.
  Arguments are positional.

``@command(read_only=True)`` marks a command that only reads.  It is still
replicated (so it is linearizable: it sees every call answered before it was
sent), but its result is not kept for a resend: a read resent after a
failover runs again, which only a change could make visible.

The state is the instance's attributes.  A snapshot holds all of those the
subclass set (pickled: any object pickle takes) and the record of recent calls
that makes calls exactly once; override ``snapshot_state()`` and
``restore_state(state)`` to choose what goes in (the records go in whatever
they return).  A subclass that overrides ``on_start`` or ``on_take_snapshot``
must call the base's.

Exactly once: each client registers once (a random 128-bit client id) and
numbers its calls.  Per client the service keeps the replies of the calls the
client may still be waiting for, so a call resent after a failover or on a
new session is answered from that record instead of being applied again.  The
client tells, in every call, the lowest sequence it still waits for; the
replies below it are dropped.  A client not heard from for
``client_expiry_ms`` of cluster time (the log's timestamps, so every member
expires it at the same message) is forgotten: a call from it then gets an
EXPIRED answer and is not applied.  The client then registers anew; a call
it had sent once goes again, and one it had sent more than once (an earlier
copy may have been applied) raises ``ClientExpiredError``.  Clients touch
the service while idle, so only one cut off for that long is forgotten.
"""

from __future__ import annotations

import heapq
import inspect
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, overload

from fulmar.errors import FulmarError
from fulmar.service.call_protocol import (
    PROTOCOL_VERSION,
    REQUEST_HEADER,
    ReplyStatus,
    RequestKind,
    encode_error,
    encode_reply,
    exception_type_name,
    pack,
    unpack,
)
from fulmar.service.clustered_service import (
    ClientSession,
    Cluster,
    ClusteredService,
    SnapshotImage,
    SnapshotPublication,
)

__all__ = ["ClientRecord", "ClientTable", "SnapshotFormatError", "StateMachine", "command"]

F = TypeVar("F", bound=Callable[..., Any])

# Each snapshot message of a StateMachine starts with this.  The container
# decodes every snapshot message as a cluster codec first (service/agent.py):
# bytes 4-5 ("ar") are no SBE header's schema id 111, so these never pass for one.
SNAPSHOT_CHUNK_MAGIC = b"fulmarSM"
SNAPSHOT_FORMAT_VERSION = 1
# Longest snapshot message: within any snapshot publication's max message
# length (an eighth of its term), and no copy of a huge state in one piece.
SNAPSHOT_CHUNK_LENGTH = 64 * 1024


class SnapshotFormatError(FulmarError):
    """A snapshot to load is not one a StateMachine wrote (or is of a later format)."""


@dataclass(frozen=True)
class _CommandMark:
    read_only: bool


@overload
def command(function: F, /) -> F: ...


@overload
def command(*, read_only: bool = False) -> Callable[[F], F]: ...


def command(function: Any = None, /, *, read_only: bool = False) -> Any:
    """Mark a method of a ``StateMachine`` as a command clients may call by name.

    ``@command`` or ``@command(read_only=True)`` (a command that changes
    nothing: its result is not kept for resends)."""

    def mark(method: F) -> F:
        method.__fulmar_command__ = _CommandMark(read_only)  # type: ignore[attr-defined]
        return method

    return mark if function is None else mark(function)


# ---------------------------------------------------------------------------- the call records


@dataclass
class ClientRecord:
    """What the service remembers of one client."""

    last_heard_ms: int
    # The client waits for no call below this (the highest it told); the
    # replies of those are dropped, and such a call is not applied again.
    lowest_unanswered: int = 1
    replies: dict[int, bytes] = field(default_factory=dict)  # sequence -> the reply sent
    _sequences: list[int] = field(default_factory=list)  # heap of the replies' sequences

    def remember(self, sequence: int, reply: bytes) -> None:
        self.replies[sequence] = reply
        heapq.heappush(self._sequences, sequence)

    def advance(self, lowest_unanswered: int) -> None:
        """The client waits for nothing below ``lowest_unanswered`` (a lower,
        stale value from a resent call changes nothing)."""
        if lowest_unanswered <= self.lowest_unanswered:
            return
        self.lowest_unanswered = lowest_unanswered
        sequences = self._sequences
        while sequences and sequences[0] < lowest_unanswered:
            self.replies.pop(heapq.heappop(sequences), None)


class ClientTable:
    """Every client's record, expired by cluster time.

    A record not heard from for more than ``expiry_ms`` is dead the moment a
    message finds it so (``find``); the sweep that frees dead records runs at
    times the log decides and is in the snapshot, so every member holds the
    same records at every log position."""

    def __init__(self, expiry_ms: int) -> None:
        self.expiry_ms = expiry_ms
        self.records: dict[bytes, ClientRecord] = {}
        self.next_sweep_ms = 0

    def register(self, client_id: bytes, now_ms: int) -> ClientRecord:
        record = self.find(client_id, now_ms)
        if record is None:
            record = self.records[client_id] = ClientRecord(now_ms)
        return record

    def find(self, client_id: bytes, now_ms: int) -> ClientRecord | None:
        """The live record of ``client_id``, now heard from; None if there is none (or it expired)."""
        record = self.records.get(client_id)
        if record is None:
            return None
        if now_ms - record.last_heard_ms > self.expiry_ms:
            del self.records[client_id]
            return None
        record.last_heard_ms = max(record.last_heard_ms, now_ms)
        return record

    def sweep(self, now_ms: int) -> None:
        """Free the dead records, every quarter of the expiry (of cluster time)."""
        if now_ms < self.next_sweep_ms:
            return
        self.next_sweep_ms = now_ms + max(1, self.expiry_ms // 4)
        dead = [key for key, record in self.records.items() if now_ms - record.last_heard_ms > self.expiry_ms]
        for key in dead:
            del self.records[key]

    def to_snapshot(self) -> tuple[int, list[tuple[bytes, int, int, list[tuple[int, bytes]]]]]:
        """Plain data (no class of this module): a later version can read it."""
        return self.next_sweep_ms, [
            (key, record.last_heard_ms, record.lowest_unanswered, list(record.replies.items()))
            for key, record in self.records.items()
        ]

    def restore(self, data: tuple[int, list[tuple[bytes, int, int, list[tuple[int, bytes]]]]]) -> None:
        self.next_sweep_ms, records = data
        self.records = {}
        for key, last_heard_ms, lowest_unanswered, replies in records:
            record = ClientRecord(last_heard_ms, lowest_unanswered)
            for sequence, reply in replies:
                record.remember(sequence, reply)
            self.records[key] = record


# ---------------------------------------------------------------------------- the machine


class _Bookkeeping:
    """The base class's part of a StateMachine instance (one attribute, ``_fulmar``,
    which the default snapshot leaves out)."""

    def __init__(self, expiry_ms: int) -> None:
        self.cluster: Cluster | None = None
        self.clients = ClientTable(expiry_ms)


class StateMachine(ClusteredService):
    """Subclass it, give it state in ``__init__`` (no arguments) and methods
    marked ``@command``.  See the module's documentation for the rules."""

    # How long (ms of cluster time) a client no call or touch came from is remembered.
    client_expiry_ms: ClassVar[int] = 3_600_000
    # name -> (function, read only); collected for each subclass.
    _commands: ClassVar[dict[str, tuple[Callable[..., Any], bool]]] = {}
    _fulmar: _Bookkeeping

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        commands: dict[str, tuple[Callable[..., Any], bool]] = {}
        for name in dir(cls):
            value = inspect.getattr_static(cls, name)
            mark = getattr(value, "__fulmar_command__", None)
            if isinstance(mark, _CommandMark):
                commands[name] = (value, mark.read_only)
        cls._commands = commands

    def __new__(cls, *args: Any, **kwargs: Any) -> StateMachine:
        # Here rather than in __init__: a subclass's __init__ need not call super().
        self = super().__new__(cls)
        self._fulmar = _Bookkeeping(cls.client_expiry_ms)
        return self

    # ------------------------------------------------------------ for commands

    @property
    def cluster(self) -> Cluster:
        """The cluster (timers, ``member_id``, ...); there from ``on_start`` on."""
        cluster = self._fulmar.cluster
        if cluster is None:
            raise RuntimeError("the state machine has not started: no cluster yet")
        return cluster

    @property
    def cluster_time(self) -> int:
        """The log's time (ms since the epoch) of the message being applied: the only clock a command may read."""
        return self.cluster.time

    # ------------------------------------------------------------ snapshot hooks

    def snapshot_state(self) -> Any:
        """What a snapshot keeps of the state (pickled).  The default: every
        attribute of the instance but the base class's bookkeeping."""
        return {name: value for name, value in vars(self).items() if name != "_fulmar"}

    def restore_state(self, state: Any) -> None:
        """Load what ``snapshot_state`` returned (into an instance just made by
        ``__init__``).  The default sets the attributes back."""
        vars(self).update(state)

    # ------------------------------------------------------------ the container's callbacks

    def on_start(self, cluster: Cluster, snapshot: SnapshotImage | None) -> None:
        self._fulmar.cluster = cluster
        if snapshot is None:
            return
        chunks = []
        for message in snapshot.messages():
            if not message.startswith(SNAPSHOT_CHUNK_MAGIC):
                raise SnapshotFormatError(f"a snapshot message of {len(message)} bytes is not a StateMachine's")
            chunks.append(memoryview(message)[len(SNAPSHOT_CHUNK_MAGIC) :])
        if not chunks:
            raise SnapshotFormatError("the snapshot holds no StateMachine state")
        version, clients, state = pickle.loads(b"".join(chunks))
        if version != SNAPSHOT_FORMAT_VERSION:
            raise SnapshotFormatError(f"snapshot format {version}: this version reads {SNAPSHOT_FORMAT_VERSION}")
        self._fulmar.clients.restore(clients)
        self.restore_state(state)

    def on_take_snapshot(self, publication: SnapshotPublication) -> None:
        data = pickle.dumps(
            (SNAPSHOT_FORMAT_VERSION, self._fulmar.clients.to_snapshot(), self.snapshot_state()),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
        chunk_length = min(SNAPSHOT_CHUNK_LENGTH, publication.max_message_length) - len(SNAPSHOT_CHUNK_MAGIC)
        view = memoryview(data)
        for start in range(0, len(data), chunk_length):
            publication.offer(SNAPSHOT_CHUNK_MAGIC + view[start : start + chunk_length])

    def on_message(self, session: ClientSession | None, timestamp: int, payload: bytes) -> None:
        if session is None:
            return  # a message the service offered into the log: a StateMachine offers none
        reply = handle_request(self, timestamp, payload)
        if reply is not None:
            # Sent once: a reply the egress refused (its client gone or
            # stalled) is answered from the record when the call is resent.
            session.offer(reply)


def handle_request(machine: StateMachine, timestamp: int, payload: bytes) -> bytes | None:
    """The reply to one request (None: nothing to answer), after applying it if
    it is due: what the container does with each message of a client session
    (and an offline replay of the log, ``fulmar.analytics.replay``)."""
    if len(payload) < REQUEST_HEADER.size:
        return encode_error(ReplyStatus.BAD_REQUEST, 0, "BadRequest", f"a request of {len(payload)} bytes")
    kind, version, _, client_id, sequence, lowest_unanswered = REQUEST_HEADER.unpack_from(payload)
    if version != PROTOCOL_VERSION:
        return encode_error(
            ReplyStatus.BAD_REQUEST,
            sequence,
            "BadRequest",
            f"protocol version {version}: this service speaks {PROTOCOL_VERSION}",
        )
    clients = machine._fulmar.clients
    clients.sweep(timestamp)
    if kind == RequestKind.REGISTER:
        clients.register(client_id, timestamp)
        return encode_reply(ReplyStatus.REGISTERED, 0, pack([client_id, clients.expiry_ms]))
    if kind not in (RequestKind.CALL, RequestKind.TOUCH):
        return encode_error(ReplyStatus.BAD_REQUEST, sequence, "BadRequest", f"unknown request kind {kind}")
    record = clients.find(client_id, timestamp)
    if record is None:
        if kind == RequestKind.TOUCH:
            return None  # its next call hears of it
        return encode_error(
            ReplyStatus.EXPIRED,
            sequence,
            "ClientExpired",
            f"no record of client {client_id.hex()} (none heard for {clients.expiry_ms} ms of cluster "
            "time, or it never registered): the call was not applied now",
        )
    record.advance(lowest_unanswered)
    if kind == RequestKind.TOUCH:
        return None
    kept = record.replies.get(sequence)
    if kept is not None:
        return kept  # a resend: the same answer, nothing applied again
    if sequence < record.lowest_unanswered:
        return encode_error(
            ReplyStatus.FORGOTTEN,
            sequence,
            "CallForgotten",
            f"call {sequence} is below the lowest the client waits for ({record.lowest_unanswered}): not applied again",
        )
    reply, read_only = _apply(machine, sequence, memoryview(payload)[REQUEST_HEADER.size :])
    if not read_only:
        record.remember(sequence, reply)
    return reply


def _apply(machine: StateMachine, sequence: int, body: memoryview) -> tuple[bytes, bool]:
    """Run the call's command; (the reply, whether it was read-only)."""
    try:
        name, args = unpack(body)
        if not isinstance(name, str) or not isinstance(args, list):
            raise TypeError(f"expected [name, [arguments]], got [{type(name).__name__}, {type(args).__name__}]")
    except Exception as error:  # noqa: BLE001 - whatever the body is, it is the caller's error
        return encode_error(ReplyStatus.BAD_REQUEST, sequence, exception_type_name(error), str(error)), True
    found = machine._commands.get(name)
    if found is None:
        known = ", ".join(sorted(machine._commands)) or "none"
        message = f"{type(machine).__name__} has no command {name!r} (its commands: {known})"
        return encode_error(ReplyStatus.UNKNOWN_COMMAND, sequence, "UnknownCommand", message), True
    function, read_only = found
    try:
        result = function(machine, *args)
    except Exception as error:  # noqa: BLE001 - the command's exception is the caller's answer
        if isinstance(error, TypeError) and not _arguments_fit(function, machine, args):
            # Nothing ran: the arguments did not bind (looked at only after a
            # TypeError, so a call that fits pays nothing for the check).
            return encode_error(ReplyStatus.BAD_ARGUMENTS, sequence, "TypeError", f"{name}(): {error}"), True
        return encode_error(ReplyStatus.RAISED, sequence, exception_type_name(error), str(error)), read_only
    try:
        body_out = pack(result)
    except Exception as error:  # noqa: BLE001 - an unencodable result is the caller's error
        message = (
            f"{name} returned {type(result).__name__}, which msgpack cannot encode ({error}); the command was applied"
        )
        return encode_error(ReplyStatus.UNENCODABLE_RESULT, sequence, exception_type_name(error), message), read_only
    return encode_reply(ReplyStatus.OK, sequence, body_out), read_only


def _arguments_fit(function: Callable[..., Any], machine: StateMachine, args: list[Any]) -> bool:
    try:
        inspect.signature(function).bind(machine, *args)
    except TypeError:
        return False
    return True
