"""The archive client: ``AeronArchive`` (synchronous, for users and the
consensus module), built on two pieces that never block and that the
archive's own replication sessions use directly:

- ``ArchiveProxy`` encodes control requests onto the request publication;
- ``ControlResponsePoller`` polls the response subscription and decodes what
  comes back: control responses, recording descriptors and recording signals.

Every ERROR response becomes an ``ArchiveResponseError`` carrying Aeron's
error code (an archive that refused the credentials: AUTHENTICATION_REJECTED);
a response that does not come within the message timeout is an
``ArchiveTimeoutError``.

A client connects with an AuthConnectRequest carrying its credentials (Aeron's
clients do since the ConnectRequest was superseded) and answers a Challenge
with what its ``CredentialsSupplier`` (``fulmar.security``) says.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fulmar.archive import protocol
from fulmar.archive.catalog import RecordingDescriptor
from fulmar.archive.protocol import (
    NULL_LENGTH,
    NULL_POSITION,
    NULL_VALUE,
    ArchiveErrorCode,
    ControlResponseCode,
    RecordingSignal,
    SourceLocation,
)
from fulmar.channel_uri import ChannelUri
from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import archive as codecs
from fulmar.errors import FulmarError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.log_reader import Header
from fulmar.log_writer import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from fulmar.security import CredentialsSupplier, credentials_supplier

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.publication import ExclusivePublication
    from fulmar.subscription import Subscription

DEFAULT_MESSAGE_TIMEOUT_NS = 10_000_000_000


class ArchiveClientError(FulmarError):
    """Base class of the archive client's errors."""


class ArchiveResponseError(ArchiveClientError):
    """The archive answered a request with an error."""

    def __init__(self, error_code: int, correlation_id: int, message: str) -> None:
        try:
            name = ArchiveErrorCode(error_code).name
        except ValueError:
            name = str(error_code)
        # The correlation id is kept as an attribute, not in the text: the same
        # refusal repeated (a request retried) is then one distinct error, said
        # once and counted, rather than a new one each time.
        super().__init__(f"archive error {name}: {message}")
        self.error_code = error_code
        self.correlation_id = correlation_id
        self.archive_message = message


class ArchiveTimeoutError(ArchiveClientError):
    """No response from the archive within the message timeout."""


class ArchiveNotConnectedError(ArchiveClientError):
    """The control session is closed or its channels are not connected."""


@dataclass(frozen=True)
class RecordingSignalEvent:
    control_session_id: int
    correlation_id: int
    recording_id: int
    subscription_id: int
    position: int
    signal: RecordingSignal


class ArchiveProxy:
    """Encodes control requests onto the request publication.  Each method
    returns False when the request could not be offered (back pressure or not
    connected) after a few tries; nothing is half-sent."""

    def __init__(self, publication: ExclusivePublication, retry_attempts: int = 3) -> None:
        self.publication = publication
        self.retry_attempts = retry_attempts
        self._buffer = bytearray(16 * 1024)

    def send(self, encoder: Any, **fields: Any) -> bool:
        length = encoder.encode(self._buffer, 0, **fields)
        message = bytes(self._buffer[:length])
        for _ in range(self.retry_attempts):
            result = self.publication.offer(message)
            if result > 0:
                return True
            if result not in (BACK_PRESSURED, NOT_CONNECTED, ADMIN_ACTION):
                raise ArchiveNotConnectedError(f"the archive request publication is closed ({result})")
        return False

    def connect(
        self, response_channel: str, response_stream_id: int, correlation_id: int, encoded_credentials: bytes = b""
    ) -> bool:
        return self.send(
            codecs.AuthConnectRequestEncoder,
            correlation_id=correlation_id,
            response_stream_id=response_stream_id,
            version=protocol.PROTOCOL_SEMANTIC_VERSION,
            response_channel=response_channel,
            encoded_credentials=encoded_credentials,
        )

    def challenge_response(self, control_session_id: int, correlation_id: int, encoded_credentials: bytes) -> bool:
        return self.send(
            codecs.ChallengeResponseEncoder,
            control_session_id=control_session_id,
            correlation_id=correlation_id,
            encoded_credentials=encoded_credentials,
        )

    def replay(
        self,
        control_session_id: int,
        correlation_id: int,
        recording_id: int,
        position: int,
        length: int,
        replay_channel: str,
        replay_stream_id: int,
        limit_counter_id: int | None = None,
    ) -> bool:
        common = dict(
            control_session_id=control_session_id,
            correlation_id=correlation_id,
            recording_id=recording_id,
            position=position,
            length=length,
            replay_stream_id=replay_stream_id,
            file_io_max_length=NULL_VALUE,
            replay_token=NULL_VALUE,
            replay_channel=replay_channel,
        )
        if limit_counter_id is None:
            return self.send(codecs.ReplayRequestEncoder, **common)
        return self.send(codecs.BoundedReplayRequestEncoder, limit_counter_id=limit_counter_id, **common)

    def close_session(self, control_session_id: int) -> bool:
        return self.send(codecs.CloseSessionRequestEncoder, control_session_id=control_session_id)


