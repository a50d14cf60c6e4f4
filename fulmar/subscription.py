"""Client subscriptions and their images.

A ``Subscription`` holds one ``Image`` per publication (session) it receives.
``Image.poll`` reads fragments from the image's log buffer and publishes the
subscriber position the driver uses for flow control; ``Subscription.poll``
polls its images fairly (round robin, starting one further each time).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from fulmar._native import lib
from fulmar.buffers import AtomicBuffer
from fulmar.counters import counter_offset
from fulmar.frames import FRAME_ALIGNMENT, HEADER_LENGTH
from fulmar.log_reader import BATCH_CAPACITY, FragmentBatch, FragmentHandler, Header, LogReader, SessionMessagesHandler
from fulmar.logbuffer import LogBuffers

if TYPE_CHECKING:
    from fulmar.aeron import ClientConductor

_INT64_MAX = (1 << 63) - 1


class ControlledAction(IntEnum):
    """What a controlled fragment handler tells the poll to do next."""

    ABORT = 1  # do not consume this fragment; stop the poll (it is delivered again)
    BREAK = 2  # consume this fragment and stop the poll
    COMMIT = 3  # consume and publish the position now, then continue
    CONTINUE = 4  # consume and continue


ControlledFragmentHandler = Callable[[memoryview, int, int, Header], ControlledAction]
ImageHandler = Callable[["Image"], None]
# (log view, offset of the block in it, length, stream position of its start)
BlockHandler = Callable[[memoryview, int, int, int], None]


class Image:
    """One publication's stream as seen by one subscription."""

    def __init__(
        self,
        subscription: Subscription,
        correlation_id: int,
        session_id: int,
        log: LogBuffers,
        counters_values: AtomicBuffer,
        subscriber_position_id: int,
        source_identity: str,
    ) -> None:
        self.subscription = subscription
        self.correlation_id = correlation_id
        self.session_id = session_id
        self.log = log
        self.subscriber_position_id = subscriber_position_id
        self.source_identity = source_identity
        offset = counter_offset(subscriber_position_id)
        self.join_position = counters_values.get_int64_volatile(offset)
        self._reader = LogReader(log, self.join_position, counters_values, offset)
        self._term_length = log.term_length
        self._closed = False

    @property
    def position(self) -> int:
        return self._reader.position

    @position.setter
    def position(self, position: int) -> None:
        """Move the read position within the current term window (e.g. to skip)."""
        self._reader.position = position

    def adopt_position(self, position: int) -> None:
        """Someone else read up to ``position`` and published it (see
        ``LogReader.adopt_position``)."""
        self._reader.adopt_position(position)

    @property
    def stream_id(self) -> int:
        return self.subscription.stream_id

    @property
    def term_buffer_length(self) -> int:
        return self._term_length

    @property
    def initial_term_id(self) -> int:
        return self.log.initial_term_id

    @property
    def mtu_length(self) -> int:
        return self.log.mtu

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_end_of_stream(self) -> bool:
        """True once every message of a closed publication has been read."""
        return self._reader.position >= self.log.end_of_stream_position

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        if self._closed:
            return 0
        return self._reader.poll(handler, fragment_limit)

    def is_data_available(self) -> bool:
        """Whether a poll now would find a fragment (or padding) to read."""
        return not self._closed and self._reader.is_data_available()

    def bounded_poll(self, handler: FragmentHandler, limit_position: int, fragment_limit: int) -> int:
        """Poll, never reading a fragment that ends past ``limit_position``
        (the clustered service reads the log bounded by the commit position)."""
        if self._closed:
            return 0
        return self._reader.bounded_poll(handler, limit_position, fragment_limit)

    def bounded_poll_session_runs(
        self,
        handler: FragmentHandler,
        on_session_messages: SessionMessagesHandler,
        limit_position: int,
        fragment_limit: int,
    ) -> int:
        """:meth:`bounded_poll`, with each run of whole cluster client messages
        handed over in one call (``LogReader.bounded_poll_session_runs``)."""
        if self._closed:
            return 0
        return self._reader.bounded_poll_session_runs(handler, on_session_messages, limit_position, fragment_limit)

    def scan(self, fragment_limit: int = BATCH_CAPACITY, limit_position: int = _INT64_MAX) -> FragmentBatch:
        """Consume a batch of fragments and return it whole (no per-fragment call)."""
        if self._closed:
            return FragmentBatch()
        return self._reader.scan(fragment_limit, limit_position)

    def block_poll(self, handler: BlockHandler, block_length_limit: int) -> int:
        """Hand the next run of whole committed frames (data and padding, as
        laid in the term, never past its end) to ``handler(view, offset,
        length, position)`` in one call, then consume it: Aeron's
        ``blockPoll``, which the archive records with.  If the handler raises,
        nothing is consumed.  Returns the bytes consumed."""
        if self._closed:
            return 0
        reader = self._reader
        position = reader.position
        term_length = self._term_length
        term_offset = position & (term_length - 1)
        partition_offset = (position >> self.log.position_bits_to_shift) % 3 * term_length
        limit_offset = min(term_length, term_offset + block_length_limit)
        end = int(lib.fulmar_term_block_scan(self.log.address + partition_offset, term_offset, limit_offset))
        length = end - term_offset
        if length > 0:
            handler(reader.view, partition_offset + term_offset, length, position)
            reader.position = position + length
        return length

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        """Poll with a handler that decides, fragment by fragment, whether to
        consume it (CONTINUE, COMMIT), stop after it (BREAK) or leave it (ABORT)."""
        if self._closed:
            return 0
        reader = self._reader
        start = reader.position
        batch = reader.peek(fragment_limit, _INT64_MAX)
        if not batch.count:
            if batch.next_position != start:
                reader.position = batch.next_position  # only padding: step over it
            return 0
        view = reader.view
        header = reader.header
        term_length = self._term_length
        term_start = start - (start & (term_length - 1))
        partition_base = (start >> (term_length.bit_length() - 1)) % 3 * term_length
        position = start
        handled = 0
        finished = True
        for frame_offset, frame_length in zip(batch.frame_offsets, batch.frame_lengths):
            header.offset = frame_offset
            frame_position = term_start + frame_offset - partition_base
            action = handler(view, frame_offset + HEADER_LENGTH, frame_length - HEADER_LENGTH, header)
            if action == ControlledAction.ABORT:
                position = frame_position
                finished = False
                break
            handled += 1
            position = frame_position + ((frame_length + FRAME_ALIGNMENT - 1) & ~(FRAME_ALIGNMENT - 1))
            if action == ControlledAction.BREAK:
                finished = False
                break
            if action == ControlledAction.COMMIT:
                reader.position = position
        if finished:
            position = batch.next_position  # includes padding after the last fragment
        if position != reader.position:
            reader.position = position
        return handled

    def _close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return (
            f"Image(session_id={self.session_id}, stream_id={self.stream_id}, position={self.position}, "
            f"source={self.source_identity!r})"
        )


