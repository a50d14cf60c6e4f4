"""ClusterClient against a fake cluster on a real media driver.

The consensus module is not here yet, so each cluster member is played by a
``FakeMember``: a thread with its own Aeron client that reads the ingress,
answers connect requests (OK, REDIRECT, Challenge, ERROR, rejection), echoes
session messages on the egress and, on command, sends NewLeaderEvent,
SessionEvent CLOSED or raw bytes.  Everything runs on loopback with bounded
waits; threads are joined and the driver is reaped by the fixtures.
"""

from __future__ import annotations

import asyncio
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fulmar.aeron import Aeron, DriverTimeoutError
from fulmar.cnc import CncFile
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.consensus.client import (
    CONNECT_ATTEMPT_TIMEOUT_NS,
    SESSION_HEADER_LENGTH,
    AsyncClusterClient,
    AuthenticationRejectedError,
    ClusterClient,
    ClusterConnectError,
    ClusterSessionClosedError,
    ClusterTimeoutError,
    MediaDriverLostError,
    parse_ingress_endpoints,
)
from fulmar.errors import CodecError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header
from fulmar.publication import Publication
from fulmar.ring_buffer import ManyToOneRingBuffer
from support.driver import free_udp_port, new_driver_dir, remove_driver_dir, wait_for

# Every test here starts processes (a media driver, a cluster, a subprocess).
pytestmark = pytest.mark.system

IPC = "aeron:ipc?term-length=64k"
INGRESS_STREAM = protocol.INGRESS_STREAM_ID
EGRESS_STREAM = protocol.EGRESS_STREAM_ID
EXPECTED_CREDENTIALS = b"open sesame"
CHALLENGE = b"prove it"


def encode(encoder: Any, **fields: Any) -> bytes:
    buffer = bytearray(4096)
    length = encoder.encode(buffer, 0, **fields)
    return bytes(buffer[:length])


class FakeCluster:
    """What the fake members share: the term, the sessions, the endpoints."""

    def __init__(self, driver_dir: Path) -> None:
        self.driver_dir = driver_dir
        self.leadership_term_id = 7
        self.endpoints = ""
        self.sessions: dict[int, tuple[str, int]] = {}  # id -> (response channel, stream)
        self._next_session_id = 100
        self.lock = threading.Lock()
        self.members: list[FakeMember] = []

    def open_session(self, channel: str, stream_id: int) -> int:
        with self.lock:
            session_id = self._next_session_id
            self._next_session_id += 1
            self.sessions[session_id] = (channel, stream_id)
            return session_id

    def member(self, member_id: int, ingress_channel: str, mode: str = "leader", **options: Any) -> FakeMember:
        member = FakeMember(self, member_id, ingress_channel, mode, **options)
        self.members.append(member)
        member.start()
        return member

    def stop(self) -> None:
        for member in self.members:
            member.stop()


