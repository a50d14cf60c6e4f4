"""In-memory media driver and Aeron client for the simulator.

What it models (the parts of ``fulmar.aeron.Aeron``, ``Publication``,
``Subscription`` and ``Image`` the consensus module, its archive and its
service use):

* A publication's stream as Aeron lays it out: 32-byte DATA frame headers
  (``fulmar.frames.DATA_HEADER``) and payloads, each frame aligned to 32, so
  positions are Aeron's positions.  A stream is append-only and starts at the
  publication's initial position (``init-term-id``/``term-id``/``term-offset``
  of the channel, as a leader's log continuing a recording).
* IPC and spy subscriptions read the publication's own buffer (no copy): an
  image joins at the publication's position when the driver links it.
* UDP subscriptions receive bytes through ``sim_network``: the log, ingress,
  egress and catchup/replay streams are reliable ordered byte streams per
  image (a partition stalls them; a connection lost longer than the image
  liveness timeout closes the image; out-of-order chunks are reassembled, as
  Aeron's receiver does by NAK and retransmit); the consensus stream is
  datagrams (each message may be lost, duplicated, reordered, delayed).
* Multi-destination publications (``add_destination``) and
  multi-destination subscriptions (``control-mode=manual`` with
  ``add_destination``), channel ``tags`` shared by the archive and the
  services, ``session-id`` filters.
* Images and publications become known to a client through its conductor:
  ``has_driver_news`` / ``do_work`` link new images and fire the
  subscription's ``on_available_image``/``on_unavailable_image``, as the
  real client conductor does on its duty cycle.
* Counters (a node's ``cnc.dat`` counters: id, type, key, label,
  registration id, value), shared by every client of the node's driver.

* Runs of client messages handed to the production hot paths as one
  ``SessionMessages``-like batch (``bounded_poll_session_runs``,
  ``poll_session_runs``), by the rule of ``fulmar_batch_session_messages``.
* Doorbells: data for an image, driver news, and a ring of a watched counter
  (commit-pos, rec-pos) wake the process that reads them.

What it does not model: term buffers and their rotation (no padding frames at
term ends, no term-length bound on what an image holds ahead of its reader),
flow control and back pressure (an offer is accepted unless the publication
is closed), fragmentation (a message is one frame), the driver's registration
failures and timeouts except the image liveness timeout, client liveness
(a dead process's registrations go at once).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from fulmar.channel_uri import ChannelUri
from fulmar.frames import DATA_HEADER, UNFRAGMENTED
from fulmar.log_writer import CLOSED, NOT_CONNECTED

INT64_MAX = (1 << 63) - 1
HEADER_LENGTH = 32
RECORD_ALLOCATED = 1
HDR_TYPE_DATA = 1
LINGER_NS = 5_000_000_000
_RESERVED = struct.Struct("<q")


def aligned(length: int) -> int:
    return (length + 31) & ~31


# ------------------------------------------------------------------------ counters


class SimCounter:
    """One counter of a node's driver (``fulmar.aeron.Counter``'s API)."""

    __slots__ = ("id", "type_id", "label", "key", "registration_id", "value", "allocated")

    def __init__(self, counter_id: int, type_id: int, label: str, key: bytes, registration_id: int) -> None:
        self.id = counter_id
        self.type_id = type_id
        self.label = label
        self.key = key
        self.registration_id = registration_id
        self.value = 0
        self.allocated = True

    def get(self) -> int:
        return self.value

    def set(self, value: int) -> None:
        self.value = int(value)

    def increment(self) -> int:
        self.value += 1
        return self.value

    def propose_max(self, value: int) -> bool:
        if value > self.value:
            self.value = int(value)
            return True
        return False

    def close(self) -> None:
        self.allocated = False


class SimCountersReader:
    """``fulmar.counters.CountersReader`` over the node's counters."""

    def __init__(self, counters: dict[int, SimCounter]) -> None:
        self._counters = counters

    def counter_value(self, counter_id: int) -> int:
        counter = self._counters.get(counter_id)
        return counter.value if counter is not None else 0

    def counter_key(self, counter_id: int) -> bytes:
        return self._counters[counter_id].key

    def counter_label(self, counter_id: int) -> str:
        return self._counters[counter_id].label

    def counter_registration_id(self, counter_id: int) -> int:
        counter = self._counters.get(counter_id)
        return counter.registration_id if counter is not None else -1

    def counter_state(self, counter_id: int) -> int:
        counter = self._counters.get(counter_id)
        return RECORD_ALLOCATED if counter is not None and counter.allocated else 0

    def counter_type_id(self, counter_id: int) -> int:
        return self._counters[counter_id].type_id

    def ids_of_type(self, type_id: int) -> list[int]:
        return [c.id for c in self._counters.values() if c.type_id == type_id and c.allocated]


