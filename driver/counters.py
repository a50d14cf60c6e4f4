"""The counters a media driver keeps: Aeron's type ids and system counters."""

from __future__ import annotations

import struct
from enum import IntEnum

from fulmar.counters import AtomicCounter, CountersManager

# Counter type ids (Aeron's AeronCounters).
SYSTEM_COUNTER_TYPE_ID = 0
PUBLISHER_LIMIT_TYPE_ID = 1
SENDER_POSITION_TYPE_ID = 2
RECEIVER_HWM_TYPE_ID = 3
SUBSCRIBER_POSITION_TYPE_ID = 4
RECEIVER_POSITION_TYPE_ID = 5
CLIENT_HEARTBEAT_TYPE_ID = 11
PUBLISHER_POSITION_TYPE_ID = 12
SENDER_BPE_TYPE_ID = 13
SEND_CHANNEL_STATUS_TYPE_ID = 6
RECEIVE_CHANNEL_STATUS_TYPE_ID = 7
LOCAL_SOCKADDR_TYPE_ID = 14
CHANNEL_ENDPOINT_ACTIVE = 1  # a channel status counter's value while the endpoint is open
# fulmar's own: messages appended to a publication (Aeron counts only bytes).
PUBLISHER_MESSAGES_TYPE_ID = 90

_REGISTRATION_KEY = struct.Struct("<qiiq")  # registration id, session id, stream id, (spare)


class SystemCounter(IntEnum):
    """Driver-wide counters; the ids follow Aeron's SystemCounterDescriptor."""

    BYTES_SENT = 0
    BYTES_RECEIVED = 1
    RECEIVER_PROXY_FAILS = 2
    SENDER_PROXY_FAILS = 3
    CONDUCTOR_PROXY_FAILS = 4
    NAK_MESSAGES_SENT = 5
    NAK_MESSAGES_RECEIVED = 6
    STATUS_MESSAGES_SENT = 7
    STATUS_MESSAGES_RECEIVED = 8
    HEARTBEATS_SENT = 9
    HEARTBEATS_RECEIVED = 10
    RETRANSMITS_SENT = 11
    FLOW_CONTROL_UNDER_RUNS = 12
    FLOW_CONTROL_OVER_RUNS = 13
    INVALID_PACKETS = 14
    ERRORS = 15
    SHORT_SENDS = 16
    FREE_FAILS = 17
    SENDER_FLOW_CONTROL_LIMITS = 18
    UNBLOCKED_PUBLICATIONS = 19
    UNBLOCKED_COMMANDS = 20
    POSSIBLE_TTL_ASYMMETRY = 21
    CONTROLLABLE_IDLE_STRATEGY = 22
    LOSS_GAP_FILLS = 23
    CLIENT_TIMEOUTS = 24
    RESOLUTION_CHANGES = 25
    CONDUCTOR_MAX_CYCLE_TIME = 26
    CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED = 27
    # fulmar's own follow the ones above (Aeron's later ids are for agents
    # fulmar does not have).
    ACTIVE_CLIENTS = 28
    ACTIVE_PUBLICATIONS = 29
    ACTIVE_SUBSCRIPTIONS = 30
    COMMANDS_RECEIVED = 31
    # Loss injection, set by tests and tools while the driver runs.
    LOSS_RECEIVE_RATE_PPM = 32
    LOSS_SEND_RATE_PPM = 33
    LOSS_FRAME_TYPE_MASK = 34
    DATAGRAMS_DROPPED_BY_LOSS_INJECTION = 35
    # datagram-mac channels: datagrams refused before any frame was read,
    # their MAC missing or wrong (a stranger's, or a driver with another secret).
    DATAGRAMS_REFUSED_NO_MAC = 36