class FakeMember:
    """One member of the fake cluster, on its own thread.

    Modes: ``leader`` (opens sessions and echoes), ``redirect`` (answers REDIRECT
    naming ``redirect_to``), ``challenge`` (challenges, then OK if the answer is
    EXPECTED_CREDENTIALS), ``reject`` (AUTHENTICATION_REJECTED), ``error``
    (SessionEvent ERROR), ``silent`` (reads, never answers: a leader whose
    process stopped while its driver holds its ingress), ``late`` (answers
    nothing until the client asks a second time, then opens a session for each
    request in order: a cluster slower than the client's attempt timeout).
    Any other mode set once a session is open (``quiet``) reads its messages
    and answers none.
    """

    def __init__(
        self,
        cluster: FakeCluster,
        member_id: int,
        ingress_channel: str,
        mode: str,
        redirect_to: int = 0,
        listen_after: threading.Event | None = None,
    ) -> None:
        self.cluster = cluster
        self.member_id = member_id
        self.ingress_channel = ingress_channel
        self.mode = mode
        self.redirect_to = redirect_to
        self.listen_after = listen_after
        self.redirected = threading.Event()
        self.listening = threading.Event()
        self.connect_requests: list[Any] = []
        self.challenge_responses: list[bytes] = []
        self.messages: list[tuple[int, int, bytes]] = []  # (term, session id, payload)
        self.keepalives: list[tuple[int, int]] = []
        self.close_requests: list[int] = []
        self.admin_requests: list[Any] = []
        self.egress: dict[int, Publication] = {}
        self.errors: list[BaseException] = []
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._stop = threading.Event()
        self._timestamp = 0
        self._thread = threading.Thread(target=self._run, name=f"fake-member-{member_id}", daemon=True)
        self.aeron: Aeron | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        aeron = self.aeron
        if aeron is not None:
            aeron.conductor.data_doorbell.ring()
        self._thread.join(10)
        assert not self._thread.is_alive(), f"fake member {self.member_id} did not stop"

    def call(self, command: Callable[[], None]) -> None:
        """Run ``command`` on the member's thread."""
        self._commands.put(command)
        if self.aeron is not None:
            self.aeron.conductor.data_doorbell.ring()

    # ------------------------------------------------------------ thread

    def _run(self) -> None:
        try:
            self.aeron = aeron = Aeron.connect(self.cluster.driver_dir)
        except BaseException as error:  # pragma: no cover - reported through errors
            self.errors.append(error)
            return
        try:
            if self.listen_after is not None:
                while not self.listen_after.wait(0.01):
                    if self._stop.is_set():
                        return
            subscription = aeron.add_subscription(self.ingress_channel, INGRESS_STREAM)
            self.listening.set()
            assembler = FragmentAssembler(self._on_ingress)
            doorbell = aeron.conductor.data_doorbell
            while not self._stop.is_set():
                work = subscription.poll(assembler.on_fragment, 50)
                while not self._commands.empty():
                    self._commands.get_nowait()()
                    work += 1
                if not work:
                    token = doorbell.prepare()
                    if self._stop.is_set() or not self._commands.empty() or subscription.is_data_available():
                        doorbell.cancel()
                    else:
                        doorbell.wait(token, 5_000_000)
        except BaseException as error:
            self.errors.append(error)
        finally:
            aeron.close()

    def _publication_to(self, channel: str, stream_id: int) -> Publication:
        publication = self.aeron.add_publication(channel, stream_id)  # type: ignore[union-attr]
        deadline = time.monotonic() + 5
        while not publication.is_connected:
            assert time.monotonic() < deadline, f"egress {channel} did not connect"
            time.sleep(0.001)
        return publication

    def _send(self, publication: Publication, message: bytes) -> None:
        deadline = time.monotonic() + 5
        while publication.offer(message) <= 0:
            assert time.monotonic() < deadline, "the fake member could not send"
            time.sleep(0.0002)

    def _event(
        self,
        publication: Publication,
        session_id: int,
        correlation_id: int,
        code: int,
        detail: str = "",
        leader: int | None = None,
    ) -> None:
        self._send(
            publication,
            encode(
                codecs.SessionEventEncoder,
                cluster_session_id=session_id,
                correlation_id=correlation_id,
                leadership_term_id=self.cluster.leadership_term_id,
                leader_member_id=self.member_id if leader is None else leader,
                code=code,
                version=protocol.PROTOCOL_SEMANTIC_VERSION,
                detail=detail,
            ),
        )

    def _on_ingress(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        message = codecs.decode(buffer, offset, length)
        if isinstance(message, codecs.SessionConnectRequestDecoder):
            self._on_connect(message)
        elif isinstance(message, codecs.ChallengeResponseDecoder):
            self._on_challenge_response(message)
        elif isinstance(message, codecs.SessionMessageHeaderDecoder):
            payload = bytes(buffer[offset + SESSION_HEADER_LENGTH : offset + length])
            self.messages.append((message.leadership_term_id, message.cluster_session_id, payload))
            publication = self.egress.get(message.cluster_session_id)
            if publication is not None and self.mode == "leader":
                self._timestamp += 1
                reply = encode(
                    codecs.SessionMessageHeaderEncoder,
                    leadership_term_id=self.cluster.leadership_term_id,
                    cluster_session_id=message.cluster_session_id,
                    timestamp=self._timestamp,
                )
                self._send(publication, reply + payload)
        elif isinstance(message, codecs.SessionKeepAliveDecoder):
            self.keepalives.append((message.leadership_term_id, message.cluster_session_id))
        elif isinstance(message, codecs.SessionCloseRequestDecoder):
            self.close_requests.append(message.cluster_session_id)
        elif isinstance(message, codecs.AdminRequestDecoder):
            self.admin_requests.append(message)
            publication = self.egress.get(message.cluster_session_id)
            if publication is not None:
                self._send(
                    publication,
                    encode(
                        codecs.AdminResponseEncoder,
                        cluster_session_id=message.cluster_session_id,
                        correlation_id=message.correlation_id,
                        request_type=message.request_type_raw,
                        response_code=codecs.AdminResponseCode.OK,
                        message="snapshot taken",
                        payload=b"",
                    ),
                )

    def _on_connect(self, request: Any) -> None:
        self.connect_requests.append(request)
        channel, stream_id = request.response_channel, request.response_stream_id
        if self.mode == "silent":
            return
        if self.mode == "late":
            if len(self.connect_requests) < 2:
                return
            for held in self.connect_requests:
                publication = self._publication_to(held.response_channel, held.response_stream_id)
                session_id = self.cluster.open_session(held.response_channel, held.response_stream_id)
                self.egress[session_id] = publication
                self._event(publication, session_id, held.correlation_id, codecs.EventCode.OK)
            self.mode = "leader"
            return
        publication = self._publication_to(channel, stream_id)
        correlation_id = request.correlation_id
        if self.mode == "leader":
            session_id = self.cluster.open_session(channel, stream_id)
            self.egress[session_id] = publication
            self._event(publication, session_id, correlation_id, codecs.EventCode.OK)
        elif self.mode == "challenge":
            session_id = self.cluster.open_session(channel, stream_id)
            self.egress[session_id] = publication
            self._send(
                publication,
                encode(
                    codecs.ChallengeEncoder,
                    correlation_id=correlation_id,
                    cluster_session_id=session_id,
                    encoded_challenge=CHALLENGE,
                ),
            )
        elif self.mode == "redirect":
            self._event(
                publication,
                protocol.NULL_SESSION_ID,
                correlation_id,
                codecs.EventCode.REDIRECT,
                detail=self.cluster.endpoints,
                leader=self.redirect_to,
            )
            self.redirected.set()
            publication.close()
        elif self.mode == "reject":
            self._event(
                publication,
                protocol.NULL_SESSION_ID,
                correlation_id,
                codecs.EventCode.AUTHENTICATION_REJECTED,
                detail="credentials not accepted",
            )
            publication.close()
        elif self.mode == "error":
            self._event(
                publication,
                protocol.NULL_SESSION_ID,
                correlation_id,
                codecs.EventCode.ERROR,
                detail="too many sessions",
            )
            publication.close()

    def _on_challenge_response(self, response: Any) -> None:
        credentials = bytes(response.encoded_credentials)
        self.challenge_responses.append(credentials)
        publication = self.egress[response.cluster_session_id]
        if credentials == EXPECTED_CREDENTIALS:
            self.mode = "leader"
            self._event(publication, response.cluster_session_id, response.correlation_id, codecs.EventCode.OK)
        else:
            self._event(
                publication,
                response.cluster_session_id,
                response.correlation_id,
                codecs.EventCode.AUTHENTICATION_REJECTED,
                detail="wrong answer to the challenge",
            )
            del self.egress[response.cluster_session_id]

    # ------------------------------------------------------------ commands (run on the thread)

    def become_leader(self, session_id: int) -> None:
        """Take over a session after an 'election': connect its egress, send NewLeaderEvent."""

        def command() -> None:
            self.cluster.leadership_term_id += 1
            channel, stream_id = self.cluster.sessions[session_id]
            publication = self.egress.get(session_id) or self._publication_to(channel, stream_id)
            self.egress[session_id] = publication
            self.mode = "leader"
            self._send(
                publication,
                encode(
                    codecs.NewLeaderEventEncoder,
                    leadership_term_id=self.cluster.leadership_term_id,
                    cluster_session_id=session_id,
                    leader_member_id=self.member_id,
                    ingress_endpoints=self.cluster.endpoints,
                ),
            )

        self.call(command)

    def send_closed(self, session_id: int) -> None:
        self.call(
            lambda: self._event(
                self.egress[session_id], session_id, 0, codecs.EventCode.CLOSED, detail="session timed out"
            )
        )

    def send_raw(self, session_id: int, *messages: bytes) -> None:
        def command() -> None:
            for message in messages:
                self._send(self.egress[session_id], message)

        self.call(command)


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture
def driver(start_driver: Any) -> Any:
    return start_driver()


@pytest.fixture
def aeron(driver: Any) -> Iterator[Aeron]:
    client = driver.connect()
    yield client
    client.close()


@pytest.fixture
def cluster(driver: Any) -> Iterator[FakeCluster]:
    fake = FakeCluster(driver.directory)
    yield fake
    fake.stop()
    for member in fake.members:
        assert not member.errors, f"fake member {member.member_id} failed: {member.errors!r}"


def udp(port: int) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}"


