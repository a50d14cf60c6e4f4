"""A simulated archive: the ``AeronArchive`` client API the consensus module
uses, over an in-memory catalog that outlives the node's processes.

Models:

* recordings (``SimRecording``): bytes of whole frames from a start position,
  active or stopped, with a rec-pos counter on the node's driver while active
  (key and type as ``fulmar.archive.protocol``, so the module finds it by
  recording id, session id and archive id as it does in production);
* start/extend recording on a channel (LOCAL: a spy of the local
  publication; REMOTE: the channel as given, a tagged log subscription),
  with auto stop; the recording begins once the image is linked (START or
  EXTEND signal), records what the image receives each time the archive
  runs (``do_work``; the simulator schedules it, so the archive lags the
  log), and stops when the image goes (STOP signal).  An extension whose
  image does not start at the recording's stop position is refused
  asynchronously (INVALID_EXTENSION), as the real archive does;
* stop by subscription or identity, positions (recording, stop, start,
  max recorded), listing, truncate (stopped recordings only, frame
  boundaries), purge;
* replays: a publication (IPC, or UDP to a catchup endpoint) with the
  requested session id from the start position, fed with the recording's
  frames once connected, bounded or following the live recording; a replay
  that does not connect within the connect timeout fails with an
  asynchronous error;
* replication from another node's archive (found by its archive endpoint):
  the source recording's bytes copied into a new or an extended
  recording while both hosts reach each other; signals START/EXTEND, then
  STOP and REPLICATE_END; a replication cut off for the connect timeout
  fails with an asynchronous error (REPLICATION_CONNECTION_FAILURE);
* recording signals and asynchronous errors delivered through
  ``poll_for_signals`` / ``signals`` / ``wait_for_signal``, requests answered
  at once (the simulated archive never times out).

Not modelled: segment files, checksums, the catalog file, detach/attach of
segments, authentication, a replay's session id rewrite in the frame
headers (positions and payloads are what the readers use), file sync: the
archive holds only whole frames, so a torn tail is never seen (the real
archive's recovery truncates to the last whole frame, which is what is here).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from fulmar.archive.catalog import RecordingDescriptor
from fulmar.archive.client import ArchiveResponseError, ArchiveTimeoutError, RecordingSignalEvent
from fulmar.archive.protocol import (
    NULL_POSITION,
    NULL_VALUE,
    RECORDING_POSITION_TYPE_ID,
    ArchiveErrorCode,
    RecordingSignal,
    SourceLocation,
    recording_position_key,
)
from fulmar.channel_uri import ChannelUri
from sim_aeron import SimAeron, SimCounter, SimImage, SimPublication, SimSubscription

CONNECT_TIMEOUT_NS = 5_000_000_000


class SimRecording:
    __slots__ = (
        "recording_id",
        "start_position",
        "data",
        "stop_position",
        "session_id",
        "stream_id",
        "initial_term_id",
        "term_length",
        "mtu",
        "channel",
        "source_identity",
        "counter",
    )

    def __init__(
        self,
        recording_id: int,
        start_position: int,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        term_length: int,
        mtu: int,
        channel: str,
        source_identity: str,
    ) -> None:
        self.recording_id = recording_id
        self.start_position = start_position
        self.data = bytearray()
        self.stop_position = NULL_POSITION  # active while NULL_POSITION
        self.session_id = session_id
        self.stream_id = stream_id
        self.initial_term_id = initial_term_id
        self.term_length = term_length
        self.mtu = mtu
        self.channel = channel
        self.source_identity = source_identity
        self.counter: SimCounter | None = None

    @property
    def recorded_position(self) -> int:
        return self.start_position + len(self.data)

    @property
    def active(self) -> bool:
        return self.stop_position == NULL_POSITION

    def descriptor(self) -> RecordingDescriptor:
        return RecordingDescriptor(
            recording_id=self.recording_id,
            control_session_id=0,
            correlation_id=0,
            start_timestamp=0,
            stop_timestamp=0,
            start_position=self.start_position,
            stop_position=self.stop_position,
            initial_term_id=self.initial_term_id,
            segment_file_length=max(self.term_length, 1 << 20),
            term_buffer_length=self.term_length,
            mtu_length=self.mtu,
            session_id=self.session_id,
            stream_id=self.stream_id,
            stripped_channel=self.channel,
            original_channel=self.channel,
            source_identity=self.source_identity,
        )


class SimArchiveStore:
    """One node's archive directory: what survives the archive's process."""

    def __init__(self, archive_id: int) -> None:
        self.archive_id = archive_id
        self.recordings: dict[int, SimRecording] = {}
        self.next_recording_id = 0

    def after_crash(self) -> None:
        """The archive process died: its active recordings end where they are."""
        for recording in self.recordings.values():
            if recording.active:
                recording.stop_position = recording.recorded_position
            recording.counter = None


class _RecordingTask:
    def __init__(
        self, subscription: SimSubscription, recording_id: int, stream_id: int, channel: str, client: Any
    ) -> None:
        self.client = client
        self.subscription = subscription
        self.extend_id = recording_id  # NULL_VALUE: a new recording
        self.stream_id = stream_id
        self.channel = channel
        self.image: SimImage | None = None
        self.recording: SimRecording | None = None


class _Replay:
    def __init__(
        self,
        replay_id: int,
        recording: SimRecording,
        publication: SimPublication,
        position: int,
        limit: int | None,
        now_ns: int,
        client: Any = None,
    ) -> None:
        self.client = client
        self.replay_id = replay_id
        self.recording = recording
        self.publication = publication
        self.position = position
        self.limit = limit
        self.connect_deadline_ns = now_ns + CONNECT_TIMEOUT_NS
        self.connected = False


class _Replication:
    def __init__(
        self,
        replication_id: int,
        source: SimArchiveProcess,
        src_recording_id: int,
        dst: SimRecording,
        stop_position: int,
        now_ns: int,
        client: Any = None,
        subscription_id: int = NULL_VALUE,
    ) -> None:
        self.client = client
        self.subscription_id = subscription_id
        self.replication_id = replication_id
        self.source = source
        self.src_recording_id = src_recording_id
        self.dst = dst
        self.stop_position = stop_position
        self.last_contact_ns = now_ns


class SimArchiveProcess:
    """The archive process of one node: its recorder, replayer and replicator."""

    def __init__(self, world: Any, node_id: int, store: SimArchiveStore, aeron: SimAeron) -> None:
        self.world = world
        self.node_id = node_id
        self.store = store
        self.aeron = aeron
        self.alive = True
        self.tasks: dict[int, _RecordingTask] = {}  # by subscription id
        self.replays: dict[int, _Replay] = {}
        self.replications: dict[int, _Replication] = {}
        self.clients: list[SimArchive] = []
        self._next_replay_id = 1

    # -- signals to the clients

    def _signal(
        self, recording_id: int, subscription_id: int, position: int, signal: RecordingSignal, client: Any = None
    ) -> None:
        """To the control session that asked for what is signalled (all, if it is not known)."""
        for target in [client] if client is not None else self.clients:
            target._pending.append(
                RecordingSignalEvent(target.control_session_id, 0, recording_id, subscription_id, position, signal)
            )

    def _async_error(self, code: ArchiveErrorCode, correlation_id: int, text: str, client: Any = None) -> None:
        for target in [client] if client is not None else self.clients:
            target._errors.append(ArchiveResponseError(int(code), correlation_id, text))

    # -- recordings

    def _new_recording(
        self,
        start: int,
        session_id: int,
        stream_id: int,
        initial_term_id: int,
        term_length: int,
        mtu: int,
        channel: str,
        source: str,
    ) -> SimRecording:
        recording_id = self.store.next_recording_id
        self.store.next_recording_id += 1
        recording = SimRecording(
            recording_id, start, session_id, stream_id, initial_term_id, term_length, mtu, channel, source
        )
        self.store.recordings[recording_id] = recording
        return recording

    def _activate(self, recording: SimRecording) -> None:
        recording.stop_position = NULL_POSITION
        key = recording_position_key(
            recording.recording_id, recording.session_id, recording.source_identity, self.store.archive_id
        )
        recording.counter = self.aeron.add_counter(
            RECORDING_POSITION_TYPE_ID, f"rec-pos: {recording.recording_id} {recording.session_id}", key
        )
        recording.counter.set(recording.recorded_position)

    def _stop(self, recording: SimRecording, client: Any = None) -> None:
        if recording.active:
            recording.stop_position = recording.recorded_position
            if recording.counter is not None:
                recording.counter.close()
                recording.counter = None
            self._signal(recording.recording_id, NULL_VALUE, recording.stop_position, RecordingSignal.STOP, client)

    def start_recording(
        self, channel: str, stream_id: int, source_location: int, recording_id: int, client: Any = None
    ) -> int:
        uri = ChannelUri.parse(channel)
        subscribed = channel
        if int(source_location) == SourceLocation.LOCAL and uri.media == "udp" and not uri.prefix:
            subscribed = "aeron-spy:" + channel
        if recording_id != NULL_VALUE:
            recording = self.store.recordings.get(recording_id)
            if recording is None:
                raise ArchiveResponseError(
                    int(ArchiveErrorCode.UNKNOWN_RECORDING), 0, f"unknown recording {recording_id}"
                )
            if recording.active:
                raise ArchiveResponseError(
                    int(ArchiveErrorCode.ACTIVE_RECORDING), 0, f"cannot extend active recording {recording_id}"
                )
        subscription = self.aeron.add_subscription(subscribed, stream_id)
        self.tasks[subscription.registration_id] = _RecordingTask(
            subscription, recording_id, stream_id, channel, client
        )
        return subscription.registration_id

    def stop_recording_subscription(self, subscription_id: int) -> None:
        task = self.tasks.pop(subscription_id, None)
        if task is None:
            raise ArchiveResponseError(
                int(ArchiveErrorCode.UNKNOWN_SUBSCRIPTION), 0, f"no recording subscription {subscription_id}"
            )
        self._end_task(task)

    def _end_task(self, task: _RecordingTask) -> None:
        if task.recording is not None:
            self._record(task)
            self._stop(task.recording, task.client)
        task.subscription.close()

    def stop_recording_by_identity(self, recording_id: int) -> bool:
        for sub_id, task in list(self.tasks.items()):
            if task.recording is not None and task.recording.recording_id == recording_id:
                del self.tasks[sub_id]
                self._end_task(task)
                return True
        recording = self.store.recordings.get(recording_id)
        if recording is not None and recording.active:
            self._stop(recording)
            return True
        return False

    def _record(self, task: _RecordingTask) -> int:
        image = task.image
        recording = task.recording
        if image is None or recording is None:
            return 0
        end = image.log.end
        if end <= image.position:
            return 0
        recording.data += image.log.chunk(image.position, end)
        image.position = end
        assert recording.counter is not None
        recording.counter.set(recording.recorded_position)
        self.aeron.conductor.ring_counter_watchers(recording.counter.id)
        return 1

    def _link(self, task: _RecordingTask, image: SimImage) -> None:
        if task.extend_id != NULL_VALUE:
            recording = self.store.recordings[task.extend_id]
            if image.join_position != recording.stop_position or recording.active:
                self._async_error(
                    ArchiveErrorCode.INVALID_EXTENSION,
                    0,
                    f"cannot extend recording {recording.recording_id}: image joined at "
                    f"{image.join_position}, recording stops at {recording.stop_position}",
                    task.client,
                )
                del self.tasks[task.subscription.registration_id]
                task.subscription.close()
                return
            recording.session_id = image.session_id
            self._activate(recording)
            signal = RecordingSignal.EXTEND
        else:
            log = image.log
            recording = self._new_recording(
                image.join_position,
                image.session_id,
                task.stream_id,
                log.initial_term_id,
                log.term_length,
                log.mtu,
                task.channel,
                image.source_identity,
            )
            self._activate(recording)
            signal = RecordingSignal.START
        task.image = image
        task.recording = recording
        self._signal(
            recording.recording_id, task.subscription.registration_id, recording.recorded_position, signal, task.client
        )

    # -- replays

    def start_replay(
        self, recording_id: int, channel: str, stream_id: int, position: int, length: int, client: Any = None
    ) -> int:
        recording = self.store.recordings.get(recording_id)
        if recording is None:
            raise ArchiveResponseError(int(ArchiveErrorCode.UNKNOWN_RECORDING), 0, f"unknown recording {recording_id}")
        if position == NULL_POSITION:
            position = recording.start_position
        if position < recording.start_position or position > recording.recorded_position:
            raise ArchiveResponseError(
                int(ArchiveErrorCode.GENERIC),
                0,
                f"replay position {position} outside [{recording.start_position}, "
                f"{recording.recorded_position}] of recording {recording_id}",
            )
        replay_id = self._next_replay_id
        self._next_replay_id += 1
        uri = ChannelUri.parse(channel)
        session_id = int(uri.params["session-id"]) if "session-id" in uri.params else self.world.next_session_id()
        term_id = recording.initial_term_id + (position >> (recording.term_length.bit_length() - 1))
        replay_channel = str(
            uri.with_param("session-id", session_id)
            .with_initial_position(recording.initial_term_id, term_id, position & (recording.term_length - 1))
            .with_param("term-length", recording.term_length)
        )
        publication = self.aeron.add_exclusive_publication(replay_channel, stream_id)
        limit = None if length < 0 or length >= (1 << 62) else position + length
        self.replays[replay_id] = _Replay(
            replay_id, recording, publication, position, limit, self.world.events.now_ns, client
        )
        return (replay_id << 32) | (session_id & 0xFFFF_FFFF)

    def stop_replay(self, replay_session_id: int) -> None:
        replay = self.replays.pop(replay_session_id >> 32, None)
        if replay is None:
            raise ArchiveResponseError(int(ArchiveErrorCode.UNKNOWN_REPLAY), 0, f"no replay {replay_session_id}")
        replay.publication.close(crashed=True)  # (linger=0: it stops, its receivers time it out)

    def _replay_work(self, replay: _Replay) -> int:
        publication = replay.publication
        if not replay.connected:
            if not publication.is_connected:
                if self.world.events.now_ns > replay.connect_deadline_ns:
                    del self.replays[replay.replay_id]
                    publication.close(crashed=True)
                    self._async_error(ArchiveErrorCode.GENERIC, 0, "replay publication did not connect", replay.client)
                return 0
            replay.connected = True
        recording = replay.recording
        end = recording.recorded_position
        if replay.limit is not None:
            end = min(end, replay.limit)
        work = 0
        if end > replay.position:
            publication.log.data += recording.data[
                replay.position - recording.start_position : end - recording.start_position
            ]
            replay.position = end
            self.world.network.on_appended(publication)
            work = 1
        done = replay.limit is not None and replay.position >= replay.limit
        if done or (
            not recording.active and replay.position >= recording.recorded_position and replay.limit is None and False
        ):
            del self.replays[replay.replay_id]
            publication.close()
        return work

    # -- replication

    def replicate(
        self,
        src_recording_id: int,
        src_control_channel: str,
        dst_recording_id: int,
        stop_position: int,
        client: Any = None,
    ) -> int:
        endpoint = ChannelUri.parse(src_control_channel).params.get("endpoint", "")
        source = self.world.archive_at(endpoint)
        replication_id = self.world.next_id()
        now_ns = self.world.events.now_ns
        if source is None or not self._reaches(source):
            self._async_error(
                ArchiveErrorCode.REPLICATION_CONNECTION_FAILURE,
                replication_id,
                f"cannot reach the source archive at {endpoint}",
                client,
            )
            return replication_id
        src = source.store.recordings.get(src_recording_id)
        if src is None:
            self._async_error(
                ArchiveErrorCode.UNKNOWN_RECORDING,
                replication_id,
                f"unknown source recording {src_recording_id}",
                client,
            )
            return replication_id
        if dst_recording_id != NULL_VALUE:
            dst = self.store.recordings.get(dst_recording_id)
            if dst is None or dst.active:
                raise ArchiveResponseError(
                    int(ArchiveErrorCode.GENERIC), 0, f"cannot replicate into recording {dst_recording_id}"
                )
            self._activate(dst)
            signal = RecordingSignal.EXTEND
        else:
            dst = self._new_recording(
                src.start_position,
                src.session_id,
                src.stream_id,
                src.initial_term_id,
                src.term_length,
                src.mtu,
                src.channel,
                f"replication of {src_recording_id}",
            )
            self._activate(dst)
            signal = RecordingSignal.START
        # (The replication records through a subscription of its own: its
        # signals carry that subscription's id, as the real archive's do.)
        subscription_id = self.world.next_id()
        self._signal(dst.recording_id, subscription_id, dst.recorded_position, RecordingSignal.REPLICATE, client)
        self._signal(dst.recording_id, subscription_id, dst.recorded_position, signal, client)
        self.replications[replication_id] = _Replication(
            replication_id, source, src_recording_id, dst, stop_position, now_ns, client, subscription_id
        )
        return replication_id

    def _reaches(self, source: SimArchiveProcess) -> bool:
        network = self.world.network
        return (
            source.alive
            and network.reachable(self.node_id, source.node_id)
            and network.reachable(source.node_id, self.node_id)
        )

    def stop_replication(self, replication_id: int) -> None:
        replication = self.replications.pop(replication_id, None)
        if replication is None:
            raise ArchiveResponseError(int(ArchiveErrorCode.UNKNOWN_REPLICATION), 0, f"no replication {replication_id}")
        self._stop(replication.dst, replication.client)
        self._signal(
            replication.dst.recording_id,
            NULL_VALUE,
            replication.dst.stop_position,
            RecordingSignal.REPLICATE_END,
            replication.client,
        )

    def _replication_work(self, replication: _Replication) -> int:
        now_ns = self.world.events.now_ns
        dst = replication.dst
        if not self._reaches(replication.source):
            if now_ns - replication.last_contact_ns > CONNECT_TIMEOUT_NS:
                del self.replications[replication.replication_id]
                self._stop(dst, replication.client)
                self._async_error(
                    ArchiveErrorCode.REPLICATION_CONNECTION_FAILURE,
                    replication.replication_id,
                    "the source archive went out of reach",
                    replication.client,
                )
            return 0
        replication.last_contact_ns = now_ns
        src = replication.source.store.recordings.get(replication.src_recording_id)
        if src is None or dst.recorded_position < src.start_position:
            del self.replications[replication.replication_id]
            self._stop(dst, replication.client)
            self._async_error(
                ArchiveErrorCode.GENERIC, replication.replication_id, "source recording gone", replication.client
            )
            return 0
        end = src.recorded_position
        if replication.stop_position != NULL_POSITION:
            end = min(end, replication.stop_position)
        work = 0
        if end > dst.recorded_position:
            dst.data += src.data[dst.recorded_position - src.start_position : end - src.start_position]
            assert dst.counter is not None
            dst.counter.set(dst.recorded_position)
            self.aeron.conductor.ring_counter_watchers(dst.counter.id)
            work = 1
        if replication.stop_position != NULL_POSITION and dst.recorded_position >= replication.stop_position:
            del self.replications[replication.replication_id]
            self._stop(dst, replication.client)
            self._signal(
                dst.recording_id, NULL_VALUE, dst.stop_position, RecordingSignal.REPLICATE_END, replication.client
            )
        elif not src.active and dst.recorded_position >= src.recorded_position:
            del self.replications[replication.replication_id]
            self._stop(dst, replication.client)
            self._signal(
                dst.recording_id, NULL_VALUE, dst.stop_position, RecordingSignal.REPLICATE_END, replication.client
            )
        return work

    # -- the duty cycle

    def do_work(self) -> int:
        if not self.alive:
            return 0
        work = self.aeron.do_work()
        for sub_id, task in list(self.tasks.items()):
            if task.image is None:
                image = task.subscription.images[0] if task.subscription.images else None
                if image is not None:
                    self._link(task, image)
                continue
            work += self._record(task)
            image = task.image
            if image.is_closed or image.is_end_of_stream:
                self.tasks.pop(sub_id, None)
                self._end_task(task)
        for replay in list(self.replays.values()):
            work += self._replay_work(replay)
        for replication in list(self.replications.values()):
            work += self._replication_work(replication)
        return work

    def crash(self) -> None:
        self.alive = False
        self.aeron.close(crashed=True)
        self.store.after_crash()
        for client in self.clients:
            client._archive_gone = True


class _Proxy:
    def __init__(self, client: SimArchive) -> None:
        self.publication = self
        self._client = client

    @property
    def is_connected(self) -> bool:
        return self._client.process.alive and not self._client._archive_gone


class SimArchive:
    """``fulmar.archive.client.AeronArchive`` for one client process of the node's archive."""

    def __init__(self, process: SimArchiveProcess, control_session_id: int, aeron: SimAeron | None = None) -> None:
        self.process = process
        self.aeron = aeron  # the client's own (a replay it subscribes to is its)
        self.control_session_id = control_session_id
        self.signals: deque[RecordingSignalEvent] = deque()
        self.last_correlation_id = NULL_VALUE
        self._pending: list[RecordingSignalEvent] = []
        self._errors: list[ArchiveResponseError] = []
        self._archive_gone = False
        self.proxy = _Proxy(self)
        process.clients.append(self)

    def _check(self) -> SimArchiveProcess:
        if not self.process.alive:
            raise ArchiveTimeoutError("the archive does not answer")
        self.last_correlation_id = self.process.world.next_id()
        return self.process

    def _take_signals(self) -> None:
        if self._pending:
            self.signals.extend(self._pending)
            self._pending.clear()

    def _recording(self, recording_id: int) -> Any:
        recording = self._check().store.recordings.get(recording_id)
        if recording is None:
            raise ArchiveResponseError(
                int(ArchiveErrorCode.UNKNOWN_RECORDING), self.last_correlation_id, f"unknown recording {recording_id}"
            )
        return recording

    # -- recording

    def start_recording(
        self, channel: str, stream_id: int, source_location: int = SourceLocation.LOCAL, auto_stop: bool = False
    ) -> int:
        return self._check().start_recording(channel, stream_id, source_location, NULL_VALUE, self)

    def extend_recording(
        self,
        recording_id: int,
        channel: str,
        stream_id: int,
        source_location: int = SourceLocation.LOCAL,
        auto_stop: bool = False,
    ) -> int:
        return self._check().start_recording(channel, stream_id, source_location, recording_id, self)

    def stop_recording_subscription(self, subscription_id: int) -> None:
        self._check().stop_recording_subscription(subscription_id)
        self._take_signals()

    def stop_recording_by_identity(self, recording_id: int) -> bool:
        stopped = self._check().stop_recording_by_identity(recording_id)
        self._take_signals()
        return stopped

    def get_recording_position(self, recording_id: int) -> int:
        """(A client that polls this waits on the wall clock: the archive runs meanwhile.)"""
        self._check().do_work()
        recording = self._recording(recording_id)
        return recording.recorded_position if recording.active else NULL_POSITION

    def get_stop_position(self, recording_id: int) -> int:
        return int(self._recording(recording_id).stop_position)

    def get_start_position(self, recording_id: int) -> int:
        return int(self._recording(recording_id).start_position)

    def get_max_recorded_position(self, recording_id: int) -> int:
        return int(self._recording(recording_id).recorded_position)

    def archive_id(self) -> int:
        return self._check().store.archive_id

    def list_recordings(self, from_recording_id: int = 0, record_count: int = 1 << 30) -> list[RecordingDescriptor]:
        recordings = self._check().store.recordings
        ids = sorted(i for i in recordings if i >= from_recording_id)[:record_count]
        return [recordings[i].descriptor() for i in ids]

    def list_recording(self, recording_id: int) -> RecordingDescriptor | None:
        recording = self._check().store.recordings.get(recording_id)
        return recording.descriptor() if recording is not None else None

    def truncate_recording(self, recording_id: int, position: int) -> None:
        recording = self._recording(recording_id)
        if recording.active:
            raise ArchiveResponseError(
                int(ArchiveErrorCode.ACTIVE_RECORDING),
                self.last_correlation_id,
                f"cannot truncate active recording {recording_id}",
            )
        if position < recording.start_position or position > recording.stop_position or position % 32:
            raise ArchiveResponseError(
                int(ArchiveErrorCode.GENERIC),
                self.last_correlation_id,
                f"invalid truncate position {position} for recording {recording_id}",
            )
        del recording.data[position - recording.start_position :]
        recording.stop_position = position

    def purge_recording(self, recording_id: int) -> None:
        recording = self._recording(recording_id)
        if recording.active:
            raise ArchiveResponseError(
                int(ArchiveErrorCode.ACTIVE_RECORDING),
                self.last_correlation_id,
                f"cannot purge active recording {recording_id}",
            )
        del self.process.store.recordings[recording_id]
        self._pending.append(
            RecordingSignalEvent(
                self.control_session_id, 0, recording_id, NULL_VALUE, NULL_POSITION, RecordingSignal.DELETE
            )
        )

    # -- replay and replication

    def start_replay(
        self,
        recording_id: int,
        replay_channel: str,
        replay_stream_id: int,
        position: int = NULL_POSITION,
        length: int = -1,
        limit_counter_id: int | None = None,
    ) -> int:
        return self._check().start_replay(recording_id, replay_channel, replay_stream_id, position, length, self)

    def replay(
        self,
        recording_id: int,
        replay_channel: str,
        replay_stream_id: int,
        position: int = NULL_POSITION,
        length: int = -1,
        limit_counter_id: int | None = None,
    ) -> Any:
        """Start a replay and subscribe the client to it (its session id's image)."""
        assert self.aeron is not None
        replay_session_id = self.start_replay(recording_id, replay_channel, replay_stream_id, position, length)
        low = replay_session_id & 0xFFFF_FFFF
        session_id = low - (1 << 32) if low >= 1 << 31 else low
        channel = ChannelUri.parse(replay_channel).with_param("session-id", session_id)
        return self.aeron.add_subscription(str(channel), replay_stream_id)

    def stop_replay(self, replay_session_id: int) -> None:
        self._check().stop_replay(replay_session_id)

    def replicate(
        self,
        src_recording_id: int,
        src_control_channel: str,
        src_control_stream_id: int = 10,
        dst_recording_id: int = NULL_VALUE,
        stop_position: int = NULL_POSITION,
        **options: Any,
    ) -> int:
        return self._check().replicate(src_recording_id, src_control_channel, dst_recording_id, stop_position, self)

    def stop_replication(self, replication_id: int) -> None:
        self._check().stop_replication(replication_id)
        self._take_signals()

    # -- signals

    def poll_for_signals(self) -> int:
        if not self.process.alive:
            return 0
        count = len(self._pending)
        self._take_signals()
        if self._errors:
            raise self._errors.pop(0)
        return count

    def wait_for_signal(
        self, predicate: Callable[[RecordingSignalEvent], bool], timeout_ns: int | None = None
    ) -> RecordingSignalEvent:
        """As the real client: the archive runs meanwhile (here: a few of its duty cycles)."""
        for _ in range(100):
            self.poll_for_signals()
            while self.signals:
                event = self.signals.popleft()
                if predicate(event):
                    return event
            self.process.do_work()
        raise ArchiveTimeoutError("the awaited recording signal did not come")

    def close(self) -> None:
        if self in self.process.clients:
            self.process.clients.remove(self)
