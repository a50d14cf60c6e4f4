"""The sending end of a UDP channel: one socket that sends a publication's
DATA, SETUP and heartbeats to its destination and receives the receivers'
control frames (status messages, NAKs, RTT measurements, errors) back.

The conductor opens and binds the socket here; the data plane
(``data_plane.py``) sends on it and reads it.  This record keeps what the
conductor decides with: the channel, the destinations of a manual
multi-destination-cast channel, and the publications that share the socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fulmar.channel_uri import ChannelUri
from fulmar.driver.data_plane import CONTROL_DYNAMIC, CONTROL_MANUAL, CONTROL_UNICAST, DataPlane, DataPlaneError
from fulmar.driver.udp_transport import ChannelEndpointError, UdpAddress, UdpTransport

if TYPE_CHECKING:
    from fulmar.driver.network_publication import NetworkPublication


class SendChannelEndpoint:
    """One sending socket.  Unicast: to the channel's endpoint.  Multi-
    destination-cast: ``control-mode=dynamic`` (or a ``control`` address
    alone) binds the socket to the control address and sends to every
    receiver whose status messages arrive there; ``control-mode=manual``
    sends to the destinations clients add and remove."""

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
        # What its socket asks the OS for (0: its default).
        self.socket_rcvbuf = socket_rcvbuf
        self.socket_sndbuf = socket_sndbuf
        endpoint = channel.endpoint()
        control = channel.control()
        mode = channel.control_mode()
        self.is_manual = mode == "manual"
        self.is_dynamic = mode == "dynamic" or (control is not None and mode is None)
        self.datagram_mac = channel.datagram_mac()
        if endpoint is None and not (self.is_manual or self.is_dynamic):
            raise ChannelEndpointError(f"channel '{channel}': a UDP publication needs an endpoint or a control address")
        if self.is_dynamic and control is None:
            raise ChannelEndpointError(f"channel '{channel}': control-mode=dynamic needs a control address")
        destination = None
        if control is not None:
            bind = (control.host, control.port)
        elif endpoint is None:
            bind = ("0.0.0.0", 0)  # manual destinations only: any ephemeral port
        else:
            destination = UdpAddress.resolve(endpoint.host, endpoint.port)
            interface = channel.interface()
            if interface is not None:
                bind = (interface.host, 0)
            elif destination.host in ("127.0.0.1", "::1"):
                bind = (destination.host, 0)  # stay on loopback for loopback peers
            else:
                bind = ("::" if ":" in destination.host else "0.0.0.0", 0)
        # The data plane receives on the socket itself: one slot is all this object maps.
        self.transport = UdpTransport.open(bind, so_rcvbuf=socket_rcvbuf, so_sndbuf=socket_sndbuf, receive_batch=1)
        if self.is_manual:
            control_mode = CONTROL_MANUAL
        elif self.is_dynamic:
            control_mode = CONTROL_DYNAMIC
        else:
            control_mode = CONTROL_UNICAST
        try:
            data_plane.add_send_endpoint(
                endpoint_id, self.transport.fileno(), control_mode,
                destination if control_mode == CONTROL_UNICAST else None, str(channel),
                datagram_mac=self.datagram_mac,
            )  # fmt: skip
        except DataPlaneError as error:
            self.transport.close()
            raise ChannelEndpointError(f"channel '{channel}': {error}") from None
        if self.is_manual and destination is not None:
            # A manual channel that names an endpoint sends there too, as a destination it can remove.
            try:
                data_plane.add_destination(endpoint_id, destination)
            except DataPlaneError as error:
                self.close()
                raise ChannelEndpointError(f"channel '{channel}': {error}") from None
        self.publications: dict[tuple[int, int], NetworkPublication] = {}

    def fileno(self) -> int:
        return self.transport.fileno()

    @property
    def local_address(self) -> tuple[str, int]:
        return self.transport.local_address

    def add(self, publication: NetworkPublication) -> None:
        self.publications[(publication.session_id, publication.stream_id)] = publication

    def remove(self, publication: NetworkPublication) -> None:
        self.publications.pop((publication.session_id, publication.stream_id), None)

    def add_destination(self, address: UdpAddress) -> None:
        if not self.is_manual:
            raise ChannelEndpointError(
                f"channel '{self.channel}': destinations are added only with control-mode=manual"
            )
        try:
            self._data_plane.add_destination(self.id, address)
        except DataPlaneError as error:
            raise ChannelEndpointError(f"channel '{self.channel}': destination {address}: {error}") from None

    def remove_destination(self, address: UdpAddress) -> bool:
        if not self.is_manual:
            raise ChannelEndpointError(
                f"channel '{self.channel}': destinations are removed only with control-mode=manual"
            )
        return self._data_plane.remove_destination(self.id, address)

    def close(self) -> None:
        self._data_plane.remove_endpoint(self.id)
        self.transport.close()
