"""Recording one image to segment files.

A recording session takes the image's committed frames a block at a time
(``Image.block_poll``: whole frames, padding included, exactly as they lie
in the term) and appends them to the recording's segment files, then
publishes the new position on the recording position counter, which is the
"append position" the consensus module reads.  The block is consumed only
after the write returned, so a failed write loses nothing it acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fulmar.archive.errors import ArchiveError
from fulmar.archive.segment import SegmentWriter

if TYPE_CHECKING:
    from fulmar.aeron import Counter
    from fulmar.archive.control_session import ControlSession
    from fulmar.subscription import Image, Subscription


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
        self._aborted = False
        self._done = False
        position_counter.set(image.join_position)

    @property
    def recorded_position(self) -> int:
        return self.writer.position

    @property
    def is_done(self) -> bool:
        return self._done

    def abort(self) -> None:
        """Stop at the next duty cycle (the subscription was closed, or the archive stops)."""
        self._aborted = True

    def do_work(self, now_ns: int) -> int:
        if self._done:
            return 0
        if self._aborted:
            self._done = True
            return 1
        image = self.image
        try:
            length = image.block_poll(self._write, self.block_length)
        except (ArchiveError, OSError) as error:
            self.error = f"recording {self.recording_id} stopped at {self.writer.position}: {error}"
            self._done = True
            return 1
        if length:
            self.position_counter.set(self.writer.position)
            if self.on_progress is not None:
                self.on_progress(self)
            return 1
        if image.is_closed or image.is_end_of_stream:
            self._done = True
            return 1
        return 0

    def _write(self, view: memoryview, offset: int, length: int, position: int) -> None:
        self.writer.write(view[offset : offset + length], position)

    def close(self) -> None:
        self.writer.close()
        self.position_counter.close()
