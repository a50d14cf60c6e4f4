"""The driver conductor: reads client commands from the to-driver ring
buffer, owns every publication, subscription link, counter and client
record, and answers on the to-clients broadcast buffer.

Commands are Aeron's (``fulmar.codecs.generated.driver``), so Aeron's own
clients can use this driver.  Every failure of a command is answered with
ON_ERROR carrying the command's correlation id, recorded in the error log
and counted; nothing a client sends can stop the conductor.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fulmar.broadcast import BroadcastTransmitter
from fulmar.channel_uri import (
    DATAGRAM_MAC_LENGTH,
    DATAGRAM_MAC_PARAM,
    MAX_DATAGRAM_MAC_MTU_LENGTH,
    ChannelUri,
    InvalidChannelError,
    Tag,
    datagram_mac_mtu_reason,
)
from fulmar.client_liveness import declared_process, is_process_gone, pid_namespace
from fulmar.cnc import CncFile
from fulmar.codecs import CodecError
from fulmar.codecs.generated import driver as protocol
from fulmar.codecs.runtime import MessageEncoder
from fulmar.counters import AtomicCounter, CountersError, CountersManager
from fulmar.driver.context import MEMBER_SECRET_ENV, DriverContext
from fulmar.driver.counters import (
    CHANNEL_ENDPOINT_ACTIVE,
    CLIENT_HEARTBEAT_TYPE_ID,
    LOCAL_SOCKADDR_TYPE_ID,
    PUBLISHER_LIMIT_TYPE_ID,
    PUBLISHER_MESSAGES_TYPE_ID,
    PUBLISHER_POSITION_TYPE_ID,
    RECEIVE_CHANNEL_STATUS_TYPE_ID,
    RECEIVER_HWM_TYPE_ID,
    RECEIVER_POSITION_TYPE_ID,
    SENDER_BPE_TYPE_ID,
    SENDER_POSITION_TYPE_ID,
    SUBSCRIBER_POSITION_TYPE_ID,
    SystemCounter,
    SystemCounters,
    registration_key,
)
from fulmar.driver.data_plane import DataPlane, DataPlaneError, SetupEvent, flow_control_settings
from fulmar.driver.ipc_publication import IpcPublication, PublicationState, SubscriberLink
from fulmar.driver.network_publication import NetworkPublication
from fulmar.driver.publication_image import PublicationImage
from fulmar.driver.receive_channel_endpoint import ReceiveChannelEndpoint
from fulmar.driver.send_channel_endpoint import SendChannelEndpoint
from fulmar.driver.udp_transport import ChannelEndpointError, OsBufferLengths, UdpAddress, UdpTransport
from fulmar.duty_cycle import DutyCycleStallTracker
from fulmar.error_log import DistinctErrorLog
from fulmar.errors import InvalidLogBufferError
from fulmar.logbuffer import LogBuffers
from fulmar.permissions import make_directory
from fulmar.reader_doorbells import CLIENT_DOORBELL_TYPE_ID, THREAD_DOORBELL_TYPE_ID, LogReaders, client_doorbell
from fulmar.ring_buffer import ManyToOneRingBuffer

ErrorCode = protocol.ErrorCode
NULL_VALUE = -1
COMMANDS_PER_CYCLE = 10
IPC_SOURCE_IDENTITY = "aeron:ipc"
SPY_SOURCE_IDENTITY = "aeron-spy"


class ControlProtocolError(Exception):
    """A command that cannot be carried out; answered with ON_ERROR."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class AeronClient:
    client_id: int
    heartbeat: AtomicCounter  # last keepalive, epoch ms
    registered_ms: int = 0  # when the driver first heard of it (epoch ms)
    counters: dict[int, AtomicCounter] = field(default_factory=dict)  # by registration id
    # The process the client declared in its heartbeat label (fulmar.client_liveness),
    # once read: (pid, pid namespace).
    process: tuple[int, int] | None = None
    # The counter id of the doorbell the client sleeps on (fulmar.reader_doorbells),
    # once it has added one; a real Aeron client never does.
    doorbell_id: int | None = None


@dataclass
class SubscriptionLink:
    registration_id: int
    client_id: int
    stream_id: int
    channel: str
    session_id: int | None
    endpoint: ReceiveChannelEndpoint | None = None  # UDP subscriptions: where their stream arrives
    spy_key: str | None = None  # spies: the endpoint key of the publications they watch
    wake_on_data: bool = True  # wake-on-data=false: data landing does not ring its client
    # doorbell-id: data landing rings this thread doorbell of its client instead.
    doorbell_id: int | None = None


