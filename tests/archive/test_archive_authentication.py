"""Authenticated archive control sessions (issue 48).

First the handshake on ``ControlSession`` alone, over a fake response
publication: connected, challenged, authenticated or rejected, as Aeron's
archive decides through its ``Authenticator``.  Then the bytes of the three
messages of the handshake, as Aeron's schema lays them out.  Then one archive
process started with a secret, reached over UDP: good credentials are served,
bad ones rejected with Aeron's error code and counted, a challenge is
answered, and nothing is served on a session before it is authenticated or
from another client's stream.
"""

from __future__ import annotations

import struct
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fulmar.aeron import Aeron
from fulmar.archive import protocol
from fulmar.archive.client import AeronArchive, ArchiveResponseError
from fulmar.archive.control_session import (
    AUTHENTICATION_REJECTED_MESSAGE,
    NOT_AUTHENTICATED_IN_TIME,
    ControlSession,
    ControlSessionState,
)
from fulmar.archive.protocol import ArchiveErrorCode, ControlResponseCode
from fulmar.cli import archive_tool
from fulmar.cnc import CncFile
from fulmar.codecs.generated import archive as codecs
from fulmar.counters import CountersReader
from fulmar.security import CredentialsAuthenticator, NullAuthenticator, SessionProxy
from support.archive import ArchiveProcess, RawControlClient
from support.driver import DriverProcess, free_udp_port, new_driver_dir, remove_driver_dir, wait_for

SECRET = b"archive-s3cret"
TIMEOUT_NS = 5_000_000_000


class FakePublication:
    """A response publication that takes every offer (once connected)."""

    def __init__(self, connected: bool = True) -> None:
        self.is_connected = connected
        self.sent: list[Any] = []
        self.closed = False

    def offer(self, message: bytes) -> int:
        if not self.is_connected:
            return -1  # NOT_CONNECTED
        self.sent.append(codecs.decode(message))
        return len(self.sent) * 64

    def close(self) -> None:
        self.closed = True


def session_with(
    authenticator: Any, credentials: bytes, publication: FakePublication | None = None
) -> tuple[ControlSession, FakePublication]:
    """A session as the conductor makes one on a connect request (correlation id 7)."""
    publication = publication or FakePublication()
    session = ControlSession(
        42,
        7,
        publication,  # type: ignore[arg-type]  # a fake
        0,
        TIMEOUT_NS,
        authenticator=authenticator,
        origin=(1, 99),
    )
    if authenticator is not None:
        authenticator.on_connect_request(42, credentials, 0)
    return session, publication


# ------------------------------------------------------------------ handshake states


def test_without_an_authenticator_a_connected_session_is_active_at_once() -> None:
    session, publication = session_with(None, b"")
    session.do_work(1, 1)
    assert session.state is ControlSessionState.ACTIVE and session.encoded_principal == b""
    (ok,) = publication.sent
    assert (ok.code_raw, ok.correlation_id, ok.relevant_id, ok.control_session_id) == (
        ControlResponseCode.OK,
        7,
        42,
        42,
    )


def test_the_null_authenticator_lets_everyone_in() -> None:
    session, publication = session_with(NullAuthenticator(), b"")
    session.do_work(1, 1)
    assert session.is_active and publication.sent[0].code_raw == ControlResponseCode.OK


def test_good_credentials_in_the_connect_request_make_the_session_active() -> None:
    session, publication = session_with(CredentialsAuthenticator(SECRET), b"alice:" + SECRET)
    session.do_work(1, 1)
    assert session.is_active and session.encoded_principal == b"alice" and session.refusal is None
    (ok,) = publication.sent
    assert (ok.code_raw, ok.correlation_id, ok.relevant_id) == (ControlResponseCode.OK, 7, 42)


