"""One client's control session with the archive.

A client opens a session with an AuthConnectRequest (or the older
ConnectRequest, which carries no credentials) naming its response channel;
the archive publishes every answer for that client on an exclusive
publication to that channel.  Responses that meet back pressure wait in the
session's queue, in order, so a slow client never loses one and never stalls
the archive.

Before a session is served it is authenticated, as in Aeron's archive: once
its response publication is connected (CONNECTED) the archive's
``Authenticator`` (``fulmar.security``) decides, through the session's proxy,
to authenticate it (the connect's OK goes out: ACTIVE), to challenge it (a
Challenge goes out: CHALLENGED, until the client's ChallengeResponse lets the
authenticator decide) or to reject it (an ERROR with Aeron's
AUTHENTICATION_REJECTED code and "authentication rejected", then the session
ends).  A session not decided within the connect timeout ends too.  Both are
refusals (``refusal`` says why): the archive counts them and logs them.  A
session without an authenticator (the node's local IPC channel, see
``ArchiveConductor``) is authenticated as soon as it is connected.

A session ends when the client closes it, when its response publication
never connects, when it is refused, or when it stops being connected (the
client has gone away).
"""

from __future__ import annotations

from collections import deque
from enum import Enum
from typing import Any

from fulmar.archive import protocol
from fulmar.archive.protocol import ArchiveErrorCode, ControlResponseCode, RecordingSignal
from fulmar.codecs.generated import archive as codecs
from fulmar.log_writer import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from fulmar.publication import ExclusivePublication
from fulmar.security import NULL_ENCODED_PRINCIPAL, Authenticator

_SCRATCH_LENGTH = 64 * 1024
# A session's queue of undelivered responses is bounded: a client that reads
# nothing must not make the archive hold its whole catalog in memory.
MAX_QUEUED_RESPONSES = 100_000
# Aeron's ControlSession.SESSION_REJECTED_MSG: the text of the refusal.
AUTHENTICATION_REJECTED_MESSAGE = "authentication rejected"
NOT_AUTHENTICATED_IN_TIME = "not authenticated within the connect timeout"


class ControlSessionState(Enum):
    CONNECTING = "CONNECTING"  # waiting for the response publication to connect
    CONNECTED = "CONNECTED"  # connected: the authenticator has yet to decide
    CHALLENGED = "CHALLENGED"  # a Challenge went out: waiting for the client's answer
    ACTIVE = "ACTIVE"  # authenticated: requests are served
    REJECTED = "REJECTED"  # the authenticator said no: the ERROR goes out, then DONE
    DONE = "DONE"


class ControlSessionProxy:
    """What an authenticator may do with a session (Aeron's
    ``ControlSessionProxy``, a ``fulmar.security.SessionProxy``)."""

    __slots__ = ("_session",)

    def __init__(self, session: ControlSession) -> None:
        self._session = session

    @property
    def session_id(self) -> int:
        return self._session.session_id

    def challenge(self, encoded_challenge: bytes) -> bool:
        return self._session.challenge(encoded_challenge)

    def authenticate(self, encoded_principal: bytes = NULL_ENCODED_PRINCIPAL) -> bool:
        return self._session.authenticate(encoded_principal)

    def reject(self) -> None:
        self._session.reject()