class ControlResponsePoller:
    """Polls the response subscription and decodes each message whole.

    ``poll`` returns the messages of one poll, as ``(kind, decoder)`` pairs:
    kind is "response", "descriptor", "signal" or "challenge" (other messages
    are skipped).
    Malformed messages are counted in ``malformed`` and skipped.
    """

    def __init__(self, subscription: Subscription, fragment_limit: int = 16) -> None:
        self.subscription = subscription
        self.fragment_limit = fragment_limit
        self.malformed = 0
        self._batch: list[tuple[str, Any]] = []
        self._assembler = FragmentAssembler(self._on_message)

    def poll(self) -> list[tuple[str, Any]]:
        self._batch = []
        self.subscription.poll(self._assembler.on_fragment, self.fragment_limit)
        return self._batch

    def _on_message(self, buffer: memoryview, offset: int, length: int, header: Header) -> None:
        try:
            message = codecs.decode(buffer, offset, length)
        except CodecError:
            self.malformed += 1
            return
        if isinstance(message, codecs.ControlResponseDecoder):
            self._batch.append(("response", message))
        elif isinstance(message, codecs.RecordingDescriptorDecoder):
            self._batch.append(("descriptor", message))
        elif isinstance(message, codecs.RecordingSignalEventDecoder):
            self._batch.append(("signal", message))
        elif isinstance(message, codecs.ChallengeDecoder):
            self._batch.append(("challenge", message))


def descriptor_of(message: Any) -> RecordingDescriptor:
    """A RecordingDescriptor message as the catalog's dataclass."""
    return RecordingDescriptor(
        **{name: getattr(message, name) for name in codecs.RecordingDescriptorDecoder.FIELD_NAMES},
    )


def signal_of(message: Any) -> RecordingSignalEvent:
    return RecordingSignalEvent(
        message.control_session_id,
        message.correlation_id,
        message.recording_id,
        message.subscription_id,
        message.position,
        RecordingSignal(message.signal_raw),
    )


def error_of(message: Any) -> ArchiveResponseError:
    return ArchiveResponseError(message.relevant_id, message.correlation_id, message.error_message)