def test_bad_credentials_are_rejected_with_aerons_error_code_and_the_session_ends() -> None:
    session, publication = session_with(CredentialsAuthenticator(SECRET), b"alice:guess")
    session.do_work(1, 1)
    assert session.is_done and publication.closed
    assert session.refusal == AUTHENTICATION_REJECTED_MESSAGE == "authentication rejected"
    (error,) = publication.sent
    assert error.code_raw == ControlResponseCode.ERROR
    assert error.relevant_id == ArchiveErrorCode.AUTHENTICATION_REJECTED == 10
    assert (error.correlation_id, error.error_message) == (7, "authentication rejected")


def test_no_credentials_get_a_challenge_and_a_good_answer_makes_the_session_active() -> None:
    session, publication = session_with(CredentialsAuthenticator(SECRET), b"")
    session.do_work(1, 1)
    assert session.state is ControlSessionState.CHALLENGED
    (challenge,) = publication.sent
    assert isinstance(challenge, codecs.ChallengeDecoder)
    assert (challenge.control_session_id, challenge.correlation_id) == (42, 7)
    assert challenge.encoded_challenge == CredentialsAuthenticator.CHALLENGE
    session.do_work(2, 2)  # no answer yet: still waiting, nothing more sent
    assert session.state is ControlSessionState.CHALLENGED and len(publication.sent) == 1
    session.on_challenge_response(8, SECRET, 3)
    session.do_work(3, 3)
    assert session.is_active
    ok = publication.sent[-1]
    # As in Aeron, the connect's answer carries the challenge response's correlation id.
    assert (ok.code_raw, ok.correlation_id, ok.relevant_id) == (ControlResponseCode.OK, 8, 42)


def test_a_wrong_answer_to_the_challenge_is_rejected() -> None:
    session, publication = session_with(CredentialsAuthenticator(SECRET), b"")
    session.do_work(1, 1)
    session.on_challenge_response(8, b"nope", 2)
    session.do_work(2, 2)
    assert session.is_done and session.refusal == AUTHENTICATION_REJECTED_MESSAGE
    error = publication.sent[-1]
    assert (error.code_raw, error.relevant_id, error.correlation_id) == (ControlResponseCode.ERROR, 10, 8)


def test_a_challenge_response_without_a_challenge_is_ignored() -> None:
    session, publication = session_with(CredentialsAuthenticator(SECRET), b"alice:" + SECRET)
    session.on_challenge_response(9, b"x", 0)  # not challenged (not even connected): no effect
    session.do_work(1, 1)
    assert session.is_active and publication.sent[-1].correlation_id == 7


def test_a_session_left_undecided_past_the_connect_timeout_is_refused() -> None:
    session, publication = session_with(CredentialsAuthenticator(SECRET), b"")
    session.do_work(1, 1)  # challenged; the client never answers (an old ConnectRequest client)
    session.do_work(TIMEOUT_NS - 1, 2)
    assert session.state is ControlSessionState.CHALLENGED
    session.do_work(TIMEOUT_NS + 1, 3)
    assert session.is_done and session.refusal == NOT_AUTHENTICATED_IN_TIME
    assert not any(isinstance(m, codecs.ControlResponseDecoder) for m in publication.sent)


def test_nothing_is_decided_before_the_response_publication_connects() -> None:
    class Watching(NullAuthenticator):
        calls = 0

        def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
            Watching.calls += 1
            super().on_connected_session(proxy, now_ms)

    publication = FakePublication(connected=False)
    session, _ = session_with(Watching(), b"", publication)
    session.do_work(1, 1)
    assert session.state is ControlSessionState.CONNECTING and Watching.calls == 0
    session.do_work(TIMEOUT_NS + 1, 2)  # it never connected: closed, but not a refusal (nobody was asked)
    assert session.is_done and session.refusal is None and Watching.calls == 0