EGRESS_UDP = "aeron:udp?endpoint=127.0.0.1:0"


def ipc_connect(aeron: Aeron, **options: Any) -> ClusterClient:
    options.setdefault("message_timeout_ns", 10_000_000_000)
    return ClusterClient.connect(aeron, ingress_channel=IPC, egress_channel=IPC, **options)


# ---------------------------------------------------------------------------- tests


def test_protocol_version_is_aerons() -> None:
    # AeronCluster.Configuration: PROTOCOL_MAJOR/MINOR/PATCH_VERSION = 0, 3, 0.
    assert protocol.PROTOCOL_SEMANTIC_VERSION == (0 << 16) | (3 << 8) | 0
    assert SESSION_HEADER_LENGTH == 32


def test_parse_ingress_endpoints() -> None:
    assert parse_ingress_endpoints("0=a:1,1=b:2, 2=c:3") == {0: "a:1", 1: "b:2", 2: "c:3"}
    with pytest.raises(ValueError, match="lacks the 'member_id=' prefix"):
        parse_ingress_endpoints("a:1")
    with pytest.raises(ValueError, match="not an integer"):
        parse_ingress_endpoints("x=a:1")


def test_connect_and_1000_echoed_requests_in_order(aeron: Aeron, cluster: FakeCluster) -> None:
    port = free_udp_port()
    leader = cluster.member(0, udp(port))
    leader.listening.wait(10)
    client = ClusterClient.connect(
        aeron, ingress_channel=udp(port), egress_channel=EGRESS_UDP, message_timeout_ns=10_000_000_000
    )
    try:
        assert client.cluster_session_id == 100
        assert client.leadership_term_id == cluster.leadership_term_id
        assert client.leader_member_id == 0
        assert client.cluster_version == protocol.PROTOCOL_SEMANTIC_VERSION
        request = leader.connect_requests[0]
        assert request.version == protocol.PROTOCOL_SEMANTIC_VERSION
        assert request.response_stream_id == EGRESS_STREAM
        # Port 0 was replaced by the port the driver bound.
        assert request.response_channel.startswith("aeron:udp?endpoint=127.0.0.1:")
        assert not request.response_channel.endswith(":0")
        for i in range(1000):
            payload = f"request {i}".encode() * (1 + i % 3)
            assert client.request(payload, timeout_s=10) == payload
        assert len(leader.messages) == 1000
        assert {(term, session) for term, session, _ in leader.messages} == {(7, 100)}
        assert [p for _, _, p in leader.messages[:3]] == [b"request 0", b"request 1request 1", b"request 2" * 3]
    finally:
        client.close()
    wait_for(lambda: leader.close_requests == [100], 5, "the SessionCloseRequest")
    assert client.is_closed
    with pytest.raises(ClusterSessionClosedError):
        client.offer(b"after close")


