"""Calling a ``StateMachine``'s commands: ``connect``, ``Client``, ``AsyncClient``.

::

    client = fulmar.connect("0=10.0.0.1:9010,1=10.0.0.2:9010,2=10.0.0.3:9010")
    client.call("deposit", "alice", 10)         # 10, or the command's exception as CommandError
    future = client.call_async("balance", "alice")
    client.close()

A ``Client`` starts a media driver of its own (``driver="embedded"``, a child
process stopped by ``close()``, at interpreter exit, and when this process
dies), opens a session with the cluster and registers with the service.
One background thread owns all of it (``ClusterClient`` is not thread safe):
it sends the calls of every thread, polls the replies and completes their
futures, keeps the session alive while the program does something else, and
follows the cluster through failovers.

Every call is applied once.  It carries the client's id (random, 128 bits)
and a sequence number; the service keeps the replies of the calls a client
may still wait for.  After a NewLeaderEvent, and on a new session when the
cluster closed the old one, the client sends every unanswered call again,
and a call the service applied before is answered from its record.

What a call raises:

- ``CommandError`` (and subclasses): the service answered with an error.  The
  command's own exception comes as a plain ``CommandError`` whose
  ``remote_type`` is the exception's type name (``"ValueError"``,
  ``"bank.Overdraft"``) and ``remote_message`` its message; built-in types
  are not mapped back to themselves, so one ``except CommandError`` catches
  every answer that is an error.
- ``CallTimeoutError``: no answer within the call's timeout.  It may or may
  not have been applied (at most once: a copy arriving later is not applied
  once the client waits for it no more).
- ``ClusterUnavailableError``: the session was lost and a new one could not
  be opened within the connect timeout; ``ClientExpiredError``: the cluster
  forgot this client after hearing nothing from it for its client expiry;
  ``ClientClosedError``: the client was closed (or its driver died) first.
"""

from __future__ import annotations

import asyncio
import atexit
import heapq
import itertools
import os
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulmar.aeron import Aeron
from fulmar.consensus.client import (
    CLOSED,
    MAX_POSITION_EXCEEDED,
    ClusterClient,
    ClusterClientError,
    ClusterConnectError,
    ClusterSessionClosedError,
    ClusterTimeoutError,
    MediaDriverLostError,
    parse_ingress_endpoints,
)
from fulmar.driver.embedded import EmbeddedDriver
from fulmar.errors import FulmarError, MessageTooLongError
from fulmar.service.call_protocol import (
    CLIENT_ID_LENGTH,
    PROTOCOL_VERSION,
    REPLY_HEADER,
    ReplyStatus,
    RequestKind,
    encode_request,
    pack,
    unpack,
)

if TYPE_CHECKING:
    from fulmar.codecs.generated import cluster as codecs

__all__ = [
    "AsyncClient",
    "CallError",
    "CallTimeoutError",
    "Client",
    "ClientClosedError",
    "ClientExpiredError",
    "ClusterUnavailableError",
    "CommandArgumentsError",
    "CommandError",
    "ResultEncodingError",
    "UnknownCommandError",
    "connect",
]

DEFAULT_CALL_TIMEOUT_S = 30.0  # a failover: a leader heartbeat timeout (10 s) and an election
DEFAULT_CONNECT_TIMEOUT_S = 20.0
DEFAULT_KEEPALIVE_INTERVAL_S = 2.5  # a quarter of the cluster's default session timeout
EMBEDDED = "embedded"
# Longest idle sleep of the client's thread: it also wakes for replies, new
# calls and the next call deadline; this bounds the wait for its keepalives.
_MAX_IDLE_NS = 100_000_000
# ... and while calls wait for the ingress (back pressure, or a new leader's
# publication not connected yet: neither rings the doorbell).
_BLOCKED_IDLE_NS = 1_000_000
_EGRESS_FRAGMENT_LIMIT = 256
_DEADLINES_SLACK = 256  # settled calls kept in the deadline heap before it is pruned


# ---------------------------------------------------------------------------- errors


class CommandError(FulmarError):
    """The service answered the call with an error: the command raised, or it
    could not run it.  ``remote_type`` and ``remote_message`` say what."""

    def __init__(self, remote_type: str, remote_message: str) -> None:
        super().__init__(f"{remote_type}: {remote_message}")
        self.remote_type = remote_type
        self.remote_message = remote_message


