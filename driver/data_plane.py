"""The media driver's data plane: the native thread that sends network
publications, receives images and moves IPC publishers' limits
(``driver/native/dataplane.h``), seen from the conductor.

The conductor opens the sockets, maps the log buffers and allocates the
counters, then hands them over here by id; it asks for the state it needs for
its slow work (draining, lingering, liveness) and takes the events the thread
leaves for it (a SETUP that needs an image, an error to record).  A call
returns once the thread has seen the change: after ``remove`` the thread no
longer touches the log or the socket.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from fulmar._native import ffi, lib
from fulmar.buffers import AtomicBuffer
from fulmar.channel_uri import (
    CONTROL_MODE_DYNAMIC,
    CONTROL_MODE_MANUAL,
    CONTROL_PARAM,
    FLOW_CONTROL_MAX,
    FLOW_CONTROL_MIN,
    FLOW_CONTROL_PARAM,
    FLOW_CONTROL_TAGGED,
    ChannelUri,
    InvalidChannelError,
)
from fulmar.driver.udp_transport import UdpAddress, native_address
from fulmar.errors import FulmarError
from fulmar.idle import Doorbell

CONTROL_UNICAST = int(lib.FULMAR_DP_CONTROL_UNICAST)
CONTROL_MANUAL = int(lib.FULMAR_DP_CONTROL_MANUAL)
CONTROL_DYNAMIC = int(lib.FULMAR_DP_CONTROL_DYNAMIC)
EVENT_SETUP = int(lib.FULMAR_DP_EVENT_SETUP)
EVENT_ERROR = int(lib.FULMAR_DP_EVENT_ERROR)
MAX_TRANSPORTS = int(lib.FULMAR_DP_MAX_TRANSPORTS)
MAX_STREAMS = int(lib.FULMAR_DP_MAX_STREAMS)

_RESULTS = {
    int(lib.FULMAR_DP_UNKNOWN): "unknown id",
    int(lib.FULMAR_DP_EXISTS): "id already in use",
    int(lib.FULMAR_DP_NO_MEMORY): "out of memory",
    int(lib.FULMAR_DP_INVALID): "invalid argument",
    int(lib.FULMAR_DP_FULL): "table full",
}

# Aeron's defaults (Configuration.java / aeron_driver_context.c).
FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS = 5_000_000_000
FLOW_CONTROL_GROUP_TAG_DEFAULT = -1
FLOW_CONTROL_GROUP_MIN_SIZE_DEFAULT = 0
INITIAL_WINDOW_LENGTH_DEFAULT = 128 * 1024
STATUS_MESSAGE_TIMEOUT_DEFAULT_NS = 200_000_000

_EVENT_BATCH = 64


class DataPlaneError(FulmarError):
    """A data plane call failed: the message says which and why."""


def _check(result: int, what: str) -> int:
    if result < 0:
        raise DataPlaneError(f"{what}: {_RESULTS.get(result, f'error {result}')}")
    return result


def has_group_semantics(uri: ChannelUri) -> bool:
    """Multicast or multi-destination (MDC): many receivers may answer one publication.

    As ``aeron_default_multicast_flow_control_strategy_supplier``: a multicast
    endpoint, an explicit ``control`` address, or ``control-mode`` manual or
    dynamic.  A host name endpoint counts as unicast (it is not resolved here).
    """
    if CONTROL_PARAM in uri or uri.control_mode() in (CONTROL_MODE_MANUAL, CONTROL_MODE_DYNAMIC):
        return True
    endpoint = uri.endpoint()
    if endpoint is None:
        return False
    try:
        return ipaddress.ip_address(endpoint.host.split("%", 1)[0]).is_multicast
    except ValueError:
        return False


@dataclass(frozen=True)
class FlowControlSettings:
    """Which strategy a network publication's sender uses, and its parameters (see flow_control.h)."""

    strategy: int
    receiver_timeout_ns: int = FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS
    group_tag: int = FLOW_CONTROL_GROUP_TAG_DEFAULT
    group_min_size: int = FLOW_CONTROL_GROUP_MIN_SIZE_DEFAULT