def test_offer_variants_callbacks_keepalive_and_admin(aeron: Aeron, cluster: FakeCluster) -> None:
    leader = cluster.member(0, IPC)
    leader.listening.wait(10)
    received: list[tuple[int, int, bytes]] = []
    admin: list[tuple[Any, ...]] = []
    client = ipc_connect(
        aeron,
        on_message=lambda session, timestamp, payload: received.append((session, timestamp, bytes(payload))),
        on_admin_response=lambda *args: admin.append(args),
    )
    try:

        def send(action: Callable[[], int]) -> None:
            wait_for(lambda: action() > 0, 5, "the ingress to take the message")

        send(lambda: client.offer(b"plain"))
        send(lambda: client.offer(bytearray(b"bytearray")))
        send(lambda: client.offer_parts([b"two ", memoryview(b"parts")]))
        big = bytes(range(256)) * 20  # longer than one MTU: fragmented and reassembled both ways
        send(lambda: client.offer(big))

        def claim() -> int:
            position, buffer_claim = client.try_claim(7)
            if buffer_claim is not None:
                buffer_claim.buffer[SESSION_HEADER_LENGTH:] = b"claimed"
                buffer_claim.commit()
            return position

        send(claim)
        wait_for(lambda: client.poll_egress() >= 0 and len(received) == 5, 10, "five echoes")
        assert [p for _, _, p in received] == [b"plain", b"bytearray", b"two parts", big, b"claimed"]
        assert {s for s, _, _ in received} == {client.cluster_session_id}
        assert [t for _, t, _ in received] == [1, 2, 3, 4, 5]  # the cluster's timestamps

        assert client.send_keepalive()
        wait_for(lambda: leader.keepalives, 5, "the keepalive")
        assert leader.keepalives == [(client.leadership_term_id, client.cluster_session_id)]

        correlation_id = client.send_admin_request_to_take_snapshot()
        assert correlation_id is not None
        wait_for(lambda: client.poll_egress() >= 0 and admin, 5, "the admin response")
        assert admin[0][0] == correlation_id
        assert admin[0][2] == codecs.AdminRequestType.SNAPSHOT
        assert admin[0][3] == codecs.AdminResponseCode.OK
        assert leader.admin_requests[0].request_type == codecs.AdminRequestType.SNAPSHOT
    finally:
        client.close()


def test_idle_session_sends_keepalives_from_poll(aeron: Aeron, cluster: FakeCluster) -> None:
    leader = cluster.member(0, IPC)
    leader.listening.wait(10)
    client = ipc_connect(aeron, keepalive_interval_ns=20_000_000)
    try:
        wait_for(lambda: client.poll_egress() >= 0 and len(leader.keepalives) >= 2, 5, "periodic keepalives")
    finally:
        client.close()


def test_redirect_from_a_follower_to_the_leader(aeron: Aeron, cluster: FakeCluster) -> None:
    ports = free_udp_port(), free_udp_port()
    cluster.endpoints = f"0=127.0.0.1:{ports[0]},1=127.0.0.1:{ports[1]}"
    follower = cluster.member(0, udp(ports[0]), "redirect", redirect_to=1)
    # The leader only listens once the follower has redirected: the client must follow it.
    leader = cluster.member(1, udp(ports[1]), listen_after=follower.redirected)
    client = ClusterClient.connect(
        aeron,
        ingress_channel="aeron:udp",
        ingress_endpoints=cluster.endpoints,
        egress_channel=EGRESS_UDP,
        message_timeout_ns=10_000_000_000,
    )
    try:
        assert len(follower.connect_requests) == 1
        assert len(leader.connect_requests) == 1
        assert client.leader_member_id == 1
        assert client.publication.channel == udp(ports[1])
        assert client.request(b"to the leader", timeout_s=10) == b"to the leader"
        assert [p for _, _, p in leader.messages] == [b"to the leader"]
        assert follower.messages == []
    finally:
        client.close()


def test_challenge_answered_with_the_credentials_supplier(aeron: Aeron, cluster: FakeCluster) -> None:
    member = cluster.member(0, IPC, "challenge")
    member.listening.wait(10)
    challenges: list[bytes] = []

    def on_challenge(challenge: bytes) -> bytes:
        challenges.append(challenge)
        return EXPECTED_CREDENTIALS

    client = ipc_connect(aeron, credentials=b"initial", on_challenge=on_challenge)
    try:
        assert challenges == [CHALLENGE]
        assert member.challenge_responses == [EXPECTED_CREDENTIALS]
        assert bytes(member.connect_requests[0].encoded_credentials) == b"initial"
        assert client.request(b"authenticated", timeout_s=10) == b"authenticated"
    finally:
        client.close()


def test_wrong_challenge_answer_is_rejected(aeron: Aeron, cluster: FakeCluster) -> None:
    member = cluster.member(0, IPC, "challenge")
    member.listening.wait(10)
    with pytest.raises(AuthenticationRejectedError, match="wrong answer to the challenge"):
        ipc_connect(aeron, on_challenge=lambda challenge: b"guess")


def test_rejected_credentials_raise(aeron: Aeron, cluster: FakeCluster) -> None:
    member = cluster.member(0, IPC, "reject")
    member.listening.wait(10)
    with pytest.raises(AuthenticationRejectedError, match="credentials not accepted"):
        ipc_connect(aeron, credentials=b"bad")


def test_cluster_error_raises_connect_error(aeron: Aeron, cluster: FakeCluster) -> None:
    member = cluster.member(0, IPC, "error")
    member.listening.wait(10)
    with pytest.raises(ClusterConnectError, match="too many sessions") as raised:
        ipc_connect(aeron)
    assert not isinstance(raised.value, AuthenticationRejectedError)


