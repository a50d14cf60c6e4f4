"""One client's control session with the archive.

A client opens a session with a ConnectRequest naming its response channel;
the archive publishes every answer for that client on an exclusive
publication to that channel.  Responses that meet back pressure wait in the
session's queue, in order, so a slow client never loses one and never stalls
the archive.  A session ends when the client closes it, when its response
publication never connects, or when it stops being connected (the client has
gone away).
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

_SCRATCH_LENGTH = 64 * 1024
# A session's queue of undelivered responses is bounded: a client that reads
# nothing must not make the archive hold its whole catalog in memory.
MAX_QUEUED_RESPONSES = 100_000


class ControlSessionState(Enum):
    CONNECTING = "CONNECTING"  # waiting for the response publication to connect
    CONNECTED = "CONNECTED"
    DONE = "DONE"


class ControlSession:
    def __init__(
        self,
        session_id: int,
        connect_correlation_id: int,
        publication: ExclusivePublication,
        now_ns: int,
        connect_timeout_ns: int,
        invalid_version_message: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.connect_correlation_id = connect_correlation_id
        self.publication = publication
        self.state = ControlSessionState.CONNECTING
        self.connect_deadline_ns = now_ns + connect_timeout_ns
        self.invalid_version_message = invalid_version_message
        self.close_reason = ""
        self._queue: deque[bytes] = deque()
        self._scratch = bytearray(_SCRATCH_LENGTH)
        self.active_listing: Any = None  # a listing in progress sends one descriptor at a time

    # ------------------------------------------------------------ duty cycle

    def do_work(self, now_ns: int) -> int:
        if self.state is ControlSessionState.CONNECTING:
            if self.publication.is_connected:
                self.state = ControlSessionState.CONNECTED
                if self.invalid_version_message is not None:
                    self.send_error(self.connect_correlation_id, self.invalid_version_message)
                    self._flush()
                    self.close(self.invalid_version_message)
                    return 1
                self._respond(self.connect_correlation_id, self.session_id, ControlResponseCode.OK)
                return 1
            if now_ns > self.connect_deadline_ns:
                self.close("the response publication did not connect in time")
            return 0
        if self.state is ControlSessionState.DONE:
            return 0
        if not self.publication.is_connected:
            self.close("the client's response subscription went away")
            return 0
        return self._flush()

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
    def is_connected(self) -> bool:
        return self.state is ControlSessionState.CONNECTED

    @property
    def queued_responses(self) -> int:
        return len(self._queue)

    # --------------------------------------------------------------- sending

    def send_encoded(self, message: bytes) -> None:
        """Send now if nothing waits ahead of it, else queue it behind the rest."""
        if self.state is ControlSessionState.DONE:
            return
        if not self._queue and self.state is ControlSessionState.CONNECTED:
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