class UnknownCommandError(CommandError):
    """The state machine has no command of that name: nothing ran."""


class CommandArgumentsError(CommandError):
    """The arguments do not fit the command's parameters: nothing ran."""


class ResultEncodingError(CommandError):
    """The command ran (its changes stay made) but msgpack cannot encode its result."""


class BadRequestError(CommandError):
    """The service could not read the request (another protocol version?): nothing ran."""


class CallError(ClusterClientError):
    """The call got no answer from the service."""


class CallTimeoutError(CallError, ClusterTimeoutError):
    """No answer within the call's timeout: it may or may not have been applied."""


class ClusterUnavailableError(CallError):
    """The session with the cluster was lost and no new one could be opened."""


class ClientExpiredError(CallError):
    """The service forgot this client (nothing heard from it for its client
    expiry) before this call, sent more than once, was answered: the copies
    after that were not applied; an earlier one may have been.  The client
    registers again for its next calls."""


class ClientClosedError(CallError):
    """The client was closed, or stopped (its media driver died), before the answer."""


_ERRORS: dict[int, type[CommandError]] = {
    ReplyStatus.RAISED: CommandError,
    ReplyStatus.UNKNOWN_COMMAND: UnknownCommandError,
    ReplyStatus.BAD_ARGUMENTS: CommandArgumentsError,
    ReplyStatus.UNENCODABLE_RESULT: ResultEncodingError,
    ReplyStatus.BAD_REQUEST: BadRequestError,
}


# ---------------------------------------------------------------------------- endpoints


def _ingress(endpoints: str) -> tuple[str, str | None, str]:
    """(ingress channel, ingress endpoints, first member's host:port) of
    ``"0=host:port,1=host:port"``, or of one member's ``"host:port"``."""
    if "=" in endpoints:
        members = parse_ingress_endpoints(endpoints)
        if not members:
            raise ValueError(f"no ingress endpoint in {endpoints!r}")
        return "aeron:udp", endpoints, members[min(members)]
    endpoint = endpoints.strip()
    return f"aeron:udp?endpoint={endpoint}", None, endpoint


def _egress_toward(endpoint: str) -> str:
    """An egress channel on the local address the route to ``endpoint`` leaves
    from (connecting a UDP socket sends nothing), any free port."""
    host, _, port = endpoint.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, int(port)))
        local = probe.getsockname()[0]
    return f"aeron:udp?endpoint={local}:0"


def _clock_ns() -> int:
    # Counts a suspended machine's sleep (the cluster's clock went on meanwhile).
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic_ns()


# ---------------------------------------------------------------------------- the client


@dataclass(eq=False)
class _Call:
    name: str
    body: bytes  # msgpack [name, [args]]: encoded once, by the caller
    future: Future[Any]
    timeout_s: float
    deadline_ns: int
    sequence: int = 0  # given when first sent
    client_id: bytes = b""
    message: bytes = b""  # the whole request, built when first sent, resent as it is
    sends: int = 0


@dataclass
class _ThreadState:
    """The client thread's state of its identity and session: only that thread changes it."""

    client_id: bytes = field(default_factory=lambda: os.urandom(CLIENT_ID_LENGTH))
    registered: bool = False
    register_due: bool = True
    cluster: ClusterClient | None = None
    lost_reason: str = ""  # why the last session ended
    closed_detail: str = ""  # the cluster's word when it closed the session
    resend_due: bool = False
    touch_interval_ns: int = 0
    last_request_ns: int = 0


