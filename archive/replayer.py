"""Replaying a recording onto a publication.

The archive adds an exclusive publication whose stream starts exactly where
the replay starts (same initial term id, term id and term offset as the
recording at that position), so the recorded frames can be appended as
they are: blocks of whole frames from the segment files go straight into
the publication's log (``ExclusivePublication.offer_frames``), which only
rewrites their session and stream ids.  The subscriber sees the same
positions as the original stream.

The replay stops at ``start + length``; with no length it runs to the end of
the recording, and if the recording is still live it follows it until the
recording stops.  A bounded replay never passes the value of a limit
counter (e.g. a commit position).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from fulmar.archive.errors import ArchiveError, SegmentError
from fulmar.archive.protocol import NULL_LENGTH, NULL_POSITION
from fulmar.archive.segment import SegmentReader, checksum_mismatch
from fulmar.errors import InvalidFrameBlockError
from fulmar.frames import FRAME_ALIGNMENT, FrameType, align
from fulmar.log_writer import ADMIN_ACTION, BACK_PRESSURED, NOT_CONNECTED
from fulmar.publication import ExclusivePublication

if TYPE_CHECKING:
    from fulmar.archive.control_session import ControlSession

_LENGTH_AND_TYPE = struct.Struct("<i2xH")
_DATA = int(FrameType.DATA)
_PAD = int(FrameType.PAD)


class ReplayState(Enum):
    INIT = "INIT"  # waiting for the replay publication to connect
    REPLAY = "REPLAY"
    DONE = "DONE"


class ReplaySession:
    def __init__(
        self,
        replay_session_id: int,
        recording_id: int,
        correlation_id: int,
        control_session: ControlSession,
        publication: ExclusivePublication,
        reader: SegmentReader,
        start_position: int,
        length: int,
        recorded_limit: Callable[[], int],
        stop_position: Callable[[], int],
        now_ns: int,
        connect_timeout_ns: int,
        block_length: int,
        limit_counter: Callable[[], int] | None = None,
        verify_checksum: bool = False,
    ) -> None:
        """``recorded_limit()`` is how far the recording is on disk now (its
        position counter while live, else its stop position);
        ``stop_position()`` is the recording's stop position, NULL_POSITION
        while it is live.  ``limit_counter()`` bounds a bounded replay.
        ``verify_checksum`` (the archive's replay checksum) checks each DATA
        frame's recorded checksum before it is sent."""
        self.replay_session_id = replay_session_id
        self.recording_id = recording_id
        self.correlation_id = correlation_id
        self.control_session = control_session
        self.publication = publication
        self.reader = reader
        self.position = start_position
        self.end_position = NULL_POSITION if length == NULL_LENGTH else start_position + length
        self.recorded_limit = recorded_limit
        self.stop_position = stop_position
        self.limit_counter = limit_counter
        self.verify_checksum = verify_checksum
        self.block_length = block_length
        self.state = ReplayState.INIT
        self.connect_deadline_ns = now_ns + connect_timeout_ns
        self.error: str | None = None
        self._pending: memoryview | None = None

    @property
    def is_done(self) -> bool:
        return self.state is ReplayState.DONE

    def abort(self, reason: str | None = None) -> None:
        if reason is not None and self.error is None:
            self.error = reason
        self.state = ReplayState.DONE

    def waiting_on_back_pressure(self) -> bool:
        return self._pending is not None

    def do_work(self, now_ns: int) -> int:
        if self.state is ReplayState.INIT:
            if self.publication.is_connected:
                self.state = ReplayState.REPLAY
            elif now_ns > self.connect_deadline_ns:
                self.abort(f"no connection established for replay of recording {self.recording_id}")
                return 1
            else:
                return 0
        if self.state is not ReplayState.REPLAY:
            return 0
        try:
            return self._replay()
        except (ArchiveError, InvalidFrameBlockError) as error:
            # A segment that is not what was recorded (a hole, a frame whose
            # term id or offset is wrong): end the replay and say where.
            self.abort(f"replay of recording {self.recording_id} failed at {self.position}: {error}")
            return 1

    def _replay(self) -> int:
        if not self.publication.is_connected:
            # Its subscriber went away (as Aeron's ReplaySession): a replay
            # waiting at its limit offers nothing that would tell it, and would
            # otherwise hold its recording (no truncate, no purge) for good.
            self.abort()
            return 1
        block = self._pending
        if block is None:
            limit = self._limit()
            if self.position >= limit:
                if self._finished():
                    self.state = ReplayState.DONE
                    return 1
                return 0
            room = min(self.block_length, self.publication.position_limit - self.position)
            if room <= 0:
                return 0
            try:
                block = self.reader.read(limit, room)
            except ValueError:
                return 0  # the next frame is longer than the room the subscriber left: wait
            if not len(block):
                return 0
            if self.verify_checksum:
                self._verify(block)
        result = self.publication.offer_frames(block)
        if result == ADMIN_ACTION:
            result = self.publication.offer_frames(block)
        if result > 0:
            self._pending = None
            self.position = result
            return 1
        if result == NOT_CONNECTED:
            self.abort()  # the replay's subscriber went away
            return 1
        if result != BACK_PRESSURED and result != ADMIN_ACTION:
            self.abort(f"replay publication refused a block ({result})")
            return 1
        self._pending = block
        return 0

    def _verify(self, block: memoryview) -> None:
        """Aeron's ReplaySession.verifyChecksum: a frame whose bytes do not match
        the checksum recorded with them ends the replay before it is sent.  The
        frame type is checked on the way (the checksum covers only the payload,
        and the publication checks only term ids and offsets)."""
        offset = 0
        while offset < len(block):
            position = self.position + offset
            frame_length, frame_type = _LENGTH_AND_TYPE.unpack_from(block, offset)
            if frame_type not in (_DATA, _PAD):
                raise SegmentError(
                    f"recording {self.recording_id}: the frame at position {position} "
                    f"({self.reader.describe(position)}) has type {frame_type}, neither DATA nor PAD"
                )
            mismatch = checksum_mismatch(block, offset)
            if mismatch is not None:
                recorded, computed = mismatch
                raise SegmentError(
                    f"recording {self.recording_id}: CRC checksum mismatch in the frame at position {position} "
                    f"({self.reader.describe(position)}): recorded checksum={recorded}, computed checksum={computed}"
                )
            offset += align(frame_length, FRAME_ALIGNMENT)

    def _limit(self) -> int:
        limit = self.recorded_limit()
        if self.end_position != NULL_POSITION:
            limit = min(limit, self.end_position)
        if self.limit_counter is not None:
            limit = min(limit, self.limit_counter())
        return limit

    def _finished(self) -> bool:
        if self.end_position != NULL_POSITION and self.position >= self.end_position:
            return True
        stop = self.stop_position()
        return stop != NULL_POSITION and self.position >= stop

    def close(self) -> None:
        self.reader.close()
        self.publication.close()
