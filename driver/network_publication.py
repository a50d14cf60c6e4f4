"""A publication sent over UDP, as the conductor keeps it: its log buffer
(which local publishers append to and spies read), its counters, the clients
that use it and its life cycle.  The sending itself (data within the
receivers' window, SETUPs, heartbeats, retransmits, flow control) is the data
plane's (``data_plane.py``, ``driver/native/dp_send.c``)."""

from __future__ import annotations

from pathlib import Path

from fulmar.channel_uri import ChannelUri
from fulmar.counters import AtomicCounter
from fulmar.driver.data_plane import DataPlane, FlowControlSettings, PublicationStatus, has_group_semantics
from fulmar.driver.ipc_publication import PublicationState, SubscriberLink
from fulmar.driver.send_channel_endpoint import SendChannelEndpoint
from fulmar.logbuffer import LogBuffers
from fulmar.reader_doorbells import LogReaders


class NetworkPublication:
    # The doorbells of the log's readers (spies), named in its table (set by the conductor).
    readers: LogReaders
    # How long it lingers once drained: its channel's ``linger``, else the driver's (set by the conductor).
    linger_timeout_ns: int

    def __init__(
        self,
        registration_id: int,
        client_id: int,
        session_id: int,
        stream_id: int,
        channel: str,
        uri: ChannelUri,
        is_exclusive: bool,
        log: LogBuffers,
        endpoint: SendChannelEndpoint,
        data_plane: DataPlane,
        flow_control: FlowControlSettings,
        publisher_limit: AtomicCounter,
        publisher_position: AtomicCounter,
        sender_position: AtomicCounter,
        back_pressure_events: AtomicCounter,
        messages: AtomicCounter,
        term_window_length: int,
        initial_setup_interval_ns: int,
    ) -> None:
        self.registration_id = registration_id
        self.session_id = session_id
        self.stream_id = stream_id
        self.channel = channel
        self.uri = uri
        self.is_exclusive = is_exclusive
        self.log = log
        self.endpoint = endpoint
        self.publisher_limit = publisher_limit
        self.publisher_position = publisher_position
        self.sender_position_counter = sender_position
        self.back_pressure_events = back_pressure_events
        self.messages = messages
        self.client_refs: list[int] = [client_id]
        self.subscribers: list[SubscriberLink] = []  # spies: local subscribers reading this log directly
        self.state = PublicationState.ACTIVE
        self.linger_deadline_ns = 0
        self._data_plane = data_plane
        # A publication may start mid-stream (an initial position): sending starts there.
        data_plane.add_network_publication(
            registration_id=registration_id,
            endpoint_id=endpoint.id,
            log=log.address,
            term_length=log.term_length,
            mtu=log.mtu,
            initial_term_id=log.initial_term_id,
            session_id=session_id,
            stream_id=stream_id,
            ttl=uri.ttl() or 0,
            start_position=log.clean_position,
            term_window_length=term_window_length,
            publisher_limit_id=publisher_limit.id,
            publisher_position_id=publisher_position.id,
            sender_position_id=sender_position.id,
            flow_control=flow_control.strategy,
            fc_receiver_timeout_ns=flow_control.receiver_timeout_ns,
            fc_group_tag=flow_control.group_tag,
            fc_group_min_size=flow_control.group_min_size,
            has_group_semantics=has_group_semantics(uri),
            # With ssc=true, spies alone make the publication connected.
            spies_simulate_connection=bool(uri.spies_simulate_connection()),
            initial_setup_interval_ns=initial_setup_interval_ns,
        )
        endpoint.add(self)

    @property
    def log_file_name(self) -> str:
        return str(self.log.path)

    @property
    def path(self) -> Path:
        return self.log.path

    def status(self) -> PublicationStatus:
        return self._data_plane.publication_status(self.registration_id)

    def close_for_draining(self) -> None:
        """The last publisher left: the stream ends where it is."""
        self._data_plane.close_publication(self.registration_id)
        self.state = PublicationState.DRAINING

    def is_drained(self) -> bool:
        """Sent to its end, or with no receiver left to send the rest to (as
        Aeron: a stream nobody hears would otherwise drain for ever and hold
        its session id), and read to the end by its spies."""
        status = self.status()
        end = status.producer_position
        sent = status.sender_position >= end or not status.is_connected
        return sent and all(spy.position.get() >= end for spy in self.subscribers)

    def join_position(self) -> int:
        """Spies start at the current end of the stream."""
        return self.log.producer_position()

    def check_for_blocked_publisher(self, now_ns: int, unblock_timeout_ns: int) -> bool:
        return False  # the sender never waits on an uncommitted frame: it only sends committed ones

    def close(self) -> None:
        """Out of the data plane: its log may be unmapped after this."""
        self._data_plane.remove(self.registration_id)
        self.endpoint.remove(self)