class Client:
    """A client of a cluster serving a ``StateMachine``; thread safe.

    ``endpoints``: every member's ingress, ``"0=host:port,1=host:port,..."``
    (the client finds the leader), or one member's ``"host:port"``.
    ``driver``: ``"embedded"`` (a media driver of the client's own) or the
    directory of a running one.  ``egress_channel``: where replies come (by
    default the local address toward the first member, any free port).
    ``timeout``: the default of each call's (s).  ``keepalive_interval``: at
    most a quarter of the cluster's session timeout.  Connecting (driver,
    session, registration) raises what keeps it from completing within
    ``connect_timeout``.
    """

    def __init__(
        self,
        endpoints: str,
        *,
        driver: str | Path = EMBEDDED,
        egress_channel: str | None = None,
        credentials: bytes = b"",
        timeout: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        keepalive_interval: float = DEFAULT_KEEPALIVE_INTERVAL_S,
    ) -> None:
        self.ingress_channel, self.ingress_endpoints, first_member = _ingress(endpoints)
        self.egress_channel = egress_channel or _egress_toward(first_member)
        self.credentials = credentials
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.keepalive_interval = keepalive_interval
        self._driver_option = driver
        self.driver: EmbeddedDriver | None = None
        self.aeron: Aeron | None = None
        self.sessions_opened = 0
        """How many sessions the client opened (one, unless the cluster closed one)."""
        self._incoming: deque[_Call] = deque()  # from any thread to the client's
        self._lock = threading.Lock()  # closing vs. a new call
        self._closing = False
        self._wake_doorbell: Any = None
        # The client's thread's alone:
        self._state = _ThreadState()
        self._unsent: deque[_Call] = deque()  # waiting for the registration
        self._pending: dict[int, _Call] = {}  # by sequence, in its order: unanswered
        self._outbox: deque[_Call] = deque()  # pending calls to (re)send, in order
        self._deadlines: list[tuple[int, int, _Call]] = []
        self._deadline_order = itertools.count()
        self._next_sequence = 1
        self._lowest_unanswered = 1
        self.calls_resent = 0
        """Calls sent again (after a NewLeaderEvent, or on a new session)."""
        self.unrecognized_replies = 0
        """Egress messages that were no StateMachine reply."""
        ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="fulmar-client", daemon=True)
        self._thread.start()
        ready.result()
        atexit.register(self.close)

    # ------------------------------------------------------------ calls (any thread)

    def call(self, name: str, *args: Any, timeout: float | None = None) -> Any:
        """Apply command ``name`` to ``args`` on the cluster; its result, or
        raise (see the module's documentation)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("call() in a future's callback would wait for itself: use call_async there")
        return self.call_async(name, *args, timeout=timeout).result()

    def call_async(self, name: str, *args: Any, timeout: float | None = None) -> Future[Any]:
        """``call`` without waiting: a future of its result.  It cannot be
        cancelled (the call may be on its way); it completes, in the client's
        thread, by the call's timeout at the latest."""
        body = pack([name, args])  # unencodable arguments raise here, in the caller's thread
        timeout_s = self.timeout if timeout is None else timeout
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        call = _Call(name, body, future, timeout_s, _clock_ns() + int(timeout_s * 1e9))
        with self._lock:
            if self._closing:
                raise ClientClosedError("the client is closed")
            self._incoming.append(call)
            # Under the lock: the doorbell is in the driver's memory, which
            # the client's thread unmaps only after it marked itself closing.
            self._wake_doorbell.ring()
        return future

    @property
    def client_id(self) -> bytes:
        return self._state.client_id

    @property
    def cluster_session_id(self) -> int | None:
        """The session's id (None between sessions)."""
        cluster = self._state.cluster
        return None if cluster is None else cluster.cluster_session_id

    @property
    def leader_member_id(self) -> int | None:
        """The member the session is with: the leader, as the client last heard (None between sessions)."""
        cluster = self._state.cluster
        return None if cluster is None else cluster.leader_member_id

    def close(self) -> None:
        """Fail the unanswered calls (ClientClosedError), close the session and
        stop the embedded driver, removing its directory."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._wake_doorbell.ring()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        atexit.unregister(self.close)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(id={self._state.client_id.hex()}, session={self.cluster_session_id})"

    # ------------------------------------------------------------ the client's thread

    def _run(self, ready: Future[None]) -> None:
        error: BaseException | None = None
        try:
            self._start()
        except BaseException as failure:  # noqa: BLE001 - handed to the constructor
            self._release()
            ready.set_exception(failure)
            return
        ready.set_result(None)
        try:
            while not self._closing:
                if not self._do_work(_clock_ns()):
                    self._idle()
        except BaseException as failure:  # noqa: BLE001 - every waiting call hears of it
            error = failure
        finally:
            self._finish(error)

    def _start(self) -> None:
        if self._driver_option == EMBEDDED:
            # Started from this thread: the driver stops when it ends (close, or the process's death).
            self.driver = EmbeddedDriver.start()
            directory: Path = self.driver.directory
        else:
            directory = Path(self._driver_option)
        self.aeron = Aeron.connect(directory)
        self._wake_doorbell = self.aeron.conductor.data_doorbell
        deadline_ns = _clock_ns() + int(self.connect_timeout * 1e9)
        self._open_session()
        while not self._state.registered:
            if self._state.cluster is None:
                raise ClusterConnectError(
                    f"the cluster closed the session while the client registered: {self._state.lost_reason}"
                )
            if not self._do_work(_clock_ns()):
                if _clock_ns() > deadline_ns:
                    raise ClusterConnectError(
                        f"the cluster did not answer the client's registration within {self.connect_timeout:g} s "
                        f"({self.unrecognized_replies} replies not understood: is its service a StateMachine?)"
                    )
                self._idle()

    def _open_session(self) -> None:
        assert self.aeron is not None
        self._state.cluster = ClusterClient.connect(
            self.aeron,
            self.ingress_channel,
            self.ingress_endpoints,
            self.egress_channel,
            credentials=self.credentials,
            on_message=self._on_reply,
            on_new_leader=self._on_new_leader,
            on_session_event=self._on_session_event,
            message_timeout_ns=int(self.connect_timeout * 1e9),
            keepalive_interval_ns=int(self.keepalive_interval * 1e9),
        )
        self.sessions_opened += 1
        self._state.closed_detail = ""
        self._resend_all()

    def _do_work(self, now_ns: int) -> int:
        """One pass: new calls, sending, replies, timeouts.  The work done."""
        work = 0
        while self._incoming:
            call = self._incoming.popleft()
            heapq.heappush(self._deadlines, (call.deadline_ns, next(self._deadline_order), call))
            self._unsent.append(call)
            work += 1
        if len(self._deadlines) > 2 * (len(self._pending) + len(self._unsent)) + _DEADLINES_SLACK:
            self._prune_deadlines()
        state = self._state
        if state.cluster is None and (self._unsent or self._pending):
            self._reconnect()
            work += 1
        cluster = state.cluster
        if cluster is not None:
            work += self._send(cluster, now_ns)
            if state.cluster is cluster:  # (sending may have found it closed)
                work += self._poll(cluster)
        return work + self._expire(now_ns)

    def _send(self, cluster: ClusterClient, now_ns: int) -> int:
        state = self._state
        if not state.registered:
            if state.register_due and self._offer(cluster, encode_request(RequestKind.REGISTER, state.client_id, 0, 0)):
                state.register_due = False
                return 1
            return 0
        while self._unsent:
            call = self._unsent.popleft()
            if call.future.done():
                continue  # timed out before it could go
            call.sequence = self._next_sequence
            self._next_sequence += 1
            call.client_id = state.client_id
            if not self._pending:
                self._lowest_unanswered = call.sequence
            call.message = encode_request(
                RequestKind.CALL, state.client_id, call.sequence, self._lowest_unanswered, call.body
            )
            self._pending[call.sequence] = call
            self._outbox.append(call)
        sent = 0
        while self._outbox:
            call = self._outbox[0]
            if self._pending.get(call.sequence) is not call:
                self._outbox.popleft()  # answered, or given up, meanwhile
                continue
            try:
                if not self._offer(cluster, call.message):
                    break  # back pressure, or between leaders: the rest waits too, in order
            except MessageTooLongError as error:
                self._outbox.popleft()
                self._settle(call)
                call.future.set_exception(error)
                continue
            self._outbox.popleft()
            if call.sends:
                self.calls_resent += 1
            call.sends += 1
            sent += 1
        if not sent and not self._outbox and now_ns - state.last_request_ns >= state.touch_interval_ns:
            lowest = self._lowest_unanswered if self._pending else self._next_sequence
            if self._offer(cluster, encode_request(RequestKind.TOUCH, state.client_id, 0, lowest)):
                sent += 1
        return sent

    def _offer(self, cluster: ClusterClient, message: bytes) -> bool:
        """Offer one request; False if it must wait (a lost session is noted)."""
        try:
            result = cluster.offer(message)
        except MediaDriverLostError:
            raise
        except ClusterSessionClosedError as error:
            self._lose_session(f"the session closed ({error})")
            return False
        if result > 0:
            self._state.last_request_ns = _clock_ns()
            return True
        if result in (CLOSED, MAX_POSITION_EXCEEDED):
            self._lose_session(f"the session's ingress publication is {'closed' if result == CLOSED else 'full'}")
        return False

    def _poll(self, cluster: ClusterClient) -> int:
        try:
            work = cluster.poll_egress(_EGRESS_FRAGMENT_LIMIT)
        except MediaDriverLostError:
            raise
        except ClusterSessionClosedError as error:
            self._lose_session(f"the session closed ({error})")
            return 1
        if cluster.is_closed:
            self._lose_session(f"the cluster closed session {cluster.cluster_session_id} ({self._state.closed_detail})")
            return 1
        if self._state.resend_due:
            self._resend_all()
            work += 1
        return work

    def _lose_session(self, reason: str) -> None:
        state = self._state
        if state.cluster is None:
            return
        cluster, state.cluster = state.cluster, None
        state.lost_reason = reason
        try:
            cluster.close()
        except FulmarError:
            pass  # its publication and subscription are released whatever the close request did

    def _reconnect(self) -> None:
        """A new session for the calls that wait; if none can be opened, they fail saying why."""
        try:
            self._open_session()
        except MediaDriverLostError:
            raise
        except ClusterClientError as error:
            failure = ClusterUnavailableError(
                f"{self._state.lost_reason}, and no new session could be opened within "
                f"{self.connect_timeout:g} s: {error}"
            )
            for call in [*self._pending.values(), *self._unsent]:
                if not call.future.done():
                    call.future.set_exception(failure)
            self._pending.clear()
            self._unsent.clear()
            self._outbox.clear()

    def _resend_all(self) -> None:
        """After a NewLeaderEvent, or on a new session: every unanswered call again, in order."""
        self._state.resend_due = False
        if self._state.registered:
            self._outbox = deque(self._pending.values())
        else:
            self._state.register_due = True

    def _prune_deadlines(self) -> None:
        """Drop the deadlines of calls already settled.  A call answered stays
        in the heap until its deadline (a heap has no cheap removal from its
        middle); a busy client would hold a call timeout's worth of answered
        calls, their messages and futures, so once they outnumber the live
        ones they go in one pass (amortized O(1) a call)."""
        self._deadlines = [entry for entry in self._deadlines if not entry[2].future.done()]
        heapq.heapify(self._deadlines)

    def _expire(self, now_ns: int) -> int:
        expired = 0
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now_ns:
            _, _, call = heapq.heappop(deadlines)
            if call.future.done():
                continue
            self._settle(call)
            where = f"call {call.sequence} ({call.name})" if call.sequence else f"{call.name} (not sent yet)"
            call.future.set_exception(
                CallTimeoutError(f"{where}: no answer within {call.timeout_s:g} s; it may or may not have been applied")
            )
            expired += 1
        return expired

    def _settle(self, call: _Call) -> None:
        """The client waits for ``call`` no more: its sequence leaves the unanswered."""
        if self._pending.pop(call.sequence, None) is None:
            return
        lowest = self._lowest_unanswered
        while lowest < self._next_sequence and lowest not in self._pending:
            lowest += 1
        self._lowest_unanswered = lowest

    def _idle(self) -> None:
        cluster = self._state.cluster
        blocked = cluster is not None and (self._outbox or self._state.register_due)
        wait_ns = _BLOCKED_IDLE_NS if blocked else _MAX_IDLE_NS
        if self._deadlines:
            wait_ns = max(0, min(wait_ns, self._deadlines[0][0] - _clock_ns()))
        doorbell = self._wake_doorbell
        token = doorbell.prepare()
        if self._incoming or self._closing or (cluster is not None and cluster.subscription.is_data_available()):
            doorbell.cancel()
        else:
            doorbell.wait(token, max(1, wait_ns))

    # ------------------------------------------------------------ egress (in poll_egress)

    def _on_reply(self, cluster_session_id: int, timestamp: int, payload: memoryview) -> None:
        if len(payload) < REPLY_HEADER.size:
            self.unrecognized_replies += 1
            return
        status, version, _, sequence = REPLY_HEADER.unpack_from(payload)
        if version != PROTOCOL_VERSION:
            self.unrecognized_replies += 1
            return
        body = payload[REPLY_HEADER.size :]
        if status == ReplyStatus.REGISTERED:
            self._on_registered(body)
            return
        call = self._pending.get(sequence)
        if call is None:
            return  # answered before (a resend's second answer), or given up
        self._settle(call)
        if status == ReplyStatus.EXPIRED:
            self._on_expired(call, body)
        elif status == ReplyStatus.OK:
            try:
                call.future.set_result(unpack(body))
            except Exception as error:  # noqa: BLE001 - a result this side cannot decode
                call.future.set_exception(
                    CallError(f"call {sequence} ({call.name}): its result did not decode: {error}")
                )
        else:
            call.future.set_exception(self._error(status, call, body))

    def _on_registered(self, body: memoryview) -> None:
        state = self._state
        try:
            client_id, expiry_ms = unpack(body)
        except Exception:  # noqa: BLE001 - not a StateMachine's answer
            self.unrecognized_replies += 1
            return
        if client_id != state.client_id or state.registered:
            return  # a registration resent: answered twice
        state.registered = True
        state.touch_interval_ns = expiry_ms * 1_000_000 // 4

    def _on_expired(self, call: _Call, body: memoryview) -> None:
        state = self._state
        if call.client_id == state.client_id:
            # The service forgot this identity: a new one, registered afresh
            # (the calls resent under the old one get EXPIRED too).
            state.client_id = os.urandom(CLIENT_ID_LENGTH)
            state.registered = False
            state.register_due = True
        if call.sends == 1:
            # Its only copy was not applied: it goes again, as a new call of the new identity.
            call.sequence, call.client_id, call.message, call.sends = 0, b"", b"", 0
            self._unsent.appendleft(call)
        else:
            _, message = self._error_fields(body)
            call.future.set_exception(ClientExpiredError(f"call {call.sequence} ({call.name}): {message}"))

    def _error(self, status: int, call: _Call, body: memoryview) -> Exception:
        remote_type, remote_message = self._error_fields(body)
        kind = _ERRORS.get(status)
        if kind is None:
            return CallError(f"call {call.sequence} ({call.name}): reply status {status}: {remote_message}")
        return kind(remote_type, remote_message)

    @staticmethod
    def _error_fields(body: memoryview) -> tuple[str, str]:
        try:
            remote_type, remote_message = unpack(body)
            return str(remote_type), str(remote_message)
        except Exception:  # noqa: BLE001 - an error reply that does not decode still fails the call
            return "UnknownError", f"an error reply of {len(body)} bytes that did not decode"

    def _on_new_leader(self, session_id: int, leadership_term_id: int, leader_member_id: int, endpoints: str) -> None:
        self._state.resend_due = True  # what the old leader had not answered may be lost with it

    def _on_session_event(
        self, correlation_id: int, session_id: int, term: int, leader: int, code: codecs.EventCode, detail: str
    ) -> None:
        self._state.closed_detail = f"{code.name}: {detail}" if detail else code.name

    # ------------------------------------------------------------ the end

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            self._closing = True
            leftover = list(self._incoming)
            self._incoming.clear()
        if error is None:
            failure: Exception = ClientClosedError("the client was closed before the answer")
        else:
            failure = ClientClosedError(f"the client stopped: {type(error).__name__}: {error}")
            failure.__cause__ = error
        for call in [*self._pending.values(), *self._unsent, *leftover]:
            if not call.future.done():
                call.future.set_exception(failure)
        self._pending.clear()
        self._unsent.clear()
        self._release()

    def _release(self) -> None:
        state = self._state
        try:
            if state.cluster is not None:
                cluster, state.cluster = state.cluster, None
                try:
                    cluster.close()
                except FulmarError:
                    pass
            if self.aeron is not None:
                self.aeron.close()
        finally:
            if self.driver is not None:
                self.driver.close()


def connect(endpoints: str, **options: Any) -> Client:
    """A ``Client`` of the cluster at ``endpoints`` (``Client``'s options)."""
    return Client(endpoints, **options)


class AsyncClient:
    """The asyncio form of ``Client``: ``client = await AsyncClient.connect(endpoints)``,
    ``await client.call(name, *args)``; any number of calls may be awaited at once."""

    def __init__(self, client: Client) -> None:
        self.client = client

    @classmethod
    async def connect(cls, endpoints: str, **options: Any) -> AsyncClient:
        """Takes ``Client``'s options; connects without blocking the event loop."""
        return cls(await asyncio.to_thread(Client, endpoints, **options))

    async def call(self, name: str, *args: Any, timeout: float | None = None) -> Any:
        return await asyncio.wrap_future(self.client.call_async(name, *args, timeout=timeout))

    async def close(self) -> None:
        await asyncio.to_thread(self.client.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