# ------------------------------------------------------------------------ streams


class SimLogBuffer:
    """The bytes of one stream as one holder has them: a publication's own
    (written by its offers) or a receiver's (filled by the network).  Bytes
    before ``base`` are not held; ``end`` is where the contiguous bytes end;
    chunks beyond a gap wait in ``pending`` until the gap is filled."""

    __slots__ = (
        "data",
        "base",
        "session_id",
        "stream_id",
        "term_length",
        "initial_term_id",
        "mtu",
        "end_of_stream_position",
        "pending",
        "closed",
        "readers",
        "linger_deadline_ns",
    )

    def __init__(
        self, base: int, session_id: int, stream_id: int, term_length: int, initial_term_id: int, mtu: int
    ) -> None:
        self.data = bytearray()
        self.base = base
        self.session_id = session_id
        self.stream_id = stream_id
        self.term_length = term_length
        self.initial_term_id = initial_term_id
        self.mtu = mtu
        self.end_of_stream_position = INT64_MAX
        self.pending: dict[int, bytes] = {}
        self.closed = False
        self.readers: list[SimAeron] = []  # the clients with an image of it (woken by new bytes)
        self.linger_deadline_ns = INT64_MAX  # a closed publication's local images go once drained, or then

    def wake_readers(self) -> None:
        for reader in self.readers:
            reader.wake()

    @property
    def end(self) -> int:
        return self.base + len(self.data)

    def append_frame(self, payload: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        """Append one unfragmented DATA frame; returns the new position."""
        position = self.end
        length = HEADER_LENGTH + len(payload)
        shift = self.term_length.bit_length() - 1
        term_id = self.initial_term_id + (position >> shift)
        data = self.data
        start = len(data)
        data += DATA_HEADER.pack(
            length,
            0,
            UNFRAGMENTED,
            HDR_TYPE_DATA,
            position & (self.term_length - 1),
            self.session_id,
            self.stream_id,
            term_id,
            reserved_value,
        )
        data += payload
        data += bytes(aligned(length) - length)
        self.wake_readers()
        return self.base + start + aligned(length)

    def receive(self, position: int, chunk: bytes) -> bool:
        """Take a chunk of the stream (from the network); True if it advanced ``end``."""
        end = self.end
        if position > end:
            self.pending[position] = chunk
            return False
        if position + len(chunk) <= end:
            return False
        self.data += chunk[end - position :]
        while self.pending:
            end = self.end
            ready = [p for p in self.pending if p <= end]
            if not ready:
                break
            for p in ready:
                piece = self.pending.pop(p)
                if p + len(piece) > self.end:
                    self.data += piece[self.end - p :]
        self.wake_readers()
        return True

    def chunk(self, from_position: int, to_position: int) -> bytes:
        return bytes(self.data[from_position - self.base : to_position - self.base])


class SimHeader:
    """``fulmar.log_reader.Header`` for the fragment being handled."""

    __slots__ = (
        "frame_length",
        "flags",
        "type",
        "term_offset",
        "session_id",
        "stream_id",
        "term_id",
        "reserved_value",
        "position",
        "term_length",
        "offset",
    )

    def __init__(self) -> None:
        self.frame_length = self.flags = self.type = self.term_offset = 0
        self.session_id = self.stream_id = self.term_id = self.reserved_value = 0
        self.position = self.term_length = self.offset = 0


_SESSION_HEAD = struct.Struct("<HHHHqqq")  # SBE header, then leadershipTermId, clusterSessionId, timestamp
_SESSION_TEMPLATE_ID = 1
_CLUSTER_SCHEMA_ID = 111
_SESSION_BLOCK_LENGTH = 24


class SimSessionMessages:
    """``fulmar.log_reader.SessionMessages``: a run of client messages as
    parallel lists (what the production hot paths read)."""

    def __init__(self) -> None:
        self.view: memoryview | None = None
        self.clear()

    def clear(self) -> None:
        self.count = 0
        self.leadership_term_ids: list[int] = []
        self.session_ids: list[int] = []
        self.timestamps: list[int] = []
        self.end_positions: list[int] = []
        self.message_offsets: list[int] = []
        self.message_lengths: list[int] = []

    def take(self, data: bytearray, offset: int, length: int, flags: int, end_position: int) -> bool:
        if flags & UNFRAGMENTED != UNFRAGMENTED or length < HEADER_LENGTH + _SESSION_HEAD.size:
            return False
        block_length, template_id, schema_id, _version, term, session_id, timestamp = _SESSION_HEAD.unpack_from(
            data, offset + HEADER_LENGTH
        )
        if (
            block_length != _SESSION_BLOCK_LENGTH
            or template_id != _SESSION_TEMPLATE_ID
            or schema_id != _CLUSTER_SCHEMA_ID
        ):
            return False
        self.count += 1
        self.leadership_term_ids.append(term)
        self.session_ids.append(session_id)
        self.timestamps.append(timestamp)
        self.end_positions.append(end_position)
        self.message_offsets.append(offset + HEADER_LENGTH)
        self.message_lengths.append(length - HEADER_LENGTH)
        return True

    def deliver(self, on_session_messages: Callable[..., Any]) -> None:
        try:
            on_session_messages(self)
        finally:
            view = self.view
            self.clear()
            self.view = view


class SimImage:
    """One subscriber's reader over a ``SimLogBuffer`` (``fulmar.subscription.Image``)."""

    def __init__(
        self, subscription: SimSubscription, log: SimLogBuffer, join_position: int, source_identity: str
    ) -> None:
        self.subscription = subscription
        self.log = log
        self.session_id = log.session_id
        self.correlation_id = 0
        self.join_position = join_position
        self.position = join_position
        self.source_identity = source_identity
        self._closed = False
        self._header = SimHeader()
        self._runs = SimSessionMessages()
        if subscription.client not in log.readers:
            log.readers.append(subscription.client)

    @property
    def stream_id(self) -> int:
        return self.log.stream_id

    @property
    def term_buffer_length(self) -> int:
        return self.log.term_length

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
        return self.position >= self.log.end_of_stream_position

    def is_data_available(self) -> bool:
        return not self._closed and self.log.end > self.position

    def poll(self, handler: Callable[..., Any], fragment_limit: int) -> int:
        return self.bounded_poll(handler, INT64_MAX, fragment_limit)

    def bounded_poll(self, handler: Callable[..., Any], limit_position: int, fragment_limit: int) -> int:
        log = self.log
        if self._closed or self.position >= limit_position or self.position >= log.base + len(log.data):
            return 0
        data = log.data
        view = memoryview(data)
        base = log.base
        end = min(log.end, limit_position)
        header = self._header
        header.term_length = log.term_length
        count = 0
        try:
            while count < fragment_limit and self.position < end:
                offset = self.position - base
                length, _v, flags, ftype, term_offset, session_id, stream_id, term_id, reserved = (
                    DATA_HEADER.unpack_from(data, offset)
                )
                next_position = self.position + aligned(length)
                if next_position > end:
                    break
                header.frame_length = length
                header.flags = flags
                header.type = ftype
                header.term_offset = term_offset
                header.session_id = session_id
                header.stream_id = stream_id
                header.term_id = term_id
                header.reserved_value = reserved
                header.position = next_position
                header.offset = offset
                self.position = next_position
                count += 1
                handler(view, offset + HEADER_LENGTH, length - HEADER_LENGTH, header)
        finally:
            view.release()
        return count

    def bounded_poll_session_runs(
        self,
        handler: Callable[..., Any],
        on_session_messages: Callable[..., Any],
        limit_position: int,
        fragment_limit: int,
    ) -> int:
        """``LogReader.bounded_poll_session_runs``: each run of whole cluster
        client messages in a row (the rule of ``fulmar_batch_session_messages``:
        unfragmented, a SessionMessageHeader of the cluster schema with its
        block length) goes to ``on_session_messages`` as one
        ``SimSessionMessages``; every other fragment goes to ``handler``."""
        log = self.log
        if self._closed or self.position >= limit_position or self.position >= log.base + len(log.data):
            return 0
        data = log.data
        base = log.base
        end = min(log.base + len(data), limit_position)
        header = self._header
        header.term_length = log.term_length
        count = 0
        runs = self._runs
        view = memoryview(data)
        runs.view = view
        try:
            while count < fragment_limit and self.position < end:
                offset = self.position - base
                length, _v, flags, ftype, term_offset, session_id, stream_id, term_id, reserved = (
                    DATA_HEADER.unpack_from(data, offset)
                )
                next_position = self.position + aligned(length)
                if next_position > end:
                    break
                if runs.take(data, offset, length, flags, next_position):
                    self.position = next_position
                    count += 1
                    continue
                if runs.count:
                    runs.deliver(on_session_messages)
                header.frame_length = length
                header.flags = flags
                header.type = ftype
                header.term_offset = term_offset
                header.session_id = session_id
                header.stream_id = stream_id
                header.term_id = term_id
                header.reserved_value = reserved
                header.position = next_position
                header.offset = offset
                self.position = next_position
                count += 1
                handler(view, offset + HEADER_LENGTH, length - HEADER_LENGTH, header)
            if runs.count:
                runs.deliver(on_session_messages)
        finally:
            runs.clear()
            view.release()
        return count

    def _close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"SimImage(session_id={self.session_id}, stream={self.stream_id}, position={self.position})"


# ------------------------------------------------------------------------ driver objects


class SimPublication:
    """``fulmar.publication.Publication`` / ``ExclusivePublication``."""

    def __init__(
        self, client: SimAeron, channel: str, stream_id: int, registration_id: int, log: SimLogBuffer, exclusive: bool
    ) -> None:
        self.client = client
        self.driver = client.driver
        self.channel = channel
        self.uri = ChannelUri.parse(channel)
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.log = log
        self.session_id = log.session_id
        self.exclusive = exclusive
        self.destinations: list[str] = []
        endpoint = self.uri.params.get("endpoint")
        if self.uri.media == "udp" and endpoint:
            self.destinations.append(endpoint)
        self.is_datagram = stream_id == client.driver.world.consensus_stream_id
        self._closed = False
        self.crashed = False
        self.local_images: list[SimImage] = []
        if self.destinations and not self.is_datagram:
            client.driver.world.network.on_appended(self)  # (its SETUP)
        self.max_message_length = 1 << 20
        self.max_payload_length = 1 << 20

    @property
    def position(self) -> int:
        return self.log.end

    @property
    def term_buffer_length(self) -> int:
        return self.log.term_length

    @property
    def initial_term_id(self) -> int:
        return self.log.initial_term_id

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_connected(self) -> bool:
        if self._closed:
            return False
        if self.uri.media == "ipc" or self.uri.prefix:
            return self.driver.has_local_subscriber(self)
        if self.is_datagram:
            return True
        return self.driver.world.network.is_connected(self) or self.driver.has_local_subscriber(self)

    def offer(self, message: bytes | bytearray | memoryview, reserved_value: int = 0) -> int:
        if self._closed:
            return CLOSED
        if self.is_datagram:
            if not self.destinations:
                return NOT_CONNECTED
            self.driver.world.network.send_datagram(self, bytes(message))
            return 1
        if self.uri.media == "ipc" and not self.driver.has_local_subscriber(self):
            return NOT_CONNECTED
        position = self.log.append_frame(message, reserved_value)
        self.driver.world.network.on_appended(self)
        return position

    def offer_parts(self, parts: Any, reserved_value: int = 0) -> int:
        return self.offer(b"".join(bytes(p) for p in parts), reserved_value)

    def offer_block(self, data: bytes, lengths: Any, reserved_value: int = 0) -> tuple[int, int]:
        offset = 0
        result = 0
        count = 0
        for length in lengths:
            result = self.offer(data[offset : offset + length], reserved_value)
            if result <= 0:
                break
            offset += length
            count += 1
        return count, result

    def add_destination(self, channel: str) -> None:
        endpoint = ChannelUri.parse(channel).params["endpoint"]
        if endpoint not in self.destinations:
            self.destinations.append(endpoint)
            self.driver.world.network.on_appended(self)

    def remove_destination(self, channel: str) -> None:
        endpoint = ChannelUri.parse(channel).params["endpoint"]
        if endpoint in self.destinations:
            self.destinations.remove(endpoint)

    def defer_rings(self) -> None:
        pass

    def close(self, crashed: bool = False) -> None:
        """Closing ends the stream in order (Aeron's end of stream): readers
        that reach ``end_of_stream_position`` see ``is_end_of_stream``.  A
        crashed process's publication just stops (no end of stream): its
        remote images go after the image liveness timeout."""
        if self._closed:
            return
        self._closed = True
        self.crashed = crashed
        if not crashed:
            self.log.end_of_stream_position = self.log.end
        self.log.closed = True
        self.driver.on_publication_closed(self)

    def __repr__(self) -> str:
        return f"SimPublication({self.channel!r}, {self.stream_id}, session={self.session_id}, pos={self.position})"


class SimSubscription:
    """``fulmar.subscription.Subscription``."""

    def __init__(
        self,
        client: SimAeron,
        channel: str,
        stream_id: int,
        registration_id: int,
        on_available_image: Callable[[Any], None] | None,
        on_unavailable_image: Callable[[Any], None] | None,
    ) -> None:
        self.client = client
        self.channel = channel
        self.uri = ChannelUri.parse(channel)
        self.stream_id = stream_id
        self.registration_id = registration_id
        self.on_available_image = on_available_image
        self.on_unavailable_image = on_unavailable_image
        self._images: tuple[Any, ...] = ()
        self._round_robin = 0
        self._closed = False
        session = self.uri.params.get("session-id")
        self.session_filter = int(session) if session is not None and not session.startswith("tag:") else None
        tags = self.uri.params.get("tags")
        self.tag = int(tags.split(",")[0]) if tags else None
        self.endpoints: list[str] = []
        # A UDP subscription's received streams, by session id (what a tagged
        # subscription shares with the archive and the services).
        self.received: dict[Any, Any] = {}
        self.is_datagram = stream_id == client.driver.world.consensus_stream_id

    @property
    def images(self) -> tuple[Any, ...]:
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
        return any(image.is_data_available() for image in self._images)

    def add_destination(self, channel: str) -> None:
        endpoint = ChannelUri.parse(channel).params["endpoint"]
        self.client.driver.world.network.bind(endpoint, self)
        self.endpoints.append(endpoint)

    def remove_destination(self, channel: str) -> None:
        endpoint = ChannelUri.parse(channel).params["endpoint"]
        if endpoint in self.endpoints:
            self.endpoints.remove(endpoint)
            self.client.driver.world.network.unbind(endpoint, self)

    def image_by_session_id(self, session_id: int) -> Any:
        for image in self._images:
            if image.session_id == session_id:
                return image
        return None

    def poll(self, handler: Callable[..., Any], fragment_limit: int) -> int:
        images = self._images
        count = len(images)
        if not count:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        fragments = 0
        for i in range(count):
            fragments += images[(start + i) % count].poll(handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    def poll_session_runs(
        self, handler: Callable[..., Any], on_session_messages: Callable[..., Any], fragment_limit: int
    ) -> int:
        images = self._images
        count = len(images)
        if not count:
            return 0
        start = self._round_robin = (self._round_robin + 1) % count
        fragments = 0
        for i in range(count):
            image = images[(start + i) % count]
            if isinstance(image, SimImage):
                fragments += image.bounded_poll_session_runs(
                    handler, on_session_messages, INT64_MAX, fragment_limit - fragments
                )
            else:
                fragments += image.poll(handler, fragment_limit - fragments)
            if fragments >= fragment_limit:
                break
        return fragments

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.driver.on_subscription_closed(self)
            for image in self._images:
                image._close()
            self._images = ()

    def _add_image(self, image: Any) -> None:
        self._images = self._images + (image,)
        if self.on_available_image is not None:
            self.on_available_image(image)

    def _remove_image(self, image: Any) -> None:
        if image in self._images:
            self._images = tuple(i for i in self._images if i is not image)
            image._close()
            if self.on_unavailable_image is not None:
                self.on_unavailable_image(image)

    def __repr__(self) -> str:
        return f"SimSubscription({self.channel!r}, {self.stream_id}, images={len(self._images)})"


class SimDatagramImage:
    """An image of the consensus stream: the messages that arrived, in the order
    they arrived (the network may lose, repeat or reorder them)."""

    def __init__(self, subscription: SimSubscription, session_id: int, source_identity: str) -> None:
        self.subscription = subscription
        self.session_id = session_id
        self.source_identity = source_identity
        self.correlation_id = 0
        self.join_position = 0
        self.position = 0
        self.messages: list[bytes] = []
        self._closed = False
        self._header = SimHeader()
        self._header.flags = UNFRAGMENTED
        self._header.session_id = session_id
        self._header.term_length = 64 * 1024

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_end_of_stream(self) -> bool:
        return False

    def is_data_available(self) -> bool:
        return bool(self.messages)

    def poll(self, handler: Callable[..., Any], fragment_limit: int) -> int:
        count = 0
        header = self._header
        while self.messages and count < fragment_limit:
            message = self.messages.pop(0)
            self.position += aligned(HEADER_LENGTH + len(message))
            header.position = self.position
            header.frame_length = HEADER_LENGTH + len(message)
            count += 1
            handler(memoryview(message), 0, len(message), header)
        return count

    def _close(self) -> None:
        self._closed = True


class SimCounterWatch:
    """``fulmar.reader_doorbells.CounterWatch``: a client watching a counter
    is woken when a writer rings the counter's watchers (the module rings
    commit-pos, the archive rec-pos), as the doorbells do."""

    doorbell_id = 0

    def __init__(self, client: SimAeron) -> None:
        self.client = client

    def watch(self, counter_id: int) -> bool:
        self.client.driver.watchers.setdefault(counter_id, set()).add(self.client)
        return True

    def unwatch(self, counter_id: int) -> None:
        self.client.driver.watchers.get(counter_id, set()).discard(self.client)


class SimDoorbell:
    def ring(self) -> None:
        pass


class SimConductor:
    """The parts of ``fulmar.aeron.ClientConductor`` the module reads."""

    def __init__(self, client: SimAeron) -> None:
        self.client = client
        self.data_doorbell = SimDoorbell()

    def has_driver_news(self) -> bool:
        return bool(self.client.news)

    def ring_counter_watchers(self, counter_id: int) -> int:
        return self.client.driver.ring_watchers(counter_id)

    def counter_watch(self) -> SimCounterWatch:
        return SimCounterWatch(self.client)


class SimAeron:
    """One process's client of its node's ``SimDriver`` (``fulmar.aeron.Aeron``)."""

    def __init__(self, driver: SimDriver, name: str) -> None:
        self.driver = driver
        self.name = name
        self.client_id = driver.next_id()
        self.conductor = SimConductor(self)
        self.counters_reader = SimCountersReader(driver.counters)
        self.directory = f"/sim/node{driver.node_id}"
        self.context = SimpleNamespace(use_conductor_thread=False)  # (its conductor runs in do_work)
        self.is_closed = False
        self.news: list[tuple[str, SimSubscription, Any]] = []  # images to link or unlink at the next do_work
        self.publications: list[SimPublication] = []
        self.subscriptions: list[SimSubscription] = []
        self.counters: list[SimCounter] = []
        self._async: dict[int, SimPublication] = {}
        # Called by do_work: what runs meanwhile in other processes while this
        # one waits on the wall clock (the node's archive recording).
        self.on_do_work: Callable[[], object] | None = None

    def next_correlation_id(self) -> int:
        return self.driver.next_id()

    def wake(self) -> None:
        """Something arrived for this client: its process's doorbell."""
        if not self.is_closed:
            self.driver.world.on_wake(self)

    def tell(self, kind: str, subscription: SimSubscription, image: Any) -> None:
        """Driver news (an image came or went), taken at the next ``do_work``."""
        self.news.append((kind, subscription, image))
        self.wake()

    def add_publication(self, channel: str, stream_id: int, exclusive: bool = False) -> SimPublication:
        publication = self.driver.add_publication(self, channel, stream_id, exclusive)
        self.publications.append(publication)
        return publication

    def add_exclusive_publication(self, channel: str, stream_id: int) -> SimPublication:
        return self.add_publication(channel, stream_id, exclusive=True)

    def async_add_publication(self, channel: str, stream_id: int, exclusive: bool = False) -> int:
        publication = self.add_publication(channel, stream_id, exclusive)
        self._async[publication.registration_id] = publication
        return publication.registration_id

    def get_publication(self, registration_id: int) -> SimPublication | None:
        return self._async.pop(registration_id, None)

    def async_remove_publication(self, registration_id: int) -> None:
        for publication in self.publications:
            if publication.registration_id == registration_id:
                publication.close()
        self._async.pop(registration_id, None)

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: Any = None,
        on_unavailable_image: Any = None,
        **options: Any,
    ) -> SimSubscription:
        subscription = SimSubscription(
            self, channel, stream_id, self.driver.next_id(), on_available_image, on_unavailable_image
        )
        self.subscriptions.append(subscription)
        self.driver.add_subscription(subscription)
        return subscription

    def add_counter(self, type_id: int, label: str, key: bytes = b"") -> SimCounter:
        counter = self.driver.add_counter(type_id, label, key)
        self.counters.append(counter)
        return counter

    def do_work(self, now_ns: int = 0) -> int:
        if self.on_do_work is not None:
            self.on_do_work()
        if self.driver.closing:
            for subscription in self.subscriptions:
                if subscription.images and not subscription.is_closed:
                    self.driver.reap(subscription)
            self.driver.closing = [p for p in self.driver.closing if any(not i.is_closed for i in p.local_images)]
        news, self.news = self.news, []
        for kind, subscription, image in news:
            if subscription.is_closed:
                continue
            if kind == "add":
                subscription._add_image(image)
            else:
                subscription._remove_image(image)
        return len(news)

    def ring_deferred(self) -> int:
        return 0

    def close(self, crashed: bool = False) -> None:
        """The client closes (or its process died, ``crashed``): the driver
        lets its registrations go at once (a real driver does so for a dead
        client after its client liveness timeout)."""
        if self.is_closed:
            return
        self.is_closed = True
        for subscription in self.subscriptions:
            subscription.close()
        for publication in self.publications:
            publication.close(crashed)
        for counter in self.counters:
            counter.close()


class SimDriver:
    """One node's media driver: its counters, its IPC and spy routing, and the
    node's side of UDP (through ``world.network``)."""

    def __init__(self, world: Any, node_id: int) -> None:
        self.world = world
        self.node_id = node_id
        self.host = f"node{node_id}"
        self.counters: dict[int, SimCounter] = {}
        self._next_counter_id = 0
        self.publications: list[SimPublication] = []
        self.subscriptions: list[SimSubscription] = []
        self.watchers: dict[int, set[SimAeron]] = {}
        self.closing: list[SimPublication] = []  # closed publications whose local images may linger

    def next_id(self) -> int:
        return self.world.next_id()

    def ring_watchers(self, counter_id: int) -> int:
        watchers = self.watchers.get(counter_id)
        if not watchers:
            return 0
        for client in sorted(watchers, key=lambda c: c.client_id):
            client.wake()
        return len(watchers)

    # -- counters

    def add_counter(self, type_id: int, label: str, key: bytes) -> SimCounter:
        counter_id = self._next_counter_id
        self._next_counter_id += 1
        counter = SimCounter(counter_id, type_id, label, bytes(key), self.next_id())
        self.counters[counter_id] = counter
        return counter

    # -- publications

    def add_publication(
        self, client: SimAeron, channel: str, stream_id: int, exclusive: bool, session_id: int | None = None
    ) -> SimPublication:
        uri = ChannelUri.parse(channel)
        params = uri.params
        term_length = _size(params.get("term-length"), 16 * 1024 * 1024)
        mtu = _size(params.get("mtu"), 1408)
        if session_id is None:
            session_id = int(params["session-id"]) if "session-id" in params else self.world.next_session_id()
        base = 0
        initial_term_id = 0
        if "init-term-id" in params:
            initial_term_id = int(params["init-term-id"])
            term_id = int(params.get("term-id", initial_term_id))
            term_offset = int(params.get("term-offset", 0))
            base = (term_id - initial_term_id) * term_length + term_offset
        log = SimLogBuffer(base, session_id, stream_id, term_length, initial_term_id, mtu)
        publication = SimPublication(client, channel, stream_id, self.next_id(), log, exclusive)
        self.publications.append(publication)
        for subscription in self.subscriptions:
            if self._local_match(subscription, publication):
                self._link_local(subscription, publication)
        return publication

    def on_publication_closed(self, publication: SimPublication) -> None:
        """Local readers may still read what was published; each image goes
        once it has read to the end, or after the linger (as the driver's
        IPC and spy images of a closed publication do)."""
        publication.log.linger_deadline_ns = self.world.events.now_ns + LINGER_NS
        if publication.local_images:
            self.closing.append(publication)
        for reader in publication.log.readers:
            reader.wake()

    def reap(self, subscription: SimSubscription) -> None:
        now_ns = self.world.events.now_ns
        for image in subscription.images:
            if not getattr(image, "_local", False):
                continue
            log = image.log
            if log.closed and (image.position >= log.end or now_ns >= log.linger_deadline_ns):
                subscription._remove_image(image)

    def has_local_subscriber(self, publication: SimPublication) -> bool:
        return any(self._local_match(s, publication) and not s.is_closed for s in self.subscriptions)

    # -- subscriptions

    def add_subscription(self, subscription: SimSubscription) -> None:
        self.subscriptions.append(subscription)
        uri = subscription.uri
        if uri.media == "udp" and not uri.prefix:
            endpoint = uri.params.get("endpoint")
            if endpoint:
                self.world.network.bind(endpoint, subscription)
                subscription.endpoints.append(endpoint)
            if subscription.tag is not None and not endpoint and uri.params.get("control-mode") != "manual":
                # Shares the tagged subscription's receive endpoint: its images too.
                for owner in self.subscriptions:
                    if (
                        owner is not subscription
                        and owner.tag == subscription.tag
                        and owner.endpoints is not None
                        and not owner.is_closed
                        and owner.uri.params.get("control-mode") == "manual"
                    ):
                        for log in owner.received.values():
                            self.link_received(subscription, log)
            return
        for publication in list(self.publications):
            if publication.is_closed and self._drained(publication):
                self.publications.remove(publication)  # (gone for good)
            elif self._local_match(subscription, publication):
                self._link_local(subscription, publication)

    def on_subscription_closed(self, subscription: SimSubscription) -> None:
        if subscription in self.subscriptions:
            self.subscriptions.remove(subscription)
        for endpoint in list(subscription.endpoints):
            self.world.network.unbind(endpoint, subscription)

    def _local_match(self, subscription: SimSubscription, publication: SimPublication) -> bool:
        if subscription.stream_id != publication.stream_id or subscription.is_closed:
            return False
        if publication.is_closed and self._drained(publication):
            # (A closed IPC publication still takes subscribers while a reader
            # has yet to read to its end: Aeron's DRAINING state.)
            return False
        if subscription.session_filter is not None and subscription.session_filter != publication.session_id:
            return False
        s_uri = subscription.uri
        p_uri = publication.uri
        if s_uri.media == "ipc":
            return p_uri.media == "ipc" and not p_uri.prefix
        if s_uri.prefix == "aeron-spy":
            # A spy sees the publications of its own send channel (the same
            # endpoint and control), as the driver matches them.
            keys = ("endpoint", "control", "control-mode")
            return p_uri.media == "udp" and all(s_uri.params.get(k) == p_uri.params.get(k) for k in keys)
        return False

    @staticmethod
    def _open_images(publication: SimPublication) -> list[SimImage]:
        return [i for i in publication.local_images if not i.is_closed]

    def _drained(self, publication: SimPublication) -> bool:
        images = self._open_images(publication)
        return not images or min(i.position for i in images) >= publication.log.end

    def _link_local(self, subscription: SimSubscription, publication: SimPublication) -> None:
        """An IPC or spy image joins where the slowest reader of the
        publication is (Aeron's IPC join position), else at its end."""
        images = self._open_images(publication)
        join = min(i.position for i in images) if images else publication.log.end
        image = SimImage(subscription, publication.log, join, f"{self.host}:ipc")
        image._local = True  # type: ignore[attr-defined]
        publication.local_images.append(image)
        subscription.client.tell("add", subscription, image)

    # -- received UDP streams

    def on_received(self, subscription: SimSubscription, log: SimLogBuffer, is_new: bool) -> None:
        """Called by the network when a UDP subscription got a new stream."""
        if is_new:
            self.link_received(subscription, log)
            for other in self.subscriptions:
                if (
                    other is not subscription
                    and subscription.tag is not None
                    and other.tag == subscription.tag
                    and not other.endpoints
                    and not other.is_closed
                ):
                    self.link_received(other, log)

    def link_received(self, subscription: SimSubscription, log: SimLogBuffer) -> None:
        if subscription.session_filter is not None and subscription.session_filter != log.session_id:
            return
        image = SimImage(subscription, log, log.base, "udp")
        subscription.client.tell("add", subscription, image)

    def on_received_lost(self, subscription: SimSubscription, log: SimLogBuffer) -> None:
        """The connection of a received stream was lost (image liveness timeout)."""
        log.closed = True
        for other in [subscription] + self.subscriptions:
            for image in other.images:
                if getattr(image, "log", None) is log:
                    other.client.tell("remove", other, image)


def _size(text: str | None, default: int) -> int:
    if text is None:
        return default
    text = text.strip().lower()
    if text.endswith("k"):
        return int(text[:-1]) * 1024
    if text.endswith("m"):
        return int(text[:-1]) * 1024 * 1024
    return int(text)