class Subscription:
    def __init__(
        self,
        conductor: ClientConductor,
        channel: str,
        stream_id: int,
        registration_id: int,
        on_available_image: ImageHandler | None,
        on_unavailable_image: ImageHandler | None,
    ) -> None:
        self._conductor = conductor
        self.channel = channel
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.on_available_image = on_available_image
        self.on_unavailable_image = on_unavailable_image
        self._images: tuple[Image, ...] = ()
        self._round_robin = 0
        self._closed = False
        self.channel_status_id = -1  # the driver's channel status counter, for UDP

    @property
    def images(self) -> tuple[Image, ...]:
        return self._images

    @property
    def image_count(self) -> int:
        return len(self._images)

    @property
    def is_connected(self) -> bool:
        return any(not image.is_closed for image in self._images)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def is_data_available(self) -> bool:
        """Whether any image has something to read: pass this as the
        ``has_work`` of a doorbell idle strategy so no wake-up is missed."""
        return any(image.is_data_available() for image in self._images)

    @property
    def resolved_endpoints(self) -> list[str]:
        """The ``host:port`` addresses the driver bound for this subscription
        (an endpoint with port 0 gets its real port here)."""
        return self._conductor.local_socket_addresses(self.channel_status_id)

    @property
    def resolved_endpoint(self) -> str | None:
        addresses = self.resolved_endpoints
        return addresses[0] if addresses else None

    def add_destination(self, channel: str) -> None:
        """Receive on one more endpoint (``aeron:udp?endpoint=host:port``); for a
        ``control-mode=manual`` subscription (multi-destination subscription)."""
        self._conductor.add_receive_destination(self, channel)

    def remove_destination(self, channel: str) -> None:
        self._conductor.remove_receive_destination(self, channel)

    def image_by_session_id(self, session_id: int) -> Image | None:
        return next((image for image in self._images if image.session_id == session_id), None)

    def poll(self, handler: FragmentHandler, fragment_limit: int) -> int:
        """Poll the images in turn until ``fragment_limit`` fragments are read."""
        return self._poll_images(Image.poll, handler, fragment_limit)

    def poll_session_runs(
        self, handler: FragmentHandler, on_session_messages: SessionMessagesHandler, fragment_limit: int
    ) -> int:
        """:meth:`poll`, with runs of whole cluster client messages handed over
        together (``LogReader.bounded_poll_session_runs``)."""

        def poll(image: Image, handler: FragmentHandler, limit: int) -> int:
            return image.bounded_poll_session_runs(handler, on_session_messages, _INT64_MAX, limit)

        return self._poll_images(poll, handler, fragment_limit)

    def controlled_poll(self, handler: ControlledFragmentHandler, fragment_limit: int) -> int:
        return self._poll_images(Image.controlled_poll, handler, fragment_limit)

    def _poll_images(self, poll: Callable[[Image, Any, int], int], handler: Any, fragment_limit: int) -> int:
        # Start one image further each time, so no image is always served last.
        images = self._images
        count = len(images)
        if not count:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        fragments = 0
        for i in range(count):
            fragments += poll(images[(start + i) % count], handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    def _add_image(self, image: Image) -> None:
        self._images = self._images + (image,)

    def _remove_image(self, correlation_id: int) -> Image | None:
        image = next((i for i in self._images if i.correlation_id == correlation_id), None)
        if image is not None:
            self._images = tuple(i for i in self._images if i is not image)
            image._close()
        return image

    def close(self) -> None:
        if not self._closed:
            self._conductor.release_subscription(self)

    def _mark_closed(self) -> list[Image]:
        self._closed = True
        images, self._images = self._images, ()
        for image in images:
            image._close()
        return list(images)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Subscription(channel={self.channel!r}, stream_id={self.stream_id}, images={len(self._images)})"