class AeronArchive:
    """A control session with an archive; every operation waits for its answer.

    Recording signals that arrive while an answer is awaited are kept in
    ``signals`` (oldest first) for ``poll_for_signals`` / ``wait_for_signal``.
    """

    def __init__(
        self,
        aeron: Aeron,
        request_publication: ExclusivePublication,
        response_subscription: Subscription,
        control_session_id: int,
        archive_version: int,
        message_timeout_ns: int,
    ) -> None:
        self.aeron = aeron
        self.request_publication = request_publication
        self.response_subscription = response_subscription
        self.control_session_id = control_session_id
        self.archive_version = archive_version
        self.message_timeout_ns = message_timeout_ns
        self.proxy = ArchiveProxy(request_publication)
        self.poller = ControlResponsePoller(response_subscription)
        self.signals: deque[RecordingSignalEvent] = deque()
        self.last_correlation_id = NULL_VALUE
        # An asynchronous ERROR (a replication or replay that failed) read
        # while waiting for another answer: raised by the next poll_for_signals.
        self._async_error: ArchiveResponseError | None = None
        self._closed = False

    # ------------------------------------------------------------------ connect

    @classmethod
    def connect(
        cls,
        aeron: Aeron,
        control_request_channel: str = protocol.LOCAL_CONTROL_CHANNEL,
        control_request_stream_id: int = protocol.CONTROL_STREAM_ID,
        control_response_channel: str = protocol.CONTROL_RESPONSE_CHANNEL,
        control_response_stream_id: int = protocol.CONTROL_RESPONSE_STREAM_ID,
        message_timeout_ns: int = DEFAULT_MESSAGE_TIMEOUT_NS,
        *,
        credentials: bytes | CredentialsSupplier | None = None,
    ) -> AeronArchive:
        """Open a control session.  A UDP response channel may use port 0:
        the archive is told the port the driver actually bound.

        ``credentials``: bytes (sent in the connect request, and again in
        answer to a challenge) or a ``CredentialsSupplier``; none: empty
        credentials and an empty answer, as Aeron's null supplier.  An
        archive that refuses them raises ArchiveResponseError with the
        AUTHENTICATION_REJECTED error code."""
        supplier = credentials_supplier(credentials)
        subscription = aeron.add_subscription(control_response_channel, control_response_stream_id)
        publication = None
        try:
            publication = aeron.add_exclusive_publication(control_request_channel, control_request_stream_id)
            deadline = time.monotonic_ns() + message_timeout_ns
            response_channel = _resolved_channel(subscription, control_response_channel, deadline)
            _wait(
                lambda: publication.is_connected,
                deadline,
                aeron,
                f"no archive is listening on {control_request_channel} stream {control_request_stream_id}",
            )
            proxy = ArchiveProxy(publication)
            correlation_id = aeron.next_correlation_id()
            encoded = bytes(supplier.encoded_credentials())
            _wait(
                lambda: proxy.connect(response_channel, control_response_stream_id, correlation_id, encoded),
                deadline,
                aeron,
                "the archive did not take the connect request",
            )
            poller = ControlResponsePoller(subscription)
            found: list[Any] = []
            awaited = [correlation_id]

            def answered() -> bool:
                for kind, message in poller.poll():
                    if kind in ("response", "challenge") and message.correlation_id == awaited[0]:
                        found.append(message)
                        return True
                return False

            while True:
                _wait(answered, deadline, aeron, "no connect response from the archive")
                response = found.pop()
                if not isinstance(response, codecs.ChallengeDecoder):
                    break
                # The archive's authenticator asks: the supplier answers, and
                # the connect's answer then carries the answer's correlation id.
                answer = bytes(supplier.on_challenge(bytes(response.encoded_challenge)))
                awaited[0] = aeron.next_correlation_id()
                session_id = response.control_session_id
                _wait(
                    lambda: proxy.challenge_response(session_id, awaited[0], answer),
                    deadline,
                    aeron,
                    "the archive did not take the challenge response",
                )
            if response.code_raw != ControlResponseCode.OK:
                raise error_of(response)
            return cls(
                aeron, publication, subscription, response.control_session_id, response.version, message_timeout_ns
            )
        except BaseException:
            subscription.close()
            if publication is not None:
                publication.close()
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.request_publication.is_connected:
                self.proxy.close_session(self.control_session_id)
        finally:
            self.request_publication.close()
            self.response_subscription.close()

    def __enter__(self) -> AeronArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- plumbing

    def _send(self, encoder: Any, **fields: Any) -> int:
        if self._closed:
            raise ArchiveNotConnectedError("the archive client is closed")
        correlation_id = self.aeron.next_correlation_id()
        deadline = time.monotonic_ns() + self.message_timeout_ns
        _wait(
            lambda: self.proxy.send(
                encoder, control_session_id=self.control_session_id, correlation_id=correlation_id, **fields
            ),
            deadline,
            self.aeron,
            f"could not send {encoder.NAME} to the archive",
        )
        # Lets a caller match a later asynchronous ERROR (a replay that failed
        # midway answers with its request's correlation id) to its request.
        self.last_correlation_id = correlation_id
        return correlation_id

    def _await(self, correlation_id: int) -> Any:
        """The control response to ``correlation_id``, raising on ERROR.
        Signals that arrive meanwhile are kept in ``signals``."""
        deadline = time.monotonic_ns() + self.message_timeout_ns
        found: list[Any] = []

        def answered() -> bool:
            # The whole batch is read: signals after the answer are kept too.
            for kind, message in self.poller.poll():
                if message.control_session_id != self.control_session_id:
                    continue
                if kind == "signal":
                    self.signals.append(signal_of(message))
                elif kind == "response" and message.correlation_id == correlation_id and not found:
                    found.append(message)
                elif kind == "response":
                    self._keep_async_error(message)
            return bool(found)

        try:
            _wait(answered, deadline, self.aeron, "")
        except ArchiveTimeoutError:
            if not self.response_subscription.is_connected:
                raise ArchiveNotConnectedError("the archive's response stream is not connected") from None
            raise ArchiveTimeoutError(
                f"no response from the archive to correlation id {correlation_id} within "
                f"{self.message_timeout_ns // 1_000_000} ms"
            ) from None
        response = found[0]
        if response.code_raw == ControlResponseCode.ERROR:
            raise error_of(response)
        return response

    def _keep_async_error(self, message: Any) -> None:
        """An ERROR that answers no request being waited for: a failure of
        something under way, kept for ``poll_for_signals`` (the first one)."""
        if message.code_raw == ControlResponseCode.ERROR and self._async_error is None:
            self._async_error = error_of(message)

    def _request(self, encoder: Any, **fields: Any) -> int:
        """Send a request whose answer is OK + relevant id; returns the relevant id."""
        return int(self._await(self._send(encoder, **fields)).relevant_id)

    # ------------------------------------------------------------- recording

    def start_recording(
        self,
        channel: str,
        stream_id: int,
        source_location: SourceLocation = SourceLocation.LOCAL,
        auto_stop: bool = False,
    ) -> int:
        """Record every image of ``channel``/``stream_id``; returns the recording subscription's id."""
        if auto_stop:
            return self._request(
                codecs.StartRecordingRequest2Encoder,
                stream_id=stream_id,
                source_location=int(source_location),
                auto_stop=1,
                channel=channel,
            )
        return self._request(
            codecs.StartRecordingRequestEncoder,
            stream_id=stream_id,
            source_location=int(source_location),
            channel=channel,
        )

    def extend_recording(
        self,
        recording_id: int,
        channel: str,
        stream_id: int,
        source_location: SourceLocation = SourceLocation.LOCAL,
        auto_stop: bool = False,
    ) -> int:
        """Append the next image of the channel to a stopped recording (the image must start at its stop position)."""
        return self._request(
            codecs.ExtendRecordingRequest2Encoder,
            recording_id=recording_id,
            stream_id=stream_id,
            source_location=int(source_location),
            auto_stop=1 if auto_stop else 0,
            channel=channel,
        )

    def stop_recording(self, channel: str, stream_id: int) -> None:
        self._request(codecs.StopRecordingRequestEncoder, stream_id=stream_id, channel=channel)

    def stop_recording_subscription(self, subscription_id: int) -> None:
        self._request(codecs.StopRecordingSubscriptionRequestEncoder, subscription_id=subscription_id)

    def stop_recording_by_identity(self, recording_id: int) -> bool:
        return self._request(codecs.StopRecordingByIdentityRequestEncoder, recording_id=recording_id) == 1

    # ---------------------------------------------------------------- queries

    def get_recording_position(self, recording_id: int) -> int:
        """The live position of an active recording, NULL_POSITION if it is not active."""
        return self._request(codecs.RecordingPositionRequestEncoder, recording_id=recording_id)

    def get_stop_position(self, recording_id: int) -> int:
        """Where a stopped recording ends, NULL_POSITION while it is active."""
        return self._request(codecs.StopPositionRequestEncoder, recording_id=recording_id)

    def get_start_position(self, recording_id: int) -> int:
        return self._request(codecs.StartPositionRequestEncoder, recording_id=recording_id)

    def get_max_recorded_position(self, recording_id: int) -> int:
        """The live position if active, else the stop position."""
        return self._request(codecs.MaxRecordedPositionRequestEncoder, recording_id=recording_id)

    def archive_id(self) -> int:
        return self._request(codecs.ArchiveIdRequestEncoder)

    def find_last_matching_recording(
        self, min_recording_id: int, channel_fragment: str, stream_id: int, session_id: int
    ) -> int:
        """The newest recording id from ``min_recording_id`` matching, or NULL_VALUE."""
        try:
            return self._request(
                codecs.FindLastMatchingRecordingRequestEncoder,
                min_recording_id=min_recording_id,
                session_id=session_id,
                stream_id=stream_id,
                channel=channel_fragment,
            )
        except ArchiveResponseError as error:
            if error.error_code == ArchiveErrorCode.UNKNOWN_RECORDING:
                return NULL_VALUE
            raise

    def _list(self, encoder: Any, **fields: Any) -> list[RecordingDescriptor]:
        descriptors: list[RecordingDescriptor] = []
        correlation_id = self._send(encoder, **fields)
        expected = fields.get("record_count", 1)
        # A listing ends with RECORDING_UNKNOWN, unless exactly the count asked
        # for was sent; wait for one or the other.
        deadline = time.monotonic_ns() + self.message_timeout_ns

        done: list[bool] = []
        errors: list[ArchiveResponseError] = []

        def finished() -> bool:
            # The whole batch is read: signals after the end are kept too.
            for kind, message in self.poller.poll():
                if message.control_session_id != self.control_session_id:
                    continue
                if kind == "signal":
                    self.signals.append(signal_of(message))
                elif message.correlation_id != correlation_id or done:
                    if kind == "response":
                        self._keep_async_error(message)
                    continue
                elif kind == "descriptor":
                    descriptors.append(descriptor_of(message))
                    if len(descriptors) >= expected:
                        done.append(True)
                elif message.code_raw == ControlResponseCode.RECORDING_UNKNOWN:
                    done.append(True)
                elif message.code_raw == ControlResponseCode.ERROR:
                    errors.append(error_of(message))
                    done.append(True)
            if errors:
                raise errors[0]
            return bool(done)

        _wait(finished, deadline, self.aeron, f"the archive's listing (correlation id {correlation_id}) did not end")
        return descriptors

    def list_recordings(self, from_recording_id: int = 0, record_count: int = 1 << 30) -> list[RecordingDescriptor]:
        return self._list(
            codecs.ListRecordingsRequestEncoder, from_recording_id=from_recording_id, record_count=record_count
        )

    def list_recordings_for_uri(
        self, from_recording_id: int, record_count: int, channel_fragment: str, stream_id: int
    ) -> list[RecordingDescriptor]:
        return self._list(
            codecs.ListRecordingsForUriRequestEncoder,
            from_recording_id=from_recording_id,
            record_count=record_count,
            stream_id=stream_id,
            channel=channel_fragment,
        )

    def list_recording(self, recording_id: int) -> RecordingDescriptor | None:
        found = self._list(codecs.ListRecordingRequestEncoder, recording_id=recording_id)
        return found[0] if found else None

    # ------------------------------------------------------------------ replay

    def start_replay(
        self,
        recording_id: int,
        replay_channel: str,
        replay_stream_id: int,
        position: int = NULL_POSITION,
        length: int = NULL_LENGTH,
        limit_counter_id: int | None = None,
    ) -> int:
        """Start a replay; returns the replay session id (its low 32 bits are
        the replay image's session id).  ``length`` NULL_LENGTH: to the end,
        following the recording while it is live.  ``limit_counter_id``: never
        past that counter's value (a bounded replay)."""
        fields: dict[str, Any] = dict(
            recording_id=recording_id,
            position=position,
            length=length,
            replay_stream_id=replay_stream_id,
            file_io_max_length=NULL_VALUE,
            replay_token=NULL_VALUE,
            replay_channel=replay_channel,
        )
        if limit_counter_id is None:
            return self._request(codecs.ReplayRequestEncoder, **fields)
        return self._request(codecs.BoundedReplayRequestEncoder, limit_counter_id=limit_counter_id, **fields)

    def replay(
        self,
        recording_id: int,
        replay_channel: str,
        replay_stream_id: int,
        position: int = NULL_POSITION,
        length: int = NULL_LENGTH,
        limit_counter_id: int | None = None,
    ) -> Subscription:
        """Start a replay and subscribe to it (the subscription filters on the replay's session id)."""
        replay_session_id = self.start_replay(
            recording_id, replay_channel, replay_stream_id, position, length, limit_counter_id
        )
        channel = ChannelUri.parse(replay_channel).with_param(
            "session-id", protocol.replay_image_session_id(replay_session_id)
        )
        return self.aeron.add_subscription(str(channel), replay_stream_id)

    def stop_replay(self, replay_session_id: int) -> None:
        self._request(codecs.StopReplayRequestEncoder, replay_session_id=replay_session_id)

    def stop_all_replays(self, recording_id: int = NULL_VALUE) -> None:
        self._request(codecs.StopAllReplaysRequestEncoder, recording_id=recording_id)

    # ----------------------------------------------------- truncate and purge

    def truncate_recording(self, recording_id: int, position: int) -> None:
        """Cut a stopped recording back to ``position`` (a frame boundary)."""
        self._request(codecs.TruncateRecordingRequestEncoder, recording_id=recording_id, position=position)

    def purge_recording(self, recording_id: int) -> None:
        """Delete a stopped recording: its catalog entry and its segment files."""
        self._request(codecs.PurgeRecordingRequestEncoder, recording_id=recording_id)

    # ------------------------------------------------- segments (Aeron's detach, purge, attach)

    def detach_segments(self, recording_id: int, new_start_position: int) -> None:
        """Move the recording's start to ``new_start_position``, the first byte
        of a later segment (``segment_file_base_position``); the files before
        it stay on disk until deleted or attached again."""
        self._request(
            codecs.DetachSegmentsRequestEncoder, recording_id=recording_id, new_start_position=new_start_position
        )

    def delete_detached_segments(self, recording_id: int) -> int:
        """Delete the files detached from the recording; returns how many."""
        return self._request(codecs.DeleteDetachedSegmentsRequestEncoder, recording_id=recording_id)

    def purge_segments(self, recording_id: int, new_start_position: int) -> int:
        """Detach and delete the segments before ``new_start_position``; returns how many files went."""
        return self._request(
            codecs.PurgeSegmentsRequestEncoder, recording_id=recording_id, new_start_position=new_start_position
        )

    def attach_segments(self, recording_id: int) -> int:
        """Take back detached segment files that join the recording's start; returns how many."""
        return self._request(codecs.AttachSegmentsRequestEncoder, recording_id=recording_id)

    # ------------------------------------------------------------- replication

    def replicate(
        self,
        src_recording_id: int,
        src_control_channel: str,
        src_control_stream_id: int = protocol.CONTROL_STREAM_ID,
        dst_recording_id: int = NULL_VALUE,
        stop_position: int = NULL_POSITION,
        live_destination: str = "",
        replication_channel: str = "",
        replication_session_id: int = NULL_VALUE,
        channel_tag_id: int = NULL_VALUE,
        subscription_tag_id: int = NULL_VALUE,
        encoded_credentials: bytes = b"",
    ) -> int:
        """Copy a recording from another archive into this one (ReplicateRequest2).

        ``dst_recording_id`` NULL_VALUE makes a new recording; otherwise the
        existing one is extended from its stop position.  ``stop_position``
        NULL_POSITION: to the source's end (following it while it is live).
        ``live_destination`` (an endpoint the source's live stream is sent to)
        merges the replicated stream into the live one once caught up.
        ``encoded_credentials``: what this archive presents to the source
        archive (empty: its own replication credentials, if it has any).
        Returns the replication id; progress comes as recording signals.
        """
        return self._request(
            codecs.ReplicateRequest2Encoder,
            src_recording_id=src_recording_id,
            dst_recording_id=dst_recording_id,
            stop_position=stop_position,
            channel_tag_id=channel_tag_id,
            subscription_tag_id=subscription_tag_id,
            src_control_stream_id=src_control_stream_id,
            file_io_max_length=NULL_VALUE,
            replication_session_id=replication_session_id,
            src_control_channel=src_control_channel,
            live_destination=live_destination,
            replication_channel=replication_channel,
            encoded_credentials=encoded_credentials,
            src_response_channel="",
        )

    def stop_replication(self, replication_id: int) -> None:
        self._request(codecs.StopReplicationRequestEncoder, replication_id=replication_id)

    # ------------------------------------------------------------------ signals

    def poll_for_signals(self) -> int:
        """Read what has arrived; recording signals are added to ``signals``.
        Raises ArchiveResponseError for an ERROR response that arrived (the
        archive reports asynchronous failures that way), here or while a
        request waited for its own answer."""
        count = 0
        error, self._async_error = self._async_error, None
        for kind, message in self.poller.poll():
            if message.control_session_id != self.control_session_id:
                continue
            if kind == "signal":
                self.signals.append(signal_of(message))
                count += 1
            elif kind == "response" and message.code_raw == ControlResponseCode.ERROR and error is None:
                error = error_of(message)
        if error is not None:
            # An error that answers no pending request: an asynchronous
            # failure (a recording that stopped on a full disk, a replication
            # that failed).  Signals read with it are kept.
            raise error
        return count

    def wait_for_signal(
        self, predicate: Callable[[RecordingSignalEvent], bool], timeout_ns: int | None = None
    ) -> RecordingSignalEvent:
        """The first signal (kept or new) that satisfies ``predicate``; the
        signals before it are dropped."""
        deadline = time.monotonic_ns() + (self.message_timeout_ns if timeout_ns is None else timeout_ns)
        found: list[RecordingSignalEvent] = []

        def seen() -> bool:
            self.poll_for_signals()
            while self.signals:
                event = self.signals.popleft()
                if predicate(event):
                    found.append(event)
                    return True
            return False

        _wait(seen, deadline, self.aeron, "the awaited recording signal did not come")
        return found[0]


