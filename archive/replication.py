"""Replicating a recording from another archive into this one.

The destination archive (this one) acts as a client of the source archive:
it opens a control session over UDP, asks for the source recording's
descriptor, and sends a ReplayRequest whose replay channel points back at a
subscription of its own.  The replayed image is recorded like any extension
of the destination recording (a new recording is made first when none was
given), so the destination holds the same bytes at the same positions.

Seed 001 shows the exchange: the consensus module sends ReplicateRequest2
(source control channel, source recording id, destination recording id,
stop position) to its own archive, which sends ReplayRequest(position =
the destination's stop position, length = stop - that) to the leader's.

With a live destination, and a source recording that is still live, the
replay goes to a multi-destination subscription under the live stream's
session id.  Once the recording is within a window of the source's live
position the live endpoint is added to the subscription: both streams feed
one image, the replay fills in up to where live data begins, and then the
replay destination is removed and the replay stopped.  The recording simply
carries on from the live stream (MERGE).

The control session with the source archive presents credentials: those the
ReplicateRequest2 carried, else this archive's own replication credentials
(``ArchiveContext.replication_credentials``: the members of a cluster share
one secret); a Challenge is answered with the same credentials.

States follow the exchange: CONNECT, AWAIT_CONNECT, DESCRIBE,
AWAIT_DESCRIPTOR, SRC_POSITION, REPLAY, AWAIT_REPLAY, AWAIT_IMAGE, REPLICATE,
CATCHUP, ATTEMPT_LIVE_JOIN, DONE.  Progress reaches the requesting client as
recording signals: REPLICATE (a new destination recording), EXTEND (its
recording starts), SYNC (the requested stop position is reached), MERGE
(joined the live stream), STOP (the destination recording stops) and
REPLICATE_END (this session is over, successfully or not).
"""

from __future__ import annotations

import random
from enum import Enum
from typing import TYPE_CHECKING, Any

from fulmar.archive import protocol
from fulmar.archive.client import ArchiveProxy, ControlResponsePoller
from fulmar.archive.errors import ArchiveError
from fulmar.archive.protocol import (
    NULL_LENGTH,
    NULL_POSITION,
    NULL_VALUE,
    ArchiveErrorCode,
    ControlResponseCode,
    RecordingSignal,
)
from fulmar.channel_uri import DATAGRAM_MAC_PARAM, ChannelUri
from fulmar.codecs.generated import archive as codecs
from fulmar.errors import FulmarError

if TYPE_CHECKING:
    from fulmar.archive.conductor import ArchiveConductor
    from fulmar.archive.control_session import ControlSession
    from fulmar.archive.recorder import RecordingSession
    from fulmar.publication import ExclusivePublication
    from fulmar.subscription import Image, Subscription

_NULL_INT32 = -(2**31)
# How often the source's live position is asked for while catching up.
SRC_POSITION_INTERVAL_NS = 50_000_000


class ReplicationState(Enum):
    CONNECT = "CONNECT"
    AWAIT_CONNECT = "AWAIT_CONNECT"
    DESCRIBE = "DESCRIBE"
    AWAIT_DESCRIPTOR = "AWAIT_DESCRIPTOR"
    SRC_POSITION = "SRC_POSITION"
    REPLAY = "REPLAY"
    AWAIT_REPLAY = "AWAIT_REPLAY"
    AWAIT_IMAGE = "AWAIT_IMAGE"
    REPLICATE = "REPLICATE"
    CATCHUP = "CATCHUP"
    ATTEMPT_LIVE_JOIN = "ATTEMPT_LIVE_JOIN"
    DONE = "DONE"