class DriverConductor:
    role_name = "driver-conductor"

    def __init__(
        self,
        context: DriverContext,
        cnc: CncFile,
        counters: CountersManager,
        error_log: DistinctErrorLog,
        data_plane: DataPlane,
        os_buffers: OsBufferLengths,
        epoch_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        ring_doorbell: Callable[[], object] = lambda: None,
    ) -> None:
        self.context = context
        # What the OS gives sockets' buffers (see MediaDriver.launch): checked
        # against windows and MTUs, and written into UDP log buffers.
        self.os_buffers = os_buffers
        self.to_driver = ManyToOneRingBuffer(cnc.to_driver)
        self.to_clients = BroadcastTransmitter(cnc.to_clients)
        self.counters = counters
        self.system = SystemCounters(counters)
        # From one duty cycle to the next (Aeron's DutyCycleStallTracker): a
        # stall between cycles counts too; the runner's idle strategy reports
        # its intended sleeps to it (MediaDriver.run).
        self.duty_cycle_tracker = DutyCycleStallTracker(
            self.system[SystemCounter.CONDUCTOR_MAX_CYCLE_TIME],
            self.system[SystemCounter.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED],
            context.conductor_cycle_threshold_ns,
        )
        self.error_log = error_log
        self.epoch_clock_ms = epoch_clock_ms
        self._ring_doorbell = ring_doorbell
        self.clients: dict[int, AeronClient] = {}
        self.publications: list[IpcPublication | NetworkPublication] = []
        self.images: list[PublicationImage] = []
        self.send_endpoints: dict[str, SendChannelEndpoint] = {}
        self.receive_endpoints: dict[str, ReceiveChannelEndpoint] = {}
        # The data path (sending, receiving, IPC publishers' limits) runs in
        # the data plane's native thread; the conductor hands it what it creates.
        self.data_plane = data_plane
        self._next_endpoint_id = 1
        # Per receive endpoint: its channel status counter and a local socket
        # address counter per bound transport (how a client learns port 0's port).
        self.channel_status: dict[int, tuple[AtomicCounter, dict[int, AtomicCounter]]] = {}
        self._now_ns = 0
        self.subscriptions: list[SubscriptionLink] = []
        self.static_counters: dict[tuple[int, int], int] = {}
        self.termination_requested = False
        self._next_timer_ns = 0
        self._next_client_process_check_ns = 0
        self._pid_namespace = pid_namespace()
        self._next_session_id = random.randint(-(2**31), 2**31 - 1)
        self._scratch = bytearray(64 * 1024)
        self._handlers: dict[int, Callable[[object], None]] = {
            protocol.TemplateId.ADD_PUBLICATION: lambda c: self._on_add_publication(c, exclusive=False),
            protocol.TemplateId.ADD_EXCLUSIVE_PUBLICATION: lambda c: self._on_add_publication(c, exclusive=True),
            protocol.TemplateId.REMOVE_PUBLICATION: self._on_remove_publication,
            protocol.TemplateId.ADD_SUBSCRIPTION: self._on_add_subscription,
            protocol.TemplateId.REMOVE_SUBSCRIPTION: self._on_remove_subscription,
            protocol.TemplateId.CLIENT_KEEPALIVE: self._on_client_keepalive,
            protocol.TemplateId.CLIENT_CLOSE: self._on_client_close,
            protocol.TemplateId.ADD_COUNTER: self._on_add_counter,
            protocol.TemplateId.ADD_STATIC_COUNTER: self._on_add_static_counter,
            protocol.TemplateId.REMOVE_COUNTER: self._on_remove_counter,
            protocol.TemplateId.ADD_DESTINATION: self._on_destination,
            protocol.TemplateId.REMOVE_DESTINATION: self._on_destination,
            protocol.TemplateId.ADD_RCV_DESTINATION: self._on_destination,
            protocol.TemplateId.REMOVE_RCV_DESTINATION: self._on_destination,
            protocol.TemplateId.REMOVE_DESTINATION_BY_ID: self._on_destination,
            protocol.TemplateId.TERMINATE_DRIVER: self._on_terminate_driver,
        }

    # ------------------------------------------------------------------ duty cycle

    def on_start(self) -> None:
        self.to_driver.consumer_heartbeat_time = self.epoch_clock_ms()

    def do_work(self, now_ns: int) -> int:
        self.duty_cycle_tracker.measure_and_update(now_ns)
        self._now_ns = now_ns
        work = self.to_driver.read(self._on_command, COMMANDS_PER_CYCLE)
        for event in self.data_plane.poll_events():
            work += 1
            if isinstance(event, SetupEvent):
                self._on_setup(event, now_ns)
            else:
                self.record_error(event)
        if now_ns >= self._next_timer_ns:
            self._next_timer_ns = now_ns + self.context.timer_interval_ns
            work += self._on_timer(now_ns)
        return work

    def has_events(self) -> bool:
        """The data plane left something (asked after registering as a sleeper: no lost wake-up)."""
        return self.data_plane.has_events()

    def idle_wait_ns(self) -> int:
        """How long the conductor may sleep when a duty cycle found nothing:
        the timer interval while a closed publication drains (its subscribers
        are told promptly), the data plane's idle wait while an image at its
        end of stream waits to be read (a subscriber that never reads keeps
        it so until the image times out: no faster than the conductor's pace
        before its own idle wait), until the first linger ends, else its
        idle wait.  Commands and the data plane's events ring it sooner."""
        timer_interval_ns = self.context.timer_interval_ns
        ended_image_wait_ns = max(timer_interval_ns, self.context.idle_max_wait_ns)
        wait_ns = max(timer_interval_ns, self.context.conductor_idle_max_wait_ns)
        for publication in self.publications:
            if publication.state is PublicationState.DRAINING:
                return timer_interval_ns
            if publication.state is PublicationState.LINGER:
                wait_ns = min(wait_ns, max(publication.linger_deadline_ns - self._now_ns, timer_interval_ns))
        for image in self.images:
            if image.status is PublicationState.LINGER:
                wait_ns = min(wait_ns, max(image.linger_deadline_ns - self._now_ns, timer_interval_ns))
            elif (
                wait_ns > ended_image_wait_ns
                and image.status is PublicationState.ACTIVE
                and image.receive_status().is_end_of_stream
            ):
                wait_ns = ended_image_wait_ns
        return wait_ns

    def _invalid_packet(self, message: str) -> None:
        self.system[SystemCounter.INVALID_PACKETS].increment()

    def on_close(self) -> None:
        for publication in list(self.publications):
            self._free_publication(publication)
        for image in list(self.images):
            self._free_image(image)
        for send_endpoint in self.send_endpoints.values():
            send_endpoint.close()
        for receive_endpoint in list(self.receive_endpoints.values()):
            self._close_receive_endpoint(receive_endpoint)
        self.send_endpoints.clear()
        self.receive_endpoints.clear()

    def _on_timer(self, now_ns: int) -> int:
        now_ms = self.epoch_clock_ms()
        self.to_driver.consumer_heartbeat_time = now_ms
        work = 0
        timeout_ms = self.context.client_liveness_timeout_ns // 1_000_000
        for client in list(self.clients.values()):
            if client.heartbeat.get() + timeout_ms < now_ms:
                self._on_client_timeout(client)
                work += 1
        if self.context.client_process_check and now_ns >= self._next_client_process_check_ns:
            self._next_client_process_check_ns = now_ns + self.context.client_process_check_interval_ns
            work += self._check_client_processes(now_ms)
        for publication in list(self.publications):
            if publication.state in (PublicationState.ACTIVE, PublicationState.DRAINING) and (
                publication.check_for_blocked_publisher(now_ns, self.context.publication_unblock_timeout_ns)
            ):
                self.system[SystemCounter.UNBLOCKED_PUBLICATIONS].increment()
                self.record_error(
                    f"unblocked publication {publication.registration_id} (session {publication.session_id}): "
                    "a publisher stopped in the middle of an append"
                )
            work += self._advance_publication(publication, now_ns)
        for image in list(self.images):
            work += self._advance_image(image, now_ns)
        return work

    # ------------------------------------------------------------------ commands

    def _on_command(self, msg_type_id: int, body: memoryview) -> None:
        self.system[SystemCounter.COMMANDS_RECEIVED].increment()
        # Every command starts with clientId, correlationId: read the
        # correlation id before decoding so even a bad command gets an answer.
        correlation_id = int.from_bytes(body[8:16], "little", signed=True) if len(body) >= 16 else NULL_VALUE
        try:
            handler = self._handlers.get(msg_type_id)
            if handler is None:
                raise ControlProtocolError(
                    ErrorCode.UNKNOWN_COMMAND_TYPE_ID, f"unknown command type id {msg_type_id:#x}"
                )
            command = protocol.decode(msg_type_id, body, 0, len(body))
            handler(command)
        except ControlProtocolError as error:
            self._on_error(correlation_id, error.code, str(error))
        except InvalidChannelError as error:
            # A channel can be refused past the first parse (an endpoint's
            # address or a parameter's value): the same answer as a parse error.
            self._on_error(correlation_id, ErrorCode.INVALID_CHANNEL, str(error))
        except CodecError as error:
            self._on_error(correlation_id, ErrorCode.MALFORMED_COMMAND, f"malformed command {msg_type_id:#x}: {error}")
        except Exception as error:  # a bug must not stop the conductor: answer, record, go on
            self._on_error(correlation_id, ErrorCode.GENERIC_ERROR, f"{type(error).__name__}: {error}")

    def _on_error(self, correlation_id: int, code: ErrorCode, message: str) -> None:
        self.record_error(message)
        if correlation_id != NULL_VALUE:
            self._send(
                protocol.OnErrorEncoder,
                offending_command_correlation_id=correlation_id,
                error_code=code,
                error_message=message[:1024],
            )

    def record_error(self, message: str) -> None:
        self.system[SystemCounter.ERRORS].increment()
        self.error_log.record(message)

    def _send(self, encoder: type[MessageEncoder], **fields: object) -> None:
        length = encoder.encode_fields(self._scratch, 0, fields)
        self.to_clients.transmit(encoder.TEMPLATE_ID, memoryview(self._scratch)[:length])
        self._ring_doorbell()

    def _client(self, client_id: int) -> AeronClient:
        """The client's record, created on its first command."""
        client = self.clients.get(client_id)
        if client is None:
            heartbeat = self.counters.new_counter(
                f"client-heartbeat: {client_id}",
                CLIENT_HEARTBEAT_TYPE_ID,
                client_id.to_bytes(8, "little", signed=True),
                registration_id=client_id,
            )
            client = self.clients[client_id] = AeronClient(client_id, heartbeat, self.epoch_clock_ms())
            self.system[SystemCounter.ACTIVE_CLIENTS].set(len(self.clients))
        client.heartbeat.set(self.epoch_clock_ms())
        return client

    def _parse_channel(self, channel: str, subscription: bool = False) -> ChannelUri:
        """A UDP subscription (not a spy) may name nothing but a channel tag
        (``aeron:udp?tags=7``): it uses the receive endpoint of that tag."""
        try:
            uri = ChannelUri.parse(channel)
        except InvalidChannelError as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, str(error)) from None
        if uri.is_spy and not uri.is_udp:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, f"channel '{channel}': spies watch UDP publications")
        if (
            uri.is_udp
            and uri.endpoint() is None
            and uri.control() is None
            and uri.control_mode() != "manual"
            and not (subscription and not uri.is_spy and uri.channel_tag() is not None)
        ):
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"channel '{channel}': UDP needs an endpoint, a control address or control-mode=manual",
            )
        return uri

    def _session_id_filter(self, uri: ChannelUri) -> int | None:
        try:
            session_id = uri.session_id()
        except InvalidChannelError as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, str(error)) from None
        if isinstance(session_id, Tag):
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, f"{uri}: session-id tags are not supported on IPC")
        return session_id

    def _on_add_publication(self, command: object, exclusive: bool) -> None:
        client_id, correlation_id = command.client_id, command.correlation_id  # type: ignore[attr-defined]
        stream_id, channel = command.stream_id, command.channel  # type: ignore[attr-defined]
        client = self._client(client_id)
        uri = self._parse_channel(channel)
        if uri.is_spy:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, f"channel '{channel}': a publication cannot be a spy")
        session_id = self._session_id_filter(uri)
        if uri.is_udp:
            self._check_datagram_mac(uri, channel, [e for e in self.send_endpoints.values() if e.is_dynamic])
            existing = self.send_endpoints.get(self._endpoint_key(uri))
            if existing is not None:
                self._check_same_socket_lengths(uri, channel, existing)
        publication = None
        kind = NetworkPublication if uri.is_udp else IpcPublication
        if not exclusive:
            publication = next(
                (
                    p
                    for p in self.publications
                    if isinstance(p, kind)
                    and p.state is PublicationState.ACTIVE
                    and not p.is_exclusive
                    and p.stream_id == stream_id
                    and (session_id is None or p.session_id == session_id)
                    and (kind is IpcPublication or self._endpoint_key(uri) == self._endpoint_key(p.uri))  # type: ignore[union-attr]
                ),
                None,
            )
        if publication is not None:
            publication.client_refs.append(client.client_id)
        else:
            # As in Aeron, a session id clashes only with the same stream on
            # the same medium and send endpoint: an archive replays under a
            # live stream's session id to another endpoint (replay merge).
            # A closed UDP publication keeps its session id until it is freed:
            # while it drains and lingers its endpoint still takes the
            # receivers' status messages for that session, and a second
            # publication under the same id would never see them.
            if session_id is not None and any(
                p.session_id == session_id
                and p.stream_id == stream_id
                and isinstance(p, kind)
                and (
                    p.state in (PublicationState.ACTIVE, PublicationState.DRAINING)
                    if kind is IpcPublication
                    else self._endpoint_key(uri) == self._endpoint_key(p.uri)  # type: ignore[union-attr]
                )
                for p in self.publications
            ):
                raise ControlProtocolError(
                    ErrorCode.GENERIC_ERROR, f"session-id {session_id} is already in use for stream {stream_id}"
                )
            publication = self._new_publication(
                correlation_id, client_id, uri, channel, stream_id, session_id, exclusive
            )
        encoder = protocol.OnExclusivePublicationReadyEncoder if exclusive else protocol.OnPublicationReadyEncoder
        self._send(
            encoder,
            correlation_id=correlation_id,
            registration_id=publication.registration_id,
            session_id=publication.session_id,
            stream_id=stream_id,
            publication_limit_counter_id=publication.publisher_limit.id,
            channel_status_indicator_id=NULL_VALUE,
            log_file_name=publication.log_file_name,
        )

    @staticmethod
    def _address_key(uri: ChannelUri) -> str:
        """The addresses and control mode of a channel: what a spy names."""
        return f"{uri.endpoint()}|{uri.control()}|{uri.control_mode()}|{uri.interface()}"

    @classmethod
    def _endpoint_key(cls, uri: ChannelUri) -> str:
        """Channels that share a socket: the same addresses and control mode,
        and both with datagram MACs or both without (a socket's datagrams are
        all authenticated or none are)."""
        return f"{cls._address_key(uri)}|mac={uri.datagram_mac()}"

    def _check_datagram_mac(
        self, uri: ChannelUri, channel: str, bound: list[SendChannelEndpoint] | list[ReceiveChannelEndpoint]
    ) -> None:
        """A datagram-mac channel needs this driver's member secret; and its
        addresses must not be those of an open endpoint (of ``bound``, the
        endpoints with a port of their own) of the other kind: one socket
        cannot take both, and a second could not bind the port."""
        mac = uri.datagram_mac()
        if mac and not self.data_plane.has_datagram_key:
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"channel '{channel}': datagram-mac=true needs a member secret, and this driver has none "
                f"(set {MEMBER_SECRET_ENV} or --member-secret where the driver starts)",
            )
        if uri.control_mode() == "manual":
            return  # its endpoint is its own, its ports are its destinations'
        address_key = self._address_key(uri)
        for endpoint in bound:
            if endpoint.datagram_mac != mac and self._address_key(endpoint.channel) == address_key:
                raise ControlProtocolError(
                    ErrorCode.INVALID_CHANNEL,
                    f"channel '{channel}': its addresses are open as '{endpoint.channel}' "
                    f"{'without' if mac else 'with'} datagram-mac; one socket's datagrams are all "
                    "authenticated or none are",
                )

    def _new_publication(
        self,
        registration_id: int,
        client_id: int,
        uri: ChannelUri,
        channel: str,
        stream_id: int,
        session_id: int | None,
        exclusive: bool,
    ) -> IpcPublication | NetworkPublication:
        context = self.context
        try:
            term_length = uri.term_length() or context.ipc_term_length
            mtu = uri.mtu() or context.ipc_mtu
            if uri.is_udp and uri.datagram_mac() and mtu > MAX_DATAGRAM_MAC_MTU_LENGTH:
                raise InvalidChannelError(channel, datagram_mac_mtu_reason(mtu))
            initial_position = uri.initial_position(term_length)
            linger_ns = uri.linger_ns()
        except InvalidChannelError as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, str(error)) from None
        if initial_position is not None and not exclusive:
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL, f"channel '{channel}': a start position is for exclusive publications only"
            )
        if session_id is None:
            session_id = self._allocate_session_id(stream_id)
        make_directory(context.publications_dir)
        try:
            log = LogBuffers.create(
                context.publications_dir / f"{registration_id}.logbuffer",
                term_length,
                mtu=mtu,
                initial_term_id=(
                    initial_position.initial_term_id
                    if initial_position is not None
                    else random.randint(-(2**31), 2**31 - 1)
                ),
                session_id=session_id,
                stream_id=stream_id,
                correlation_id=registration_id,
                term_window_length=context.term_window_length(term_length),
            )
            if initial_position is not None:
                log.initialise_at(initial_position.term_id, initial_position.term_offset)
        except InvalidLogBufferError as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, f"channel '{channel}': {error}") from None
        except OSError as error:
            raise ControlProtocolError(ErrorCode.STORAGE_SPACE, f"cannot create a log buffer: {error}") from None
        key = registration_key(registration_id, session_id, stream_id)
        suffix = f"{registration_id} {session_id} {stream_id} {channel}"
        # The channel's linger, else the driver's (Aeron's lingerTimeoutNs).
        linger_timeout_ns = context.publication_linger_timeout_ns if linger_ns is None else linger_ns
        if uri.is_udp:
            network = self._new_network_publication(
                registration_id, client_id, uri, channel, stream_id, session_id, exclusive, log, key, suffix
            )
            network.linger_timeout_ns = linger_timeout_ns
            return network
        publication = IpcPublication(
            registration_id,
            client_id,
            session_id,
            stream_id,
            channel,
            exclusive,
            log,
            self.counters.new_counter(f"pub-lmt: {suffix}", PUBLISHER_LIMIT_TYPE_ID, key, registration_id),
            self.counters.new_counter(f"pub-pos: {suffix}", PUBLISHER_POSITION_TYPE_ID, key, registration_id),
            self.counters.new_counter(f"snd-bpe: {suffix}", SENDER_BPE_TYPE_ID, key, registration_id),
            self.counters.new_counter(f"pub-msgs: {suffix}", PUBLISHER_MESSAGES_TYPE_ID, key, registration_id),
            context.term_window_length(term_length),
            self.data_plane,
        )
        publication.readers = LogReaders(publication.log, self.counters.values_buffer)
        publication.linger_timeout_ns = linger_timeout_ns
        self.publications.append(publication)
        self.system[SystemCounter.ACTIVE_PUBLICATIONS].set(len(self.publications))
        for subscription in self.subscriptions:
            if self._matches(subscription, publication):
                self._link(subscription, publication)
        return publication

    def _new_network_publication(
        self,
        registration_id: int,
        client_id: int,
        uri: ChannelUri,
        channel: str,
        stream_id: int,
        session_id: int,
        exclusive: bool,
        log: LogBuffers,
        key: bytes,
        suffix: str,
    ) -> NetworkPublication:
        def discard_log() -> None:
            path = log.path
            log.close()
            path.unlink(missing_ok=True)

        try:
            flow_control = flow_control_settings(uri)
        except InvalidChannelError as error:
            discard_log()
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, str(error)) from None
        endpoint_key = self._endpoint_key(uri)
        endpoint = self.send_endpoints.get(endpoint_key)
        rcvbuf, sndbuf = (
            self._socket_lengths(uri) if endpoint is None else (endpoint.socket_rcvbuf, endpoint.socket_sndbuf)
        )
        try:
            # A datagram is the frames (up to the mtu) and its MAC after them.
            self._check_mtu_fits(channel, log.mtu + (DATAGRAM_MAC_LENGTH if uri.datagram_mac() else 0), sndbuf)
        except ControlProtocolError:
            discard_log()
            raise
        if endpoint is None:
            try:
                endpoint = SendChannelEndpoint(self._new_endpoint_id(), uri, self.data_plane, rcvbuf, sndbuf)
            except ChannelEndpointError as error:
                discard_log()
                raise ControlProtocolError(ErrorCode.CHANNEL_ENDPOINT_ERROR, f"channel '{channel}': {error}") from None
            self.send_endpoints[endpoint_key] = endpoint
            self._check_granted(channel, endpoint.transport, uri)
        self._write_socket_lengths(log, endpoint.channel, 0)
        counters = self.counters
        limit = counters.new_counter(f"pub-lmt: {suffix}", PUBLISHER_LIMIT_TYPE_ID, key, registration_id)
        position = counters.new_counter(f"pub-pos: {suffix}", PUBLISHER_POSITION_TYPE_ID, key, registration_id)
        sent = counters.new_counter(f"snd-pos: {suffix}", SENDER_POSITION_TYPE_ID, key, registration_id)
        back_pressure = counters.new_counter(f"snd-bpe: {suffix}", SENDER_BPE_TYPE_ID, key, registration_id)
        messages = counters.new_counter(f"pub-msgs: {suffix}", PUBLISHER_MESSAGES_TYPE_ID, key, registration_id)
        publication_counters = [limit, position, sent, back_pressure, messages]
        try:
            publication = NetworkPublication(
                registration_id,
                client_id,
                session_id,
                stream_id,
                channel,
                uri,
                exclusive,
                log,
                endpoint,
                self.data_plane,
                flow_control,
                limit,
                position,
                sent,
                back_pressure,
                messages,
                self.context.term_window_length(log.term_length),
                self.context.initial_setup_interval_ns,
            )
        except DataPlaneError as error:
            for counter in publication_counters:
                counter.close()
            discard_log()
            if not endpoint.publications:
                self.send_endpoints.pop(endpoint_key, None)
                endpoint.close()
            raise ControlProtocolError(ErrorCode.GENERIC_ERROR, f"channel '{channel}': {error}") from None
        publication.readers = LogReaders(publication.log, self.counters.values_buffer)
        self.publications.append(publication)
        self.system[SystemCounter.ACTIVE_PUBLICATIONS].set(len(self.publications))
        for subscription in self.subscriptions:
            if subscription.spy_key is not None and self._spies_on(subscription, publication):
                self._link(subscription, publication)
        return publication

    def _new_endpoint_id(self) -> int:
        endpoint_id = self._next_endpoint_id
        self._next_endpoint_id += 1
        return endpoint_id

    def _allocate_session_id(self, stream_id: int) -> int:
        while True:
            session_id = self._next_session_id
            self._next_session_id = session_id + 1 if session_id < 2**31 - 1 else -(2**31)
            if not any(p.session_id == session_id and p.stream_id == stream_id for p in self.publications):
                return session_id

    def _on_remove_publication(self, command: object) -> None:
        client_id, correlation_id = command.client_id, command.correlation_id  # type: ignore[attr-defined]
        registration_id = command.registration_id  # type: ignore[attr-defined]
        self._client(client_id)
        for publication in self.publications:
            if publication.registration_id == registration_id and client_id in publication.client_refs:
                self._release_publication_ref(publication, client_id)
                self._send(protocol.OnOperationSuccessEncoder, correlation_id=correlation_id)
                return
        raise ControlProtocolError(
            ErrorCode.UNKNOWN_PUBLICATION, f"unknown publication registration id {registration_id}"
        )

    def _release_publication_ref(self, publication: IpcPublication | NetworkPublication, client_id: int) -> None:
        publication.client_refs.remove(client_id)
        if not publication.client_refs and publication.state is PublicationState.ACTIVE:
            publication.close_for_draining()

    def _on_add_subscription(self, command: object) -> None:
        client_id, correlation_id = command.client_id, command.correlation_id  # type: ignore[attr-defined]
        stream_id, channel = command.stream_id, command.channel  # type: ignore[attr-defined]
        self._client(client_id)
        uri = self._parse_channel(channel, subscription=True)
        subscription = SubscriptionLink(
            correlation_id,
            client_id,
            stream_id,
            channel,
            self._session_id_filter(uri),
            wake_on_data=uri.wake_on_data() is not False,
            doorbell_id=self._thread_doorbell(client_id, uri.doorbell_id()),
        )
        status_id = NULL_VALUE
        if uri.is_spy:
            # A spy reads the publication's log, not its datagrams: whether
            # they carry MACs does not matter to it.
            subscription.spy_key = self._address_key(uri)
        elif uri.is_udp:
            self._check_datagram_mac(uri, channel, list(self.receive_endpoints.values()))
            subscription.endpoint = self._receive_endpoint(uri, channel, correlation_id)
            # Each subscription counts once on its stream: the endpoint closes
            # when the last subscription of its last stream goes, whoever opened it.
            subscription.endpoint.add_stream(stream_id)
            status_id = self.channel_status[id(subscription.endpoint)][0].id
        self.subscriptions.append(subscription)
        self.system[SystemCounter.ACTIVE_SUBSCRIPTIONS].set(len(self.subscriptions))
        self._send(
            protocol.OnSubscriptionReadyEncoder, correlation_id=correlation_id, channel_status_indicator_id=status_id
        )
        # Offer what it can see already: a UDP publication's log (spy), the
        # images of its endpoint (UDP) or the IPC publications of its stream.
        sources: list[IpcPublication | NetworkPublication | PublicationImage]
        if uri.is_spy:
            sources = [
                p for p in self.publications if isinstance(p, NetworkPublication) and self._spies_on(subscription, p)
            ]
        elif uri.is_udp:
            sources = [
                i for i in self.images if i.status is PublicationState.ACTIVE and self._matches_image(subscription, i)
            ]
        else:
            sources = [p for p in self.publications if isinstance(p, IpcPublication) and self._matches(subscription, p)]
        for source in sources:
            if isinstance(source, IpcPublication):
                if not source.is_accepting_subscriptions():
                    continue
            elif not isinstance(source, PublicationImage) and source.state is not PublicationState.ACTIVE:
                continue
            self._link(subscription, source)

    def _receive_endpoint(self, uri: ChannelUri, channel: str, registration_id: int) -> ReceiveChannelEndpoint:
        """The receive endpoint a UDP subscription uses: an open one it names
        (by channel tag or by address), else a new one.  Its socket must hold
        the window the subscription's channel asks for (as Aeron's driver
        checks), and a shared socket cannot take other buffer lengths."""
        window = uri.receiver_window_length() or self.context.initial_window_length
        endpoint = self._find_receive_endpoint(uri, channel)
        if endpoint is not None:
            self._check_same_socket_lengths(uri, channel, endpoint)
            self._check_window_fits(channel, window, endpoint.socket_rcvbuf)
            return endpoint
        rcvbuf, sndbuf = self._socket_lengths(uri)
        self._check_window_fits(channel, window, rcvbuf)
        # An untagged multi-destination subscription owns its endpoint: its
        # destinations are its own.  A tagged one is found by its tag, not its key.
        key = f"mds:{registration_id}" if uri.control_mode() == "manual" else self._endpoint_key(uri)
        try:
            endpoint = ReceiveChannelEndpoint(self._new_endpoint_id(), uri, self.data_plane, rcvbuf, sndbuf)
        except ChannelEndpointError as error:
            raise ControlProtocolError(ErrorCode.CHANNEL_ENDPOINT_ERROR, f"channel '{channel}': {error}") from None
        self.receive_endpoints[key] = endpoint
        status = self.counters.new_counter(f"rcv-channel: {channel}", RECEIVE_CHANNEL_STATUS_TYPE_ID)
        status.set(CHANNEL_ENDPOINT_ACTIVE)
        self.channel_status[id(endpoint)] = (status, {})
        for transport in endpoint.transports:
            if transport is not None:
                self._on_transport_bound(endpoint, transport)
        return endpoint

    def _find_receive_endpoint(self, uri: ChannelUri, channel: str) -> ReceiveChannelEndpoint | None:
        """As Aeron's ``findExistingReceiveChannelEndpoint``: a tagged channel
        first looks for the endpoint opened with its tag (``tags=N``), which lets
        subscriptions of other clients share a multi-destination endpoint;
        otherwise the endpoint of the same addresses is shared."""
        tag = uri.channel_tag()
        if tag is not None:
            for endpoint in self.receive_endpoints.values():
                if endpoint.tag == tag:
                    self._check_tag_match(uri, channel, endpoint)
                    return endpoint
        if uri.control_mode() == "manual":
            return None
        if uri.endpoint() is None:
            if tag is not None:
                raise ControlProtocolError(
                    ErrorCode.INVALID_CHANNEL, f"channel '{channel}': no receive channel endpoint has tag {tag}"
                )
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"channel '{channel}': a UDP subscription needs an endpoint or control-mode=manual",
            )
        by_address = self.receive_endpoints.get(self._endpoint_key(uri))
        if by_address is not None and tag is not None and by_address.tag is not None:
            # Same address, another tag: Aeron would open a second socket on the
            # port, which cannot bind; say why instead.
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"channel '{channel}': its endpoint is already open with tag {by_address.tag} ({by_address.channel})",
            )
        return by_address

    @staticmethod
    def _check_tag_match(uri: ChannelUri, channel: str, endpoint: ReceiveChannelEndpoint) -> None:
        """A channel naming an open endpoint's tag must not contradict it (Aeron's
        ``UdpChannel.matchesTag``): the same control mode or none, and no
        addresses or the same ones."""
        opened = endpoint.channel
        # As control-mode: a channel that names the tag and says nothing of
        # datagram-mac takes the endpoint's (the archive and the services
        # subscribe to a follower's log by its tag alone).
        if DATAGRAM_MAC_PARAM in uri and uri.datagram_mac() != endpoint.datagram_mac:
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"channel '{channel}': tag {endpoint.tag} names '{opened}', whose datagram-mac differs",
            )
        if uri.control_mode() is not None and uri.control_mode() != opened.control_mode():
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"channel '{channel}': tag {endpoint.tag} names '{opened}', whose control-mode differs",
            )
        addresses = (uri.endpoint(), uri.control())
        if addresses != (None, None) and addresses != (opened.endpoint(), opened.control()):
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"channel '{channel}': tag {endpoint.tag} names '{opened}', whose endpoint or control differs",
            )

    # ------------------------------------------------- sockets' buffer lengths

    def _socket_lengths(self, uri: ChannelUri) -> tuple[int, int]:
        """SO_RCVBUF and SO_SNDBUF a new endpoint's sockets ask for: the
        channel's so-rcvbuf / so-sndbuf, else the driver's (0: the OS default)."""
        context = self.context
        return uri.socket_rcvbuf_length() or context.socket_rcvbuf, uri.socket_sndbuf_length() or context.socket_sndbuf

    def _check_same_socket_lengths(
        self, uri: ChannelUri, channel: str, endpoint: ReceiveChannelEndpoint | SendChannelEndpoint
    ) -> None:
        """A channel that shares an open endpoint's socket cannot ask for other
        buffer lengths than the socket has (Aeron refuses it too)."""
        for name, wanted, existing in (
            ("so-rcvbuf", uri.socket_rcvbuf_length(), endpoint.socket_rcvbuf),
            ("so-sndbuf", uri.socket_sndbuf_length(), endpoint.socket_sndbuf),
        ):
            if wanted is not None and wanted != existing:
                has = "the OS default" if existing == 0 else str(existing)
                raise ControlProtocolError(
                    ErrorCode.INVALID_CHANNEL,
                    f"channel '{channel}': {name}={wanted} does not match the {has} of the open endpoint it "
                    f"shares ('{endpoint.channel}')",
                )

    def _check_window_fits(self, channel: str, window: int, rcvbuf: int) -> None:
        """A receiver window larger than its socket's buffer lets a sender
        send more than the socket can hold while the data plane is busy."""
        limit = rcvbuf or self.os_buffers.default_rcvbuf
        if window > limit:
            which = f"so-rcvbuf {rcvbuf}" if rcvbuf else f"the OS default SO_RCVBUF {limit}"
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"channel '{channel}': receiver window (rcv-wnd) {window} is larger than {which}; "
                "raise so-rcvbuf or lower rcv-wnd",
            )

    def _check_mtu_fits(self, channel: str, mtu: int, sndbuf: int) -> None:
        limit = sndbuf or self.os_buffers.default_sndbuf
        if mtu > limit:
            which = f"so-sndbuf {sndbuf}" if sndbuf else f"the OS default SO_SNDBUF {limit}"
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL, f"channel '{channel}': mtu {mtu} is larger than {which}; raise so-sndbuf"
            )

    def _check_granted(self, channel: str, transport: UdpTransport, uri: ChannelUri) -> None:
        """Say so in the error log when the OS granted a socket less than its
        channel's so-rcvbuf / so-sndbuf asked for (capped at net.core.rmem_max
        / wmem_max).  The driver's own lengths are checked once, at its start."""
        for name, wanted, granted, limit in (
            ("SO_RCVBUF", uri.socket_rcvbuf_length(), transport.so_rcvbuf, "net.core.rmem_max"),
            ("SO_SNDBUF", uri.socket_sndbuf_length(), transport.so_sndbuf, "net.core.wmem_max"),
        ):
            if wanted and granted < wanted:
                self.record_error(
                    f"channel '{channel}': {name} {wanted} asked for, the OS granted {granted}; raise {limit}"
                )

    def _write_socket_lengths(self, log: LogBuffers, endpoint_channel: ChannelUri, receiver_window: int) -> None:
        os_buffers = self.os_buffers
        log.write_socket_lengths(
            receiver_window,
            endpoint_channel.socket_sndbuf_length() or 0,
            os_buffers.default_sndbuf,
            os_buffers.max_sndbuf,
            endpoint_channel.socket_rcvbuf_length() or 0,
            os_buffers.default_rcvbuf,
            os_buffers.max_rcvbuf,
        )

    def _on_transport_bound(self, endpoint: ReceiveChannelEndpoint, transport: UdpTransport) -> None:
        self._check_granted(str(endpoint.channel), transport, endpoint.channel)
        status, addresses = self.channel_status[id(endpoint)]
        host, port = transport.local_address[:2]
        text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        addresses[transport.fileno()] = self.counters.new_counter(
            f"rcv-local-sockaddr: {status.id} {text}", LOCAL_SOCKADDR_TYPE_ID, status.id.to_bytes(4, "little")
        )

    def _on_transport_closed(self, endpoint: ReceiveChannelEndpoint, transport: UdpTransport) -> None:
        _, addresses = self.channel_status[id(endpoint)]
        counter = addresses.pop(transport.fileno(), None)
        if counter is not None:
            counter.close()

    def _spies_on(self, subscription: SubscriptionLink, publication: NetworkPublication) -> bool:
        return (
            subscription.spy_key == self._address_key(publication.uri)
            and subscription.stream_id == publication.stream_id
            and (subscription.session_id is None or subscription.session_id == publication.session_id)
        )

    @staticmethod
    def _matches_image(subscription: SubscriptionLink, image: PublicationImage) -> bool:
        return (
            subscription.endpoint is image.endpoint
            and subscription.stream_id == image.stream_id
            and (subscription.session_id is None or subscription.session_id == image.session_id)
        )

    def _on_setup(self, setup: SetupEvent, now_ns: int) -> None:
        """A new sender on a subscribed stream (the data plane saw its SETUP
        and has no image for it): create its image and tell the subscribers."""
        endpoint = next((e for e in self.receive_endpoints.values() if e.id == setup.endpoint_id), None)
        if endpoint is None or (setup.session_id, setup.stream_id) in endpoint.images:
            return  # the endpoint closed meanwhile, or a repeated SETUP queued before the image existed
        source = setup.source
        if not any(
            s.endpoint is endpoint
            and s.stream_id == setup.stream_id
            and (s.session_id is None or s.session_id == setup.session_id)
            for s in self.subscriptions
        ):
            # Every subscription of the stream here wants one session only
            # (a cluster follower's log): as in Aeron, a stranger gets no
            # image (no log buffer, no status messages), and is counted.
            self._invalid_packet(
                f"SETUP from {source} for session {setup.session_id} stream {setup.stream_id}, "
                "which no subscription here takes"
            )
            return
        context = self.context
        # The window this receiver grants: its endpoint's channel's rcv-wnd,
        # else the driver's (the data plane takes at most half a term of it).
        # A sender whose datagrams would not fit in it could never send one.
        window = endpoint.channel.receiver_window_length() or context.initial_window_length
        if setup.mtu_length > window:
            self._invalid_packet(
                f"SETUP from {source} for session {setup.session_id} stream {setup.stream_id}: "
                f"mtu {setup.mtu_length} is larger than the receiver window {window}"
            )
            return
        correlation_id = self.to_driver.next_correlation_id()
        make_directory(context.images_dir)
        try:
            log = LogBuffers.create(
                context.images_dir / f"{correlation_id}.logbuffer",
                setup.term_length,
                mtu=setup.mtu_length,
                initial_term_id=setup.initial_term_id,
                session_id=setup.session_id,
                stream_id=setup.stream_id,
                correlation_id=correlation_id,
            )
        except (InvalidLogBufferError, OSError) as error:
            self._invalid_packet(f"SETUP from {source}: {error}")
            return
        key = registration_key(correlation_id, setup.session_id, setup.stream_id)
        suffix = f"{correlation_id} {setup.session_id} {setup.stream_id} {endpoint.channel}"
        hwm = self.counters.new_counter(f"rcv-hwm: {suffix}", RECEIVER_HWM_TYPE_ID, key, correlation_id)
        position = self.counters.new_counter(f"rcv-pos: {suffix}", RECEIVER_POSITION_TYPE_ID, key, correlation_id)
        try:
            image = PublicationImage(
                correlation_id,
                setup.session_id,
                setup.stream_id,
                log,
                setup.active_term_id,
                setup.term_offset,
                endpoint,
                source,
                setup.transport_index,
                hwm,
                position,
                self.data_plane,
                context.image_liveness_timeout_ns,
                window,
            )
        except DataPlaneError as error:
            # A term offset or active term the log cannot hold: the new log
            # buffer file goes at once, not one left behind per hostile SETUP.
            hwm.close()
            position.close()
            path = log.path
            log.close()
            path.unlink(missing_ok=True)
            self._invalid_packet(f"SETUP from {source}: {error}")
            return
        self._write_socket_lengths(log, endpoint.channel, window)
        image.readers = LogReaders(log, self.counters.values_buffer)
        endpoint.images[(setup.session_id, setup.stream_id)] = image
        self.images.append(image)
        for subscription in self.subscriptions:
            if self._matches_image(subscription, image):
                self._link(subscription, image)

    @staticmethod
    def _matches(subscription: SubscriptionLink, publication: IpcPublication) -> bool:
        """An IPC subscription (neither UDP nor a spy) of the publication's stream."""
        if subscription.endpoint is not None or subscription.spy_key is not None:
            return False
        return subscription.stream_id == publication.stream_id and (
            subscription.session_id is None or subscription.session_id == publication.session_id
        )

    def _link(
        self, subscription: SubscriptionLink, publication: IpcPublication | NetworkPublication | PublicationImage
    ) -> None:
        join_position = publication.join_position()
        position = self.counters.new_counter(
            f"sub-pos: {subscription.registration_id} {publication.session_id} {publication.stream_id} "
            f"{subscription.channel} @{join_position}",
            SUBSCRIBER_POSITION_TYPE_ID,
            registration_key(subscription.registration_id, publication.session_id, publication.stream_id),
            subscription.registration_id,
        )
        position.set(join_position)
        publication.subscribers.append(
            SubscriberLink(
                subscription.registration_id,
                subscription.client_id,
                position,
                subscription.wake_on_data,
                subscription.doorbell_id,
            )
        )
        self._update_readers(publication)
        if isinstance(publication, IpcPublication):
            publication.set_connected()
            correlation_id, source_identity = publication.registration_id, IPC_SOURCE_IDENTITY
        elif isinstance(publication, NetworkPublication):
            correlation_id, source_identity = publication.registration_id, SPY_SOURCE_IDENTITY
        else:
            correlation_id, source_identity = publication.correlation_id, publication.source_identity
        self._send(
            protocol.OnAvailableImageEncoder,
            correlation_id=correlation_id,
            session_id=publication.session_id,
            stream_id=publication.stream_id,
            subscription_registration_id=subscription.registration_id,
            subscriber_position_id=position.id,
            log_file_name=publication.log_file_name,
            source_identity=source_identity,
        )
        self._ring_client(subscription.client_id)  # an agent asleep on its data takes the image now

    def _on_remove_subscription(self, command: object) -> None:
        client_id, correlation_id = command.client_id, command.correlation_id  # type: ignore[attr-defined]
        registration_id = command.registration_id  # type: ignore[attr-defined]
        self._client(client_id)
        subscription = next(
            (s for s in self.subscriptions if s.registration_id == registration_id and s.client_id == client_id), None
        )
        if subscription is None:
            raise ControlProtocolError(
                ErrorCode.UNKNOWN_SUBSCRIPTION, f"unknown subscription registration id {registration_id}"
            )
        self._remove_subscription(subscription)
        self._send(protocol.OnOperationSuccessEncoder, correlation_id=correlation_id)

    def _remove_subscription(self, subscription: SubscriptionLink) -> None:
        self.subscriptions.remove(subscription)
        self.system[SystemCounter.ACTIVE_SUBSCRIPTIONS].set(len(self.subscriptions))
        for publication in [*self.publications, *self.images]:
            subscribers: list[SubscriberLink] = publication.subscribers
            links = [link for link in subscribers if link.subscription_registration_id == subscription.registration_id]
            for link in links:
                subscribers.remove(link)
                link.position.close()
            if links:
                self._update_readers(publication)
            if isinstance(publication, IpcPublication):
                publication.set_connected()
        endpoint = subscription.endpoint
        if endpoint is not None and endpoint.remove_stream(subscription.stream_id):
            for image in [i for i in self.images if i.endpoint is endpoint and i.stream_id == subscription.stream_id]:
                self._free_image(image)
            if not endpoint.stream_refs:
                self._close_receive_endpoint(endpoint)

    def _on_client_keepalive(self, command: object) -> None:
        self._client(command.client_id)  # type: ignore[attr-defined]

    def _on_client_close(self, command: object) -> None:
        client_id = command.client_id  # type: ignore[attr-defined]
        client = self.clients.get(client_id)
        if client is None:
            # Nothing to release, but a close nobody can have sent (or one
            # after a timeout) is recorded rather than ignored unseen.
            self.record_error(f"client close from unknown client {client_id}")
            return
        self._close_client(client)

    def _on_client_timeout(self, client: AeronClient, reason: str = "no keepalive for the liveness timeout") -> None:
        self.system[SystemCounter.CLIENT_TIMEOUTS].increment()
        self.record_error(f"client {client.client_id} timed out: {reason}")
        self._close_client(client)
        self._send(protocol.OnClientTimeoutEncoder, client_id=client.client_id)

    def _check_client_processes(self, now_ms: int) -> int:
        """Close at once a quiet client whose declared process is gone (see
        fulmar.client_liveness): what it registered (UDP ports above all) is
        free for a restarted process now, not after the liveness timeout.  Only
        clients quiet for longer than a keepalive interval are looked at, so a
        healthy client costs nothing here."""
        quiet_ms = self.context.client_process_check_quiet_ns // 1_000_000
        work = 0
        for client in list(self.clients.values()):
            if client.heartbeat.get() + quiet_ms >= now_ms or self._pid_namespace is None:
                continue
            if client.process is None:
                # Read until found: a client declares itself a keepalive after
                # its first command, and a real Aeron client never does.
                client.process = declared_process(self.counters.counter_label(client.heartbeat.id))
                if client.process is None:
                    continue
            pid, namespace = client.process
            if namespace == self._pid_namespace and is_process_gone(pid, client.registered_ms):
                self._on_client_timeout(client, f"its process {pid} is gone")
                work += 1
        return work

    def _close_client(self, client: AeronClient) -> None:
        """Release everything a client held: its publications, subscriptions and counters."""
        for publication in self.publications:
            while client.client_id in publication.client_refs:
                self._release_publication_ref(publication, client.client_id)
        for subscription in [s for s in self.subscriptions if s.client_id == client.client_id]:
            self._remove_subscription(subscription)
        for registration_id, counter in list(client.counters.items()):
            self._free_client_counter(client, registration_id, counter)
        client.heartbeat.close()
        del self.clients[client.client_id]
        self.system[SystemCounter.ACTIVE_CLIENTS].set(len(self.clients))

    def _on_add_counter(self, command: object) -> None:
        client = self._client(command.client_id)  # type: ignore[attr-defined]
        correlation_id = command.correlation_id  # type: ignore[attr-defined]
        counter = self._allocate_counter(command, registration_id=correlation_id, owner_id=client.client_id)
        client.counters[correlation_id] = counter
        self._send(protocol.OnCounterReadyEncoder, correlation_id=correlation_id, counter_id=counter.id)
        if command.type_id == CLIENT_DOORBELL_TYPE_ID:  # type: ignore[attr-defined]
            client.doorbell_id = counter.id
            self._update_client_readers(client)

    # ------------------------------------------------------------------ reader doorbells

    def _update_readers(self, log_owner: IpcPublication | NetworkPublication | PublicationImage) -> None:
        """Tell the data plane who reads the log (their positions: the
        publishers' limit, the image's status messages), and name their
        doorbells in the log's reader table (fulmar.reader_doorbells): its
        writers wake just them, and the data plane the ones beyond the table."""
        readers = log_owner.readers
        ids = []
        for link in log_owner.subscribers:
            client = self.clients.get(link.client_id)
            if not link.wake_on_data or client is None:
                continue
            doorbell_id = link.doorbell_id if link.doorbell_id is not None else client.doorbell_id
            if doorbell_id is not None:
                ids.append(doorbell_id)
        readers.update(ids)
        if isinstance(log_owner, PublicationImage):
            if not log_owner.in_data_plane:
                return  # lingering: nothing lands in it any more
            log_id = log_owner.correlation_id
        else:
            log_id = log_owner.registration_id
        self.data_plane.set_readers(log_id, [link.position.id for link in log_owner.subscribers], readers.beyond_table)

    def _ring_client(self, client_id: int) -> None:
        """Wake a client that sleeps on its own doorbell for news about what it reads."""
        client = self.clients.get(client_id)
        if client is not None and client.doorbell_id is not None:
            client_doorbell(self.counters.values_buffer, client.doorbell_id).ring()

    def _thread_doorbell(self, client_id: int, counter_id: int | None) -> int | None:
        """The doorbell a subscription's doorbell-id names, once checked: a
        thread doorbell counter of the same client (a ring of any other
        counter's slot would write into its value)."""
        if counter_id is None:
            return None
        client = self._client(client_id)
        for counter in client.counters.values():
            if counter.id == counter_id and self.counters.counter_type_id(counter_id) == THREAD_DOORBELL_TYPE_ID:
                return counter_id
        raise ControlProtocolError(
            ErrorCode.INVALID_CHANNEL,
            f"doorbell-id={counter_id} is not a thread doorbell counter (type {THREAD_DOORBELL_TYPE_ID}) "
            f"of client {client_id}",
        )

    def _forget_thread_doorbell(self, client: AeronClient, counter_id: int) -> None:
        """A thread doorbell went: its subscriptions' data rings the client's own again."""
        changed = False
        for subscription in self.subscriptions:
            if subscription.client_id == client.client_id and subscription.doorbell_id == counter_id:
                subscription.doorbell_id = None
                changed = True
        if not changed:
            return
        for log_owner in [*self.publications, *self.images]:
            touched = False
            for link in log_owner.subscribers:
                if link.client_id == client.client_id and link.doorbell_id == counter_id:
                    link.doorbell_id = None
                    touched = True
            if touched:
                self._update_readers(log_owner)

    def _update_client_readers(self, client: AeronClient) -> None:
        """The client's doorbell came or went: the tables of the logs it reads."""
        for log_owner in [*self.publications, *self.images]:
            if any(link.client_id == client.client_id for link in log_owner.subscribers):
                self._update_readers(log_owner)

    def _on_add_static_counter(self, command: object) -> None:
        self._client(command.client_id)  # type: ignore[attr-defined]
        type_id, registration_id = command.type_id, command.registration_id  # type: ignore[attr-defined]
        counter_id = self.static_counters.get((type_id, registration_id))
        if counter_id is None:
            counter_id = self._allocate_counter(command, registration_id=registration_id, owner_id=NULL_VALUE).id
            self.static_counters[(type_id, registration_id)] = counter_id
        self._send(
            protocol.OnStaticCounterEncoder,
            correlation_id=command.correlation_id,  # type: ignore[attr-defined]
            counter_id=counter_id,
        )

    def _allocate_counter(self, command: object, registration_id: int, owner_id: int) -> AtomicCounter:
        try:
            return self.counters.new_counter(
                command.label,  # type: ignore[attr-defined]
                command.type_id,  # type: ignore[attr-defined]
                bytes(command.key),  # type: ignore[attr-defined]
                registration_id=registration_id,
                owner_id=owner_id,
            )
        except CountersError as error:
            raise ControlProtocolError(ErrorCode.GENERIC_ERROR, f"cannot allocate counter: {error}") from None

    def _on_remove_counter(self, command: object) -> None:
        client = self._client(command.client_id)  # type: ignore[attr-defined]
        registration_id = command.registration_id  # type: ignore[attr-defined]
        counter = client.counters.get(registration_id)
        if counter is None:
            raise ControlProtocolError(ErrorCode.UNKNOWN_COUNTER, f"unknown counter registration id {registration_id}")
        self._send(protocol.OnOperationSuccessEncoder, correlation_id=command.correlation_id)  # type: ignore[attr-defined]
        self._free_client_counter(client, registration_id, counter)

    def _free_client_counter(self, client: AeronClient, registration_id: int, counter: AtomicCounter) -> None:
        del client.counters[registration_id]
        counter_id = counter.id
        if client.doorbell_id == counter_id:
            client.doorbell_id = None
            self._update_client_readers(client)
        self._forget_thread_doorbell(client, counter_id)
        counter.close()
        self._send(protocol.OnUnavailableCounterEncoder, correlation_id=registration_id, counter_id=counter_id)

    def _on_destination(self, command: object) -> None:
        """Add or remove a destination of a manual multi-destination-cast publication."""
        client_id = command.client_id  # type: ignore[attr-defined]
        self._client(client_id)
        if isinstance(command, (protocol.AddRcvDestinationDecoder, protocol.RemoveRcvDestinationDecoder)):
            self._on_receive_destination(command)
            return
        if not isinstance(command, (protocol.AddDestinationDecoder, protocol.RemoveDestinationDecoder)):
            raise ControlProtocolError(ErrorCode.NOT_SUPPORTED, "removing a destination by id is not supported")
        registration_id = command.registration_correlation_id
        publication = next(
            (
                p
                for p in self.publications
                if isinstance(p, NetworkPublication)
                and p.registration_id == registration_id
                and client_id in p.client_refs
            ),
            None,
        )
        if publication is None:
            raise ControlProtocolError(
                ErrorCode.UNKNOWN_PUBLICATION, f"unknown publication registration id {registration_id}"
            )
        try:
            destination = ChannelUri.parse(command.channel)
            endpoint = destination.endpoint()
            if endpoint is None:
                raise ControlProtocolError(
                    ErrorCode.INVALID_CHANNEL, f"destination '{command.channel}' has no endpoint"
                )
            address = UdpAddress.resolve(endpoint.host, endpoint.port)
            if isinstance(command, protocol.AddDestinationDecoder):
                publication.endpoint.add_destination(address)
            else:
                publication.endpoint.remove_destination(address)
        except (InvalidChannelError, ChannelEndpointError) as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, str(error)) from None
        self.data_plane.trigger_setup(publication.registration_id)  # greet the new destination
        self._send(protocol.OnOperationSuccessEncoder, correlation_id=command.correlation_id)

    def _on_receive_destination(
        self, command: protocol.AddRcvDestinationDecoder | protocol.RemoveRcvDestinationDecoder
    ) -> None:
        """Add or remove a transport of a multi-destination subscription."""
        registration_id = command.registration_correlation_id
        subscription = next(
            (
                s
                for s in self.subscriptions
                if s.registration_id == registration_id and s.client_id == command.client_id
            ),
            None,
        )
        if subscription is None:
            raise ControlProtocolError(
                ErrorCode.UNKNOWN_SUBSCRIPTION, f"unknown subscription registration id {registration_id}"
            )
        endpoint = subscription.endpoint
        if endpoint is None or not endpoint.is_manual:
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL,
                f"subscription {registration_id} is not a control-mode=manual UDP subscription",
            )
        try:
            destination = ChannelUri.parse(command.channel).endpoint()
            if destination is None:
                raise ControlProtocolError(
                    ErrorCode.INVALID_CHANNEL, f"destination '{command.channel}' has no endpoint"
                )
            if isinstance(command, protocol.AddRcvDestinationDecoder):
                transport = endpoint.add_transport(destination.host, destination.port)
                self._on_transport_bound(endpoint, transport)
            else:
                removed = endpoint.remove_transport(destination.host, destination.port)
                if removed is None:
                    raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, f"no receive destination '{command.channel}'")
                self._on_transport_closed(endpoint, removed)
                removed.close()
        except InvalidChannelError as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, str(error)) from None
        except ChannelEndpointError as error:
            raise ControlProtocolError(ErrorCode.CHANNEL_ENDPOINT_ERROR, str(error)) from None
        self._send(protocol.OnOperationSuccessEncoder, correlation_id=command.correlation_id)

    def _on_terminate_driver(self, command: object) -> None:
        token = bytes(command.token)  # type: ignore[attr-defined]
        expected = self.context.terminate_token
        if expected is not None and token == expected:
            self.termination_requested = True
        else:
            # As in Aeron, a refused termination is not answered, only recorded.
            self.record_error(f"terminate driver request from client {command.client_id} refused: invalid token")  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ lifecycle of publications

    def _close_receive_endpoint(self, endpoint: ReceiveChannelEndpoint) -> None:
        for key, candidate in list(self.receive_endpoints.items()):
            if candidate is endpoint:
                del self.receive_endpoints[key]
        for transport in endpoint.transports:
            if transport is not None:
                self._on_transport_closed(endpoint, transport)
        status, _ = self.channel_status.pop(id(endpoint))
        status.close()
        endpoint.close()

    def _advance_image(self, image: PublicationImage, now_ns: int) -> int:
        """An image whose sender went quiet, or whose stream ended and was read,
        becomes unavailable to its subscribers, lingers, then is freed."""
        if image.status is PublicationState.ACTIVE:
            if image.is_timed_out(now_ns) or image.is_drained():
                for link in image.subscribers:
                    subscription = next(
                        (s for s in self.subscriptions if s.registration_id == link.subscription_registration_id), None
                    )
                    self._send(
                        protocol.OnUnavailableImageEncoder,
                        correlation_id=image.correlation_id,
                        subscription_registration_id=link.subscription_registration_id,
                        stream_id=image.stream_id,
                        channel=subscription.channel if subscription is not None else str(image.endpoint.channel),
                    )
                    self._ring_client(link.client_id)
                    link.position.close()
                image.subscribers.clear()
                self._update_readers(image)
                # Nothing more lands in it: the sender's next SETUP (or data) makes a new image.
                image.close()
                image.endpoint.images.pop((image.session_id, image.stream_id), None)
                image.status = PublicationState.LINGER
                image.linger_deadline_ns = now_ns + self.context.publication_linger_timeout_ns
                return 1
        elif image.status is PublicationState.LINGER and now_ns >= image.linger_deadline_ns:
            self._free_image(image)
            return 1
        return 0

    def _free_image(self, image: PublicationImage) -> None:
        image.close()  # out of the data plane first: it writes the log and the counters until then
        for link in image.subscribers:
            link.position.close()
        image.subscribers.clear()
        image.endpoint.images.pop((image.session_id, image.stream_id), None)
        image.receiver_hwm.close()
        image.receiver_position.close()
        path = image.path
        image.log.close()
        path.unlink(missing_ok=True)
        image.status = PublicationState.DONE
        if image in self.images:
            self.images.remove(image)

    def _advance_publication(self, publication: IpcPublication | NetworkPublication, now_ns: int) -> int:
        if publication.state is PublicationState.DRAINING:
            if publication.is_drained():
                for link in publication.subscribers:
                    self._send(
                        protocol.OnUnavailableImageEncoder,
                        correlation_id=publication.registration_id,
                        subscription_registration_id=link.subscription_registration_id,
                        stream_id=publication.stream_id,
                        channel=publication.channel,
                    )
                    self._ring_client(link.client_id)
                    link.position.close()
                publication.subscribers.clear()
                self._update_readers(publication)
                if isinstance(publication, IpcPublication):
                    publication.set_connected()
                publication.state = PublicationState.LINGER
                publication.linger_deadline_ns = now_ns + publication.linger_timeout_ns
                return 1
        elif publication.state is PublicationState.LINGER and now_ns >= publication.linger_deadline_ns:
            self._free_publication(publication)
            return 1
        return 0

    def _free_publication(self, publication: IpcPublication | NetworkPublication) -> None:
        # Out of the data plane first: it reads the counters and the log until then.
        publication.close()
        for link in publication.subscribers:
            link.position.close()
        publication.subscribers.clear()
        counters = [
            publication.publisher_limit,
            publication.publisher_position,
            publication.back_pressure_events,
            publication.messages,
        ]
        if isinstance(publication, NetworkPublication):
            counters.append(publication.sender_position_counter)
            endpoint = publication.endpoint
            if not endpoint.publications:
                self.send_endpoints.pop(self._endpoint_key(publication.uri), None)
                endpoint.close()
        for counter in counters:
            counter.close()
        path = publication.path
        publication.log.close()
        path.unlink(missing_ok=True)
        publication.state = PublicationState.DONE
        self.publications.remove(publication)
        self.system[SystemCounter.ACTIVE_PUBLICATIONS].set(len(self.publications))
