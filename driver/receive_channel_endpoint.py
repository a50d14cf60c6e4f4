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
    decode_rttm,
    decode_setup,
    encode_nak,
    encode_status_message,
    frame_type_of,
)

from fulmar.driver.counters import SystemCounter
from fulmar.driver.image_state import NakToSend, PacketVerdict, StatusMessageToSend
from fulmar.driver.loss_injection import LossInjector
from fulmar.driver.udp_transport import ChannelEndpointError, UdpAddress, UdpTransport

if TYPE_CHECKING:
    from fulmar.driver.publication_image import PublicationImage

_DATA_IDS = struct.Struct("<iiii")  # term offset, session id, stream id, term id at offset 8

# How often a subscriber of a dynamic MDC channel announces itself while it
# has no image (setup-eliciting status messages to the control address).
ANNOUNCE_INTERVAL_NS = 200_000_000

SetupHandler = Callable[["ReceiveChannelEndpoint", SetupFrame, UdpAddress, int, int], None]


class ReceiveChannelEndpoint:
    def __init__(
        self,
        channel: ChannelUri,
        loss_injector: LossInjector | None,
        invalid_packet: Callable[[str], None],
        on_setup: SetupHandler,
    ) -> None:
        self.channel = channel
        self._loss_injector = loss_injector
        # A multi-destination subscription (control-mode=manual) receives on
        # every transport its client adds; any other on its one endpoint.
        self.is_manual = channel.control_mode() == "manual"
        self.transports: list[UdpTransport | None] = []
        endpoint = channel.endpoint()
        if endpoint is not None:
            self.add_transport(endpoint.host, endpoint.port)
        elif not self.is_manual:
            raise ChannelEndpointError(f"channel '{channel}': a UDP subscription needs an endpoint to bind")
        # Subscribers of a dynamic multi-destination-cast publication name its
        # control address: they announce themselves there until data flows.
        control = channel.control()
        self.control_address = UdpAddress.resolve(control.host, control.port) if control is not None else None
        # A receiver in a flow-control group says so in every status message (gtag).
        self.group_tag = channel.group_tag()
        # tags=N: later subscriptions naming the tag share this endpoint (and its destinations).
        self.tag = channel.channel_tag()
        self._next_announce_ns = 0
        self.stream_refs: dict[int, int] = {}
        self.images: dict[tuple[int, int], PublicationImage] = {}
        self.receiver_id = random.getrandbits(63)
        self._invalid_packet = invalid_packet
        self._on_setup = on_setup
        self._scratch = bytearray(64)

    def add_transport(self, host: str, port: int) -> UdpTransport:
        transport = UdpTransport.open((host, port), loss_injector=self._loss_injector)
        self.transports.append(transport)
        return transport

    def remove_transport(self, host: str, port: int) -> UdpTransport | None:
        """Take out the transport bound to ``host:port`` (the caller closes it);
        its slot stays empty so the other transports keep their indices."""
        wanted = UdpAddress.resolve(host, port)
        for index, transport in enumerate(self.transports):
            if transport is not None and UdpAddress.resolve(*transport.local_address[:2]) == wanted:
                self.transports[index] = None
                for image in self.images.values():
                    image.sources.pop(index, None)
                    image.eos_positions.pop(index, None)
                return transport
        return None

    @property
    def local_address(self) -> tuple[str, int]:
        return self._first_transport().local_address

    def _first_transport(self) -> UdpTransport:
        transport = next((t for t in self.transports if t is not None), None)
        if transport is None:
            raise ChannelEndpointError(f"channel '{self.channel}' has no receive destination")
        return transport

    def filenos(self) -> list[int]:
        return [t.fileno() for t in self.transports if t is not None]

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
            self._send_setup_request(0, 0, 0, 0, self.control_address, 0)
        count = 0
        for transport_index, transport in enumerate(self.transports):
            if transport is None:
                continue
            batch = transport.receive()
            received = len(batch)
            count += received
            for index in range(received):
                datagram = batch.datagram(index)
                try:
                    self._dispatch(datagram, batch.source_address(index), transport_index, now_ns)
                except CodecError as error:
                    self._invalid_packet(f"receive channel {self.channel}: {error}")
        return count

    def _dispatch(self, datagram: memoryview, source: UdpAddress, transport_index: int, now_ns: int) -> None:
        frame_type = frame_type_of(datagram)
        if frame_type in (FrameType.DATA, FrameType.PAD):
            if len(datagram) < 32:
                raise CodecError(f"a DATA datagram of {len(datagram)} bytes is shorter than its header")
            term_offset, session_id, stream_id, term_id = _DATA_IDS.unpack_from(datagram, 8)
            image = self.images.get((session_id, stream_id))
            if image is None:
                if stream_id not in self.stream_refs:
                    # Counted, not ignored: a frame no subscriber can ever take
                    # is either misdirected or hostile, and must show somewhere.
                    raise CodecError(f"DATA for stream {stream_id}, which nobody subscribes here")
                # Data from a sender we have no image for: ask it for a SETUP.
                self._send_setup_request(session_id, stream_id, term_id, term_offset, source, transport_index)
                return
            if transport_index not in image.sources:
                image.sources[transport_index] = source  # one more source feeding this image
            verdict = image.insert_packet(transport_index, term_id, term_offset, datagram, now_ns)
            if verdict is PacketVerdict.INVALID:
                raise CodecError(f"malformed DATA for session {session_id} stream {stream_id}")
            # Outside the receiver window: dropped, and counted as Aeron does
            # (a sender that honours our status messages never gets there).
            if verdict is PacketVerdict.OVER_RUN:
                image.system[SystemCounter.FLOW_CONTROL_OVER_RUNS].increment()
            elif verdict is PacketVerdict.UNDER_RUN:
                image.system[SystemCounter.FLOW_CONTROL_UNDER_RUNS].increment()
        elif frame_type == FrameType.SETUP:
            setup = decode_setup(datagram)
            if setup.stream_id not in self.stream_refs:
                raise CodecError(f"SETUP for stream {setup.stream_id}, which nobody subscribes here")
            image = self.images.get((setup.session_id, setup.stream_id))
            if image is None:
                self._on_setup(self, setup, source, transport_index, now_ns)
            else:
                image.sources[transport_index] = source
                image.state.request_status_message()  # this sender has not heard us yet
        elif frame_type == FrameType.RTTM:
            # This receiver never asks for RTT measurements, so a sender has
            # nothing to answer: decoded (a malformed one is reported as
            # such), then counted as unsolicited rather than dropped unseen.
            rttm = decode_rttm(datagram)
            raise CodecError(f"unsolicited RTTM for session {rttm.session_id} stream {rttm.stream_id}")
        else:
            raise CodecError(f"unexpected frame type {frame_type} on a receive channel")

    def _send_setup_request(
        self, session_id: int, stream_id: int, term_id: int, term_offset: int, source: UdpAddress, transport_index: int
    ) -> None:
        length = encode_status_message(
            self._scratch,
            0,
            session_id=session_id,
            stream_id=stream_id,
            consumption_term_id=term_id,
            consumption_term_offset=term_offset,
            receiver_window=0,
            receiver_id=self.receiver_id,
            group_tag=self.group_tag,
            flags=SM_SEND_SETUP_FLAG,
        )
        self._send(memoryview(self._scratch)[:length], source, transport_index)

    def _send(self, datagram: memoryview, destination: UdpAddress, transport_index: int) -> None:
        transport = self.transports[transport_index] if transport_index < len(self.transports) else None
        if transport is None:
            return
        try:
            transport.send_datagrams([datagram], destination)
        except ChannelEndpointError:
            pass  # unreachable for now: the next status message or NAK retries

    def send_status_message(self, message: StatusMessageToSend, destination: UdpAddress, transport_index: int) -> None:
        length = encode_status_message(
            self._scratch,
            0,
            session_id=message.session_id,
            stream_id=message.stream_id,
            consumption_term_id=message.consumption_term_id,
            consumption_term_offset=message.consumption_term_offset,
            receiver_window=message.receiver_window,
            receiver_id=self.receiver_id,
            group_tag=self.group_tag,
            flags=message.flags,
        )
        self._send(memoryview(self._scratch)[:length], destination, transport_index)

    def send_nak(self, nak: NakToSend, destination: UdpAddress, transport_index: int) -> None:
        length = encode_nak(
            self._scratch,
            0,
            session_id=nak.session_id,
            stream_id=nak.stream_id,
            term_id=nak.term_id,
            term_offset=nak.term_offset,
            length=nak.length,
        )
        self._send(memoryview(self._scratch)[:length], destination, transport_index)

    def close(self) -> None:
        for transport in self.transports:
            if transport is not None:
                transport.close()