def flow_control_settings(
    uri: ChannelUri,
    multicast_default: str = FLOW_CONTROL_MAX,
    *,
    receiver_timeout_ns: int = FLOW_CONTROL_RECEIVER_TIMEOUT_DEFAULT_NS,
    group_tag: int = FLOW_CONTROL_GROUP_TAG_DEFAULT,
    group_min_size: int = FLOW_CONTROL_GROUP_MIN_SIZE_DEFAULT,
) -> FlowControlSettings:
    """The strategy for a publication's channel, with the driver's defaults
    for what the channel leaves out.

    Unicast channels get unicast flow control; an ``fc`` parameter on one is
    an error (as Aeron's Java driver; the C driver ignores it).  Multicast and
    MDC channels get the ``fc`` strategy, or ``multicast_default`` (Aeron's
    ``MULTICAST_FLOW_CONTROL_STRATEGY_DEFAULT``: max).  The ``g:`` and ``t:``
    options override the driver-wide group tag, minimum group size and
    receiver timeout; only ``tagged`` uses a group tag (``min`` keeps the
    default), and only ``min`` and ``tagged`` a minimum group size.
    """
    fc = uri.flow_control()
    if not has_group_semantics(uri):
        if fc is not None:
            raise InvalidChannelError(
                str(uri), f"'{FLOW_CONTROL_PARAM}' applies to multicast and multi-destination channels, not unicast"
            )
        return FlowControlSettings(int(lib.FULMAR_FC_UNICAST), receiver_timeout_ns)
    strategy = multicast_default if fc is None else fc.strategy
    if fc is not None:
        receiver_timeout_ns = fc.timeout_ns if fc.timeout_ns is not None else receiver_timeout_ns
        group_tag = fc.group_tag if fc.group_tag is not None else group_tag
        group_min_size = fc.group_min_size if fc.group_min_size is not None else group_min_size
    if strategy == FLOW_CONTROL_MAX:
        return FlowControlSettings(int(lib.FULMAR_FC_MAX), receiver_timeout_ns)
    if strategy == FLOW_CONTROL_MIN:
        return FlowControlSettings(int(lib.FULMAR_FC_MIN), receiver_timeout_ns, group_min_size=group_min_size)
    if strategy == FLOW_CONTROL_TAGGED:
        return FlowControlSettings(int(lib.FULMAR_FC_TAGGED), receiver_timeout_ns, group_tag, group_min_size)
    raise InvalidChannelError(str(uri), f"unknown flow control strategy {strategy!r} (expected max, min or tagged)")


@dataclass(frozen=True)
class PublicationStatus:
    sender_position: int  # network: sent; IPC: the consumers' furthest position
    producer_position: int
    is_connected: bool
    is_end_of_stream_sent: bool
    retransmits_active: int
    setup_backing_off: bool


@dataclass(frozen=True)
class ImageStatus:
    rebuild_position: int
    hwm_position: int
    time_of_last_packet_ns: int
    is_end_of_stream: bool


@dataclass(frozen=True)
class DataPlaneStats:
    duty_cycles: int
    sleeps: int
    planned_wait_ns: int  # how long it meant to sleep the last time it found nothing to do


@dataclass(frozen=True)
class SetupEvent:
    """A SETUP of a subscribed stream with no image yet (the fields are the frame's)."""

    endpoint_id: int
    transport_index: int
    source: UdpAddress
    term_offset: int
    session_id: int
    stream_id: int
    initial_term_id: int
    active_term_id: int
    term_length: int
    mtu_length: int
    ttl: int


def _address(address: UdpAddress | None) -> object:
    return ffi.NULL if address is None else address.native


