"""A stream received over UDP, as the conductor keeps it: the image's log
buffer (which local subscribers map), its counters, its subscribers and its
life cycle.  Receiving (the log rebuilt from datagrams, status messages and
NAKs to the sources) is the data plane's (``data_plane.py``,
``driver/native/dp_receive.c``)."""

from __future__ import annotations

from pathlib import Path

from fulmar.counters import AtomicCounter
from fulmar.driver.data_plane import (
    STATUS_MESSAGE_TIMEOUT_DEFAULT_NS,
    DataPlane,
    ImageStatus,
)
from fulmar.driver.ipc_publication import PublicationState, SubscriberLink
from fulmar.driver.receive_channel_endpoint import ReceiveChannelEndpoint
from fulmar.driver.udp_transport import UdpAddress
from fulmar.logbuffer import LogBuffers
from fulmar.reader_doorbells import LogReaders


class PublicationImage:
    # The doorbells of the image's readers (set by the conductor): the data plane rings them when data lands.
    readers: LogReaders

    def __init__(
        self,
        correlation_id: int,
        session_id: int,
        stream_id: int,
        log: LogBuffers,
        active_term_id: int,
        term_offset: int,
        endpoint: ReceiveChannelEndpoint,
        control_address: UdpAddress,
        transport_index: int,
        receiver_hwm: AtomicCounter,
        receiver_position: AtomicCounter,
        data_plane: DataPlane,
        image_liveness_timeout_ns: int,
        initial_window_length: int,
    ) -> None:
        """Raises DataPlaneError when the SETUP's position does not fit the log."""
        self.correlation_id = correlation_id
        self.session_id = session_id
        self.stream_id = stream_id
        self.log = log
        self.endpoint = endpoint
        self.control_address = control_address
        # Aeron's form: "host:port" of the sender's control address.
        host, port = control_address.socket_address[:2]
        self.source_identity = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        self.receiver_hwm = receiver_hwm
        self.receiver_position = receiver_position
        self.image_liveness_timeout_ns = image_liveness_timeout_ns
        self.subscribers: list[SubscriberLink] = []
        self.status = PublicationState.ACTIVE
        self.linger_deadline_ns = 0
        self._data_plane = data_plane
        data_plane.add_image(
            control_address,
            correlation_id=correlation_id,
            endpoint_id=endpoint.id,
            log=log.address,
            term_length=log.term_length,
            initial_term_id=log.initial_term_id,
            session_id=session_id,
            stream_id=stream_id,
            active_term_id=active_term_id,
            term_offset=term_offset,
            transport_index=transport_index,
            receiver_hwm_id=receiver_hwm.id,
            receiver_position_id=receiver_position.id,
            initial_window_length=initial_window_length,
            status_message_timeout_ns=STATUS_MESSAGE_TIMEOUT_DEFAULT_NS,
            image_liveness_timeout_ns=image_liveness_timeout_ns,
        )
        # Until it lingers: then nothing lands in it and the data plane forgets it.
        self.in_data_plane = True
        self._last_status = self._data_plane.image_status(correlation_id)

    @property
    def path(self) -> Path:
        return self.log.path

    @property
    def log_file_name(self) -> str:
        return str(self.log.path)

    def receive_status(self) -> ImageStatus:
        """What the data plane knows of the stream (the last it knew, once lingering)."""
        if self.in_data_plane:
            self._last_status = self._data_plane.image_status(self.correlation_id)
        return self._last_status

    def join_position(self) -> int:
        """A late subscriber starts where the slowest subscriber is (Aeron's
        PublicationImage.joinPosition): what is still in the term buffers for
        the others is its too.  A cluster follower relies on it: its services
        subscribe to the log image after the consensus module has."""
        position = self.receive_status().rebuild_position
        for link in self.subscribers:
            position = min(position, link.position.get())
        return position

    def is_timed_out(self, now_ns: int) -> bool:
        """No packet from the sender for the liveness timeout."""
        return now_ns - self.receive_status().time_of_last_packet_ns > self.image_liveness_timeout_ns

    def is_drained(self) -> bool:
        """End of stream reached and every subscriber has read to it."""
        status = self.receive_status()
        if not status.is_end_of_stream:
            return False
        return all(link.position.get() >= status.rebuild_position for link in self.subscribers)

    def close(self) -> None:
        """Out of the data plane (once): its log may be unmapped after this."""
        if self.in_data_plane:
            self.in_data_plane = False
            self._data_plane.remove(self.correlation_id)