def _wait(condition: Callable[[], bool], deadline_ns: int, aeron: Aeron, what: str) -> None:
    """Poll ``condition`` until it holds, sleeping on the data doorbell (rung
    when data arrives in any log of this driver) between tries."""
    doorbell = aeron.conductor.data_doorbell
    # A client in invoker mode has no conductor thread: drive it here, or
    # images (and the responses in them) never arrive while this waits.
    invoker = not aeron.context.use_conductor_thread
    while not condition():
        if time.monotonic_ns() >= deadline_ns:
            raise ArchiveTimeoutError(what or "timed out")
        if invoker:
            aeron.do_work()
        token = doorbell.prepare()
        if condition():
            doorbell.cancel()
            return
        doorbell.wait(token, 1_000_000)


def _resolved_channel(subscription: Subscription, channel: str, deadline_ns: int) -> str:
    """``channel`` with a UDP endpoint's port 0 replaced by the bound port."""
    uri = ChannelUri.parse(channel)
    endpoint = uri.get("endpoint")
    if not uri.is_udp or endpoint is None or not endpoint.endswith(":0"):
        return channel
    while True:
        resolved = subscription.resolved_endpoint
        if resolved is not None:
            return str(uri.with_param("endpoint", resolved))
        if time.monotonic_ns() >= deadline_ns:
            raise ArchiveTimeoutError(f"the driver did not bind {channel}")
        time.sleep(0.001)


__all__ = [
    "AeronArchive",
    "ArchiveClientError",
    "ArchiveNotConnectedError",
    "ArchiveProxy",
    "ArchiveResponseError",
    "ArchiveTimeoutError",
    "ControlResponsePoller",
    "RecordingSignalEvent",
    "NULL_LENGTH",
    "NULL_POSITION",
    "NULL_VALUE",
    "RecordingSignal",
    "SourceLocation",
]
