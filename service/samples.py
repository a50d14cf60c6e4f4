"""Sample clustered services (run one with ``--service fulmar.service.samples:EchoService``).

- ``EchoService``: replies to every message with the same bytes.
- ``KeyValueService``: a replicated dictionary: get, put, compare-and-set.
- ``CounterService``: a counter clients increment (directly, or through a
  message the service offers into the log), with a timer that adds a tick
  every second of cluster time while anyone is connected.
- ``KeyValueStore``: the replicated dictionary as a ``StateMachine``: its
  commands ``put``, ``get`` and ``delete``, called with ``fulmar.connect``
  (``make run`` serves it).

Each keeps its whole state in snapshots, and uses only the log's timestamps.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from fulmar.service.clustered_service import (
    ClientSession,
    CloseReason,
    Cluster,
    ClusteredService,
    SnapshotImage,
    SnapshotPublication,
)
from fulmar.service.state_machine import StateMachine, command


class EchoService(ClusteredService):
    """Every message comes back to its sender; counts what it echoed."""

    def __init__(self) -> None:
        self.echoed = 0

    def on_start(self, cluster: Cluster, snapshot: SnapshotImage | None) -> None:
        self.cluster = cluster
        if snapshot is not None:
            for message in snapshot.messages():
                (self.echoed,) = struct.unpack("<q", message)

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        if session is not None:
            self.echoed += 1
            session.offer(buffer[offset : offset + length])

    def on_take_snapshot(self, publication: SnapshotPublication) -> None:
        publication.offer(struct.pack("<q", self.echoed))


class KeyValueService(ClusteredService):
    """Requests and replies are JSON objects:

    - ``{"op": "put", "key": k, "value": v, "id": n}`` -> ``{"id": n, "ok": true, "previous": old}``
    - ``{"op": "get", "key": k, "id": n}`` -> ``{"id": n, "ok": true, "value": v}`` (null if absent)
    - ``{"op": "cas", "key": k, "expected": e, "value": v, "id": n}`` -> ``{"id": n, "ok": <swapped>, "value": current}``

    A malformed request gets ``{"ok": false, "error": ...}``; the state is untouched.
    """

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    def on_start(self, cluster: Cluster, snapshot: SnapshotImage | None) -> None:
        self.cluster = cluster
        if snapshot is not None:
            for message in snapshot.messages():
                key, value = json.loads(message)
                self.data[key] = value

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        if session is None:
            return
        reply = self.apply(bytes(buffer[offset : offset + length]))
        session.offer(json.dumps(reply, separators=(",", ":")).encode())

    def apply(self, request_bytes: bytes) -> dict[str, Any]:
        try:
            request = json.loads(request_bytes)
            op, key = request["op"], request["key"]
            if not isinstance(key, str):
                raise ValueError("key must be a string")
        except (ValueError, KeyError, TypeError) as error:
            return {"ok": False, "error": f"malformed request: {error}"}
        reply: dict[str, Any] = {"id": request.get("id")}
        if op == "put":
            reply.update(ok=True, previous=self.data.get(key))
            self.data[key] = request.get("value")
        elif op == "get":
            reply.update(ok=True, value=self.data.get(key))
        elif op == "cas":
            current = self.data.get(key)
            swapped = current == request.get("expected")
            if swapped:
                self.data[key] = request.get("value")
            reply.update(ok=swapped, value=self.data.get(key))
        else:
            reply.update(ok=False, error=f"unknown op {op!r}")
        return reply

    def on_take_snapshot(self, publication: SnapshotPublication) -> None:
        for key in sorted(self.data):
            publication.offer(json.dumps([key, self.data[key]]).encode())


class CounterService(ClusteredService):
    """``b"+"`` adds one and replies with the value; ``b"!"`` adds one later,
    through a message the service offers into the cluster's log; a timer adds
    a tick every 1000 ms of cluster time while a session is open (``b"?"``
    reads both).  Replies are the value and the ticks, two int64s."""

    TIMER_ID = 1
    PERIOD_MS = 1000

    def __init__(self) -> None:
        self.value = 0
        self.ticks = 0
        self.timer_deadline = -1

    def on_start(self, cluster: Cluster, snapshot: SnapshotImage | None) -> None:
        self.cluster = cluster
        if snapshot is not None:
            for message in snapshot.messages():
                self.value, self.ticks, self.timer_deadline = struct.unpack("<qqq", message)

    def on_session_open(self, session: ClientSession, timestamp: int) -> None:
        if self.timer_deadline < 0:
            self.timer_deadline = timestamp + self.PERIOD_MS
            self.cluster.schedule_timer(self.TIMER_ID, self.timer_deadline)

    def on_session_close(self, session: ClientSession, timestamp: int, reason: CloseReason) -> None:
        if not self.cluster.client_sessions() and self.timer_deadline >= 0:
            self.cluster.cancel_timer(self.TIMER_ID)
            self.timer_deadline = -1

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        if correlation_id != self.TIMER_ID:
            return
        self.ticks += 1
        self.timer_deadline = timestamp + self.PERIOD_MS
        self.cluster.schedule_timer(self.TIMER_ID, self.timer_deadline)

    def on_session_message(
        self, session: ClientSession | None, timestamp: int, buffer: memoryview, offset: int, length: int
    ) -> None:
        request = bytes(buffer[offset : offset + length])
        if session is None:
            if request == b"+":  # the increment this service offered into the log for a b"!"
                self.value += 1
            return
        if request == b"+":
            self.value += 1
        elif request == b"!":
            # Increment later, through the log: the service offers a message
            # to the cluster, which sequences it like a client's.
            self.cluster.offer(b"+")
        session.offer(struct.pack("<qq", self.value, self.ticks))

    def on_take_snapshot(self, publication: SnapshotPublication) -> None:
        publication.offer(struct.pack("<qqq", self.value, self.ticks, self.timer_deadline))


# ----------------------------------------------------------------------------- offline replay
# CounterService as a pure function of the log, for fulmar.analytics.replay
# (``cluster-tool replay --apply fulmar.service.samples:counter_apply``).  A
# message is a row of the fulmar-log source.  The state adds the open client
# sessions to what the snapshot holds, as the service container keeps them.


def counter_initial() -> dict[str, Any]:
    return {"value": 0, "ticks": 0, "timer_deadline": -1, "sessions": frozenset()}


def counter_apply(state: dict[str, Any], message: Any) -> dict[str, Any]:
    kind = message.message_type
    if kind == "SessionOpenEvent":
        deadline = state["timer_deadline"]
        if deadline < 0:
            deadline = message.timestamp + CounterService.PERIOD_MS
        return {**state, "timer_deadline": deadline, "sessions": state["sessions"] | {message.cluster_session_id}}
    if kind == "SessionCloseEvent":
        # The container forgets the session before the service hears of the close.
        sessions = state["sessions"] - {message.cluster_session_id}
        deadline = -1 if not sessions else state["timer_deadline"]
        return {**state, "timer_deadline": deadline, "sessions": sessions}
    if kind == "TimerEvent" and message.correlation_id == CounterService.TIMER_ID:
        return {**state, "ticks": state["ticks"] + 1, "timer_deadline": message.timestamp + CounterService.PERIOD_MS}
    if kind == "SessionMessageHeader" and bytes(message.payload) == b"+":
        # A client's increment, or the one the service offered for a client's b"!".
        return {**state, "value": state["value"] + 1}
    return state


def counter_snapshot_state(records: list[bytes]) -> dict[str, Any]:
    """What a CounterService snapshot holds, in counter_view's shape."""
    value, ticks, deadline = struct.unpack("<qqq", records[-1]) if records else (0, 0, -1)
    return {"value": value, "ticks": ticks, "timer_deadline": deadline}


