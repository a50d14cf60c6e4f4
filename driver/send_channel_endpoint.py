"""The sending end of a UDP channel: one socket that sends a publication's
DATA, SETUP and heartbeats to its destination and receives the receivers'
control frames (status messages, NAKs, RTT measurements, errors) back."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fulmar.channel_uri import ChannelUri
from fulmar.errors import CodecError
from fulmar.frames import (
    SM_SEND_SETUP_FLAG,
    FrameType,
    decode_error,
    decode_nak,
    decode_rttm,
    decode_status_message,
    frame_type_of,
)

from fulmar.driver.loss_injection import LossInjector
from fulmar.driver.udp_transport import ChannelEndpointError, UdpAddress, UdpTransport

if TYPE_CHECKING:
    from fulmar.driver.network_publication import NetworkPublication


# A dynamic MDC destination that sends no status message for this long is dropped
# (Aeron's DESTINATION_TIMEOUT_NS).
DESTINATION_TIMEOUT_NS = 5_000_000_000


class SendChannelEndpoint:
    """One sending socket.  Unicast: to the channel's endpoint.  Multi-
    destination-cast: ``control-mode=dynamic`` (or a ``control`` address
    alone) binds the socket to the control address and sends to every
    receiver whose status messages arrive there; ``control-mode=manual``
    sends to the destinations clients add and remove."""

    def __init__(
        self,
        channel: ChannelUri,
        loss_injector: LossInjector | None,
        invalid_packet: Callable[[str], None],
        send_error: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.channel = channel
        self._send_error = send_error
        endpoint = channel.endpoint()
        control = channel.control()
        mode = channel.control_mode()
        self.is_manual = mode == "manual"
        self.is_dynamic = mode == "dynamic" or (control is not None and mode is None)
        if endpoint is None and not (self.is_manual or self.is_dynamic):
            raise ChannelEndpointError(f"channel '{channel}': a UDP publication needs an endpoint or a control address")
        if self.is_dynamic and control is None:
            raise ChannelEndpointError(f"channel '{channel}': control-mode=dynamic needs a control address")
        # Manual destinations (value None) or dynamic ones (last status message time).
        self.destinations: dict[UdpAddress, int | None] = {}
        if control is not None:
            bind = (control.host, control.port)
        elif endpoint is None:
            bind = ("0.0.0.0", 0)  # manual destinations only: any ephemeral port
        else:
            address = UdpAddress.resolve(endpoint.host, endpoint.port)
            self.destinations[address] = None
            interface = channel.interface()
            if interface is not None:
                bind = (interface.host, 0)
            elif address.host in ("127.0.0.1", "::1"):
                bind = (address.host, 0)  # stay on loopback for loopback peers
            else:
                bind = ("::" if ":" in address.host else "0.0.0.0", 0)
        self.transport = UdpTransport.open(bind, loss_injector=loss_injector)
        self.publications: dict[tuple[int, int], NetworkPublication] = {}
        self._invalid_packet = invalid_packet
        self._destination_list: list[UdpAddress] = list(self.destinations)

    def fileno(self) -> int:
        return self.transport.fileno()

    @property
    def local_address(self) -> tuple[str, int]:
        return self.transport.local_address

    def add(self, publication: "NetworkPublication") -> None:
        self.publications[(publication.session_id, publication.stream_id)] = publication

    def remove(self, publication: "NetworkPublication") -> None:
        self.publications.pop((publication.session_id, publication.stream_id), None)

    # ------------------------------------------------------------------ destinations

    def add_destination(self, address: UdpAddress) -> None:
        if not self.is_manual:
            raise ChannelEndpointError(f"channel '{self.channel}': destinations are added only with control-mode=manual")
        self.destinations[address] = None
        self._destination_list = list(self.destinations)

    def remove_destination(self, address: UdpAddress) -> bool:
        if not self.is_manual:
            raise ChannelEndpointError(f"channel '{self.channel}': destinations are removed only with control-mode=manual")
        removed = self.destinations.pop(address, 0) != 0
        self._destination_list = list(self.destinations)
        return removed

    def _on_receiver_heard(self, address: UdpAddress, now_ns: int) -> None:
        if self.is_dynamic:
            if address not in self.destinations:
                self.destinations[address] = now_ns
                self._destination_list = list(self.destinations)
            else:
                self.destinations[address] = now_ns

    def _expire_destinations(self, now_ns: int) -> None:
        expired = [
            address
            for address, heard_ns in self.destinations.items()
            if heard_ns is not None and now_ns - heard_ns > DESTINATION_TIMEOUT_NS
        ]
        if expired:
            for address in expired:
                del self.destinations[address]
            self._destination_list = list(self.destinations)

    # ------------------------------------------------------------------ sending

    def send(self, buffer: object, regions: list[tuple[int, int]]) -> None:
        """Send the regions to every destination; a failing destination is
        reported and the rest still get them (a retransmit repairs the loss)."""
        destinations = self._destination_list
        try:
            if len(destinations) == 1:
                self.transport.send(buffer, regions, destinations[0])  # type: ignore[arg-type]
            elif destinations:
                for outcome in self.transport.send_to_many(buffer, regions, destinations):  # type: ignore[arg-type]
                    if isinstance(outcome, ChannelEndpointError):
                        self._send_error(f"send channel {self.channel}: {outcome}")
        except ChannelEndpointError as error:
            self._send_error(f"send channel {self.channel}: {error}")

    def send_datagram(self, datagram: memoryview) -> None:
        for destination in self._destination_list:
            self.reply(datagram, destination)

    def reply(self, datagram: memoryview, destination: UdpAddress) -> None:
        try:
            self.transport.send_datagrams([datagram], destination)
        except ChannelEndpointError as error:
            self._send_error(f"send channel {self.channel}: {error}")

    # ------------------------------------------------------------------ control frames

    def poll(self, now_ns: int) -> int:
        """Dispatch the control frames waiting on the socket."""
        batch = self.transport.receive()
        count = len(batch)
        for index in range(count):
            datagram = batch.datagram(index)
            try:
                self._dispatch(datagram, batch.source_address(index), now_ns)
            except CodecError as error:
                self._invalid_packet(f"send channel {self.channel}: {error}")
        if self.is_dynamic:
            self._expire_destinations(now_ns)
        return count

    def _dispatch(self, datagram: memoryview, source: UdpAddress, now_ns: int) -> None:
        frame_type = frame_type_of(datagram)
        publication: NetworkPublication | None
        if frame_type == FrameType.SM:
            sm = decode_status_message(datagram)
            self._on_receiver_heard(source, now_ns)
            if sm.session_id == 0 and sm.stream_id == 0 and sm.flags & SM_SEND_SETUP_FLAG:
                # A receiver announcing itself to a control address: every
                # publication here sends it a SETUP.
                for publication in self.publications.values():
                    publication.on_status_message(sm, now_ns)
                return
            self._publication(sm.session_id, sm.stream_id, "SM").on_status_message(sm, now_ns)
        elif frame_type == FrameType.NAK:
            nak = decode_nak(datagram)
            self._publication(nak.session_id, nak.stream_id, "NAK").on_nak(nak, now_ns)
        elif frame_type == FrameType.RTTM:
            rttm = decode_rttm(datagram)
            self._publication(rttm.session_id, rttm.stream_id, "RTTM").on_rttm(rttm, source, now_ns)
        elif frame_type == FrameType.ERR:
            error = decode_error(datagram)
            self._publication(error.session_id, error.stream_id, "ERR").on_error_frame(error, now_ns)
        else:
            raise CodecError(f"unexpected frame type {frame_type} on a send channel")

    def _publication(self, session_id: int, stream_id: int, frame_name: str) -> "NetworkPublication":
        """The publication a control frame is for.  A frame for none of ours
        (a receiver that outlived its publication, or a forger) raises, so
        that it is counted as an invalid packet instead of vanishing unseen."""
        publication = self.publications.get((session_id, stream_id))
        if publication is None:
            raise CodecError(f"{frame_name} for session {session_id} stream {stream_id}, which is not sent here")
        return publication

    def close(self) -> None:
        self.transport.close()