def test_new_leader_event_switches_ingress(aeron: Aeron, cluster: FakeCluster) -> None:
    ports = free_udp_port(), free_udp_port()
    cluster.endpoints = f"0=127.0.0.1:{ports[0]},1=127.0.0.1:{ports[1]}"
    old_leader = cluster.member(0, udp(ports[0]))
    new_leader = cluster.member(1, udp(ports[1]), "redirect", redirect_to=0)
    old_leader.listening.wait(10)
    new_leader.listening.wait(10)
    events: list[tuple[int, int, int, str]] = []
    client = ClusterClient.connect(
        aeron,
        ingress_channel="aeron:udp",
        ingress_endpoints=cluster.endpoints,
        egress_channel=EGRESS_UDP,
        message_timeout_ns=10_000_000_000,
        on_new_leader=lambda *args: events.append(args),
    )
    try:
        assert client.leader_member_id == 0
        first_term = client.leadership_term_id
        assert client.request(b"before", timeout_s=10) == b"before"

        old_leader.mode = "silent"  # the old leader is gone
        new_leader.become_leader(client.cluster_session_id)
        wait_for(lambda: client.poll_egress() >= 0 and client.leader_member_id == 1, 10, "the NewLeaderEvent")
        assert client.leadership_term_id == first_term + 1
        assert events == [(client.cluster_session_id, first_term + 1, 1, cluster.endpoints)]
        assert client.publication.channel == udp(ports[1])

        assert client.request(b"after", timeout_s=10) == b"after"
        assert new_leader.messages == [(first_term + 1, client.cluster_session_id, b"after")]
        assert [p for _, _, p in old_leader.messages] == [b"before"]
    finally:
        client.close()


def test_new_leader_event_without_endpoints_readds_the_ingress(aeron: Aeron, cluster: FakeCluster) -> None:
    leader = cluster.member(0, IPC)
    leader.listening.wait(10)
    client = ipc_connect(aeron)
    try:
        old_publication = client.publication
        leader.become_leader(client.cluster_session_id)
        wait_for(
            lambda: client.poll_egress() >= 0 and client.publication is not old_publication, 10, "the NewLeaderEvent"
        )
        assert old_publication.is_closed
        assert client.request(b"same channel, new term", timeout_s=10) == b"same channel, new term"
        assert leader.messages[-1][0] == client.leadership_term_id == 8
    finally:
        client.close()


def test_session_closed_by_the_cluster(aeron: Aeron, cluster: FakeCluster) -> None:
    leader = cluster.member(0, IPC)
    leader.listening.wait(10)
    session_events: list[tuple[Any, ...]] = []
    client = ipc_connect(aeron, on_session_event=lambda *args: session_events.append(args))
    assert client.request(b"hello", timeout_s=10) == b"hello"
    leader.send_closed(client.cluster_session_id)
    wait_for(lambda: client.poll_egress() >= 0 and client.is_closed, 10, "the CLOSED event")
    assert session_events[0][4] == codecs.EventCode.CLOSED
    assert session_events[0][5] == "session timed out"
    assert client.subscription.is_closed and client.publication.is_closed
    with pytest.raises(ClusterSessionClosedError, match="is closed"):
        client.offer(b"too late")
    with pytest.raises(ClusterSessionClosedError):
        client.request(b"too late")
    client.close()  # harmless
    assert leader.close_requests == []  # the cluster closed it: no close request goes back


def test_connect_times_out_when_nobody_listens(aeron: Aeron) -> None:
    port = free_udp_port()
    started = time.monotonic()
    with pytest.raises(ClusterTimeoutError) as raised:
        ClusterClient.connect(
            aeron, ingress_channel=udp(port), egress_channel=EGRESS_UDP, message_timeout_ns=500_000_000
        )
    elapsed = time.monotonic() - started
    assert 0.45 < elapsed < 3, elapsed
    text = str(raised.value)
    assert "timed out after 0.5 s" in text
    assert "ingress publication to connect" in text
    assert f"127.0.0.1:{port}" in text


def test_connect_times_out_when_the_cluster_never_answers(aeron: Aeron, cluster: FakeCluster) -> None:
    member = cluster.member(0, IPC, "silent")
    member.listening.wait(10)
    with pytest.raises(ClusterTimeoutError, match="the cluster's answer on the egress"):
        ipc_connect(aeron, message_timeout_ns=300_000_000)
    assert len(member.connect_requests) == 1


def test_malformed_and_foreign_egress_messages_are_ignored(aeron: Aeron, cluster: FakeCluster) -> None:
    leader = cluster.member(0, IPC)
    leader.listening.wait(10)
    client = ipc_connect(aeron)
    try:
        session_id = client.cluster_session_id
        good_event = encode(
            codecs.SessionEventEncoder,
            cluster_session_id=session_id,
            correlation_id=1,
            leadership_term_id=7,
            leader_member_id=0,
            code=codecs.EventCode.OK,
            detail="x" * 20,
        )
        wrong_schema = bytearray(good_event)
        wrong_schema[4:6] = (999).to_bytes(2, "little")
        unknown_template = bytearray(good_event)
        unknown_template[2:4] = (250).to_bytes(2, "little")
        foreign = (
            encode(
                codecs.SessionMessageHeaderEncoder,
                leadership_term_id=7,
                cluster_session_id=session_id + 1000,
                timestamp=0,
            )
            + b"not yours"
        )
        for garbage in (b"\x01\x02\x03", bytes(wrong_schema), bytes(unknown_template), good_event[:20]):
            with pytest.raises(CodecError):
                codecs.decode(garbage, 0, len(garbage))
        leader.send_raw(
            session_id, b"\x01\x02\x03", bytes(wrong_schema), bytes(unknown_template), good_event[:20], foreign
        )
        wait_for(
            lambda: client.poll_egress() >= 0 and client.malformed_count == 4 and client.foreign_count == 1,
            10,
            "the bad messages to be counted",
        )
        assert not client.is_closed
        assert client.request(b"still fine", timeout_s=10) == b"still fine"
    finally:
        client.close()