def counter_view(state: dict[str, Any]) -> dict[str, Any]:
    """The part of counter_apply's state that a snapshot holds."""
    return {key: state[key] for key in ("value", "ticks", "timer_deadline")}


def counter_resume(snapshot_state: dict[str, Any], sessions: frozenset[int]) -> dict[str, Any]:
    """counter_apply's state at a snapshot: what it holds and the sessions the container had open."""
    return {**snapshot_state, "sessions": frozenset(sessions)}


# KeyValueService the same way (``--apply fulmar.service.samples:key_value_apply``):
# the service's own apply() on a copy of the data, for the messages of open
# client sessions (the service ignores the rest).


def key_value_initial() -> dict[str, Any]:
    return {"data": {}, "sessions": frozenset()}


def key_value_apply(state: dict[str, Any], message: Any) -> dict[str, Any]:
    kind = message.message_type
    if kind == "SessionOpenEvent":
        return {**state, "sessions": state["sessions"] | {message.cluster_session_id}}
    if kind == "SessionCloseEvent":
        return {**state, "sessions": state["sessions"] - {message.cluster_session_id}}
    if kind != "SessionMessageHeader" or message.cluster_session_id not in state["sessions"]:
        return state
    service = KeyValueService()
    service.data = dict(state["data"])
    service.apply(bytes(message.payload))
    return {**state, "data": service.data}


def key_value_snapshot_state(records: list[bytes]) -> dict[str, Any]:
    """The data a KeyValueService snapshot holds (its ``[key, value]`` records)."""
    data: dict[str, Any] = {}
    for record in records:
        key, value = json.loads(record)
        data[key] = value
    return data


def key_value_view(state: dict[str, Any]) -> dict[str, Any]:
    return dict(state["data"])


def key_value_resume(snapshot_state: dict[str, Any], sessions: frozenset[int]) -> dict[str, Any]:
    return {"data": dict(snapshot_state), "sessions": frozenset(sessions)}


class KeyValueStore(StateMachine):
    """``client.call("put", key, value)`` -> the previous value (None if there
    was none); ``get(key)`` -> the value or None; ``delete(key)`` -> whether it
    was there.  Keys are strings, values anything msgpack carries."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}

    @command
    def put(self, key: str, value: Any) -> Any:
        if not isinstance(key, str):
            raise TypeError(f"a key is a string, not {type(key).__name__}")
        previous = self.data.get(key)
        self.data[key] = value
        return previous

    @command(read_only=True)
    def get(self, key: str) -> Any:
        return self.data.get(key)

    @command
    def delete(self, key: str) -> bool:
        found = key in self.data
        self.data.pop(key, None)
        return found