class DataPlane:
    """The running data plane thread; ``close`` stops it."""

    def __init__(
        self,
        counters_values: AtomicBuffer,
        conductor_doorbell: Doorbell,
        data_doorbell: Doorbell,
        fifo_fd: int,
        idle_max_wait_ns: int,
        prompt_interval_ns: int,
        loss_seed: int,
        spin_ns: int = 0,
        datagram_key: bytes | None = None,
    ) -> None:
        config = ffi.new("fulmar_dp_config_t *")
        config.counters_values = counters_values.address
        config.counters_values_length = counters_values.capacity
        config.conductor_doorbell = conductor_doorbell.buffer.address + conductor_doorbell.offset
        config.data_doorbell = data_doorbell.buffer.address + data_doorbell.offset
        config.data_doorbell_fd = fifo_fd
        config.idle_max_wait_ns = idle_max_wait_ns
        config.prompt_interval_ns = prompt_interval_ns
        config.spin_ns = spin_ns
        config.loss_seed = loss_seed & (2**64 - 1)
        if datagram_key is not None:
            if len(datagram_key) != len(config.datagram_key):
                raise ValueError(f"a datagram key is {len(config.datagram_key)} bytes, not {len(datagram_key)}")
            config.datagram_key = datagram_key
            config.has_datagram_key = 1
        self.has_datagram_key = datagram_key is not None
        # The mappings the thread writes to must outlive it.
        self._keep = (counters_values, conductor_doorbell, data_doorbell)
        self._handle = lib.fulmar_dp_start(config)
        if self._handle == ffi.NULL:
            code = ffi.errno
            raise OSError(code, f"cannot start the data plane thread: {os.strerror(code)}")
        self._events = ffi.new("fulmar_dp_event_t[]", _EVENT_BATCH)
        self._dropped = ffi.new("int64_t *")
        self._publication_status = ffi.new("fulmar_dp_publication_status_t *")
        self._image_status = ffi.new("fulmar_dp_image_status_t *")

    def close(self) -> None:
        if self._handle != ffi.NULL:
            lib.fulmar_dp_stop(self._handle)
            self._handle = ffi.NULL

    # ------------------------------------------------------------------ endpoints

    def add_send_endpoint(
        self,
        endpoint_id: int,
        fd: int,
        control_mode: int,
        destination: UdpAddress | None,
        name: str,
        datagram_mac: bool = False,
    ) -> None:
        _check(
            lib.fulmar_dp_add_send_endpoint(
                self._handle, endpoint_id, fd, control_mode, _address(destination), datagram_mac, name.encode()[:159]
            ),
            f"send endpoint {name}",
        )

    def add_destination(self, endpoint_id: int, destination: UdpAddress) -> None:
        _check(
            lib.fulmar_dp_add_destination(self._handle, endpoint_id, destination.native), f"destination {destination}"
        )

    def remove_destination(self, endpoint_id: int, destination: UdpAddress) -> bool:
        return bool(
            _check(
                lib.fulmar_dp_remove_destination(self._handle, endpoint_id, destination.native),
                f"destination {destination}",
            )
        )

    def add_receive_endpoint(
        self,
        endpoint_id: int,
        receiver_id: int,
        group_tag: int | None,
        control: UdpAddress | None,
        is_manual: bool,
        name: str,
        datagram_mac: bool = False,
    ) -> None:
        _check(
            lib.fulmar_dp_add_receive_endpoint(
                self._handle, endpoint_id, receiver_id, group_tag is not None, group_tag or 0,
                _address(control), is_manual, datagram_mac, name.encode()[:159],
            ),
            f"receive endpoint {name}",
        )  # fmt: skip

    def set_transport(self, endpoint_id: int, transport_index: int, fd: int) -> None:
        _check(lib.fulmar_dp_set_transport(self._handle, endpoint_id, transport_index, fd), "receive transport")

    def set_streams(self, endpoint_id: int, stream_ids: list[int]) -> None:
        ids = ffi.new("int32_t[]", stream_ids or [0])
        _check(lib.fulmar_dp_set_streams(self._handle, endpoint_id, ids, len(stream_ids)), "subscribed streams")

    def remove_endpoint(self, endpoint_id: int) -> None:
        _check(lib.fulmar_dp_remove_endpoint(self._handle, endpoint_id), f"endpoint {endpoint_id}")

    # ------------------------------------------------------------------ logs

    def add_network_publication(self, **fields: object) -> None:
        publication = ffi.new("fulmar_dp_network_publication_t *")
        for name, value in fields.items():
            setattr(publication, name, value)
        _check(lib.fulmar_dp_add_network_publication(self._handle, publication), "network publication")

    def add_ipc_publication(
        self,
        registration_id: int,
        log: object,
        term_length: int,
        initial_term_id: int,
        consumer_position: int,
        term_window_length: int,
        publisher_limit_id: int,
        publisher_position_id: int,
    ) -> None:
        _check(
            lib.fulmar_dp_add_ipc_publication(
                self._handle, registration_id, log, term_length, initial_term_id, consumer_position,
                term_window_length, publisher_limit_id, publisher_position_id,
            ),
            "IPC publication",
        )  # fmt: skip

    def add_image(self, source: UdpAddress, **fields: object) -> None:
        image = ffi.new("fulmar_dp_image_t *")
        for name, value in fields.items():
            setattr(image, name, value)
        ffi.memmove(ffi.addressof(image.source), source.native, ffi.sizeof("fulmar_udp_address_t"))
        _check(lib.fulmar_dp_add_image(self._handle, image), "image")

    def set_readers(self, log_id: int, position_ids: list[int], doorbell_ids: list[int]) -> None:
        positions = ffi.new("int32_t[]", position_ids or [0])
        doorbells = ffi.new("int32_t[]", doorbell_ids or [0])
        _check(
            lib.fulmar_dp_set_readers(self._handle, log_id, positions, len(position_ids), doorbells, len(doorbell_ids)),
            f"readers of {log_id}",
        )

    def close_publication(self, registration_id: int) -> None:
        _check(lib.fulmar_dp_close_publication(self._handle, registration_id), f"publication {registration_id}")

    def trigger_setup(self, registration_id: int) -> None:
        _check(lib.fulmar_dp_trigger_setup(self._handle, registration_id), f"publication {registration_id}")

    def remove(self, log_id: int) -> None:
        _check(lib.fulmar_dp_remove(self._handle, log_id), f"log {log_id}")

    def publication_status(self, registration_id: int) -> PublicationStatus:
        status = self._publication_status
        _check(
            lib.fulmar_dp_publication_status(self._handle, registration_id, status), f"publication {registration_id}"
        )
        return PublicationStatus(
            status.sender_position, status.producer_position, bool(status.is_connected),
            bool(status.is_end_of_stream_sent), status.retransmits_active, bool(status.setup_backing_off),
        )  # fmt: skip

    def image_status(self, correlation_id: int) -> ImageStatus:
        status = self._image_status
        _check(lib.fulmar_dp_image_status(self._handle, correlation_id, status), f"image {correlation_id}")
        return ImageStatus(
            status.rebuild_position, status.hwm_position, status.time_of_last_packet_ns, bool(status.is_end_of_stream)
        )

    # ------------------------------------------------------------------ events

    def poll_events(self) -> list[SetupEvent | str]:
        """What the thread left for the conductor: SETUPs, and error messages to record."""
        events: list[SetupEvent | str] = []
        while True:
            count = lib.fulmar_dp_poll_events(self._handle, self._events, _EVENT_BATCH, self._dropped)
            for index in range(count):
                event = self._events[index]
                if event.type == EVENT_SETUP:
                    events.append(
                        SetupEvent(
                            event.endpoint_id,
                            event.transport_index,
                            native_address(event.source),
                            event.term_offset,
                            event.session_id,
                            event.stream_id,
                            event.initial_term_id,
                            event.active_term_id,
                            event.term_length,
                            event.mtu,
                            event.ttl,
                        )  # fmt: skip
                    )
                else:
                    events.append(ffi.string(event.message).decode("utf-8", errors="replace"))
            if count < _EVENT_BATCH:
                return events

    def stats(self) -> DataPlaneStats:
        stats = ffi.new("fulmar_dp_stats_t *")
        lib.fulmar_dp_stats(self._handle, stats)
        return DataPlaneStats(stats.duty_cycles, stats.sleeps, stats.planned_wait_ns)

    def has_events(self) -> bool:
        return bool(lib.fulmar_dp_has_events(self._handle))

    @property
    def events_dropped(self) -> int:
        return int(self._dropped[0])
