"""The archive's agent: control sessions, recordings, replays, replications.

One duty cycle reads the clock once, runs the tasks the client conductor
queued (new images to record), polls the control request subscriptions and
hands each request to its handler, then gives every session (control,
recording, replay, replication) its turn.  The archive runs this agent on
one thread (Aeron's SHARED threading mode): none of it blocks, except for
the short synchronous driver commands of adding a publication or
subscription.

Handlers are named after the request they answer (``on_replay_request``)
and answer on the requesting control session: OK with a relevant id, ERROR
with an ``ArchiveErrorCode`` and a message, or descriptors for listings.
Recording signals (START, STOP, EXTEND, ...) go to the control session that
asked for the recording.

A control session is served only once the archive's authenticator let it in
(``fulmar.archive.control_session``), and only for requests that come from
the stream that opened it.  Sessions opened over the local control channel
are let in without credentials when that channel is IPC (see
``ArchiveContext.authenticator``).  Each refused session counts in the
"Archive control sessions refused" counter and in the error log.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fulmar.archive import protocol
from fulmar.archive.catalog import Catalog, RecordingDescriptor
from fulmar.archive.context import ArchiveContext
from fulmar.archive.control_session import ControlSession
from fulmar.archive.errors import ArchiveError
from fulmar.archive.protocol import (
    NULL_POSITION,
    NULL_VALUE,
    ArchiveErrorCode,
    RecordingSignal,
    SourceLocation,
)
from fulmar.archive.recorder import NativeRecorder, RecordingSession
from fulmar.archive.replayer import ReplaySession
from fulmar.archive.replication import ReplicationSession
from fulmar.archive.segment import (
    SegmentReader,
    SegmentWriter,
    delete_segments,
    detached_segment_files,
    find_start_in_segment,
    segment_file_base_position,
    segment_file_name,
    truncate_segments,
)
from fulmar.channel_uri import ChannelUri
from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import archive as codecs
from fulmar.counters import RECORD_ALLOCATED
from fulmar.errors import FulmarError
from fulmar.fragment_assembler import FragmentAssembler
from fulmar.frames import FRAME_ALIGNMENT
from fulmar.log_reader import Header
from fulmar.logbuffer import compute_term_id_from_position, position_bits_to_shift
from fulmar.semantic_version import major_version, version_text

if TYPE_CHECKING:
    from fulmar.aeron import Aeron
    from fulmar.subscription import Image, Subscription

# Parameters of a channel that identify what is recorded (Aeron's stripped
# channel); the rest (term length, mtu, linger, ...) are the publisher's business.
_STRIPPED_PARAMS = (
    "endpoint",
    "interface",
    "control",
    "control-mode",
    "tags",
    "rejoin",
    "group",
    "cc",
    "fc",
    "gtag",
    "alias",
    "session-id",
    # The recording subscription must speak the channel's datagram MACs.
    "datagram-mac",
)
# Parameters that make two recording subscriptions the same one (Aeron's makeKey).
_KEY_PARAMS = ("endpoint", "interface", "control", "session-id", "tags")
CONTROL_TERM_LENGTH = 64 * 1024
# The recorder thread sleeps until a ring; this bounds a sleep all the same.
NATIVE_RECORDER_MAX_WAIT_NS = 1_000_000_000
_LISTING_BATCH = 32  # descriptors a listing sends per duty cycle


def stripped_channel(uri: ChannelUri) -> str:
    params = {key: value for key, value in uri.params.items() if key in _STRIPPED_PARAMS}
    return str(ChannelUri(uri.media, params))


def subscription_key(stream_id: int, uri: ChannelUri) -> str:
    parts = [f"{key}={uri.get(key)}" for key in _KEY_PARAMS if uri.get(key) is not None]
    return f"{stream_id}:{uri.media}?{'|'.join(parts)}"


class ArchiveConductor:
    def __init__(
        self,
        context: ArchiveContext,
        aeron: Aeron,
        catalog: Catalog,
        epoch_ms: Callable[[], int],
        record_error: Callable[[str], object],
        wake: Callable[[], object],
        log_event: Callable[[str], object] | None = None,
    ) -> None:
        self.context = context
        self.aeron = aeron
        self.catalog = catalog
        self.epoch_ms = epoch_ms
        self._error_log_record = record_error
        self._log_event = log_event
        self.wake = wake
        self.archive_dir = Path(context.archive_dir)
        self.archive_id = context.archive_id if context.archive_id != NULL_VALUE else aeron.client_id
        self.tasks: deque[Callable[[], None]] = deque()
        self.control_sessions: dict[int, ControlSession] = {}
        self.recordings: dict[int, RecordingSession] = {}  # by recording id
        self._recording_starts: dict[int, int] = {}  # start positions of active recordings, for events
        self.replays: dict[int, ReplaySession] = {}  # by replay session id
        self.replications: dict[int, ReplicationSession] = {}  # by replication id
        self.recording_subscriptions: dict[str, Subscription] = {}  # by subscription key
        self._next_session_id = int.from_bytes(os.urandom(4), "little") & 0x3FFF_FFFF
        self._replay_id = 1
        self._now_ns = time.monotonic_ns()
        self._control_subscriptions: list[Subscription] = []
        # One assembler per control subscription: a message is known by the
        # subscription it came on and its image's session id.
        self._assemblers: list[FragmentAssembler] = []
        # Whether a session opened on each subscription must be authenticated.
        # The local control channel, when it is IPC, is let in without: it
        # takes a process that maps this node's driver files (shared memory
        # only the node's user may open) to publish on it at all, and the
        # node's own processes (consensus module, services, cluster-tool) use
        # it.  Every UDP channel, reachable from the network, is authenticated.
        self._authenticated_origins: list[bool] = []
        channels = [(context.local_control_channel, context.local_control_stream_id, True)]
        if context.control_channel is not None:
            channels.append((context.control_channel, context.control_stream_id, False))
        for index, (channel, stream_id, local) in enumerate(channels):
            uri = ChannelUri.parse(channel)
            if uri.is_ipc and uri.term_length() is None:
                uri = uri.with_param("term-length", CONTROL_TERM_LENGTH)
            self._control_subscriptions.append(aeron.add_subscription(str(uri), stream_id))
            self._assemblers.append(FragmentAssembler(self._control_handler(index)))
            self._authenticated_origins.append(not (local and uri.is_ipc) or context.authenticate_local_control)
        key = protocol.archive_id_key(self.archive_id)
        self.error_counter = aeron.add_counter(
            protocol.ARCHIVE_ERROR_COUNT_TYPE_ID, f"Archive Errors - archiveId={self.archive_id}", key
        )
        self.refused_sessions_counter = aeron.add_counter(
            protocol.ARCHIVE_REFUSED_CONTROL_SESSIONS_TYPE_ID,
            f"Archive control sessions refused - archiveId={self.archive_id}",
            key,
        )
        self._refusal_line_due_ms = 0
        self._refusals_unsaid = 0
        self._events = None
        if context.recording_events_channel is not None:
            self._events = aeron.add_publication(context.recording_events_channel, context.recording_events_stream_id)
        # The recorder thread, where the client sleeps on a doorbell of its own
        # (the thread rings it when a recording needs the agent).
        self.native_recorder: NativeRecorder | None = None
        agent_doorbell_id = aeron.conductor.doorbell_id
        if context.native_recorder and agent_doorbell_id is not None:
            self.native_recorder = NativeRecorder(aeron, agent_doorbell_id, NATIVE_RECORDER_MAX_WAIT_NS)
        self._scratch = bytearray(4096)

    # ------------------------------------------------------------ duty cycle

    def do_work(self, now_ns: int) -> int:
        self._now_ns = now_ns
        work = 0
        while self.tasks:
            self.tasks.popleft()()
            work += 1
        for subscription, assembler in zip(self._control_subscriptions, self._assemblers):
            work += subscription.poll(assembler.on_fragment, 16)
        now_ms = self.epoch_ms() if self.control_sessions else 0
        for session in list(self.control_sessions.values()):
            work += session.do_work(now_ns, now_ms)
            if session.active_listing is not None and session.queued_responses == 0:
                work += session.active_listing()
            if session.is_done:
                self._close_control_session(session)
        recorded = 0
        ring_watchers = self.aeron.conductor.ring_counter_watchers
        for recording in list(self.recordings.values()):
            progress = recording.do_work(now_ns)
            if recording.wrote:
                # Whoever waits for this recording (a consensus module: its
                # commit position) watches the rec-pos counter.  (The native
                # recorder thread rings them for the blocks it writes.)
                ring_watchers(recording.position_counter.id)
            recorded += progress
            if recording.is_done:
                self._close_recording(recording)
        work += recorded
        for replay in list(self.replays.values()):
            work += replay.do_work(now_ns)
            if replay.is_done:
                self._close_replay(replay)
        for replication in list(self.replications.values()):
            work += replication.do_work(now_ns)
            if replication.is_done:
                self.replications.pop(replication.replication_id, None)
                replication.close()
        return work

    def has_work(self) -> bool:
        """A cheap check before sleeping (after registering as a waiter): is
        anything already waiting to be read?"""
        if self.tasks:
            return True
        if any(subscription.is_data_available() for subscription in self._control_subscriptions):
            return True
        return any(recording.has_work() for recording in self.recordings.values())

    @property
    def is_busy(self) -> bool:
        """Sessions that make progress without a doorbell ringing (back
        pressure lifting, files to read): the idle strategy sleeps less."""
        return bool(self.replays) or bool(self.replications)

    @property
    def has_pending_control_sessions(self) -> bool:
        """A control session whose progress no doorbell announces: its response
        publication still connecting, responses held back by back pressure, a
        listing under way.  The idle strategy keeps a short pace meanwhile."""
        return any(
            not session.is_active or session.queued_responses or session.active_listing is not None
            for session in self.control_sessions.values()
        )

    def close(self) -> None:
        for recording in list(self.recordings.values()):
            recording.abort()
            self._close_recording(recording)
        for replay in list(self.replays.values()):
            replay.abort()
            self._close_replay(replay)
        for replication in list(self.replications.values()):
            replication.close()
        self.replications.clear()
        for subscription in self.recording_subscriptions.values():
            subscription.close()
        self.recording_subscriptions.clear()
        for session in self.control_sessions.values():
            session.close("the archive is closing")
        self.control_sessions.clear()
        for counter in (self.error_counter, self.refused_sessions_counter):
            counter.close()
        if self.native_recorder is not None:
            self.native_recorder.close()
            self.native_recorder = None

    # ------------------------------------------------------- control requests

    def record_error(self, text: str) -> None:
        """An error in the archive's error log (its mark file), counted in
        "Archive Errors" (Aeron's CountedErrorHandler)."""
        self._error_log_record(text)
        self.error_counter.increment()

    def _control_handler(self, origin_index: int) -> Callable[[memoryview, int, int, Header], None]:
        def on_message(buffer: memoryview, offset: int, length: int, header: Header) -> None:
            self._on_control_message(origin_index, buffer, offset, length, header)

        return on_message

    def _on_control_message(
        self, origin_index: int, buffer: memoryview, offset: int, length: int, header: Header
    ) -> None:
        try:
            message = codecs.decode(buffer, offset, length)
        except CodecError as error:
            self.record_error(f"archive: malformed control request ignored: {error}")
            return
        name = type(message).__name__.removesuffix("Decoder")
        origin = (origin_index, header.session_id)
        if name in ("ConnectRequest", "AuthConnectRequest"):
            self.on_connect_request(message, origin)
            return
        session = self.control_sessions.get(getattr(message, "control_session_id", NULL_VALUE))
        if session is None:
            self.record_error(
                f"archive: {name} for unknown control session {getattr(message, 'control_session_id', '?')}"
            )
            return
        if session.origin != origin:
            # Another client naming this session (a guessed or seen id): not
            # served, whatever its state (Aeron's "unauthorised archive action").
            self.record_error(f"archive: {name} refused: its control session belongs to another client's stream")
            return
        if isinstance(message, codecs.ChallengeResponseDecoder):
            session.on_challenge_response(message.correlation_id, bytes(message.encoded_credentials), self.epoch_ms())
            return
        if name == "CloseSessionRequest":
            self.on_close_session_request(session, message)
            return
        if not session.is_active:
            # Nothing is served before the authenticator let the session in.
            self.record_error(f"archive: {name} on a control session not yet authenticated: not served")
            return
        handler = getattr(self, "on_" + _snake(name), None)
        correlation_id = getattr(message, "correlation_id", NULL_VALUE)
        if handler is None:
            session.send_error(correlation_id, f"{name} is not supported by this archive")
            return
        try:
            handler(session, message)
        except (FulmarError, OSError, ValueError) as error:
            self.record_error(f"archive: {name}: {error}")
            session.send_error(correlation_id, f"{name} failed: {error}")

    def on_connect_request(self, message: Any, origin: tuple[int, int] = (0, 0)) -> None:
        """A ConnectRequest or AuthConnectRequest (the former carries no
        credentials: to an authenticator that wants them it is a client with
        none, challenged or rejected as such)."""
        invalid = None
        if major_version(message.version) != protocol.PROTOCOL_MAJOR_VERSION:
            invalid = (
                f"invalid client version {version_text(message.version)}, "
                f"archive is {version_text(protocol.PROTOCOL_SEMANTIC_VERSION)}"
            )
        uri = ChannelUri.parse(message.response_channel)
        if uri.term_length() is None:
            uri = uri.with_param("term-length", CONTROL_TERM_LENGTH)
        publication = self.aeron.add_exclusive_publication(str(uri), message.response_stream_id)
        session_id = self._next_session_id
        self._next_session_id += 1
        origin_index = origin[0]
        authenticated = origin_index >= len(self._authenticated_origins) or self._authenticated_origins[origin_index]
        authenticator = self.context.authenticator if authenticated else None
        session = ControlSession(
            session_id,
            message.correlation_id,
            publication,
            self._now_ns,
            self.context.connect_timeout_ns,
            invalid,
            authenticator=authenticator,
            origin=origin,
            response_channel=message.response_channel,
        )
        self.control_sessions[session_id] = session
        if authenticator is not None:
            credentials = bytes(getattr(message, "encoded_credentials", b""))
            try:
                authenticator.on_connect_request(session_id, credentials, self.epoch_ms())
            except Exception as error:  # a user's authenticator that fails refuses the session
                session.refusal = f"the authenticator failed: {type(error).__name__}"
                session.close(f"{session.refusal}: {error}")

    def _close_control_session(self, session: ControlSession) -> None:
        self.control_sessions.pop(session.session_id, None)
        session.close(session.close_reason or "closed")
        if session.refusal is not None:
            self._on_refused(session)

    def _on_refused(self, session: ControlSession) -> None:
        """Count and log a refused session.  The error log's text is the same
        for every refusal of one kind (one entry, its observations counted, so
        a stranger's attempts cannot fill it); the log line names the client,
        at most once a second (with how many went unsaid)."""
        self.refused_sessions_counter.increment()
        self.record_error(f"archive: control session refused: {session.refusal}")
        if self._log_event is None:
            return
        now_ms = self.epoch_ms()
        if now_ms < self._refusal_line_due_ms:
            self._refusals_unsaid += 1
            return
        unsaid = f" ({self._refusals_unsaid} more refused since the last line)" if self._refusals_unsaid else ""
        self._refusals_unsaid = 0
        self._refusal_line_due_ms = now_ms + 1_000
        self._log_event(
            # (The channel is the client's text: quoted, so it cannot forge lines.)
            f"refused control session {session.session_id} (response channel {session.response_channel[:200]!r}): "
            f"{session.refusal}{unsaid}"
        )

    def on_close_session_request(self, session: ControlSession, message: Any) -> None:
        session.close("the client closed the session")

    def on_keep_alive_request(self, session: ControlSession, message: Any) -> None:
        pass  # the request itself shows the client is alive; no answer is expected

    def on_archive_id_request(self, session: ControlSession, message: Any) -> None:
        session.send_ok(message.correlation_id, self.archive_id)

    # -------------------------------------------------------------- recording

    def on_start_recording_request(self, session: ControlSession, message: Any, auto_stop: bool = False) -> None:
        self._start_recording(
            session,
            message.correlation_id,
            message.stream_id,
            message.source_location_raw,
            message.channel,
            auto_stop,
            None,
        )

    def on_start_recording_request2(self, session: ControlSession, message: Any) -> None:
        self._start_recording(
            session,
            message.correlation_id,
            message.stream_id,
            message.source_location_raw,
            message.channel,
            message.auto_stop_raw == 1,
            None,
        )

    def on_extend_recording_request(self, session: ControlSession, message: Any) -> None:
        self._start_recording(
            session,
            message.correlation_id,
            message.stream_id,
            message.source_location_raw,
            message.channel,
            False,
            message.recording_id,
        )

    def on_extend_recording_request2(self, session: ControlSession, message: Any) -> None:
        self._start_recording(
            session,
            message.correlation_id,
            message.stream_id,
            message.source_location_raw,
            message.channel,
            message.auto_stop_raw == 1,
            message.recording_id,
        )

    def _start_recording(
        self,
        session: ControlSession,
        correlation_id: int,
        stream_id: int,
        source_location: int,
        channel: str,
        auto_stop: bool,
        extend_recording_id: int | None,
    ) -> Subscription | None:
        if len(self.recordings) >= self.context.max_concurrent_recordings:
            session.send_error(
                correlation_id,
                f"max concurrent recordings reached {self.context.max_concurrent_recordings}",
                ArchiveErrorCode.MAX_RECORDINGS,
            )
            return None
        if extend_recording_id is not None:
            descriptor = self.catalog.descriptor(extend_recording_id)
            if descriptor is None:
                session.send_error(
                    correlation_id, f"unknown recording {extend_recording_id}", ArchiveErrorCode.UNKNOWN_RECORDING
                )
                return None
            if descriptor.stream_id != stream_id:
                session.send_error(
                    correlation_id,
                    f"cannot extend recording {extend_recording_id} with streamId={stream_id} "
                    f"for existing streamId={descriptor.stream_id}",
                    ArchiveErrorCode.UNKNOWN_RECORDING,
                )
                return None
            if extend_recording_id in self.recordings:
                session.send_error(
                    correlation_id,
                    f"cannot extend active recording {extend_recording_id}",
                    ArchiveErrorCode.ACTIVE_RECORDING,
                )
                return None
        uri = ChannelUri.parse(channel)
        key = subscription_key(stream_id, uri)
        if key in self.recording_subscriptions:
            session.send_error(
                correlation_id,
                f"recording exists for streamId={stream_id} channel={channel}",
                ArchiveErrorCode.ACTIVE_SUBSCRIPTION,
            )
            return None
        stripped = stripped_channel(uri)
        subscribe_to = ChannelUri.parse(stripped)
        if source_location == SourceLocation.LOCAL and uri.is_udp:
            subscribe_to = subscribe_to.with_prefix("aeron-spy")

        def on_image(image: Image) -> None:
            # Runs on the client conductor's thread: hand over to the agent.
            self.tasks.append(
                lambda: self._start_recording_session(
                    session, correlation_id, stripped, channel, image, auto_stop, extend_recording_id
                )
            )
            self.wake()

        def on_image_gone(image: Image) -> None:
            # Runs on the client conductor's thread: the recorder thread lets
            # go of the image before its log and position counter do.
            for recording in list(self.recordings.values()):
                if recording.image is image:
                    recording.on_image_unavailable()

        recorder = self.native_recorder
        subscribe_channel = str(subscribe_to) if recorder is None else recorder.doorbell_channel(str(subscribe_to))
        subscription = self.aeron.add_subscription(
            subscribe_channel, stream_id, on_available_image=on_image, on_unavailable_image=on_image_gone
        )
        self.recording_subscriptions[key] = subscription
        session.send_ok(correlation_id, subscription.registration_id)
        return subscription

    def _start_recording_session(
        self,
        session: ControlSession,
        correlation_id: int,
        stripped: str,
        original_channel: str,
        image: Image,
        auto_stop: bool,
        extend_recording_id: int | None,
    ) -> None:
        if image.is_closed:
            return
        subscription = image.subscription
        context = self.context
        if extend_recording_id is None:
            segment_length = max(context.segment_file_length, image.term_buffer_length)
            recording_id = self.catalog.add_recording(
                start_position=image.join_position,
                start_timestamp=self.epoch_ms(),
                initial_term_id=image.initial_term_id,
                segment_file_length=segment_length,
                term_buffer_length=image.term_buffer_length,
                mtu_length=image.mtu_length,
                session_id=image.session_id,
                stream_id=image.stream_id,
                stripped_channel=stripped,
                original_channel=original_channel,
                source_identity=image.source_identity,
                control_session_id=session.session_id,
                correlation_id=correlation_id,
            )
            signal = RecordingSignal.START
        else:
            recording_id = extend_recording_id
            problem = self._extension_problem(recording_id, image)
            if problem is not None:
                session.send_error(correlation_id, problem, ArchiveErrorCode.INVALID_EXTENSION)
                self.record_error(f"archive: {problem}")
                if auto_stop:
                    self._remove_recording_subscription(subscription.registration_id)
                return
            self.catalog.extend(recording_id, session.session_id, correlation_id, image.session_id)
            signal = RecordingSignal.EXTEND
        self._record(session, correlation_id, recording_id, image, signal, auto_stop, native=True)
        self._event(
            codecs.RecordingStartedEncoder,
            recording_id=recording_id,
            start_position=image.join_position,
            session_id=image.session_id,
            stream_id=image.stream_id,
            channel=original_channel,
            source_identity=image.source_identity,
        )

    def _segment_writer(self, descriptor: RecordingDescriptor, position: int) -> SegmentWriter:
        return SegmentWriter(
            self.archive_dir,
            descriptor.recording_id,
            descriptor.start_position,
            descriptor.term_buffer_length,
            descriptor.segment_file_length,
            position=position,
            file_sync_level=self.context.file_sync_level,
            checksum=self.context.record_checksum,
            catalog=self.catalog,
        )

    def _extension_problem(self, recording_id: int, image: Image) -> str | None:
        descriptor = self.catalog.descriptor(recording_id)
        if descriptor is None:
            return f"cannot extend recording {recording_id}: it no longer exists"
        if recording_id in self.recordings:
            return f"cannot extend active recording {recording_id}"
        for name, actual, expected in (
            ("joinPosition", image.join_position, descriptor.stop_position),
            ("initialTermId", image.initial_term_id, descriptor.initial_term_id),
            ("termBufferLength", image.term_buffer_length, descriptor.term_buffer_length),
            ("mtuLength", image.mtu_length, descriptor.mtu_length),
        ):
            if actual != expected:
                label = "stopPosition" if name == "joinPosition" else f"recording {name}"
                return f"cannot extend recording {recording_id} image {name}={actual} not equal to {label}={expected}"
        return None

    def _close_recording(self, recording: RecordingSession) -> None:
        recording_id = recording.recording_id
        self.recordings.pop(recording_id, None)
        self._recording_starts.pop(recording_id, None)
        position = recording.recorded_position
        self.catalog.update_stop(recording_id, position, self.epoch_ms())
        recording.close()
        session = recording.control_session
        if recording.error is not None:
            self.record_error(f"archive: {recording.error}")
            if session is not None:
                session.send_error(recording.correlation_id, recording.error)
        if session is not None:
            session.send_signal(
                recording.correlation_id,
                recording_id,
                recording.subscription.registration_id,
                position,
                RecordingSignal.STOP,
            )
        self._event(
            codecs.RecordingStoppedEncoder,
            recording_id=recording_id,
            start_position=self._descriptor_field(recording_id, "start_position", NULL_POSITION),
            stop_position=position,
        )
        if recording.auto_stop or recording.error is not None:
            self._remove_recording_subscription(recording.subscription.registration_id)
        for replication in self.replications.values():
            replication.on_recording_stopped(recording_id, position)

    def _descriptor_field(self, recording_id: int, name: str, default: int) -> int:
        descriptor = self.catalog.descriptor(recording_id)
        return default if descriptor is None else int(getattr(descriptor, name))

    def _remove_recording_subscription(self, registration_id: int) -> bool:
        for key, subscription in list(self.recording_subscriptions.items()):
            if subscription.registration_id == registration_id:
                del self.recording_subscriptions[key]
                for recording in self.recordings.values():
                    if recording.subscription is subscription:
                        recording.abort()
                subscription.close()
                return True
        return False

    def on_stop_recording_request(self, session: ControlSession, message: Any) -> None:
        key = subscription_key(message.stream_id, ChannelUri.parse(message.channel))
        subscription = self.recording_subscriptions.get(key)
        if subscription is None:
            session.send_error(
                message.correlation_id,
                f"no recording found for streamId={message.stream_id} channel={message.channel}",
                ArchiveErrorCode.UNKNOWN_SUBSCRIPTION,
            )
            return
        self._remove_recording_subscription(subscription.registration_id)
        session.send_ok(message.correlation_id)

    def on_stop_recording_subscription_request(self, session: ControlSession, message: Any) -> None:
        if self._remove_recording_subscription(message.subscription_id):
            session.send_ok(message.correlation_id)
        else:
            session.send_error(
                message.correlation_id,
                f"no recording subscription found for subscriptionId={message.subscription_id}",
                ArchiveErrorCode.UNKNOWN_SUBSCRIPTION,
            )

    def on_stop_recording_by_identity_request(self, session: ControlSession, message: Any) -> None:
        if not self._has_recording(session, message.correlation_id, message.recording_id):
            return
        recording = self.recordings.get(message.recording_id)
        found = 0
        if recording is not None and self._remove_recording_subscription(recording.subscription.registration_id):
            found = 1
        session.send_ok(message.correlation_id, found)

    # --------------------------------------------------------------- queries

    def _has_recording(self, session: ControlSession, correlation_id: int, recording_id: int) -> bool:
        if self.catalog.descriptor(recording_id) is None:
            session.send_error(correlation_id, f"unknown recording {recording_id}", ArchiveErrorCode.UNKNOWN_RECORDING)
            return False
        return True

    def on_recording_position_request(self, session: ControlSession, message: Any) -> None:
        if self._has_recording(session, message.correlation_id, message.recording_id):
            recording = self.recordings.get(message.recording_id)
            session.send_ok(message.correlation_id, NULL_POSITION if recording is None else recording.recorded_position)

    def on_stop_position_request(self, session: ControlSession, message: Any) -> None:
        if self._has_recording(session, message.correlation_id, message.recording_id):
            session.send_ok(message.correlation_id, self._stop_position(message.recording_id))

    def on_start_position_request(self, session: ControlSession, message: Any) -> None:
        if self._has_recording(session, message.correlation_id, message.recording_id):
            session.send_ok(
                message.correlation_id, self._descriptor_field(message.recording_id, "start_position", NULL_POSITION)
            )

    def on_max_recorded_position_request(self, session: ControlSession, message: Any) -> None:
        if self._has_recording(session, message.correlation_id, message.recording_id):
            session.send_ok(message.correlation_id, self._recorded_limit(message.recording_id))

    def _stop_position(self, recording_id: int) -> int:
        if recording_id in self.recordings:
            return NULL_POSITION
        return self._descriptor_field(recording_id, "stop_position", NULL_POSITION)

    def _recorded_limit(self, recording_id: int) -> int:
        """How far the recording is on disk: its live position or its stop position."""
        recording = self.recordings.get(recording_id)
        if recording is not None:
            return recording.recorded_position
        return self._descriptor_field(recording_id, "stop_position", NULL_POSITION)

    def on_find_last_matching_recording_request(self, session: ControlSession, message: Any) -> None:
        next_id = self.catalog.next_recording_id
        if message.min_recording_id < 0 or message.min_recording_id >= next_id:
            session.send_error(
                message.correlation_id,
                f"min recording id outside valid range [0, {max(0, next_id - 1)}]: {message.min_recording_id}",
                ArchiveErrorCode.UNKNOWN_RECORDING,
            )
            return
        found = self.catalog.find_last_matching(
            message.min_recording_id, message.channel, message.stream_id, message.session_id
        )
        if found is None or found == NULL_VALUE:
            session.send_error(
                message.correlation_id,
                f"recording was not found: minRecordingId={message.min_recording_id}, "
                f"sessionId={message.session_id}, streamId={message.stream_id}",
                ArchiveErrorCode.UNKNOWN_RECORDING,
            )
            return
        session.send_ok(message.correlation_id, found)

    def on_list_recording_request(self, session: ControlSession, message: Any) -> None:
        if session.active_listing is not None:
            session.send_error(
                message.correlation_id, "active listing already in progress", ArchiveErrorCode.ACTIVE_LISTING
            )
            return
        descriptor = self.catalog.descriptor(message.recording_id)
        if descriptor is None:
            session.send_recording_unknown(message.correlation_id, message.recording_id)
        else:
            session.send_descriptor(message.correlation_id, self._live_view(descriptor))

    def on_list_recordings_request(self, session: ControlSession, message: Any) -> None:
        self._start_listing(
            session, message.correlation_id, message.from_recording_id, message.record_count, lambda d: True
        )

    def on_list_recordings_for_uri_request(self, session: ControlSession, message: Any) -> None:
        fragment, stream_id = message.channel, message.stream_id
        self._start_listing(
            session,
            message.correlation_id,
            message.from_recording_id,
            message.record_count,
            lambda d: d.stream_id == stream_id and fragment in d.stripped_channel,
        )

    def _start_listing(
        self,
        session: ControlSession,
        correlation_id: int,
        from_recording_id: int,
        count: int,
        matches: Callable[[RecordingDescriptor], bool],
    ) -> None:
        """Send matching descriptors a few per duty cycle (a big catalog must
        not stall the archive), then RECORDING_UNKNOWN if fewer than ``count``
        matched: the end of the listing."""
        if session.active_listing is not None:
            session.send_error(correlation_id, "active listing already in progress", ArchiveErrorCode.ACTIVE_LISTING)
            return
        state = {"next": max(0, from_recording_id), "sent": 0}

        def step() -> int:
            work = 0
            end = self.catalog.next_recording_id
            while work < _LISTING_BATCH and state["sent"] < count and state["next"] < end:
                descriptor = self.catalog.descriptor(state["next"])
                state["next"] += 1
                work += 1
                if descriptor is not None and matches(descriptor):
                    session.send_descriptor(correlation_id, self._live_view(descriptor))
                    state["sent"] += 1
            if state["sent"] >= count:
                session.active_listing = None
            elif state["next"] >= end:
                session.send_recording_unknown(correlation_id, state["next"])
                session.active_listing = None
            return work

        session.active_listing = step

    def _live_view(self, descriptor: RecordingDescriptor) -> RecordingDescriptor:
        """An active recording is listed with a NULL stop position (it is only
        written to the catalog when the recording stops)."""
        if descriptor.recording_id in self.recordings and descriptor.stop_position != NULL_POSITION:
            return dataclasses.replace(descriptor, stop_position=NULL_POSITION)
        return descriptor

    # ------------------------------------------------------------------ replay

    def on_replay_request(self, session: ControlSession, message: Any) -> None:
        self._start_replay(session, message, None)

    def on_bounded_replay_request(self, session: ControlSession, message: Any) -> None:
        self._start_replay(session, message, message.limit_counter_id)

    def _start_replay(self, session: ControlSession, message: Any, limit_counter_id: int | None) -> None:
        correlation_id, recording_id = message.correlation_id, message.recording_id
        if len(self.replays) >= self.context.max_concurrent_replays:
            session.send_error(
                correlation_id,
                f"max concurrent replays reached {self.context.max_concurrent_replays}",
                ArchiveErrorCode.MAX_REPLAYS,
            )
            return
        descriptor = self.catalog.descriptor(recording_id)
        if descriptor is None:
            session.send_error(
                correlation_id, f"unknown recording id {recording_id}", ArchiveErrorCode.UNKNOWN_RECORDING
            )
            return
        position = descriptor.start_position if message.position == NULL_POSITION else message.position
        problem = self._replay_position_problem(recording_id, descriptor, position, message.length)
        if problem is not None:
            session.send_error(correlation_id, problem)
            return
        limit_counter: Callable[[], int] | None = None
        if limit_counter_id is not None:
            bound = self._limit_counter(limit_counter_id)
            if isinstance(bound, str):
                session.send_error(correlation_id, bound)
                return
            limit_counter = bound
        replay_channel = self._replay_channel(message.replay_channel, descriptor, position)
        publication = self.aeron.add_exclusive_publication(replay_channel, message.replay_stream_id)
        replay_session_id = protocol.replay_session_id(self._replay_id, publication.session_id)
        self._replay_id += 1
        try:
            reader_ = SegmentReader(self.archive_dir, descriptor, position)
        except ArchiveError as error:
            publication.close()
            session.send_error(correlation_id, f"cannot replay recording {recording_id}: {error}")
            return
        replay = ReplaySession(
            replay_session_id,
            recording_id,
            correlation_id,
            session,
            publication,
            reader_,
            position,
            message.length,
            lambda: self._recorded_limit(recording_id),
            lambda: self._stop_position(recording_id),
            self._now_ns,
            self.context.connect_timeout_ns,
            self.context.block_length,
            limit_counter,
            verify_checksum=self.context.replay_checksum,
        )
        self.replays[replay_session_id] = replay
        session.send_ok(correlation_id, replay_session_id)

    def _limit_counter(self, counter_id: int) -> Callable[[], int] | str:
        """A bounded replay's limit: the counter's value while it is the counter
        the replay was bounded by (Aeron's ReadableCounter).  Once its owner
        frees it (a consensus module that died) its id may go to another
        counter whose value means nothing here, perhaps a position past what
        was committed: the replay then ends with an error instead of reading
        it.  A counter that is not allocated: why, as text."""
        reader = self.aeron.counters_reader
        try:
            state = reader.counter_state(counter_id)
            registration_id = reader.counter_registration_id(counter_id)
        except (IndexError, ValueError) as error:
            return f"invalid limit counter id {counter_id}: {error}"
        if state != RECORD_ALLOCATED:
            return f"invalid limit counter id {counter_id}: it is not allocated"

        def limit() -> int:
            if (
                reader.counter_state(counter_id) != RECORD_ALLOCATED
                or reader.counter_registration_id(counter_id) != registration_id
            ):
                raise ArchiveError(f"the limit counter {counter_id} of the bounded replay was freed")
            value: int = reader.counter_value(counter_id)
            return value

        return limit

    def _replay_position_problem(
        self, recording_id: int, descriptor: RecordingDescriptor, position: int, length: int
    ) -> str | None:
        if position & (FRAME_ALIGNMENT - 1):
            return (
                f"requested replay start position={position} is not a multiple of FRAME_ALIGNMENT "
                f"({FRAME_ALIGNMENT}) for recording {recording_id}"
            )
        if position < descriptor.start_position:
            return (
                f"requested replay start position={position} is less than recording start "
                f"position={descriptor.start_position} for recording {recording_id}"
            )
        stop = self._stop_position(recording_id)
        if stop != NULL_POSITION and position >= stop and not (position == stop and length == 0):
            return (
                f"requested replay start position={position} must be less than highest recorded "
                f"position={stop} for recording {recording_id}"
            )
        if length != protocol.NULL_LENGTH and length < 0:
            return f"invalid replay length {length} for recording {recording_id}"
        if stop != NULL_POSITION and length != protocol.NULL_LENGTH and position + length > stop:
            return (
                f"requested replay end position={position + length} is past the recording's stop "
                f"position={stop} for recording {recording_id}"
            )
        return None

    def _replay_channel(self, channel: str, descriptor: RecordingDescriptor, position: int) -> str:
        """The replay publication starts where the replay starts, with the
        recording's initial term id, term length and MTU."""
        uri = ChannelUri.parse(channel)
        term_length = descriptor.term_buffer_length
        bits = position_bits_to_shift(term_length)
        term_id = compute_term_id_from_position(position, bits, descriptor.initial_term_id)
        uri = uri.with_param("term-length", term_length).with_param("mtu", descriptor.mtu_length)
        uri = uri.with_initial_position(descriptor.initial_term_id, term_id, position & (term_length - 1))
        if uri.get("linger") is None:
            uri = uri.with_param("linger", f"{self.context.replay_linger_timeout_ns}ns")
        return str(uri)

    def _close_replay(self, replay: ReplaySession) -> None:
        self.replays.pop(replay.replay_session_id, None)
        if replay.error is not None:
            self.record_error(f"archive: {replay.error}")
            replay.control_session.send_error(replay.correlation_id, replay.error)
        replay.close()

    def on_stop_replay_request(self, session: ControlSession, message: Any) -> None:
        replay = self.replays.get(message.replay_session_id)
        if replay is None:
            session.send_error(
                message.correlation_id,
                f"replay session not known for {message.replay_session_id}",
                ArchiveErrorCode.UNKNOWN_REPLAY,
            )
            return
        replay.abort()
        session.send_ok(message.correlation_id)

    def on_stop_all_replays_request(self, session: ControlSession, message: Any) -> None:
        for replay in self.replays.values():
            if message.recording_id == NULL_VALUE or replay.recording_id == message.recording_id:
                replay.abort()
        session.send_ok(message.correlation_id)

    # --------------------------------------------------- truncate and purge

    def _stopped_recording(
        self, session: ControlSession, correlation_id: int, recording_id: int, verb: str
    ) -> RecordingDescriptor | None:
        descriptor = self.catalog.descriptor(recording_id)
        if descriptor is None:
            session.send_error(correlation_id, f"unknown recording {recording_id}", ArchiveErrorCode.UNKNOWN_RECORDING)
            return None
        if any(replay.recording_id == recording_id for replay in self.replays.values()):
            session.send_error(
                correlation_id,
                f"cannot {verb} recording with active replay {recording_id}",
                ArchiveErrorCode.ACTIVE_RECORDING,
            )
            return None
        if recording_id in self.recordings or descriptor.stop_position == NULL_POSITION:
            session.send_error(
                correlation_id, f"cannot {verb} active recording {recording_id}", ArchiveErrorCode.ACTIVE_RECORDING
            )
            return None
        return descriptor

    def on_truncate_recording_request(self, session: ControlSession, message: Any) -> None:
        correlation_id, recording_id, position = message.correlation_id, message.recording_id, message.position
        descriptor = self._stopped_recording(session, correlation_id, recording_id, "truncate")
        if descriptor is None:
            return
        start, stop = descriptor.start_position, descriptor.stop_position
        if position < start or position > stop or position & (FRAME_ALIGNMENT - 1):
            session.send_error(
                correlation_id,
                f"invalid position {position}: start={start} stop={stop} alignment={FRAME_ALIGNMENT}",
            )
            return
        truncate_segments(self.archive_dir, descriptor, position)
        self.catalog.update_stop(recording_id, position, self.epoch_ms())
        session.send_ok(correlation_id)
        session.send_signal(correlation_id, recording_id, NULL_VALUE, position, RecordingSignal.DELETE)

    def on_purge_recording_request(self, session: ControlSession, message: Any) -> None:
        correlation_id, recording_id = message.correlation_id, message.recording_id
        descriptor = self._stopped_recording(session, correlation_id, recording_id, "purge")
        if descriptor is None:
            return
        self.catalog.invalidate(recording_id)
        delete_segments(self.archive_dir, recording_id)
        session.send_ok(correlation_id)
        session.send_signal(correlation_id, recording_id, NULL_VALUE, NULL_POSITION, RecordingSignal.DELETE)

    # ------------------------------------------------- segments (Aeron's detach, purge, attach)

    def _detach_problem(self, recording_id: int, descriptor: RecordingDescriptor, new_start: int) -> str | None:
        """Why the recording's start cannot move to ``new_start`` (Aeron's
        isValidDetach): it must be a segment's first byte past the first
        segment, no later than the segment the recording ends in, and no
        replay may be reading a segment before it."""
        term_length, segment_length = descriptor.term_buffer_length, descriptor.segment_file_length
        start = descriptor.start_position
        if new_start < 0 or new_start != segment_file_base_position(start, new_start, term_length, segment_length):
            return f"invalid segment start: newStartPosition={new_start}"
        lower_bound = segment_file_base_position(start, start, term_length, segment_length) + segment_length
        if new_start < lower_bound:
            return f"invalid detach: newStartPosition={new_start} lowerBound={lower_bound}"
        end = self._recorded_limit(recording_id)
        upper_bound = segment_file_base_position(start, max(end, start), term_length, segment_length)
        if new_start > upper_bound:
            return f"invalid detach: in use, newStartPosition={new_start} upperBound={upper_bound}"
        for replay in self.replays.values():
            if replay.recording_id != recording_id:
                continue
            replay_base = segment_file_base_position(start, replay.position, term_length, segment_length)
            if new_start > replay_base:
                return (
                    f"invalid detach: replay in progress - newStartPosition={new_start} "
                    f"upperBound={replay_base} replaySessionId={replay.replay_session_id}"
                )
        return None

    def _detachable(
        self, session: ControlSession, correlation_id: int, recording_id: int, new_start: int
    ) -> RecordingDescriptor | None:
        descriptor = self.catalog.descriptor(recording_id)
        if descriptor is None:
            session.send_error(correlation_id, f"unknown recording {recording_id}", ArchiveErrorCode.UNKNOWN_RECORDING)
            return None
        problem = self._detach_problem(recording_id, descriptor, new_start)
        if problem is not None:
            session.send_error(correlation_id, problem)
            return None
        return descriptor

    def _move_start(self, recording_id: int, new_start: int) -> None:
        self.catalog.update_start_position(recording_id, new_start)
        if recording_id in self._recording_starts:
            self._recording_starts[recording_id] = new_start

    def _delete_files(self, session: ControlSession, correlation_id: int, recording_id: int, names: list[str]) -> None:
        """Delete the named segment files, answer with their count and signal DELETE (Aeron's deleteSegments)."""
        for name in names:
            path = self.archive_dir / name
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
        session.send_ok(correlation_id, len(names))
        session.send_signal(correlation_id, recording_id, NULL_VALUE, NULL_POSITION, RecordingSignal.DELETE)

    def on_detach_segments_request(self, session: ControlSession, message: Any) -> None:
        """Move the start forward to a segment boundary; the files before it stay on disk (attach takes them back)."""
        correlation_id, recording_id = message.correlation_id, message.recording_id
        if self._detachable(session, correlation_id, recording_id, message.new_start_position) is None:
            return
        self._move_start(recording_id, message.new_start_position)
        session.send_ok(correlation_id)

    def on_delete_detached_segments_request(self, session: ControlSession, message: Any) -> None:
        """Delete the segment files before the start's segment (detached earlier)."""
        correlation_id, recording_id = message.correlation_id, message.recording_id
        descriptor = self.catalog.descriptor(recording_id)
        if descriptor is None:
            session.send_error(correlation_id, f"unknown recording {recording_id}", ArchiveErrorCode.UNKNOWN_RECORDING)
            return
        self._delete_files(session, correlation_id, recording_id, detached_segment_files(self.archive_dir, descriptor))

    def on_purge_segments_request(self, session: ControlSession, message: Any) -> None:
        """Detach and delete: the start moves to ``new_start_position`` and the files before it go."""
        correlation_id, recording_id = message.correlation_id, message.recording_id
        descriptor = self._detachable(session, correlation_id, recording_id, message.new_start_position)
        if descriptor is None:
            return
        self._move_start(recording_id, message.new_start_position)
        moved = dataclasses.replace(descriptor, start_position=message.new_start_position)
        self._delete_files(session, correlation_id, recording_id, detached_segment_files(self.archive_dir, moved))

    def on_attach_segments_request(self, session: ControlSession, message: Any) -> None:
        """Take back detached segment files that join the start, newest first
        (Aeron's attachSegments): each must be a whole segment of this
        recording; the start moves to its first byte, or to the recording's
        first frame in it when the recording began inside it."""
        correlation_id, recording_id = message.correlation_id, message.recording_id
        descriptor = self.catalog.descriptor(recording_id)
        if descriptor is None:
            session.send_error(correlation_id, f"unknown recording {recording_id}", ArchiveErrorCode.UNKNOWN_RECORDING)
            return
        term_length, segment_length = descriptor.term_buffer_length, descriptor.segment_file_length
        start = descriptor.start_position
        position = segment_file_base_position(start, start, term_length, segment_length) - segment_length
        count = 0
        while position >= 0:
            path = self.archive_dir / segment_file_name(recording_id, position)
            if not path.exists():
                break
            size = path.stat().st_size
            if size != segment_length:
                session.send_error(
                    correlation_id, f"{path}: fileLength={size} not equal to segmentLength={segment_length}"
                )
                return
            try:
                offset = find_start_in_segment(path, descriptor, position)
            except ArchiveError as error:
                session.send_error(correlation_id, str(error))
                return
            self._move_start(recording_id, position + offset)
            count += 1
            if offset:
                break  # the recording began inside this segment
            position -= segment_length
        session.send_ok(correlation_id, count)

    # ------------------------------------------------------------ replication

    def on_replicate_request(self, session: ControlSession, message: Any) -> None:
        self._replicate(session, message, NULL_POSITION, NULL_VALUE, NULL_VALUE, "", None)

    def on_tagged_replicate_request(self, session: ControlSession, message: Any) -> None:
        self._replicate(session, message, NULL_POSITION, message.channel_tag_id, message.subscription_tag_id, "", None)

    def on_replicate_request2(self, session: ControlSession, message: Any) -> None:
        self._replicate(
            session,
            message,
            message.stop_position,
            message.channel_tag_id,
            message.subscription_tag_id,
            message.replication_channel,
            message.replication_session_id,
        )

    def _replicate(
        self,
        session: ControlSession,
        message: Any,
        stop_position: int,
        channel_tag_id: int,
        subscription_tag_id: int,
        replication_channel: str,
        replication_session_id: int | None,
    ) -> None:
        correlation_id = message.correlation_id
        dst_recording_id = message.dst_recording_id
        if dst_recording_id != NULL_VALUE and self.catalog.descriptor(dst_recording_id) is None:
            session.send_error(
                correlation_id,
                f"unknown destination recording id {dst_recording_id}",
                ArchiveErrorCode.UNKNOWN_RECORDING,
            )
            return
        if dst_recording_id in self.recordings:
            session.send_error(
                correlation_id,
                f"cannot replicate into active recording {dst_recording_id}",
                ArchiveErrorCode.ACTIVE_RECORDING,
            )
            return
        replication_id = self.aeron.next_correlation_id()
        replication = ReplicationSession(
            self,
            replication_id=replication_id,
            correlation_id=correlation_id,
            control_session=session,
            src_recording_id=message.src_recording_id,
            dst_recording_id=dst_recording_id,
            stop_position=stop_position,
            src_control_channel=message.src_control_channel,
            src_control_stream_id=message.src_control_stream_id,
            live_destination=message.live_destination,
            replication_channel=replication_channel or self.context.replication_channel,
            replication_session_id=replication_session_id,
            now_ns=self._now_ns,
            encoded_credentials=bytes(getattr(message, "encoded_credentials", b""))
            or self.context.replication_credentials,
        )
        self.replications[replication_id] = replication
        session.send_ok(correlation_id, replication_id)

    def on_stop_replication_request(self, session: ControlSession, message: Any) -> None:
        replication = self.replications.pop(message.replication_id, None)
        if replication is None:
            session.send_error(
                message.correlation_id,
                f"unknown replication id {message.replication_id}",
                ArchiveErrorCode.UNKNOWN_REPLICATION,
            )
            return
        replication.abort("stopped by request", notify=False)
        replication.close()
        session.send_ok(message.correlation_id)

    # ---------------------------------------------- used by replication sessions

    def extend_from_image(
        self,
        session: ControlSession,
        correlation_id: int,
        recording_id: int,
        image: Image,
        signal: RecordingSignal,
        original_channel: str,
    ) -> RecordingSession:
        """Record a replicated image into ``recording_id`` (which must stop
        where the image starts)."""
        problem = self._extension_problem(recording_id, image)
        if problem is not None:
            raise ArchiveError(problem)
        self.catalog.extend(recording_id, session.session_id, correlation_id, image.session_id)
        return self._record(session, correlation_id, recording_id, image, signal, False)

    def _record(
        self,
        session: ControlSession,
        correlation_id: int,
        recording_id: int,
        image: Image,
        signal: RecordingSignal,
        auto_stop: bool,
        native: bool = False,
    ) -> RecordingSession:
        """Start recording ``image`` into ``recording_id`` from its join
        position: segment writer, rec-pos counter, session, signal.
        ``native``: the image's subscription rings the recorder thread's
        doorbell, so the thread may write its blocks."""
        descriptor = self.catalog.descriptor(recording_id)
        assert descriptor is not None
        writer = self._segment_writer(descriptor, image.join_position)
        counter = self.aeron.add_counter(
            protocol.RECORDING_POSITION_TYPE_ID,
            protocol.recording_position_label(
                recording_id, image.session_id, image.stream_id, descriptor.stripped_channel, self.archive_id
            ),
            protocol.recording_position_key(recording_id, image.session_id, image.source_identity, self.archive_id),
        )
        on_progress = self._on_recording_progress if self._events is not None else None
        recording = RecordingSession(
            recording_id,
            correlation_id,
            session,
            image,
            writer,
            counter,
            self.context.block_length,
            auto_stop,
            on_progress,
            self.native_recorder if native else None,
        )
        self.recordings[recording_id] = recording
        self._recording_starts[recording_id] = descriptor.start_position
        session.send_signal(
            correlation_id, recording_id, image.subscription.registration_id, image.join_position, signal
        )
        return recording

    def _on_recording_progress(self, recording: RecordingSession) -> None:
        self._event(
            codecs.RecordingProgressEncoder,
            recording_id=recording.recording_id,
            start_position=self._recording_starts.get(recording.recording_id, NULL_POSITION),
            position=recording.recorded_position,
        )

    def adopt_recording_subscription(self, subscription: Subscription, descriptor: Any) -> None:
        """A replication merged into the live stream: its subscription now
        records like one from StartRecording (stop_recording finds it)."""
        key = f"replication:{subscription.registration_id}:{descriptor.stream_id}"
        self.recording_subscriptions[key] = subscription

    def stop_recording_session(self, recording_id: int) -> None:
        recording = self.recordings.get(recording_id)
        if recording is not None:
            recording.abort()
            self._close_recording(recording)

    # ------------------------------------------------------------------ events

    def _event(self, encoder: Any, **fields: Any) -> None:
        if self._events is None:
            return
        length = encoder.encode(self._scratch, 0, **fields)
        self._events.offer(bytes(self._scratch[:length]))  # observers may miss events under back pressure, as in Aeron


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)
