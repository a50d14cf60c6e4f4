"""A stream received over UDP, as the driver keeps it: the image's log
buffer (which local subscribers map), its receive state, the subscribers'
positions, and where status messages and NAKs go."""

from __future__ import annotations

from pathlib import Path

from fulmar.counters import AtomicCounter
from fulmar.reader_doorbells import LogReaders
from fulmar.logbuffer import LogBuffers

from fulmar.driver.counters import SystemCounter, SystemCounters
from fulmar.driver.image_state import ImageReceiveState, PacketVerdict
from fulmar.driver.ipc_publication import PublicationState, SubscriberLink
from fulmar.driver.receive_channel_endpoint import ReceiveChannelEndpoint
from fulmar.driver.udp_transport import UdpAddress


class PublicationImage:
    # The doorbells of the image's readers (set by the conductor): rung when data lands.
    readers: LogReaders
    # Set when a DATA frame is inserted; the conductor rings the readers and clears it.
    data_arrived = False
    def __init__(
        self,
        correlation_id: int,
        session_id: int,
        stream_id: int,
        log: LogBuffers,
        state: ImageReceiveState,
        endpoint: ReceiveChannelEndpoint,
        control_address: UdpAddress,
        transport_index: int,
        receiver_hwm: AtomicCounter,
        receiver_position: AtomicCounter,
        system: SystemCounters,
    ) -> None:
        self.correlation_id = correlation_id
        self.session_id = session_id
        self.stream_id = stream_id
        self.log = log
        self.state = state
        self.endpoint = endpoint
        self.control_address = control_address
        # Where status messages and NAKs go: each source feeding the image,
        # by the transport it arrives on (several for a multi-destination subscription).
        self.sources: dict[int, UdpAddress] = {transport_index: control_address}
        # Where each source's stream ended (EOS), by transport: an image fed by
        # several (a multi-destination subscription: a catchup replay merged
        # into the live log) ends only once every destination's source has.
        self.eos_positions: dict[int, int] = {}
        # Aeron's form: "host:port" of the sender's control address.
        host, port = control_address.socket_address[:2]
        self.source_identity = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        self.receiver_hwm = receiver_hwm
        self.receiver_position = receiver_position
        self.system = system
        self.subscribers: list[SubscriberLink] = []
        self.status = PublicationState.ACTIVE
        self.linger_deadline_ns = 0
        self.needs_prompt_cycles = False
        # What the rcv-hwm and rcv-pos counters last got (written on change only).
        self._published_hwm = -1
        self._published_position = -1

    @property
    def path(self) -> Path:
        return self.log.path

    @property
    def log_file_name(self) -> str:
        return str(self.log.path)

    def insert_packet(self, transport_index: int, term_id: int, term_offset: int, datagram: memoryview,
                      now_ns: int) -> PacketVerdict:
        """A DATA or PAD datagram of this image's session from ``transport_index``.

        As Aeron's PublicationImage with its image connections: on a
        multi-destination endpoint the end of one source's stream (a catchup
        replay closed once the live log has caught up) does not end the image
        while another destination may still bring the stream; it ends when
        every bound destination's source has sent its EOS, at the furthest."""
        state = self.state
        if not self.endpoint.is_manual:
            verdict = state.insert_packet(term_id, term_offset, datagram, now_ns)
            self._note_arrival(verdict)
            return verdict
        verdict = state.insert_packet(term_id, term_offset, datagram, now_ns, record_eos=False)
        self._note_arrival(verdict)
        eos = state.packet_eos_position
        if eos is not None and verdict in (PacketVerdict.DATA, PacketVerdict.HEARTBEAT):
            self.eos_positions[transport_index] = eos
            bound = [index for index, transport in enumerate(self.endpoint.transports) if transport is not None]
            if all(index in self.eos_positions for index in bound):
                state.end_stream(max(self.eos_positions.values()))
        return verdict

    def _note_arrival(self, verdict: PacketVerdict) -> None:
        # Readers are woken for data, and for the end of the stream (a reader
        # of a closed stream stops on it); a plain heartbeat wakes nobody.
        if verdict is PacketVerdict.DATA or (verdict is PacketVerdict.HEARTBEAT and self.state.is_end_of_stream):
            self.data_arrived = True

    def join_position(self) -> int:
        """A late subscriber starts where the slowest subscriber is (Aeron's
        PublicationImage.joinPosition): what is still in the term buffers for
        the others is its too.  A cluster follower relies on it: its services
        subscribe to the log image after the consensus module has."""
        position = self.state.rebuild_position
        for link in self.subscribers:
            position = min(position, link.position.get())
        return position

    def do_work(self, now_ns: int) -> int:
        """The receiver's duty cycle for this image: rebuild, NAK, status messages."""
        positions = [link.position.get() for link in self.subscribers]
        work = self.state.rebuild(now_ns, positions)
        # Subscribers still reading will want a status message sent on
        # time; a gap has a NAK timer: either way the driver must not doze.
        self.needs_prompt_cycles = self.state.has_gap or (
            bool(positions) and min(positions) < self.state.rebuild_position)
        message = self.state.poll_status_message(now_ns)
        if message is not None:
            for transport_index, source in self.sources.items():
                self.endpoint.send_status_message(message, source, transport_index)
            self.system[SystemCounter.STATUS_MESSAGES_SENT].increment()
            work += 1
        nak = self.state.poll_nak()
        if nak is not None:
            for transport_index, source in self.sources.items():
                self.endpoint.send_nak(nak, source, transport_index)
            self.system[SystemCounter.NAK_MESSAGES_SENT].increment()
            work += 1
        state = self.state
        if state.hwm_position != self._published_hwm:
            self._published_hwm = state.hwm_position
            self.receiver_hwm.set(self._published_hwm)
        if state.rebuild_position != self._published_position:
            self._published_position = state.rebuild_position
            self.receiver_position.set(self._published_position)
        return work

    def is_drained(self) -> bool:
        """End of stream reached and every subscriber has read to it."""
        if not self.state.is_end_of_stream:
            return False
        end = self.state.rebuild_position
        return all(link.position.get() >= end for link in self.subscribers)
