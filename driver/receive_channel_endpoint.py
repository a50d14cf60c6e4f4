"""The receiving end of a UDP channel: one bound socket that takes in DATA,
PAD and SETUP frames for the streams subscribed on it, feeds them to the
images, and sends status messages and NAKs back to each image's source."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from fulmar.channel_uri import ChannelUri
from fulmar.errors import CodecError
from fulmar.frames import (
    SM_SEND_SETUP_FLAG,
    FrameType,
    SetupFrame,
    decode_setup,
    encode_nak,
    encode_status_message,
    frame_type_of,
)

from fulmar.driver.image_state import NakToSend, PacketVerdict, StatusMessageToSend
from fulmar.driver.loss_injection import LossInjector
from fulmar.driver.udp_transport import ChannelEndpointError, UdpAddress, UdpTransport

if TYPE_CHECKING:
    from fulmar.driver.publication_image import PublicationImage

_DATA_IDS = struct.Struct("<iiii")  # term offset, session id, stream id, term id at offset 8

# How often a subscriber of a dynamic MDC channel announces itself while it
# has no image (setup-eliciting status messages to the control address).
ANNOUNCE_INTERVAL_NS = 200_000_000

SetupHandler = Callable[["ReceiveChannelEndpoint", SetupFrame, UdpAddress, int], None]


class ReceiveChannelEndpoint:
    def __init__(
        self,
        channel: ChannelUri,
        loss_injector: LossInjector | None,
        invalid_packet: Callable[[str], None],
        on_setup: SetupHandler,
    ) -> None:
        self.channel = channel
        endpoint = channel.endpoint()
        if endpoint is None:
            raise ChannelEndpointError(f"channel '{channel}': a UDP subscription needs an endpoint to bind")
        self.transport = UdpTransport.open((endpoint.host, endpoint.port), loss_injector=loss_injector)
        # Subscribers of a dynamic multi-destination-cast publication name its
        # control address: they announce themselves there until data flows.
        control = channel.control()
        self.control_address = UdpAddress.resolve(control.host, control.port) if control is not None else None
        self._next_announce_ns = 0
        self.stream_refs: dict[int, int] = {}
        self.images: dict[tuple[int, int], PublicationImage] = {}
        self.receiver_id = random.getrandbits(63)
        self._invalid_packet = invalid_packet
        self._on_setup = on_setup
        self._scratch = bytearray(64)

    @property
    def local_address(self) -> tuple[str, int]:
        return self.transport.local_address

    def fileno(self) -> int:
        return self.transport.fileno()

    def add_stream(self, stream_id: int) -> None:
        self.stream_refs[stream_id] = self.stream_refs.get(stream_id, 0) + 1

    def remove_stream(self, stream_id: int) -> bool:
        """Drop one subscription's interest; True when nobody wants the stream any more."""
        remaining = self.stream_refs.get(stream_id, 0) - 1
        if remaining > 0:
            self.stream_refs[stream_id] = remaining
            return False
        self.stream_refs.pop(stream_id, None)
        return True

    def poll(self, now_ns: int) -> int:
        if self.control_address is not None and not self.images and now_ns >= self._next_announce_ns:
            self._next_announce_ns = now_ns + ANNOUNCE_INTERVAL_NS
            self._send_setup_request(0, 0, 0, 0, self.control_address)
        batch = self.transport.receive()
        count = len(batch)
        for index in range(count):
            datagram = batch.datagram(index)
            try:
                self._dispatch(datagram, batch, index, now_ns)
            except CodecError as error:
                self._invalid_packet(f"receive channel {self.channel}: {error}")
        return count

    def _dispatch(self, datagram: memoryview, batch: object, index: int, now_ns: int) -> None:
        frame_type = frame_type_of(datagram)
        if frame_type in (FrameType.DATA, FrameType.PAD):
            if len(datagram) < 32:
                raise CodecError(f"a DATA datagram of {len(datagram)} bytes is shorter than its header")
            term_offset, session_id, stream_id, term_id = _DATA_IDS.unpack_from(datagram, 8)
            image = self.images.get((session_id, stream_id))
            if image is None:
                if stream_id in self.stream_refs:
                    # Data from a sender we have no image for: ask it for a SETUP.
                    source = batch.source_address(index)  # type: ignore[attr-defined]
                    self._send_setup_request(session_id, stream_id, term_id, term_offset, source)
                return
            verdict = image.state.insert_packet(term_id, term_offset, datagram, now_ns)
            if verdict is PacketVerdict.INVALID:
                raise CodecError(f"malformed DATA for session {session_id} stream {stream_id}")
        elif frame_type == FrameType.SETUP:
            setup = decode_setup(datagram)
            if setup.stream_id not in self.stream_refs:
                return
            image = self.images.get((setup.session_id, setup.stream_id))
            if image is None:
                self._on_setup(self, setup, batch.source_address(index), now_ns)  # type: ignore[attr-defined]
            else:
                image.state.request_status_message()  # the sender has not heard us yet
        elif frame_type == FrameType.RTTM:
            return  # RTT measurement is not used by the receiver yet
        else:
            raise CodecError(f"unexpected frame type {frame_type} on a receive channel")

    def _send_setup_request(self, session_id: int, stream_id: int, term_id: int, term_offset: int, source: UdpAddress) -> None:
        length = encode_status_message(
            self._scratch,
            0,
            session_id=session_id,
            stream_id=stream_id,
            consumption_term_id=term_id,
            consumption_term_offset=term_offset,
            receiver_window=0,
            receiver_id=self.receiver_id,
            flags=SM_SEND_SETUP_FLAG,
        )
        try:
            self.transport.send_datagrams([memoryview(self._scratch)[:length]], source)
        except ChannelEndpointError:
            pass  # unreachable for now: the next announcement or data retries

    def send_status_message(self, message: StatusMessageToSend, destination: UdpAddress) -> None:
        length = encode_status_message(
            self._scratch,
            0,
            session_id=message.session_id,
            stream_id=message.stream_id,
            consumption_term_id=message.consumption_term_id,
            consumption_term_offset=message.consumption_term_offset,
            receiver_window=message.receiver_window,
            receiver_id=self.receiver_id,
            flags=message.flags,
        )
        self.transport.send_datagrams([memoryview(self._scratch)[:length]], destination)

    def send_nak(self, nak: NakToSend, destination: UdpAddress) -> None:
        length = encode_nak(
            self._scratch,
            0,
            session_id=nak.session_id,
            stream_id=nak.stream_id,
            term_id=nak.term_id,
            term_offset=nak.term_offset,
            length=nak.length,
        )
        self.transport.send_datagrams([memoryview(self._scratch)[:length]], destination)

    def close(self) -> None:
        self.transport.close()
