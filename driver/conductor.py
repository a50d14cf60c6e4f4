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
from fulmar.channel_uri import ChannelUri, InvalidChannelError, Tag
from fulmar.cnc import CncFile
from fulmar.codecs import CodecError
from fulmar.codecs.generated import driver as protocol
from fulmar.codecs.runtime import MessageEncoder
from fulmar.counters import AtomicCounter, CountersManager
from fulmar.error_log import DistinctErrorLog
from fulmar.errors import InvalidLogBufferError
from fulmar.logbuffer import LogBuffers
from fulmar.ring_buffer import ManyToOneRingBuffer

from fulmar.driver.context import DriverContext
from fulmar.driver.counters import (
    CLIENT_HEARTBEAT_TYPE_ID,
    PUBLISHER_LIMIT_TYPE_ID,
    PUBLISHER_MESSAGES_TYPE_ID,
    PUBLISHER_POSITION_TYPE_ID,
    SENDER_BPE_TYPE_ID,
    SUBSCRIBER_POSITION_TYPE_ID,
    SystemCounter,
    SystemCounters,
    registration_key,
)
from fulmar.driver.ipc_publication import IpcPublication, PublicationState, SubscriberLink

ErrorCode = protocol.ErrorCode
NULL_VALUE = -1
COMMANDS_PER_CYCLE = 10
IPC_SOURCE_IDENTITY = "aeron:ipc"


