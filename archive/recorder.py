"""Recording one image to segment files.

A recording session takes the image's committed frames a block at a time
(``Image.block_poll``: whole frames, padding included, exactly as they lie
in the term) and appends them to the recording's segment files, then
publishes the new position on the recording position counter, which is the
"append position" the consensus module reads.  The block is consumed only
after the write returned, so a failed write loses nothing it acknowledged.

With a :class:`NativeRecorder` the blocks are written by its thread
(``archive/native/recorder.h``), woken by the image's data without the agent;
the session keeps what is not a block write: the first block of each
segment (which opens the file), errors, the end of the image, the catalog's
recorded position and progress events, all on the agent's next pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from fulmar._native import ffi, lib
from fulmar.archive.errors import ArchiveError, describe_os_error
from fulmar.archive.segment import ALLOCATION_CHUNK, SegmentWriter
from fulmar.reader_doorbells import THREAD_DOORBELL_TYPE_ID

if TYPE_CHECKING:
    from fulmar.aeron import Aeron, Counter
    from fulmar.archive.control_session import ControlSession
    from fulmar.subscription import Image, Subscription


_RUNNING = int(lib.FULMAR_RECORDER_RUNNING)
_NEEDS_AGENT = int(lib.FULMAR_RECORDER_NEEDS_AGENT)
_FAILED = int(lib.FULMAR_RECORDER_FAILED)
_STAGE_CHECKSUM = int(lib.FULMAR_RECORDER_STAGE_CHECKSUM)
_STAGES = {
    int(lib.FULMAR_RECORDER_STAGE_ALLOCATE): "allocating",
    int(lib.FULMAR_RECORDER_STAGE_WRITE): "writing",
    int(lib.FULMAR_RECORDER_STAGE_SYNC): "syncing",
}


class NativeRecorder:
    """The archive's recorder thread (``archive/native/recorder.h``), which
    sleeps on a thread doorbell of the archive's client: the recording
    subscriptions name it (``doorbell_channel``), so data to record wakes
    the thread and not the agent.  It rings ``agent_doorbell_id`` when a
    session needs the agent."""

    def __init__(self, aeron: Aeron, agent_doorbell_id: int, max_wait_ns: int) -> None:
        self._counter = aeron.add_counter(THREAD_DOORBELL_TYPE_ID, f"archive-recorder-doorbell: {aeron.client_id}")
        self.doorbell_id = self._counter.id
        values = aeron.conductor.cnc.counters_values
        handle = lib.fulmar_recorder_start(
            ffi.cast("char *", values.address), values.capacity, self.doorbell_id, agent_doorbell_id, max_wait_ns
        )
        if handle == ffi.NULL:
            self._counter.close()
            raise OSError(ffi.errno, f"cannot start the archive's recorder thread: errno {ffi.errno}")
        self._handle = handle
        self._values_address = values.address
        self._state = ffi.new("fulmar_recorder_state_t *")
        self._session = ffi.new("fulmar_recorder_session_t *")

    def doorbell_channel(self, channel: str) -> str:
        """``channel`` with the parameter that makes its data ring this thread."""
        return f"{channel}{'|' if '?' in channel else '?'}doorbell-id={self.doorbell_id}"

    def attach(self, image: Image, writer: SegmentWriter, position_counter: Counter, block_length: int) -> int | None:
        """Hand the image's recording to the thread from the writer's
        position: the thread's id for it, or None when every slot is taken."""
        log = image.log
        session = self._session
        session.term_buffers = ffi.cast("char *", log.address)
        session.term_length = log.term_length
        session.position_bits_to_shift = log.position_bits_to_shift
        session.block_length = block_length
        session.subscriber_position_id = image.subscriber_position_id
        session.recording_position_id = position_counter.id
        session.file_sync_level = writer.file_sync_level
        session.checksum = 1 if writer.checksum else 0
        session.allocation_chunk = ALLOCATION_CHUNK
        session.position = writer.position
        session.fd, session.segment_base, session.segment_end, session.allocated_end = writer.open_extent()
        session_id = int(lib.fulmar_recorder_attach(self._handle, session))
        return None if session_id < 0 else session_id

    def state(self, native_id: int) -> tuple[int, int, int, int, int]:
        """(status, errno, stage, position, allocated end) of an attached recording."""
        state = self._state
        if lib.fulmar_recorder_state(self._handle, native_id, state) < 0:
            raise ArchiveError(f"recording {native_id} of the native recorder is not attached")
        return state.status, state.error, state.stage, state.position, state.allocated_end

    def blocks_written(self, native_id: int) -> int:
        """How many blocks the thread wrote for an attached recording."""
        self.state(native_id)
        return int(self._state.blocks)

    def resume(self, native_id: int, writer: SegmentWriter) -> None:
        fd, base, end, allocated_end = writer.open_extent()
        if lib.fulmar_recorder_resume(self._handle, native_id, fd, writer.position, base, end, allocated_end) < 0:
            raise ArchiveError(f"recording {native_id} of the native recorder cannot resume at {writer.position}")

    def halt(self, native_id: int) -> None:
        """The thread touches the recording's image, file and counters no
        more (safe from any thread: the client conductor's, when the image
        goes; a no-op once the recording was released)."""
        lib.fulmar_recorder_halt(self._handle, native_id)

    def release(self, native_id: int) -> None:
        lib.fulmar_recorder_release(self._handle, native_id)

    def close(self) -> None:
        if self._handle is not None:
            lib.fulmar_recorder_stop(self._handle)
            self._handle = None
            self._counter.close()