def test_async_client(aeron: Aeron, cluster: FakeCluster) -> None:
    leader = cluster.member(0, IPC)
    leader.listening.wait(10)

    async def main() -> None:
        client = await AsyncClusterClient.connect(
            aeron, ingress_channel=IPC, egress_channel=IPC, message_timeout_ns=10_000_000_000
        )
        try:
            assert client.cluster_session_id >= 100
            for i in range(50):
                assert await client.request(f"async {i}".encode(), timeout_s=10) == f"async {i}".encode()
            replies = await asyncio.gather(*(client.request(f"c{i}".encode(), timeout_s=10) for i in range(5)))
            assert replies == [f"c{i}".encode() for i in range(5)]
            await client.send(b"unsolicited")
            messages = client.messages()
            message = await asyncio.wait_for(messages.__anext__(), 10)
            assert message.payload == b"unsolicited"
            assert message.cluster_session_id == client.cluster_session_id
            assert await client.send_keepalive()
        finally:
            await client.close()
        assert client.is_closed
        with pytest.raises(ClusterSessionClosedError):
            await client.request(b"closed")

    asyncio.run(asyncio.wait_for(main(), 60))
    wait_for(lambda: leader.close_requests, 5, "the SessionCloseRequest")


def test_async_client_sees_cluster_close(aeron: Aeron, cluster: FakeCluster) -> None:
    leader = cluster.member(0, IPC)
    leader.listening.wait(10)

    async def main() -> None:
        client = await AsyncClusterClient.connect(
            aeron, ingress_channel=IPC, egress_channel=IPC, message_timeout_ns=10_000_000_000
        )
        try:
            leader.send_closed(client.cluster_session_id)
            got = [message async for message in client.messages()]  # ends when the session closes
            assert got == []
            assert client.is_closed
        finally:
            await client.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_async_connect_failure_is_raised(aeron: Aeron, cluster: FakeCluster) -> None:
    member = cluster.member(0, IPC, "reject")
    member.listening.wait(10)

    async def main() -> None:
        with pytest.raises(AuthenticationRejectedError):
            await AsyncClusterClient.connect(
                aeron, ingress_channel=IPC, egress_channel=IPC, message_timeout_ns=10_000_000_000
            )

    asyncio.run(asyncio.wait_for(main(), 60))


def test_connect_with_endpoints_times_out_naming_every_member(aeron: Aeron) -> None:
    ports = free_udp_port(), free_udp_port()
    endpoints = f"0=127.0.0.1:{ports[0]},1=127.0.0.1:{ports[1]}"
    with pytest.raises(ClusterTimeoutError) as raised:
        ClusterClient.connect(
            aeron,
            ingress_channel="aeron:udp",
            ingress_endpoints=endpoints,
            egress_channel=EGRESS_UDP,
            message_timeout_ns=300_000_000,
        )
    text = str(raised.value)
    for member, port in enumerate(ports):
        assert f"{member}=127.0.0.1:{port} connected=False" in text


# ---------------------------------------------------------------------------- silence (seed 001: elections)


def test_a_connect_nobody_answers_is_asked_again_of_the_next_member(aeron: Aeron, cluster: FakeCluster) -> None:
    """Member 0 takes the request and never answers (a leader whose process is
    stopped while its driver holds its ingress, or a member whose election
    closed its ingress): after the attempt timeout the client asks member 1."""
    ports = free_udp_port(), free_udp_port()
    cluster.endpoints = f"0=127.0.0.1:{ports[0]},1=127.0.0.1:{ports[1]}"
    stopped = cluster.member(0, udp(ports[0]), "silent")
    asked = threading.Event()
    # Member 1 listens only once member 0 has the request, so the client asks member 0 first.
    leader = cluster.member(1, udp(ports[1]), listen_after=asked)
    stopped.listening.wait(10)

    def ask_member_1_once_member_0_has_the_request() -> None:
        wait_for(lambda: stopped.connect_requests, 10, "the request to member 0")
        asked.set()

    watcher = threading.Thread(target=ask_member_1_once_member_0_has_the_request, daemon=True)
    watcher.start()
    started = time.monotonic()
    client = ClusterClient.connect(
        aeron,
        ingress_channel="aeron:udp",
        ingress_endpoints=cluster.endpoints,
        egress_channel=EGRESS_UDP,
        message_timeout_ns=10_000_000_000,
    )
    try:
        elapsed = time.monotonic() - started
        assert CONNECT_ATTEMPT_TIMEOUT_NS / 1e9 <= elapsed < 5, elapsed
        assert len(stopped.connect_requests) == 1
        assert len(leader.connect_requests) == 1
        assert client.leader_member_id == 1
        assert client.publication.channel == udp(ports[1])
        assert client.request(b"to the leader", timeout_s=10) == b"to the leader"
    finally:
        client.close()
        watcher.join(10)