class ControlProtocolError(Exception):
    """A command that cannot be carried out; answered with ON_ERROR."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class AeronClient:
    client_id: int
    heartbeat: AtomicCounter  # last keepalive, epoch ms
    counters: dict[int, AtomicCounter] = field(default_factory=dict)  # by registration id


@dataclass
class SubscriptionLink:
    registration_id: int
    client_id: int
    stream_id: int
    channel: str
    session_id: int | None


class DriverConductor:
    role_name = "driver-conductor"

    def __init__(
        self,
        context: DriverContext,
        cnc: CncFile,
        counters: CountersManager,
        error_log: DistinctErrorLog,
        epoch_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        ring_doorbell: Callable[[], object] = lambda: None,
    ) -> None:
        self.context = context
        self.to_driver = ManyToOneRingBuffer(cnc.to_driver)
        self.to_clients = BroadcastTransmitter(cnc.to_clients)
        self.counters = counters
        self.system = SystemCounters(counters)
        self.error_log = error_log
        self.epoch_clock_ms = epoch_clock_ms
        self._ring_doorbell = ring_doorbell
        self.clients: dict[int, AeronClient] = {}
        self.publications: list[IpcPublication] = []
        self.subscriptions: list[SubscriptionLink] = []
        self.static_counters: dict[tuple[int, int], int] = {}
        self.termination_requested = False
        self._next_timer_ns = 0
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
        start = time.perf_counter_ns()
        work = self.to_driver.read(self._on_command, COMMANDS_PER_CYCLE)
        for publication in self.publications:
            if publication.state is PublicationState.ACTIVE:
                work += publication.update_publisher_limit()
        if now_ns >= self._next_timer_ns:
            self._next_timer_ns = now_ns + self.context.timer_interval_ns
            work += self._on_timer(now_ns)
        self._track_cycle_time(time.perf_counter_ns() - start)
        return work

    def on_close(self) -> None:
        for publication in list(self.publications):
            self._free_publication(publication)

    def _track_cycle_time(self, cycle_ns: int) -> None:
        self.system[SystemCounter.CONDUCTOR_MAX_CYCLE_TIME].propose_max(cycle_ns)
        if cycle_ns > self.context.conductor_cycle_threshold_ns:
            self.system[SystemCounter.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED].increment()

    def _on_timer(self, now_ns: int) -> int:
        now_ms = self.epoch_clock_ms()
        self.to_driver.consumer_heartbeat_time = now_ms
        work = 0
        timeout_ms = self.context.client_liveness_timeout_ns // 1_000_000
        for client in list(self.clients.values()):
            if client.heartbeat.get() + timeout_ms < now_ms:
                self._on_client_timeout(client)
                work += 1
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
                raise ControlProtocolError(ErrorCode.UNKNOWN_COMMAND_TYPE_ID, f"unknown command type id {msg_type_id:#x}")
            command = protocol.decode(msg_type_id, body, 0, len(body))
            handler(command)
        except ControlProtocolError as error:
            self._on_error(correlation_id, error.code, str(error))
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
            client = self.clients[client_id] = AeronClient(client_id, heartbeat)
            self.system[SystemCounter.ACTIVE_CLIENTS].set(len(self.clients))
        client.heartbeat.set(self.epoch_clock_ms())
        return client

    def _parse_channel(self, channel: str) -> ChannelUri:
        try:
            uri = ChannelUri.parse(channel)
        except InvalidChannelError as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, str(error)) from None
        if not uri.is_ipc:
            raise ControlProtocolError(
                ErrorCode.INVALID_CHANNEL, f"channel '{channel}': only aeron:ipc is supported by this driver so far"
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
        session_id = self._session_id_filter(uri)
        publication = None
        if not exclusive:
            publication = next(
                (
                    p
                    for p in self.publications
                    if p.state is PublicationState.ACTIVE
                    and not p.is_exclusive
                    and p.stream_id == stream_id
                    and (session_id is None or p.session_id == session_id)
                ),
                None,
            )
        if publication is not None:
            publication.client_refs.append(client.client_id)
        else:
            if session_id is not None and any(
                p.session_id == session_id and p.stream_id == stream_id and p.state is PublicationState.ACTIVE
                for p in self.publications
            ):
                raise ControlProtocolError(
                    ErrorCode.GENERIC_ERROR, f"session-id {session_id} is already in use for stream {stream_id}"
                )
            publication = self._new_publication(correlation_id, client_id, uri, channel, stream_id, session_id, exclusive)
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

    def _new_publication(
        self,
        registration_id: int,
        client_id: int,
        uri: ChannelUri,
        channel: str,
        stream_id: int,
        session_id: int | None,
        exclusive: bool,
    ) -> IpcPublication:
        context = self.context
        try:
            term_length = uri.term_length() or context.ipc_term_length
            mtu = uri.mtu() or context.ipc_mtu
        except InvalidChannelError as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, str(error)) from None
        if session_id is None:
            session_id = self._allocate_session_id(stream_id)
        context.publications_dir.mkdir(parents=True, exist_ok=True)
        try:
            log = LogBuffers.create(
                context.publications_dir / f"{registration_id}.logbuffer",
                term_length,
                mtu=mtu,
                initial_term_id=random.randint(-(2**31), 2**31 - 1),
                session_id=session_id,
                stream_id=stream_id,
                correlation_id=registration_id,
                term_window_length=context.term_window_length(term_length),
            )
        except InvalidLogBufferError as error:
            raise ControlProtocolError(ErrorCode.INVALID_CHANNEL, f"channel '{channel}': {error}") from None
        except OSError as error:
            raise ControlProtocolError(ErrorCode.STORAGE_SPACE, f"cannot create a log buffer: {error}") from None
        key = registration_key(registration_id, session_id, stream_id)
        suffix = f"{registration_id} {session_id} {stream_id} {channel}"
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
        )
        self.publications.append(publication)
        self.system[SystemCounter.ACTIVE_PUBLICATIONS].set(len(self.publications))
        for subscription in self.subscriptions:
            if self._matches(subscription, publication):
                self._link(subscription, publication)
        return publication

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
        raise ControlProtocolError(ErrorCode.UNKNOWN_PUBLICATION, f"unknown publication registration id {registration_id}")

    def _release_publication_ref(self, publication: IpcPublication, client_id: int) -> None:
        publication.client_refs.remove(client_id)
        if not publication.client_refs and publication.state is PublicationState.ACTIVE:
            publication.close_for_draining()

    def _on_add_subscription(self, command: object) -> None:
        client_id, correlation_id = command.client_id, command.correlation_id  # type: ignore[attr-defined]
        stream_id, channel = command.stream_id, command.channel  # type: ignore[attr-defined]
        self._client(client_id)
        uri = self._parse_channel(channel)
        subscription = SubscriptionLink(correlation_id, client_id, stream_id, channel, self._session_id_filter(uri))
        self.subscriptions.append(subscription)
        self.system[SystemCounter.ACTIVE_SUBSCRIPTIONS].set(len(self.subscriptions))
        self._send(protocol.OnSubscriptionReadyEncoder, correlation_id=correlation_id, channel_status_indicator_id=NULL_VALUE)
        for publication in self.publications:
            if publication.state is PublicationState.ACTIVE and self._matches(subscription, publication):
                self._link(subscription, publication)

    @staticmethod
    def _matches(subscription: SubscriptionLink, publication: IpcPublication) -> bool:
        return subscription.stream_id == publication.stream_id and (
            subscription.session_id is None or subscription.session_id == publication.session_id
        )

    def _link(self, subscription: SubscriptionLink, publication: IpcPublication) -> None:
        join_position = publication.join_position()
        position = self.counters.new_counter(
            f"sub-pos: {subscription.registration_id} {publication.session_id} {publication.stream_id} "
            f"{subscription.channel} @{join_position}",
            SUBSCRIBER_POSITION_TYPE_ID,
            registration_key(subscription.registration_id, publication.session_id, publication.stream_id),
            subscription.registration_id,
        )
        position.set(join_position)
        publication.subscribers.append(SubscriberLink(subscription.registration_id, subscription.client_id, position))
        publication.set_connected()
        self._send(
            protocol.OnAvailableImageEncoder,
            correlation_id=publication.registration_id,
            session_id=publication.session_id,
            stream_id=publication.stream_id,
            subscription_registration_id=subscription.registration_id,
            subscriber_position_id=position.id,
            log_file_name=publication.log_file_name,
            source_identity=IPC_SOURCE_IDENTITY,
        )

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
        for publication in self.publications:
            for link in [l for l in publication.subscribers if l.subscription_registration_id == subscription.registration_id]:
                publication.subscribers.remove(link)
                link.position.close()
            publication.set_connected()

    def _on_client_keepalive(self, command: object) -> None:
        self._client(command.client_id)  # type: ignore[attr-defined]

    def _on_client_close(self, command: object) -> None:
        client = self.clients.get(command.client_id)  # type: ignore[attr-defined]
        if client is not None:
            self._close_client(client)

    def _on_client_timeout(self, client: AeronClient) -> None:
        self.system[SystemCounter.CLIENT_TIMEOUTS].increment()
        self.record_error(f"client {client.client_id} timed out: no keepalive for the liveness timeout")
        self._close_client(client)
        self._send(protocol.OnClientTimeoutEncoder, client_id=client.client_id)

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
        from fulmar.counters import CountersError

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
        counter.close()
        self._send(protocol.OnUnavailableCounterEncoder, correlation_id=registration_id, counter_id=counter_id)

    def _on_destination(self, command: object) -> None:
        self._client(command.client_id)  # type: ignore[attr-defined]
        raise ControlProtocolError(
            ErrorCode.INVALID_CHANNEL, "destinations apply to UDP multi-destination channels, which this driver lacks so far"
        )

    def _on_terminate_driver(self, command: object) -> None:
        token = bytes(command.token)  # type: ignore[attr-defined]
        expected = self.context.terminate_token
        if expected is not None and token == expected:
            self.termination_requested = True
        else:
            # As in Aeron, a refused termination is not answered, only recorded.
            self.record_error(f"terminate driver request from client {command.client_id} refused: invalid token")  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ lifecycle of publications

    def _advance_publication(self, publication: IpcPublication, now_ns: int) -> int:
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
                    link.position.close()
                publication.subscribers.clear()
                publication.set_connected()
                publication.state = PublicationState.LINGER
                publication.linger_deadline_ns = now_ns + self.context.publication_linger_timeout_ns
                return 1
        elif publication.state is PublicationState.LINGER and now_ns >= publication.linger_deadline_ns:
            self._free_publication(publication)
            return 1
        return 0

    def _free_publication(self, publication: IpcPublication) -> None:
        for link in publication.subscribers:
            link.position.close()
        publication.subscribers.clear()
        for counter in (
            publication.publisher_limit,
            publication.publisher_position,
            publication.back_pressure_events,
            publication.messages,
        ):
            counter.close()
        path = publication.path
        publication.log.close()
        path.unlink(missing_ok=True)
        publication.state = PublicationState.DONE
        self.publications.remove(publication)
        self.system[SystemCounter.ACTIVE_PUBLICATIONS].set(len(self.publications))
