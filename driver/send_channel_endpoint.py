"""The sending end of a UDP channel: one socket that sends a publication's
DATA, SETUP and heartbeats to its destination and receives the receivers'
control frames (status messages, NAKs, RTT measurements, errors) back."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fulmar.channel_uri import ChannelUri
from fulmar.errors import CodecError
from fulmar.frames import (
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


class SendChannelEndpoint:
    def __init__(
        self, channel: ChannelUri, loss_injector: LossInjector | None, invalid_packet: Callable[[str], None]
    ) -> None:
        self.channel = channel
        endpoint = channel.endpoint()
        if endpoint is None:
            raise ChannelEndpointError(f"channel '{channel}': a UDP publication needs an endpoint")
        self.destination = UdpAddress.resolve(endpoint.host, endpoint.port)
        interface = channel.interface()
        bind_host = interface.host if interface is not None else ("::" if self.destination.family == 10 else "0.0.0.0")
        if self.destination.host in ("127.0.0.1", "::1") and interface is None:
            bind_host = self.destination.host  # stay on loopback for loopback peers
        self.transport = UdpTransport.open((bind_host, 0), loss_injector=loss_injector)
        self.publications: dict[tuple[int, int], NetworkPublication] = {}
        self._invalid_packet = invalid_packet
        self.ref_count = 0

    @property
    def key(self) -> str:
        return str(self.channel)

    def fileno(self) -> int:
        return self.transport.fileno()

    def add(self, publication: "NetworkPublication") -> None:
        self.publications[(publication.session_id, publication.stream_id)] = publication

    def remove(self, publication: "NetworkPublication") -> None:
        self.publications.pop((publication.session_id, publication.stream_id), None)

    def poll(self, now_ns: int) -> int:
        """Dispatch the control frames waiting on the socket."""
        batch = self.transport.receive()
        count = len(batch)
        for index in range(count):
            datagram = batch.datagram(index)
            try:
                self._dispatch(datagram, now_ns)
            except CodecError as error:
                self._invalid_packet(f"send channel {self.channel}: {error}")
        return count

    def _dispatch(self, datagram: memoryview, now_ns: int) -> None:
        frame_type = frame_type_of(datagram)
        if frame_type == FrameType.SM:
            sm = decode_status_message(datagram)
            publication = self.publications.get((sm.session_id, sm.stream_id))
            if publication is not None:
                publication.on_status_message(sm, now_ns)
        elif frame_type == FrameType.NAK:
            nak = decode_nak(datagram)
            publication = self.publications.get((nak.session_id, nak.stream_id))
            if publication is not None:
                publication.on_nak(nak, now_ns)
        elif frame_type == FrameType.RTTM:
            rttm = decode_rttm(datagram)
            publication = self.publications.get((rttm.session_id, rttm.stream_id))
            if publication is not None:
                publication.on_rttm(rttm, now_ns)
        elif frame_type == FrameType.ERR:
            error = decode_error(datagram)
            publication = self.publications.get((error.session_id, error.stream_id))
            if publication is not None:
                publication.on_error_frame(error, now_ns)
        else:
            raise CodecError(f"unexpected frame type {frame_type} on a send channel")

    def close(self) -> None:
        self.transport.close()