class RecordingSession:
    def __init__(
        self,
        recording_id: int,
        correlation_id: int,
        control_session: ControlSession | None,
        image: Image,
        writer: SegmentWriter,
        position_counter: Counter,
        block_length: int,
        auto_stop: bool = False,
        on_progress: Callable[[RecordingSession], None] | None = None,
        native: NativeRecorder | None = None,
    ) -> None:
        self.recording_id = recording_id
        self.correlation_id = correlation_id
        self.control_session = control_session
        self.image = image
        self.subscription: Subscription = image.subscription
        self.writer = writer
        self.position_counter = position_counter
        self.block_length = block_length
        self.auto_stop = auto_stop
        self.on_progress = on_progress
        self.error: str | None = None
        # Set by each do_work: this pass wrote a block itself, so the rec-pos
        # watchers are owed a ring (the native thread rings for its own).
        self.wrote = False
        self._aborted = False
        self._done = False
        position_counter.set(image.join_position)
        self._native: NativeRecorder | None = None
        self._native_id: int | None = None
        if native is not None:
            self._native_id = native.attach(image, writer, position_counter, block_length)
            if self._native_id is not None:
                self._native = native
                if image.is_closed:
                    native.halt(self._native_id)  # it went before its callback could find this session

    @property
    def is_native(self) -> bool:
        """The native recorder thread writes this recording's blocks."""
        return self._native_id is not None

    @property
    def native_blocks(self) -> int:
        """Blocks the native thread wrote for this recording (0 without it)."""
        if self._native is not None and self._native_id is not None:
            return self._native.blocks_written(self._native_id)
        return 0

    @property
    def recorded_position(self) -> int:
        if self._native is not None and self._native_id is not None:
            return self._native.state(self._native_id)[3]
        return self.writer.position

    @property
    def is_done(self) -> bool:
        return self._done

    def on_image_unavailable(self) -> None:
        """The image went away (the client conductor's thread): the native
        thread lets go of it at once; the agent finishes on its next pass."""
        native, native_id = self._native, self._native_id  # (the agent may be finishing)
        if native is not None and native_id is not None:
            native.halt(native_id)

    def abort(self) -> None:
        """Stop at the next duty cycle (the subscription was closed, or the archive stops)."""
        self._aborted = True
        if self._native is not None and self._native_id is not None:
            self._native.halt(self._native_id)

    def has_work(self) -> bool:
        """Anything for the agent before it sleeps: the image's data, or with
        the native thread, a session it handed back."""
        if self._native is not None and self._native_id is not None:
            return self._native.state(self._native_id)[0] != _RUNNING
        return self.image.is_data_available()

    def do_work(self, now_ns: int) -> int:
        self.wrote = False
        if self._done:
            return 0
        if self._native is not None and self._native_id is not None:
            return self._native_work()
        if self._aborted:
            self._done = True
            return 1
        return self._record_block()

    def _record_block(self) -> int:
        image = self.image
        try:
            length = image.block_poll(self._write, self.block_length)
        except (ArchiveError, OSError) as error:
            self.error = f"recording {self.recording_id} stopped at {self.writer.position}: {error}"
            self._done = True
            return 1
        if length:
            self.position_counter.set(self.writer.position)
            self.wrote = True
            if self.on_progress is not None:
                self.on_progress(self)
            return 1
        if image.is_closed or image.is_end_of_stream:
            self._done = True
            return 1
        return 0

    def _native_work(self) -> int:
        native, native_id = self._native, self._native_id
        assert native is not None and native_id is not None
        image = self.image
        if self._aborted or image.is_closed:
            native.halt(native_id)  # (from here on the state is final)
        status, error, stage, position, allocated_end = native.state(native_id)
        work = self._adopt(position, allocated_end)
        if status == _RUNNING:
            if image.is_end_of_stream:
                self._stop_native()
                return 1
            return work
        if status == _NEEDS_AGENT:
            # The next block opens the next segment: the agent writes it, as
            # without the thread, and hands the new segment back.
            self._record_block()
            if self._done:
                native.halt(native_id)
                self._finish()
                return 1
            try:
                native.resume(native_id, self.writer)
            except ArchiveError as refused:
                self.error = f"recording {self.recording_id} stopped at {self.writer.position}: {refused}"
                native.halt(native_id)
                self._finish()
            return 1
        if status == _FAILED and stage == _STAGE_CHECKSUM:
            if error < 0:
                problem = f"frame at block offset {lib.FULMAR_CHECKSUM_BAD_FRAME - error} is not a whole frame"
            else:
                problem = "last frame runs past the end of the block"
            self.error = f"recording {self.recording_id} stopped at {position}: {problem}"
        elif status == _FAILED:
            os_error = OSError(error, os.strerror(error))
            self.error = (
                f"recording {self.recording_id} stopped at {position}: {describe_os_error(os_error)} while "
                f"{_STAGES.get(stage, 'recording')} {self.writer.segment_path}"
            )
        self._finish()
        return 1

    def _adopt(self, position: int, allocated_end: int) -> int:
        """Take what the thread wrote as the writer's and the image's."""
        if position == self.writer.position:
            return 0
        self.writer.adopt(position, allocated_end)
        self.image.adopt_position(position)
        if self.on_progress is not None:
            self.on_progress(self)
        return 1

    def _finish(self) -> None:
        """The thread is done with the session: its slot goes, the agent records no more."""
        native, native_id = self._native, self._native_id
        if native is not None and native_id is not None:
            native.release(native_id)
        self._native = None
        self._native_id = None
        self._done = True

    def _write(self, view: memoryview, offset: int, length: int, position: int) -> None:
        self.writer.write(view[offset : offset + length], position)

    def _stop_native(self) -> None:
        """Halt the thread's work on this recording, take what it wrote, let go of it."""
        native, native_id = self._native, self._native_id
        if native is not None and native_id is not None:
            native.halt(native_id)
            _, _, _, position, allocated_end = native.state(native_id)
            self._adopt(position, allocated_end)
            self._finish()

    def close(self) -> None:
        self._stop_native()
        self.writer.close()
        self.position_counter.close()