def test_a_redirect_to_a_leader_that_never_answers_is_left_for_another_member(
    aeron: Aeron, cluster: FakeCluster
) -> None:
    """A follower names a leader that has died (its driver still takes the
    request): the client does not wait out its whole timeout on it but asks
    the other members again, and the live leader answers."""
    ports = free_udp_port(), free_udp_port(), free_udp_port()
    cluster.endpoints = ",".join(f"{m}=127.0.0.1:{port}" for m, port in enumerate(ports))
    follower = cluster.member(0, udp(ports[0]), "redirect", redirect_to=1)
    dead = cluster.member(1, udp(ports[1]), "silent")
    leader = cluster.member(2, udp(ports[2]), listen_after=follower.redirected)
    dead.listening.wait(10)
    follower.listening.wait(10)
    client = ClusterClient.connect(
        aeron,
        ingress_channel="aeron:udp",
        ingress_endpoints=cluster.endpoints,
        egress_channel=EGRESS_UDP,
        message_timeout_ns=10_000_000_000,
    )
    try:
        assert len(follower.connect_requests) == 1
        assert len(dead.connect_requests) == 1
        assert len(leader.connect_requests) == 1
        assert client.leader_member_id == 2
        assert client.request(b"to the live leader", timeout_s=10) == b"to the live leader"
    finally:
        client.close()


def test_an_answer_to_an_earlier_connect_attempt_counts(aeron: Aeron, cluster: FakeCluster) -> None:
    """A cluster slower than the attempt timeout answers the first request after
    the client asked again: the first answer read opens the session."""
    member = cluster.member(0, IPC, "late")
    member.listening.wait(10)
    client = ipc_connect(aeron)
    try:
        assert len(member.connect_requests) == 2
        assert client.cluster_session_id == 100  # the first request's session
        assert client.request(b"late but fine", timeout_s=10) == b"late but fine"
        assert member.messages == [(cluster.leadership_term_id, 100, b"late but fine")]
    finally:
        client.close()


def test_a_connect_that_is_never_answered_times_out_naming_its_attempts(aeron: Aeron, cluster: FakeCluster) -> None:
    member = cluster.member(0, IPC, "silent")
    member.listening.wait(10)
    started = time.monotonic()
    with pytest.raises(ClusterTimeoutError, match=r"connect_attempts=2\b"):
        ipc_connect(aeron, message_timeout_ns=int(1.5 * CONNECT_ATTEMPT_TIMEOUT_NS))
    assert time.monotonic() - started < 1.5 * CONNECT_ATTEMPT_TIMEOUT_NS / 1e9 + 2
    assert len(member.connect_requests) == 2  # asked again after a back-off, not in a loop


# ---------------------------------------------------------------------------- a client whose driver goes

# A short driver timeout for the client, so that a dead driver is noticed
# within it even by its heartbeat alone.
DRIVER_TIMEOUT_MS = 1000
KEEPALIVE_INTERVAL_S = 0.5  # the Aeron client's liveness checks come with its keepalives
# Noticed within the driver timeout and one check interval; a second for a loaded machine.
NOTICED_WITHIN_S = DRIVER_TIMEOUT_MS / 1000 + KEEPALIVE_INTERVAL_S + 1.0

# Every entry point of an open session: none may return a code to retry or 0
# fragments once its driver is gone (a loop around it would spin forever).
ENTRY_POINTS: dict[str, Callable[[ClusterClient], Any]] = {
    "offer": lambda client: client.offer(b"x"),
    "offer_parts": lambda client: client.offer_parts([b"x", b"y"]),
    "try_claim": lambda client: client.try_claim(8),
    "poll_egress": lambda client: client.poll_egress(),
    "request": lambda client: client.request(b"x", timeout_s=5),
    "send_keepalive": lambda client: client.send_keepalive(),
    "send_admin_request_to_take_snapshot": lambda client: client.send_admin_request_to_take_snapshot(),
}


@pytest.fixture
def client_driver_dir() -> Iterator[Path]:
    """The directory of the client's own media driver (not the fake cluster's)."""
    directory = new_driver_dir()
    yield directory
    remove_driver_dir(directory)


def connect_over_udp(aeron: Aeron, port: int) -> ClusterClient:
    return ClusterClient.connect(
        aeron, ingress_channel=udp(port), egress_channel=EGRESS_UDP, message_timeout_ns=10_000_000_000
    )


def assert_every_call_raises(client: ClusterClient, directory: Path, first: str) -> None:
    """``first``, then every other entry point, raises MediaDriverLostError
    naming the driver's directory, at once (not after the request's timeout)."""
    for name in [first, *(name for name in ENTRY_POINTS if name != first)]:
        started = time.monotonic()
        with pytest.raises(MediaDriverLostError) as raised:
            ENTRY_POINTS[name](client)
        assert str(directory) in str(raised.value), (name, str(raised.value))
        assert isinstance(raised.value.__cause__, DriverTimeoutError), (name, raised.value.__cause__)
        assert time.monotonic() - started < 1.0, name
    assert client.is_closed
    client.close()  # cleanup after the driver's death is quiet


def test_a_client_whose_media_driver_is_killed_is_closed_and_every_call_raises(
    start_driver: Any, cluster: FakeCluster, client_driver_dir: Path
) -> None:
    """One open session per entry point on one Aeron client, its driver
    SIGKILLed: within the driver timeout each session is closed, and the
    entry point called first on it (each path that notices the loss) raises
    the driver's loss, naming its directory, as do all the others after it."""
    port = free_udp_port()
    leader = cluster.member(0, udp(port))
    leader.listening.wait(10)
    driver = start_driver(client_driver_dir)
    errors: list[BaseException] = []
    aeron = driver.connect(driver_timeout_ms=DRIVER_TIMEOUT_MS, error_handler=errors.append)
    clients: dict[str, ClusterClient] = {}
    try:
        for name in ENTRY_POINTS:
            clients[name] = connect_over_udp(aeron, port)
            assert clients[name].request(b"alive", timeout_s=10) == b"alive"
        assert not any(client.is_closed for client in clients.values())
        driver.kill()
        wait_for(lambda: all(client.is_closed for client in clients.values()), NOTICED_WITHIN_S, "every session closed")
        # The Aeron client under them records why (what the sessions' errors name).
        assert aeron.is_closed and isinstance(aeron.terminal_error, DriverTimeoutError)
        assert str(client_driver_dir) in str(aeron.terminal_error)
        for name, client in clients.items():
            assert_every_call_raises(client, client_driver_dir, first=name)
        assert [type(error) for error in errors] == [DriverTimeoutError]  # reported once
    finally:
        for client in clients.values():
            client.close()
        aeron.close()