_LABELS = {
    SystemCounter.BYTES_SENT: "Bytes sent",
    SystemCounter.BYTES_RECEIVED: "Bytes received",
    SystemCounter.RECEIVER_PROXY_FAILS: "Failed offers to ReceiverProxy",
    SystemCounter.SENDER_PROXY_FAILS: "Failed offers to SenderProxy",
    SystemCounter.CONDUCTOR_PROXY_FAILS: "Failed offers to DriverConductorProxy",
    SystemCounter.NAK_MESSAGES_SENT: "NAKs sent",
    SystemCounter.NAK_MESSAGES_RECEIVED: "NAKs received",
    SystemCounter.STATUS_MESSAGES_SENT: "Status Messages sent",
    SystemCounter.STATUS_MESSAGES_RECEIVED: "Status Messages received",
    SystemCounter.HEARTBEATS_SENT: "Heartbeats sent",
    SystemCounter.HEARTBEATS_RECEIVED: "Heartbeats received",
    SystemCounter.RETRANSMITS_SENT: "Retransmits sent",
    SystemCounter.FLOW_CONTROL_UNDER_RUNS: "Flow control under runs",
    SystemCounter.FLOW_CONTROL_OVER_RUNS: "Flow control over runs",
    SystemCounter.INVALID_PACKETS: "Invalid packets",
    SystemCounter.ERRORS: "Errors",
    SystemCounter.SHORT_SENDS: "Short sends",
    SystemCounter.FREE_FAILS: "Failed attempts to free log buffers",
    SystemCounter.SENDER_FLOW_CONTROL_LIMITS: "Sender flow control limits, i.e. back-pressure events",
    SystemCounter.UNBLOCKED_PUBLICATIONS: "Unblocked Publications",
    SystemCounter.UNBLOCKED_COMMANDS: "Unblocked Control Commands",
    SystemCounter.POSSIBLE_TTL_ASYMMETRY: "Possible TTL Asymmetry",
    SystemCounter.CONTROLLABLE_IDLE_STRATEGY: "ControllableIdleStrategy status",
    SystemCounter.LOSS_GAP_FILLS: "Loss gap fills",
    SystemCounter.CLIENT_TIMEOUTS: "Client liveness timeouts",
    SystemCounter.RESOLUTION_CHANGES: "Resolution changes",
    SystemCounter.CONDUCTOR_MAX_CYCLE_TIME: "Conductor max cycle time doing its work in ns",
    SystemCounter.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED: "Conductor work cycle exceeded threshold count",
    SystemCounter.ACTIVE_CLIENTS: "Active clients",
    SystemCounter.ACTIVE_PUBLICATIONS: "Active publications",
    SystemCounter.ACTIVE_SUBSCRIPTIONS: "Active subscriptions",
    SystemCounter.COMMANDS_RECEIVED: "Commands received from clients",
    SystemCounter.LOSS_RECEIVE_RATE_PPM: "Loss injection: incoming datagrams dropped per million",
    SystemCounter.LOSS_SEND_RATE_PPM: "Loss injection: outgoing datagrams dropped per million",
    SystemCounter.LOSS_FRAME_TYPE_MASK: "Loss injection: frame types affected (bit per type, 0 = all)",
    SystemCounter.DATAGRAMS_DROPPED_BY_LOSS_INJECTION: "Loss injection: datagrams dropped",
    SystemCounter.DATAGRAMS_REFUSED_NO_MAC: "Datagrams refused (no valid MAC)",
}


class SystemCounters:
    """Allocates the system counters first, so each one's counter id is its
    descriptor id, as in Aeron (tools find them by id)."""

    def __init__(self, manager: CountersManager) -> None:
        self._counters: dict[SystemCounter, AtomicCounter] = {}
        for descriptor in sorted(SystemCounter):
            key = struct.pack("<i", int(descriptor))
            counter = manager.new_counter(_LABELS[descriptor], SYSTEM_COUNTER_TYPE_ID, key)
            if counter.id != descriptor:
                raise RuntimeError(f"system counter {descriptor.name} got id {counter.id}; allocate it first")
            self._counters[descriptor] = counter

    def __getitem__(self, descriptor: SystemCounter) -> AtomicCounter:
        return self._counters[descriptor]


def registration_key(registration_id: int, session_id: int = 0, stream_id: int = 0) -> bytes:
    return _REGISTRATION_KEY.pack(registration_id, session_id, stream_id, 0)