class ReplicationSession:
    def __init__(
        self,
        conductor: ArchiveConductor,
        *,
        replication_id: int,
        correlation_id: int,
        control_session: ControlSession,
        src_recording_id: int,
        dst_recording_id: int,
        stop_position: int,
        src_control_channel: str,
        src_control_stream_id: int,
        live_destination: str,
        replication_channel: str,
        replication_session_id: int | None,
        now_ns: int,
        encoded_credentials: bytes = b"",
    ) -> None:
        self.conductor = conductor
        self.aeron = conductor.aeron
        self.replication_id = replication_id
        self.correlation_id = correlation_id
        self.control_session = control_session
        self.src_recording_id = src_recording_id
        self.dst_recording_id = dst_recording_id
        self.stop_position = stop_position
        self.src_control_channel = src_control_channel
        self.src_control_stream_id = src_control_stream_id
        self.live_destination = _live_destination_channel(live_destination)
        self.replication_channel = replication_channel
        self.encoded_credentials = bytes(encoded_credentials)
        if replication_session_id in (None, NULL_VALUE, _NULL_INT32):
            replication_session_id = random.randint(1, 2**31 - 1)
        self.replication_session_id = replication_session_id
        self.timeout_ns = conductor.context.connect_timeout_ns
        self.state = ReplicationState.CONNECT
        self.deadline_ns = now_ns + self.timeout_ns
        self.error: str | None = None
        self.src_control_session_id = NULL_VALUE
        self.src_descriptor: Any = None
        self.src_replay_session_id = NULL_VALUE
        self.src_live_position = NULL_POSITION
        self.replay_start = NULL_POSITION
        self.is_merge = False
        self.recording: RecordingSession | None = None
        self._pending_correlation_id = NULL_VALUE
        self._response: Any = None
        self._next_src_position_ns = 0
        self._join_position = NULL_POSITION
        self._replay_destination = ""
        self._image: Image | None = None
        self._response_subscription: Subscription | None = None
        self._request_publication: ExclusivePublication | None = None
        self._replay_subscription: Subscription | None = None
        self._keep_replay_subscription = False
        self._proxy: ArchiveProxy | None = None
        self._poller: ControlResponsePoller | None = None
        self._challenge: Any = None  # a Challenge from the source archive, to answer

    # ----------------------------------------------------------- duty cycle

    @property
    def is_done(self) -> bool:
        return self.state is ReplicationState.DONE

    def do_work(self, now_ns: int) -> int:
        try:
            if self.state not in (ReplicationState.CONNECT, ReplicationState.DONE):
                self._poll_source()
            handler = getattr(self, "_" + self.state.value.lower())
            return int(handler(now_ns))
        except (FulmarError, ValueError) as error:
            # (a refused channel, a driver error, a source that misbehaves):
            # this replication ends with an ERROR; the archive carries on.
            self.abort(f"{type(error).__name__}: {error}" if not isinstance(error, ArchiveError) else str(error))
            return 1

    def _state(self, state: ReplicationState, now_ns: int) -> None:
        self.state = state
        self.deadline_ns = now_ns + self.timeout_ns

    def _check_deadline(self, now_ns: int, what: str) -> None:
        if now_ns > self.deadline_ns:
            raise ArchiveError(
                f"replication {self.replication_id} of recording {self.src_recording_id} from "
                f"{self.src_control_channel}: timed out {what}"
            )

    # ------------------------------------------------------------- states

    def _connect(self, now_ns: int) -> int:
        if self._response_subscription is None:
            response = ChannelUri.parse(self.replication_channel)
            self._response_subscription = self.aeron.add_subscription(
                str(response), protocol.CONTROL_RESPONSE_STREAM_ID
            )
            request = ChannelUri.parse(self.src_control_channel)
            if request.term_length() is None:
                request = request.with_param("term-length", 64 * 1024)
            self._request_publication = self.aeron.add_exclusive_publication(str(request), self.src_control_stream_id)
            self._proxy = ArchiveProxy(self._request_publication)
            self._poller = ControlResponsePoller(self._response_subscription)
        assert self._request_publication is not None and self._proxy is not None
        endpoint = self._response_subscription.resolved_endpoint
        if endpoint is None or not self._request_publication.is_connected:
            self._check_deadline(now_ns, "connecting to the source archive")
            return 0
        response_channel = str(ChannelUri.parse(self.replication_channel).with_param("endpoint", endpoint))
        correlation_id = self.aeron.next_correlation_id()
        if self._proxy.connect(
            response_channel, protocol.CONTROL_RESPONSE_STREAM_ID, correlation_id, self.encoded_credentials
        ):
            self._await(correlation_id)
            self._state(ReplicationState.AWAIT_CONNECT, now_ns)
            return 1
        self._check_deadline(now_ns, "sending the connect request to the source archive")
        return 0

    def _await_connect(self, now_ns: int) -> int:
        challenge = self._challenge
        if challenge is not None:
            # The source's authenticator wants the credentials (again): the
            # connect's answer then comes with the answer's correlation id.
            assert self._proxy is not None
            correlation_id = self.aeron.next_correlation_id()
            if not self._proxy.challenge_response(
                challenge.control_session_id, correlation_id, self.encoded_credentials
            ):
                self._check_deadline(now_ns, "answering the source archive's challenge")
                return 0
            self._challenge = None
            self._await(correlation_id)
            return 1
        response = self._take_response(now_ns, "awaiting the source archive's connect response")
        if response is None:
            return 0
        self.src_control_session_id = response.control_session_id
        self._state(ReplicationState.DESCRIBE, now_ns)
        return 1

    def _describe(self, now_ns: int) -> int:
        return self._send(
            now_ns,
            ReplicationState.AWAIT_DESCRIPTOR,
            codecs.ListRecordingRequestEncoder,
            recording_id=self.src_recording_id,
        )

    def _await_descriptor(self, now_ns: int) -> int:
        response = self._take_response(now_ns, "awaiting the source recording's descriptor")
        if response is None:
            return 0
        if not isinstance(response, codecs.RecordingDescriptorDecoder):
            raise ArchiveError(f"unknown source recording {self.src_recording_id} at {self.src_control_channel}")
        src = self.src_descriptor
        catalog = self.conductor.catalog
        if self.dst_recording_id == NULL_VALUE:
            self.replay_start = src.start_position
        else:
            dst = catalog.descriptor(self.dst_recording_id)
            if dst is None:
                raise ArchiveError(f"unknown destination recording {self.dst_recording_id}")
            for name in ("stream_id", "term_buffer_length", "initial_term_id", "mtu_length"):
                if getattr(dst, name) != getattr(src, name):
                    raise ArchiveError(
                        f"cannot replicate recording {self.src_recording_id} into {self.dst_recording_id}: "
                        f"{name} {getattr(src, name)} of the source differs from {getattr(dst, name)}"
                    )
            if dst.stop_position == NULL_POSITION:
                raise ArchiveError(f"cannot replicate into active recording {self.dst_recording_id}")
            if dst.stop_position < src.start_position or (
                src.stop_position != NULL_POSITION and dst.stop_position > src.stop_position
            ):
                raise ArchiveError(
                    f"destination recording {self.dst_recording_id} stops at {dst.stop_position}, outside the "
                    f"source recording's range [{src.start_position}, {src.stop_position}]"
                )
            self.replay_start = dst.stop_position
        if self.stop_position != NULL_POSITION:
            if self.stop_position < self.replay_start or self.stop_position & 31:
                raise ArchiveError(
                    f"stop position {self.stop_position} is before the destination's end {self.replay_start} "
                    "or not frame aligned"
                )
            if src.stop_position != NULL_POSITION and self.stop_position > src.stop_position:
                raise ArchiveError(
                    f"stop position {self.stop_position} is past the source recording's stop {src.stop_position}"
                )
        if self.dst_recording_id == NULL_VALUE:
            self.dst_recording_id = catalog.add_recording(
                start_position=src.start_position,
                start_timestamp=self.conductor.epoch_ms(),
                initial_term_id=src.initial_term_id,
                segment_file_length=src.segment_file_length,
                term_buffer_length=src.term_buffer_length,
                mtu_length=src.mtu_length,
                session_id=src.session_id,
                stream_id=src.stream_id,
                stripped_channel=src.stripped_channel,
                original_channel=src.original_channel,
                source_identity=src.source_identity,
                control_session_id=self.control_session.session_id,
                correlation_id=self.correlation_id,
            )
            # Empty and stopped until the replicated image extends it.
            catalog.update_stop(self.dst_recording_id, src.start_position, self.conductor.epoch_ms())
            self._signal(RecordingSignal.REPLICATE, src.start_position)
        if self.stop_position != NULL_POSITION and self.stop_position == self.replay_start:
            self._signal(RecordingSignal.SYNC, self.replay_start)
            self._finish()
            return 1
        self.is_merge = bool(self.live_destination) and src.stop_position == NULL_POSITION
        self._state(ReplicationState.SRC_POSITION if self.is_merge else ReplicationState.REPLAY, now_ns)
        return 1

    def _src_position(self, now_ns: int) -> int:
        if self._pending_correlation_id == NULL_VALUE:
            return self._send(
                now_ns,
                ReplicationState.SRC_POSITION,
                codecs.RecordingPositionRequestEncoder,
                recording_id=self.src_recording_id,
            )
        response = self._take_response(now_ns, "awaiting the source recording's position")
        if response is None:
            return 0
        self.src_live_position = response.relevant_id
        if self.src_live_position == NULL_POSITION:
            self.is_merge = False  # the source stopped meanwhile: a plain replication
        self._state(ReplicationState.REPLAY, now_ns)
        return 1

    def _replay(self, now_ns: int) -> int:
        src = self.src_descriptor
        if self._replay_subscription is None:
            base = ChannelUri.parse(self.replication_channel)
            if self.is_merge:
                params = {"control-mode": "manual", "session-id": str(src.session_id)}
                if base.datagram_mac():  # the MACs are the subscription's endpoint's, not its destinations'
                    params[DATAGRAM_MAC_PARAM] = "true"
                channel = ChannelUri("udp", params)
                self._replay_subscription = self.aeron.add_subscription(
                    str(channel), src.stream_id, on_available_image=self._on_image
                )
                self._replay_destination = str(base)
                self._replay_subscription.add_destination(self._replay_destination)
            else:
                channel = base.with_param("session-id", self.replication_session_id)
                self._replay_subscription = self.aeron.add_subscription(
                    str(channel), src.stream_id, on_available_image=self._on_image
                )
        endpoint = self._replay_subscription.resolved_endpoint
        if endpoint is None:
            self._check_deadline(now_ns, "binding the replication channel")
            return 0
        if self.is_merge:
            self._replay_destination = str(ChannelUri.parse(self.replication_channel).with_param("endpoint", endpoint))
        session_id = src.session_id if self.is_merge else self.replication_session_id
        replay_channel = ChannelUri.parse(self.replication_channel).with_param("endpoint", endpoint)
        replay_channel = replay_channel.with_param("session-id", session_id)
        length = NULL_LENGTH if self.stop_position == NULL_POSITION else self.stop_position - self.replay_start
        return self._send(
            now_ns,
            ReplicationState.AWAIT_REPLAY,
            codecs.ReplayRequestEncoder,
            recording_id=self.src_recording_id,
            position=self.replay_start,
            length=length,
            replay_stream_id=src.stream_id,
            file_io_max_length=NULL_VALUE,
            replay_token=NULL_VALUE,
            replay_channel=str(replay_channel),
        )

    def _await_replay(self, now_ns: int) -> int:
        response = self._take_response(now_ns, "awaiting the source archive's replay response")
        if response is None:
            return 0
        self.src_replay_session_id = response.relevant_id
        self._state(ReplicationState.AWAIT_IMAGE, now_ns)
        return 1

    def _on_image(self, image: Image) -> None:
        # On the client conductor's thread: the agent picks it up.
        self._image = image
        self.conductor.wake()

    def _await_image(self, now_ns: int) -> int:
        image = self._image
        if image is None:
            self._check_deadline(now_ns, "awaiting the replayed stream")
            return 0
        self.recording = self.conductor.extend_from_image(
            self.control_session,
            self.correlation_id,
            self.dst_recording_id,
            image,
            RecordingSignal.EXTEND,
            self.src_descriptor.original_channel,
        )
        self._state(ReplicationState.CATCHUP if self.is_merge else ReplicationState.REPLICATE, now_ns)
        return 1

    def _replicate(self, now_ns: int) -> int:
        recording = self.recording
        assert recording is not None
        if self.stop_position != NULL_POSITION and recording.recorded_position >= self.stop_position:
            self.conductor.stop_recording_session(self.dst_recording_id)
            return 1  # on_recording_stopped finishes the session
        return 0

    def _catchup(self, now_ns: int) -> int:
        """Ask for the source's live position now and then; once the recording
        is within a quarter term of it, add the live destination."""
        recording = self.recording
        assert recording is not None
        if self._pending_correlation_id != NULL_VALUE:
            response = self._take_response(now_ns, "awaiting the source recording's position")
            if response is None:
                return 0
            self.src_live_position = response.relevant_id
            if self.src_live_position == NULL_POSITION:
                self.is_merge = False  # the source stopped: finish as a plain replication
                self._state(ReplicationState.REPLICATE, now_ns)
                return 1
            window = self.src_descriptor.term_buffer_length // 4
            if self.src_live_position - recording.recorded_position <= window:
                assert self._replay_subscription is not None and self.live_destination
                self._replay_subscription.add_destination(self.live_destination)
                # Live frames arrive from now on, starting at or below the
                # source's position from now on: ask for it again; once the
                # replay has filled the image up to there, nothing is missing.
                self._join_position = NULL_POSITION
                return self._send(
                    now_ns,
                    ReplicationState.ATTEMPT_LIVE_JOIN,
                    codecs.RecordingPositionRequestEncoder,
                    recording_id=self.src_recording_id,
                )
            return 1
        if now_ns >= self._next_src_position_ns:
            self._next_src_position_ns = now_ns + SRC_POSITION_INTERVAL_NS
            self.deadline_ns = now_ns + self.timeout_ns
            return self._send(
                now_ns,
                ReplicationState.CATCHUP,
                codecs.RecordingPositionRequestEncoder,
                recording_id=self.src_recording_id,
            )
        return 0

    def _attempt_live_join(self, now_ns: int) -> int:
        """Both streams feed the image; once the recording has passed where live
        data began, the replay is no longer needed."""
        recording = self.recording
        assert recording is not None and self._replay_subscription is not None
        if self._join_position == NULL_POSITION:
            response = self._take_response(now_ns, "awaiting the source recording's position")
            if response is None:
                return 0
            if response.relevant_id == NULL_POSITION:
                raise ArchiveError("the source recording stopped while joining its live stream")
            self._join_position = response.relevant_id
            self.deadline_ns = now_ns + self.timeout_ns
        if recording.recorded_position < self._join_position:
            if recording.is_done:
                raise ArchiveError("the replicated stream ended before it joined the live stream")
            return 0
        self._replay_subscription.remove_destination(self._replay_destination)
        self._stop_source_replay()
        self.conductor.adopt_recording_subscription(self._replay_subscription, self.src_descriptor)
        self._keep_replay_subscription = True
        self._signal(RecordingSignal.MERGE, recording.recorded_position)
        self._finish()
        return 1

    def _done(self, now_ns: int) -> int:
        return 0

    # ------------------------------------------------------------ events

    def on_recording_stopped(self, recording_id: int, position: int) -> None:
        """The destination recording stopped (reached the stop position, the
        replay ended, or it failed)."""
        if recording_id != self.dst_recording_id or self.state is ReplicationState.DONE or self.error is not None:
            return
        if self.stop_position != NULL_POSITION and position < self.stop_position:
            self.abort(f"the replicated stream ended at {position}, before the stop position {self.stop_position}")
            return
        if self.state is ReplicationState.ATTEMPT_LIVE_JOIN or self.state is ReplicationState.CATCHUP:
            self.abort(f"the replicated stream ended at {position} before it joined the live stream")
            return
        self._signal(RecordingSignal.SYNC, position)
        self._finish()

    def abort(self, reason: str, notify: bool = True) -> None:
        """End the replication; ``notify``: it failed, so the requester gets an ERROR."""
        if self.state is ReplicationState.DONE or self.error is not None:
            return
        self.error = reason
        if notify:
            self.conductor.record_error(f"archive: replication {self.replication_id}: {reason}")
            self.control_session.send_error(
                self.correlation_id,
                f"replication {self.replication_id} failed: {reason}",
                ArchiveErrorCode.REPLICATION_CONNECTION_FAILURE,
            )
        if self.recording is not None and not self.recording.is_done:
            self.conductor.stop_recording_session(self.dst_recording_id)
        self._stop_source_replay()
        self._finish()

    def _finish(self) -> None:
        if self.state is not ReplicationState.DONE:
            self.state = ReplicationState.DONE
            self._signal(RecordingSignal.REPLICATE_END, NULL_POSITION)

    def close(self) -> None:
        """Release the channels to the source archive (after DONE)."""
        if self.state is not ReplicationState.DONE:
            self.abort("the replication was closed", notify=False)
        if self._proxy is not None and self.src_control_session_id != NULL_VALUE:
            if self._request_publication is not None and self._request_publication.is_connected:
                self._proxy.close_session(self.src_control_session_id)
        for resource in (self._request_publication, self._response_subscription):
            if resource is not None:
                resource.close()
        if self._replay_subscription is not None and not self._keep_replay_subscription:
            self._replay_subscription.close()
        self._request_publication = self._response_subscription = None

    # ------------------------------------------------------------- plumbing

    def _signal(self, signal: RecordingSignal, position: int) -> None:
        subscription_id = NULL_VALUE
        if self._replay_subscription is not None:
            subscription_id = self._replay_subscription.registration_id
        self.control_session.send_signal(self.correlation_id, self.dst_recording_id, subscription_id, position, signal)

    def _send(self, now_ns: int, next_state: ReplicationState, encoder: Any, **fields: Any) -> int:
        assert self._proxy is not None
        correlation_id = self.aeron.next_correlation_id()
        if self._proxy.send(
            encoder, control_session_id=self.src_control_session_id, correlation_id=correlation_id, **fields
        ):
            self._await(correlation_id)
            self._state(next_state, now_ns)
            return 1
        self._check_deadline(now_ns, f"sending {encoder.NAME} to the source archive")
        return 0

    def _await(self, correlation_id: int) -> None:
        self._pending_correlation_id = correlation_id
        self._response = None

    def _poll_source(self) -> None:
        assert self._poller is not None
        for kind, message in self._poller.poll():
            if message.correlation_id != self._pending_correlation_id:
                continue
            if kind == "descriptor":
                self.src_descriptor = message
                self._response = message
            elif kind == "response":
                self._response = message
            elif kind == "challenge" and self.state is ReplicationState.AWAIT_CONNECT:
                self._challenge = message

    def _take_response(self, now_ns: int, what: str) -> Any:
        """The response to the pending request, once it came (ERROR raises)."""
        response = self._response
        if response is None:
            self._check_deadline(now_ns, what)
            return None
        self._response = None
        self._pending_correlation_id = NULL_VALUE
        if isinstance(response, codecs.RecordingDescriptorDecoder):
            return response
        if response.code_raw == ControlResponseCode.ERROR:
            raise ArchiveError(f"the source archive refused: {response.error_message}")
        return response

    def _stop_source_replay(self) -> None:
        if self._proxy is None or self.src_replay_session_id == NULL_VALUE:
            return
        self._proxy.send(
            codecs.StopReplayRequestEncoder,
            control_session_id=self.src_control_session_id,
            correlation_id=self.aeron.next_correlation_id(),
            replay_session_id=self.src_replay_session_id,
        )
        self.src_replay_session_id = NULL_VALUE


def _live_destination_channel(live_destination: str) -> str:
    """ReplicateRequest2's live destination as a receive destination channel
    (given as a channel, or as a bare host:port endpoint)."""
    if not live_destination:
        return ""
    if live_destination.startswith("aeron:"):
        return live_destination
    return f"aeron:udp?endpoint={live_destination}"