def wait_for_stale_heartbeat(directory: Path, age_ms: int) -> None:
    with CncFile.open(directory) as cnc:
        ring = ManyToOneRingBuffer(cnc.to_driver)
        wait_for(lambda: time.time_ns() // 1_000_000 - ring.consumer_heartbeat_time > age_ms, 10, "a stale heartbeat")


@pytest.mark.parametrize("how", ["killed and restarted", "stopped and replaced"])
def test_a_client_whose_media_driver_is_replaced_by_a_new_one_is_closed(
    start_driver: Any, cluster: FakeCluster, client_driver_dir: Path, how: str
) -> None:
    """A new driver in the old one's directory (a new cnc.dat): the client
    is closed within one liveness check, though its driver timeout is the
    default 10 s.  In "stopped and replaced" the old driver's process is
    still there (SIGSTOPped, so its heartbeat stops and the new one may take
    the directory): only the new cnc.dat tells the client its driver is gone."""
    port = free_udp_port()
    leader = cluster.member(0, udp(port))
    leader.listening.wait(10)
    old = start_driver(client_driver_dir)
    aeron = old.connect(error_handler=lambda error: None)
    assert aeron.context.driver_timeout_ms == 10_000
    client = connect_over_udp(aeron, port)
    try:
        assert client.request(b"alive", timeout_s=10) == b"alive"
        if how == "killed and restarted":
            old.kill()
        else:
            old.process.send_signal(signal.SIGSTOP)
            wait_for_stale_heartbeat(client_driver_dir, 600)  # beyond the new driver's liveness timeout
        start_driver(client_driver_dir, client_liveness_timeout_ns=500_000_000)  # returns once it serves
        wait_for(lambda: client.is_closed, KEEPALIVE_INTERVAL_S + 1.0, "the session closed")
        error = aeron.terminal_error
        assert isinstance(error, DriverTimeoutError)
        if how == "stopped and replaced":
            assert f"the media driver (pid {old.process.pid}) in {client_driver_dir} is gone" in str(error)
            assert "another driver has made a new cnc.dat there" in str(error)
        assert_every_call_raises(client, client_driver_dir, first="offer")
    finally:
        client.close()
        aeron.close()
        old.kill()  # (SIGKILL ends a stopped process too)


def test_an_async_clients_pending_request_fails_when_its_media_driver_dies(
    start_driver: Any, cluster: FakeCluster, client_driver_dir: Path
) -> None:
    port = free_udp_port()
    leader = cluster.member(0, udp(port))
    leader.listening.wait(10)
    driver = start_driver(client_driver_dir)
    aeron = driver.connect(driver_timeout_ms=DRIVER_TIMEOUT_MS, error_handler=lambda error: None)
    lost = re.escape(str(client_driver_dir))

    async def main() -> None:
        client = await AsyncClusterClient.connect(
            aeron, ingress_channel=udp(port), egress_channel=EGRESS_UDP, message_timeout_ns=10_000_000_000
        )
        try:
            assert await client.request(b"alive", timeout_s=10) == b"alive"
            leader.mode = "quiet"  # the next request is read, and never answered
            pending = asyncio.ensure_future(client.request(b"pending", timeout_s=30))
            deadline = time.monotonic() + 10
            while not any(payload == b"pending" for _, _, payload in leader.messages):
                assert time.monotonic() < deadline, "the request did not reach the cluster"
                await asyncio.sleep(0.005)
            assert not pending.done()
            driver.kill()
            with pytest.raises(MediaDriverLostError, match=lost):
                await asyncio.wait_for(pending, NOTICED_WITHIN_S)
            assert client.is_closed
            with pytest.raises(MediaDriverLostError, match=lost):
                await client.request(b"after")
            with pytest.raises(MediaDriverLostError, match=lost):
                await client.send(b"after")
            assert [message async for message in client.messages()] == []  # the iterator ends
        finally:
            await client.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        aeron.close()


def test_a_connect_whose_media_driver_dies_fails_at_once(
    start_driver: Any, cluster: FakeCluster, client_driver_dir: Path
) -> None:
    """The cluster never answers and the client's driver dies meanwhile: the
    connect says so within the driver timeout, not after its own 10 s."""
    port = free_udp_port()
    member = cluster.member(0, udp(port), "silent")
    member.listening.wait(10)
    driver = start_driver(client_driver_dir)
    aeron = driver.connect(driver_timeout_ms=DRIVER_TIMEOUT_MS, error_handler=lambda error: None)

    def kill_once_asked() -> None:
        wait_for(lambda: member.connect_requests, 10, "the connect request")
        driver.kill()

    killer = threading.Thread(target=kill_once_asked)
    killer.start()
    try:
        started = time.monotonic()
        with pytest.raises(MediaDriverLostError, match=re.escape(str(client_driver_dir))):
            connect_over_udp(aeron, port)
        assert time.monotonic() - started < NOTICED_WITHIN_S + 1.0  # (the connect request's own way there)
    finally:
        killer.join(20)
        aeron.close()