class ControlSession:
    def __init__(
        self,
        session_id: int,
        connect_correlation_id: int,
        publication: ExclusivePublication,
        now_ns: int,
        connect_timeout_ns: int,
        invalid_version_message: str | None = None,
        authenticator: Authenticator | None = None,
        origin: tuple[int, int] = (0, 0),
        response_channel: str = "",
    ) -> None:
        self.session_id = session_id
        # The connect's correlation id, then the ChallengeResponse's: the
        # connect's answer (OK, or the refusal) carries the latest, as in Aeron.
        self.connect_correlation_id = connect_correlation_id
        self.publication = publication
        self.state = ControlSessionState.CONNECTING
        self.connect_deadline_ns = now_ns + connect_timeout_ns
        self.invalid_version_message = invalid_version_message
        # None: authenticated as soon as connected (no credentials asked for).
        self.authenticator = authenticator
        # Where the session's requests come from (the control subscription and
        # the image's session id): a request naming this session from any
        # other stream is not served (Aeron checks the image the same way).
        self.origin = origin
        self.response_channel = response_channel
        self.encoded_principal: bytes | None = None
        self.refusal: str | None = None  # why it was refused, if it was
        self._rejection_sent = False
        self.close_reason = ""
        self._proxy = ControlSessionProxy(self)
        self._queue: deque[bytes] = deque()
        self._scratch = bytearray(_SCRATCH_LENGTH)
        self.active_listing: Any = None  # a listing in progress sends one descriptor at a time

    # ------------------------------------------------------------ duty cycle

    def do_work(self, now_ns: int, now_ms: int = 0) -> int:
        state = self.state
        if state is ControlSessionState.ACTIVE:
            if not self.publication.is_connected:
                self.close("the client's response subscription went away")
                return 0
            return self._flush()
        if state is ControlSessionState.DONE:
            return 0
        if state is ControlSessionState.CONNECTING:
            if not self.publication.is_connected:
                if now_ns > self.connect_deadline_ns:
                    self.close("the response publication did not connect in time")
                return 0
            self.state = ControlSessionState.CONNECTED
            if self.invalid_version_message is not None:
                self.send_error(self.connect_correlation_id, self.invalid_version_message)
                self._flush()
                self.close(self.invalid_version_message)
                return 1
        work = self._flush()
        try:
            if self.state is ControlSessionState.CONNECTED:
                if self.authenticator is None:
                    self.authenticate(NULL_ENCODED_PRINCIPAL)
                else:
                    self.authenticator.on_connected_session(self._proxy, now_ms)
                work += 1
            elif self.state is ControlSessionState.CHALLENGED:
                assert self.authenticator is not None
                self.authenticator.on_challenged_session(self._proxy, now_ms)
        except Exception as error:  # a user's authenticator that fails refuses the session, not the archive
            self.refusal = f"the authenticator failed: {type(error).__name__}"
            self.close(f"{self.refusal}: {error}")
            return work + 1
        if self.state is ControlSessionState.DONE:
            return work
        if self.state is ControlSessionState.REJECTED:
            if not self._rejection_sent:
                self._rejection_sent = True
                self._respond(
                    self.connect_correlation_id,
                    int(ArchiveErrorCode.AUTHENTICATION_REJECTED),
                    ControlResponseCode.ERROR,
                    AUTHENTICATION_REJECTED_MESSAGE,
                )
                work += 1
            # The ERROR goes out before the session ends (unless the client
            # reads nothing until the connect timeout).
            if not self._queue or now_ns > self.connect_deadline_ns:
                self.refusal = AUTHENTICATION_REJECTED_MESSAGE
                self.close(AUTHENTICATION_REJECTED_MESSAGE)
            return work
        if self.state is not ControlSessionState.ACTIVE and now_ns > self.connect_deadline_ns:
            self.refusal = NOT_AUTHENTICATED_IN_TIME
            self.close(f"{NOT_AUTHENTICATED_IN_TIME} (state {self.state.value})")
        return work

    def _flush(self) -> int:
        sent = 0
        queue = self._queue
        while queue:
            result = self.publication.offer(queue[0])
            if result == ADMIN_ACTION:
                continue
            if result < 0:
                if result not in (BACK_PRESSURED, NOT_CONNECTED):
                    self.close(f"response publication refused a response ({result})")
                break
            queue.popleft()
            sent += 1
        return sent

    def close(self, reason: str) -> None:
        if self.state is not ControlSessionState.DONE:
            self.state = ControlSessionState.DONE
            self.close_reason = reason
            self._queue.clear()
            self.active_listing = None
            self.publication.close()

    @property
    def is_done(self) -> bool:
        return self.state is ControlSessionState.DONE

    @property
    def is_active(self) -> bool:
        """Authenticated and connected: its requests are served."""
        return self.state is ControlSessionState.ACTIVE

    @property
    def queued_responses(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------ authentication

    def on_challenge_response(self, correlation_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        """The client's answer to a Challenge (ignored unless one is outstanding)."""
        if self.state is ControlSessionState.CHALLENGED and self.authenticator is not None:
            self.connect_correlation_id = correlation_id
            try:
                self.authenticator.on_challenge_response(self.session_id, encoded_credentials, now_ms)
            except Exception as error:  # as in do_work: the session is refused
                self.refusal = f"the authenticator failed: {type(error).__name__}"
                self.close(f"{self.refusal}: {error}")

    def challenge(self, encoded_challenge: bytes) -> bool:
        """Send a Challenge (again, for an authenticator of several rounds)."""
        if self.state not in (ControlSessionState.CONNECTED, ControlSessionState.CHALLENGED):
            return False
        self.send_encoded(
            self._encode(
                codecs.ChallengeEncoder,
                control_session_id=self.session_id,
                correlation_id=self.connect_correlation_id,
                version=protocol.PROTOCOL_SEMANTIC_VERSION,
                encoded_challenge=bytes(encoded_challenge),
            )
        )
        self.state = ControlSessionState.CHALLENGED
        return True

    def authenticate(self, encoded_principal: bytes = NULL_ENCODED_PRINCIPAL) -> bool:
        if self.state not in (ControlSessionState.CONNECTED, ControlSessionState.CHALLENGED):
            return False
        self.encoded_principal = bytes(encoded_principal)
        self.state = ControlSessionState.ACTIVE
        self._respond(self.connect_correlation_id, self.session_id, ControlResponseCode.OK)
        return True

    def reject(self) -> None:
        if self.state in (ControlSessionState.CONNECTED, ControlSessionState.CHALLENGED):
            self.state = ControlSessionState.REJECTED

    # --------------------------------------------------------------- sending

    def send_encoded(self, message: bytes) -> None:
        """Send now if nothing waits ahead of it, else queue it behind the rest."""
        if self.state is ControlSessionState.DONE:
            return
        if not self._queue and self.state is not ControlSessionState.CONNECTING:
            result = self.publication.offer(message)
            while result == ADMIN_ACTION:
                result = self.publication.offer(message)
            if result > 0:
                return
        if len(self._queue) >= MAX_QUEUED_RESPONSES:
            self.close(f"client fell {MAX_QUEUED_RESPONSES} responses behind")
            return
        self._queue.append(message)

    def _encode(self, encoder: Any, **fields: Any) -> bytes:
        length = encoder.encode(self._scratch, 0, **fields)
        return bytes(self._scratch[:length])

    def _respond(
        self, correlation_id: int, relevant_id: int, code: ControlResponseCode, error_message: str = ""
    ) -> None:
        self.send_encoded(
            self._encode(
                codecs.ControlResponseEncoder,
                control_session_id=self.session_id,
                correlation_id=correlation_id,
                relevant_id=relevant_id,
                code=int(code),
                version=protocol.PROTOCOL_SEMANTIC_VERSION,
                error_message=error_message[:4000],
            )
        )

    def send_ok(self, correlation_id: int, relevant_id: int = 0) -> None:
        self._respond(correlation_id, relevant_id, ControlResponseCode.OK)

    def send_error(
        self, correlation_id: int, message: str, error_code: ArchiveErrorCode = ArchiveErrorCode.GENERIC
    ) -> None:
        self._respond(correlation_id, int(error_code), ControlResponseCode.ERROR, message)

    def send_recording_unknown(self, correlation_id: int, recording_id: int) -> None:
        self._respond(correlation_id, recording_id, ControlResponseCode.RECORDING_UNKNOWN)

    def send_subscription_unknown(self, correlation_id: int) -> None:
        self._respond(correlation_id, 0, ControlResponseCode.SUBSCRIPTION_UNKNOWN)

    def send_descriptor(self, correlation_id: int, descriptor: Any) -> None:
        """A RecordingDescriptor message answering a listing (the catalog's
        entry, with this session's ids in its first two fields)."""
        self.send_encoded(
            self._encode(
                codecs.RecordingDescriptorEncoder,
                control_session_id=self.session_id,
                correlation_id=correlation_id,
                recording_id=descriptor.recording_id,
                start_timestamp=descriptor.start_timestamp,
                stop_timestamp=descriptor.stop_timestamp,
                start_position=descriptor.start_position,
                stop_position=descriptor.stop_position,
                initial_term_id=descriptor.initial_term_id,
                segment_file_length=descriptor.segment_file_length,
                term_buffer_length=descriptor.term_buffer_length,
                mtu_length=descriptor.mtu_length,
                session_id=descriptor.session_id,
                stream_id=descriptor.stream_id,
                stripped_channel=descriptor.stripped_channel,
                original_channel=descriptor.original_channel,
                source_identity=descriptor.source_identity,
            )
        )

    def send_signal(
        self, correlation_id: int, recording_id: int, subscription_id: int, position: int, signal: RecordingSignal
    ) -> None:
        self.send_encoded(
            self._encode(
                codecs.RecordingSignalEventEncoder,
                control_session_id=self.session_id,
                correlation_id=correlation_id,
                recording_id=recording_id,
                subscription_id=subscription_id,
                position=position,
                signal=int(signal),
            )
        )
