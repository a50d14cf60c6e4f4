"""The receiving end of a UDP channel: the bound sockets (transports) that
take in DATA, PAD and SETUP frames for the streams subscribed on it.

The conductor opens and binds the sockets here; the data plane
(``data_plane.py``) reads them, feeds the images and sends status messages
and NAKs back.  This record keeps what the conductor decides with: the
channel, its transports, which streams are subscribed and the images it has.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from fulmar.channel_uri import ChannelUri
from fulmar.driver.data_plane import MAX_STREAMS, MAX_TRANSPORTS, DataPlane, DataPlaneError
from fulmar.driver.udp_transport import ChannelEndpointError, UdpAddress, UdpTransport

if TYPE_CHECKING:
    from fulmar.driver.publication_image import PublicationImage


class ReceiveChannelEndpoint:
    def __init__(
        self,
        endpoint_id: int,
        channel: ChannelUri,
        data_plane: DataPlane,
        socket_rcvbuf: int,
        socket_sndbuf: int,
    ) -> None:
        self.id = endpoint_id
        self.channel = channel
        self._data_plane = data_plane
        # What its sockets ask the OS for (0: its default); every transport the same.
        self.socket_rcvbuf = socket_rcvbuf
        self.socket_sndbuf = socket_sndbuf
        # A multi-destination subscription (control-mode=manual) receives on
        # every transport its client adds; any other on its one endpoint.
        self.is_manual = channel.control_mode() == "manual"
        endpoint = channel.endpoint()
        if endpoint is None and not self.is_manual:
            raise ChannelEndpointError(f"channel '{channel}': a UDP subscription needs an endpoint to bind")
        # Subscribers of a dynamic multi-destination-cast publication name its
        # control address: the data plane announces them there until data flows.
        control = channel.control()
        control_address = UdpAddress.resolve(control.host, control.port) if control is not None else None
        # tags=N: later subscriptions naming the tag share this endpoint (and its destinations).
        self.tag = channel.channel_tag()
        self.stream_refs: dict[int, int] = {}
        self.images: dict[tuple[int, int], PublicationImage] = {}
        self.transports: list[UdpTransport | None] = []
        self.receiver_id = random.getrandbits(63)
        self.datagram_mac = channel.datagram_mac()
        try:
            # A receiver in a flow-control group says so in every status message (gtag).
            data_plane.add_receive_endpoint(
                endpoint_id, self.receiver_id, channel.group_tag(), control_address, self.is_manual, str(channel),
                datagram_mac=self.datagram_mac,
            )  # fmt: skip
        except DataPlaneError as error:
            raise ChannelEndpointError(f"channel '{channel}': {error}") from None
        if endpoint is not None:
            try:
                self.add_transport(endpoint.host, endpoint.port)
            except BaseException:
                data_plane.remove_endpoint(endpoint_id)
                raise

    def add_transport(self, host: str, port: int) -> UdpTransport:
        if len(self.transports) >= MAX_TRANSPORTS:
            raise ChannelEndpointError(
                f"channel '{self.channel}': at most {MAX_TRANSPORTS} receive destinations (transports) per subscription"
            )
        # The data plane receives on the socket itself: one slot is all this object maps.
        transport = UdpTransport.open(
            (host, port), so_rcvbuf=self.socket_rcvbuf, so_sndbuf=self.socket_sndbuf, receive_batch=1
        )
        try:
            self._data_plane.set_transport(self.id, len(self.transports), transport.fileno())
        except DataPlaneError as error:
            transport.close()
            raise ChannelEndpointError(f"channel '{self.channel}': {host}:{port}: {error}") from None
        self.transports.append(transport)
        return transport

    def remove_transport(self, host: str, port: int) -> UdpTransport | None:
        """Take out the transport bound to ``host:port`` (the caller closes it);
        its slot stays empty so the other transports keep their indices."""
        wanted = UdpAddress.resolve(host, port)
        for index, transport in enumerate(self.transports):
            if transport is not None and UdpAddress.resolve(*transport.local_address[:2]) == wanted:
                self._data_plane.set_transport(self.id, index, -1)
                self.transports[index] = None
                return transport
        return None

    @property
    def local_address(self) -> tuple[str, int]:
        transport = next((t for t in self.transports if t is not None), None)
        if transport is None:
            raise ChannelEndpointError(f"channel '{self.channel}' has no receive destination")
        return transport.local_address

    def add_stream(self, stream_id: int) -> None:
        if stream_id not in self.stream_refs:
            if len(self.stream_refs) >= MAX_STREAMS:
                raise ChannelEndpointError(
                    f"channel '{self.channel}': at most {MAX_STREAMS} streams per receive endpoint"
                )
            self._data_plane.set_streams(self.id, [*self.stream_refs, stream_id])
        self.stream_refs[stream_id] = self.stream_refs.get(stream_id, 0) + 1

    def remove_stream(self, stream_id: int) -> bool:
        """Drop one subscription's interest; True when nobody wants the stream any more."""
        remaining = self.stream_refs.get(stream_id, 0) - 1
        if remaining > 0:
            self.stream_refs[stream_id] = remaining
            return False
        self.stream_refs.pop(stream_id, None)
        self._data_plane.set_streams(self.id, list(self.stream_refs))
        return True

    def close(self) -> None:
        self._data_plane.remove_endpoint(self.id)
        for transport in self.transports:
            if transport is not None:
                transport.close()