def test_a_pluggable_authenticator_decides_through_the_session_proxy() -> None:
    """A user's authenticator of two rounds: it challenges with one nonce,
    then with another, and lets in only a client that echoes both."""

    class TwoRounds:
        def __init__(self) -> None:
            self.answers: dict[int, list[bytes]] = {}

        def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
            self.answers[session_id] = []

        def on_challenge_response(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
            self.answers[session_id].append(encoded_credentials)

        def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
            proxy.challenge(b"nonce-1")

        def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
            answers = self.answers[proxy.session_id]
            if answers == [b"nonce-1"]:
                proxy.challenge(b"nonce-2")
                answers.append(b"")  # (the second round's place)
            elif len(answers) == 3:
                if answers[2] == b"nonce-2":
                    proxy.authenticate(b"bob")
                else:
                    proxy.reject()

    for second_answer, admitted in ((b"nonce-2", True), (b"nonce-1", False)):
        session, publication = session_with(TwoRounds(), b"")
        session.do_work(1, 1)
        session.on_challenge_response(8, b"nonce-1", 2)
        session.do_work(2, 2)
        assert session.state is ControlSessionState.CHALLENGED
        assert [m.encoded_challenge for m in publication.sent] == [b"nonce-1", b"nonce-2"]
        session.on_challenge_response(9, second_answer, 3)
        session.do_work(3, 3)
        last = publication.sent[-1]
        if admitted:
            assert session.is_active and session.encoded_principal == b"bob"
            assert (last.code_raw, last.correlation_id) == (ControlResponseCode.OK, 9)
        else:
            assert session.is_done and (last.code_raw, last.relevant_id) == (ControlResponseCode.ERROR, 10)


def test_an_authenticator_that_fails_refuses_the_session_not_the_archive() -> None:
    class Broken(NullAuthenticator):
        def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
            raise KeyError("no such user")

    session, publication = session_with(Broken(), b"")
    assert session.do_work(1, 1) > 0
    assert session.is_done and session.refusal == "the authenticator failed: KeyError"
    assert publication.sent == []


# ------------------------------------------------------------------ bytes on the wire


def test_the_handshake_messages_have_aerons_layout() -> None:
    buffer = bytearray(256)
    length = codecs.AuthConnectRequestEncoder.encode(
        buffer,
        0,
        correlation_id=0x1122334455667788,
        response_stream_id=20,
        version=protocol.PROTOCOL_SEMANTIC_VERSION,
        response_channel="aeron:udp?endpoint=h:1",
        encoded_credentials=b"u:pw",
    )
    channel = b"aeron:udp?endpoint=h:1"
    expected = (
        struct.pack("<HHHH", 16, 58, 101, 10)  # blockLength, templateId, schemaId, version
        + struct.pack("<qii", 0x1122334455667788, 20, protocol.PROTOCOL_SEMANTIC_VERSION)
        + struct.pack("<I", len(channel))
        + channel
        + struct.pack("<I", 4)
        + b"u:pw"
    )
    assert bytes(buffer[:length]) == expected
    length = codecs.ChallengeEncoder.encode(
        buffer, 0, control_session_id=5, correlation_id=6, version=7, encoded_challenge=b"secret?"
    )
    assert bytes(buffer[:length]) == (
        struct.pack("<HHHH", 20, 59, 101, 10) + struct.pack("<qqi", 5, 6, 7) + struct.pack("<I", 7) + b"secret?"
    )
    length = codecs.ChallengeResponseEncoder.encode(
        buffer, 0, control_session_id=5, correlation_id=8, encoded_credentials=b"pw"
    )
    assert bytes(buffer[:length]) == (
        struct.pack("<HHHH", 16, 60, 101, 10) + struct.pack("<qq", 5, 8) + struct.pack("<I", 2) + b"pw"
    )


def test_an_aeron_1_48_auth_connect_request_with_client_info_decodes() -> None:
    """Aeron 1.48's schema is version 14: its AuthConnectRequest carries a
    clientInfo after the credentials (sinceVersion 12), which fulmar reads past."""
    channel = b"aeron:udp?endpoint=h:1"
    message = (
        struct.pack("<HHHH", 16, 58, 101, 14)
        + struct.pack("<qii", 3, 20, protocol.PROTOCOL_SEMANTIC_VERSION)
        + struct.pack("<I", len(channel))
        + channel
        + struct.pack("<I", 6)
        + b"secret"
        + struct.pack("<I", 9)
        + b"java-app1"
    )
    decoded = codecs.decode(message)
    assert isinstance(decoded, codecs.AuthConnectRequestDecoder)
    assert (decoded.correlation_id, decoded.response_channel, decoded.encoded_credentials) == (
        3,
        "aeron:udp?endpoint=h:1",
        b"secret",
    )


# ------------------------------------------------------------------ one archive process


class SecuredArchive:
    def __init__(self) -> None:
        self.driver_dir = new_driver_dir()
        self.archive_dir = Path(tempfile.mkdtemp(prefix="fulmar-archive-auth-"))
        self.driver: DriverProcess | None = None
        self.archive: ArchiveProcess | None = None
        self.aeron: Aeron | None = None

    def start(self) -> SecuredArchive:
        self.driver = DriverProcess(self.driver_dir)
        self.archive = ArchiveProcess(
            self.archive_dir,
            self.driver_dir,
            "--segment-length",
            "1m",
            "--authenticator-secret",
            SECRET.decode(),
            control_port=free_udp_port(),
        )
        self.aeron = self.driver.connect()
        return self

    @property
    def control_channel(self) -> str:
        assert self.archive is not None
        return self.archive.control_channel

    def connect(self, **options: Any) -> AeronArchive:
        assert self.aeron is not None
        return AeronArchive.connect(
            self.aeron,
            control_request_channel=self.control_channel,
            control_response_channel="aeron:udp?endpoint=127.0.0.1:0",
            message_timeout_ns=5_000_000_000,
            **options,
        )

    def refused(self) -> int:
        with CncFile.open(self.driver_dir) as cnc:
            reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
            (value,) = [
                reader.counter_value(c.counter_id)
                for c in reader
                if c.type_id == protocol.ARCHIVE_REFUSED_CONTROL_SESSIONS_TYPE_ID
            ]
            return value

    def errors(self) -> dict[str, int]:
        found = archive_tool.archive_errors_document(self.archive_dir)["errors"]
        return {error["text"]: error["observation_count"] for error in found}

    def close(self) -> None:
        try:
            if self.aeron is not None:
                self.aeron.close()
        finally:
            try:
                if self.archive is not None:
                    self.archive.stop()
            finally:
                if self.driver is not None:
                    self.driver.stop()
                remove_driver_dir(self.driver_dir)
                import shutil

                shutil.rmtree(self.archive_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def secured() -> Iterator[SecuredArchive]:
    archive = SecuredArchive()
    try:
        yield archive.start()
    finally:
        archive.close()


@pytest.mark.system
@pytest.mark.system
def test_a_client_with_the_secret_is_served_over_udp(secured: SecuredArchive) -> None:
    with secured.connect(credentials=SECRET) as archive:
        assert archive.list_recordings() == []
        assert archive.archive_id() != protocol.NULL_VALUE


@pytest.mark.system
def test_a_client_with_the_secret_answers_the_challenge_when_it_sent_none_first(secured: SecuredArchive) -> None:
    class OnlyWhenAsked:
        challenges: list[bytes] = []

        def encoded_credentials(self) -> bytes:
            return b""

        def on_challenge(self, encoded_challenge: bytes) -> bytes:
            self.challenges.append(encoded_challenge)
            return b"carol:" + SECRET

    supplier = OnlyWhenAsked()
    with secured.connect(credentials=supplier) as archive:
        assert archive.list_recordings() == []
    assert supplier.challenges == [CredentialsAuthenticator.CHALLENGE]


@pytest.mark.parametrize("credentials", [None, b"wrong", b"alice:wrong"], ids=["none", "wrong", "user-wrong"])
@pytest.mark.system
def test_a_client_without_the_secret_is_rejected_with_aerons_code_and_counted(
    secured: SecuredArchive, credentials: bytes | None
) -> None:
    before = secured.refused()
    with pytest.raises(ArchiveResponseError) as raised:
        secured.connect(credentials=credentials).close()
    assert raised.value.error_code == ArchiveErrorCode.AUTHENTICATION_REJECTED
    assert raised.value.archive_message == "authentication rejected"
    wait_for(lambda: secured.refused() == before + 1, 5, "the refusal to be counted")
    assert secured.errors().get("archive: control session refused: authentication rejected", 0) >= 1


@pytest.mark.system
def test_nothing_is_served_before_authentication_nor_from_another_clients_stream(secured: SecuredArchive) -> None:
    """A session's requests are not served while it is challenged, nor when
    another client names it (a stranger who learnt or guessed its id)."""
    assert secured.aeron is not None
    stranger = RawControlClient(secured.aeron, secured.control_channel)
    owner: AeronArchive | None = None
    try:
        stranger.connect(b"")  # no credentials: challenged
        challenge = stranger.next(5, "the challenge")
        assert isinstance(challenge, codecs.ChallengeDecoder)
        challenged_id = challenge.control_session_id
        owner = secured.connect(credentials=SECRET)
        for session_id in (challenged_id, owner.control_session_id):
            stranger.send(
                codecs.ListRecordingsRequestEncoder,
                control_session_id=session_id,
                correlation_id=100 + session_id % 1000,
                from_recording_id=0,
                record_count=10,
            )
            stranger.send(codecs.ArchiveIdRequestEncoder, control_session_id=session_id, correlation_id=5)
        assert stranger.quiet_for(0.5) == []  # nothing answered
        # The owner's session serves its owner still, and never answered the stranger's requests.
        assert owner.list_recordings() == [] and not owner.signals
        errors = secured.errors()
        assert errors.get("archive: ListRecordingsRequest on a control session not yet authenticated: not served")
        assert errors.get(
            "archive: ListRecordingsRequest refused: its control session belongs to another client's stream"
        )
        # Answered at last, the challenge lets it in.
        stranger.send(
            codecs.ChallengeResponseEncoder,
            control_session_id=challenged_id,
            correlation_id=9,
            encoded_credentials=SECRET,
        )
        ok = stranger.next(5, "the connect's answer")
        assert isinstance(ok, codecs.ControlResponseDecoder)
        assert (ok.code_raw, ok.correlation_id, ok.control_session_id) == (ControlResponseCode.OK, 9, challenged_id)
    finally:
        stranger.close()
        if owner is not None:
            owner.close()


@pytest.mark.system
def test_an_old_connect_request_without_credentials_is_never_served_and_is_counted(secured: SecuredArchive) -> None:
    """The ConnectRequest carries no credentials: it is challenged like a
    client without any; one that cannot answer is dropped at the connect
    timeout (5 s) and counted."""
    assert secured.aeron is not None
    before = secured.refused()
    stranger = RawControlClient(secured.aeron, secured.control_channel)
    try:
        started = time.monotonic()
        stranger.connect(None)
        challenge = stranger.next(5, "the challenge")
        assert isinstance(challenge, codecs.ChallengeDecoder)
        stranger.send(
            codecs.ListRecordingsRequestEncoder,
            control_session_id=challenge.control_session_id,
            correlation_id=2,
            from_recording_id=0,
            record_count=10,
        )
        wait_for(lambda: secured.refused() == before + 1, 10, "the undecided session to be refused")
        assert time.monotonic() - started >= 4.5  # not before the connect timeout
        assert not [m for kind, m in stranger.received if kind != "challenge"]
        assert secured.errors().get("archive: control session refused: not authenticated within the connect timeout")
    finally:
        stranger.close()


@pytest.mark.system
def test_the_local_ipc_channel_stays_open_to_the_nodes_own_processes(secured: SecuredArchive) -> None:
    assert secured.aeron is not None
    with AeronArchive.connect(secured.aeron) as archive:  # the local control channel: IPC, no credentials
        assert archive.list_recordings() == []
