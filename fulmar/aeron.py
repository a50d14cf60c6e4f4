"""The transport client: connect to a media driver and add publications,
subscriptions and counters.

``Aeron.connect(directory)`` maps the driver's cnc.dat.  Every request is a
command on the to-driver ring buffer answered on the broadcast buffer; the
``ClientConductor`` reads the answers, maps log buffers, keeps the client
alive with keepalives and watches the driver's heartbeat.  It runs either on
a background thread (the default, for scripts) or in *invoker* mode, where
the owning agent calls ``aeron.do_work(now_ns)`` from its own duty cycle (as
the consensus module does in its slow tick work).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from fulmar.broadcast import BroadcastReceiver, CopyBroadcastReceiver, UnableToKeepUpError
from fulmar.client_liveness import process_declaration
from fulmar.cnc import CncError, CncFile
from fulmar.codecs.generated import driver as protocol
from fulmar.codecs.runtime import MessageEncoder
from fulmar.counters import NULL_COUNTER_ID, AtomicCounter, CountersReader, append_to_label
from fulmar.errors import FulmarError
from fulmar.log_writer import ring_log_writer
from fulmar.logbuffer import LogBuffers
from fulmar.publication import ExclusivePublication, Publication
from fulmar.reader_doorbells import CLIENT_DOORBELL_TYPE_ID, CounterWatch, client_doorbell, ring_counter_watchers
from fulmar.ring_buffer import CorruptBufferError, ManyToOneRingBuffer
from fulmar.subscription import Image, ImageHandler, Subscription

SENDER_BPE_TYPE_ID = 13  # fulmar.driver.counters: the transport client does not import the driver
PUBLISHER_MESSAGES_TYPE_ID = 90
LOCAL_SOCKADDR_TYPE_ID = 14
CLIENT_HEARTBEAT_TYPE_ID = 11
# A driver whose heartbeat is this old and whose process is gone will never
# answer: said at once, not after the whole driver timeout.  (Both, so that a
# driver in another pid namespace sharing the directory is not taken for dead.)
_GONE_HEARTBEAT_AGE_MS = 1000


class DriverTimeoutError(FulmarError):
    """No live media driver: absent, its heartbeat stopped, its process gone,
    or another driver has taken its directory."""


class ClientTimeoutError(FulmarError):
    """The driver timed this client out (it sent no keepalive in time)."""


class RegistrationError(FulmarError):
    """The driver refused a request; ``code`` is Aeron's ErrorCode."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = protocol.ErrorCode(code) if code in protocol.ErrorCode._value2member_map_ else code


class ClientClosedError(FulmarError):
    """The client is closed."""


class UnknownRegistrationError(FulmarError):
    """No such registration with this client (never made, or already removed)."""


def default_error_handler(error: BaseException) -> None:
    import sys

    print(f"fulmar client error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)


@dataclass
class AeronContext:
    directory: Path | None = None  # default: fulmar.driver.context.default_driver_dir()
    driver_timeout_ms: int = 10_000
    keepalive_interval_ns: int = 500_000_000
    # How long a closed image's log stays mapped (another thread may still be polling it).
    resource_linger_ns: int = 3_000_000_000
    use_conductor_thread: bool = True
    # The background conductor sleeps on the clients' doorbell at most this long.
    conductor_max_wait_ns: int = 100_000_000
    error_handler: Callable[[BaseException], None] = default_error_handler
    on_available_counter: Callable[[CountersReader, int, int], None] | None = None
    on_unavailable_counter: Callable[[CountersReader, int, int], None] | None = None


@dataclass
class _Pending:
    kind: str
    args: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    # An async add whose owner let it go before the driver answered: the
    # answer is not mapped, and a publication it created is removed at once.
    cancelled: bool = False


class Counter(AtomicCounter):
    """A counter this client asked the driver for; ``close`` asks the driver to free it."""

    def __init__(self, conductor: ClientConductor, values: Any, counter_id: int, registration_id: int) -> None:
        super().__init__(values, counter_id)
        self._conductor = conductor
        self.registration_id = registration_id
        self._released = False

    def close(self) -> None:
        if not self._released:
            self._released = True
            self._conductor.release_counter(self)

    @property
    def is_closed(self) -> bool:
        return self._released


class ClientConductor:
    def __init__(self, context: AeronContext, cnc: CncFile) -> None:
        self.context = context
        self.cnc = cnc
        self.to_driver = ManyToOneRingBuffer(cnc.to_driver)
        self.receiver = CopyBroadcastReceiver(BroadcastReceiver(cnc.to_clients), scratch_length=64 * 1024)
        self.counters_reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
        self.driver_doorbell = cnc.driver_doorbell()
        self.clients_doorbell = cnc.clients_doorbell()
        # UDP publications wake the driver's data plane, which sends them.
        self._driver_data_fd = cnc.open_driver_data_fifo()
        self.driver_data_doorbell = cnc.driver_data_doorbell(self._driver_data_fd)
        # What this client sleeps on for data: its own doorbell once
        # ``open_doorbell`` has added it (fulmar.reader_doorbells), so that
        # writers wake it only for what it reads; the node's shared one until then.
        self.data_doorbell = cnc.data_doorbell()
        self.doorbell_id: int | None = None
        self._doorbell_counter: Counter | None = None
        self.client_id = self.to_driver.next_correlation_id()
        self.lock = threading.RLock()
        self._scratch = bytearray(64 * 1024)
        self._pending: dict[int, _Pending] = {}
        self._publications: dict[int, Publication] = {}  # by this client's registration (correlation) id
        # The native writers of publications whose appends ring nobody until
        # ring_deferred() (Publication.defer_rings), by registration id.
        self._deferred_writers: dict[int, Any] = {}
        self._deferred_list: list[Any] = []
        self._subscriptions: dict[int, Subscription] = {}
        self._counters: dict[int, Counter] = {}
        self._log_buffers: dict[str, tuple[LogBuffers, int]] = {}  # path -> (mapping, users)
        self._lingering: list[tuple[int, str]] = []  # (unmap deadline, path)
        self._next_keepalive_ns = 0
        # Whether this client's process is named in its heartbeat counter's label
        # (see fulmar.client_liveness): done once the driver has allocated it.
        self._process_declared = False
        # Keep alive well within the driver's liveness timeout, whatever it is.
        self._keepalive_interval_ns = min(context.keepalive_interval_ns, cnc.client_liveness_timeout_ns // 4)
        self._closed = False
        self._terminal_error: BaseException | None = None
        self._check_driver_alive()

    # ------------------------------------------------------------------ duty cycle

    def defer_rings_of(self, registration_id: int, writer: Any) -> None:
        with self.lock:
            writer.defer_rings = 1
            self._deferred_writers[registration_id] = writer
            self._deferred_list = list(self._deferred_writers.values())

    def ring_deferred(self) -> int:
        """Ring what the deferred publications' appends since the last call
        would have rung; how many publications had appended."""
        rung = 0
        for writer in self._deferred_list:
            rung += ring_log_writer(writer)
        return rung

    def do_work(self, now_ns: int) -> int:
        if self._deferred_list:
            self.ring_deferred()
        with self.lock:
            if self._closed or self._terminal_error is not None:
                return 0
            work = self._receive()
            if now_ns >= self._next_keepalive_ns:
                self._next_keepalive_ns = now_ns + self._keepalive_interval_ns
                self._on_keepalive_tick(now_ns)
                work += 1
            return work

    def has_driver_news(self) -> bool:
        """Whether the driver has broadcast something this client has not read
        yet (an image, a response): an agent that runs the conductor itself
        (no conductor thread) checks it before sleeping and runs ``do_work``
        when it is true, rather than leaving a new image unseen until its next
        slow tick while the data in it waits."""
        return self.receiver.receiver.has_news()

    def _receive(self) -> int:
        try:
            return self.receiver.receive(self._on_response, 64)
        except (UnableToKeepUpError, CorruptBufferError) as error:
            # Responses were lost: report it; the receiver has moved on to the newest.
            self.context.error_handler(error)
            return 1

    def _on_keepalive_tick(self, now_ns: int) -> None:
        try:
            self._check_driver_alive()
        except DriverTimeoutError as error:
            self._fail(error)
            return
        self._send(protocol.ClientKeepaliveEncoder, client_id=self.client_id, correlation_id=0)
        if not self._process_declared:
            self._declare_process()
        while self._lingering and self._lingering[0][0] <= now_ns:
            _, path = self._lingering.pop(0)
            self._unmap(path)

    def _declare_process(self) -> None:
        """Append this process to the heartbeat counter the driver allocated for
        this client (on its first command), so that the driver can close this
        client as soon as the process dies instead of after the liveness timeout."""
        counter_id = self.counters_reader.find_by_type_and_registration(CLIENT_HEARTBEAT_TYPE_ID, self.client_id)
        if counter_id == NULL_COUNTER_ID:
            return  # not allocated yet: the next keepalive tick looks again
        declaration = process_declaration()
        if declaration is not None:
            append_to_label(self.counters_reader.metadata_buffer, counter_id, declaration)
        # Set once the label holds it: another thread may read the flag, then the label.
        self._process_declared = True

    def _check_driver_alive(self) -> None:
        """DriverTimeoutError unless the driver whose cnc.dat this client
        mapped still serves it: its heartbeat is fresh, its process is there
        and its directory holds that very cnc.dat, not a restarted driver's
        new one.  A stat and at most a process lookup: each keepalive tick,
        never per message."""
        age_ms = int(time.time() * 1000) - self.to_driver.consumer_heartbeat_time
        directory = self.cnc.path.parent
        if age_ms > self.context.driver_timeout_ms:
            raise DriverTimeoutError(
                f"media driver in {directory} is not alive: no heartbeat for {age_ms} ms "
                f"(timeout {self.context.driver_timeout_ms} ms)"
            )
        if self.cnc.mapped.is_replaced():
            raise DriverTimeoutError(
                f"the media driver (pid {self.cnc.pid}) in {directory} is gone: another driver has made a new "
                f"{self.cnc.path.name} there (a restart)"
            )
        if age_ms > _GONE_HEARTBEAT_AGE_MS and not _process_running(self.cnc.pid):
            raise DriverTimeoutError(f"the media driver (pid {self.cnc.pid}) in {directory} is gone")

    def _fail(self, error: BaseException) -> None:
        """The driver is gone or dropped us: everything this client held is
        closed, and this client stays failed (no more keepalives)."""
        if self._terminal_error is not None:
            return
        self._terminal_error = error
        self._close_resources()
        self.context.error_handler(error)
        for pending in self._pending.values():
            pending.error, pending.done = error, True

    # ------------------------------------------------------------------ commands

    def _send(self, encoder: type[MessageEncoder], **fields: Any) -> None:
        length = encoder.encode_fields(self._scratch, 0, fields)
        deadline = time.monotonic() + self.context.driver_timeout_ms / 1000
        while not self.to_driver.write(encoder.TEMPLATE_ID, memoryview(self._scratch)[:length]):
            if time.monotonic() > deadline:
                raise DriverTimeoutError(
                    f"the command buffer of the media driver in {self.cnc.path.parent} stayed full for the "
                    f"driver timeout ({self.context.driver_timeout_ms} ms)"
                )
            time.sleep(0.0001)
        self.driver_doorbell.ring()

    def _request(
        self, kind: str, encoder: type[MessageEncoder], local: dict[str, Any] | None = None, **fields: Any
    ) -> Any:
        """Send a command and drive this conductor until the driver answers it.

        ``local`` holds what the response handler needs but the driver does not.
        """
        with self.lock:
            self._ensure_open()
            correlation_id = self.to_driver.next_correlation_id()
            pending = self._pending[correlation_id] = _Pending(kind, {**fields, **(local or {})})
            self._send(encoder, client_id=self.client_id, correlation_id=correlation_id, **fields)
        deadline_ns = time.monotonic_ns() + self.context.driver_timeout_ms * 1_000_000
        next_liveness_check_ns = time.monotonic_ns() + 100_000_000
        try:
            while True:
                with self.lock:
                    if not pending.done:
                        token = self.clients_doorbell.prepare()
                        if self._receive() == 0 and not pending.done:
                            self.clients_doorbell.wait(token, 1_000_000)
                        else:
                            self.clients_doorbell.cancel()
                    if pending.done:
                        break
                    now_ns = time.monotonic_ns()
                    if now_ns > deadline_ns:
                        self._check_driver_alive()
                        raise DriverTimeoutError(
                            f"no response from the driver to {kind} within {self.context.driver_timeout_ms} ms"
                        )
                    if now_ns >= next_liveness_check_ns:
                        # A driver that is gone will never answer: say so now
                        # rather than after the whole timeout.
                        next_liveness_check_ns = now_ns + 100_000_000
                        try:
                            self._check_driver_alive()
                        except DriverTimeoutError as error:
                            self._fail(error)
                            raise
                    if now_ns >= self._next_keepalive_ns:
                        self.do_work(now_ns)
        finally:
            with self.lock:
                self._pending.pop(correlation_id, None)
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _ensure_open(self) -> None:
        if self._terminal_error is not None:
            raise self._terminal_error
        if self._closed:
            raise ClientClosedError("the Aeron client is closed")

    def add_publication(self, channel: str, stream_id: int, exclusive: bool = False) -> Publication:
        encoder = protocol.AddExclusivePublicationEncoder if exclusive else protocol.AddPublicationEncoder
        publication: Publication = self._request(
            "exclusive publication" if exclusive else "publication", encoder, stream_id=stream_id, channel=channel
        )
        return publication

    def async_add_publication(self, channel: str, stream_id: int, exclusive: bool = False) -> int:
        """Send AddPublication and return its registration id without waiting
        for the driver (Aeron's ``asyncAddPublication``): the same command on
        the wire, but the caller goes on with its duty cycle and collects the
        publication with :meth:`get_publication` once the driver answered."""
        encoder = protocol.AddExclusivePublicationEncoder if exclusive else protocol.AddPublicationEncoder
        kind = "exclusive publication" if exclusive else "publication"
        with self.lock:
            self._ensure_open()
            correlation_id = self.to_driver.next_correlation_id()
            self._pending[correlation_id] = _Pending(kind, {"stream_id": stream_id, "channel": channel})
            try:
                self._send(
                    encoder,
                    client_id=self.client_id,
                    correlation_id=correlation_id,
                    stream_id=stream_id,
                    channel=channel,
                )
            except BaseException:
                del self._pending[correlation_id]
                raise
        return int(correlation_id)

    def get_publication(self, registration_id: int) -> Publication | None:
        """The publication of an :meth:`async_add_publication`: None while the
        driver's answer has not been received, the driver's error
        (``RegistrationError``) once it refused, the publication once it added
        it.  A lookup: the conductor's duty cycle (its thread, or the owner's
        ``do_work`` in invoker mode) receives the answers, a bounded batch per
        cycle, so that a thousand answers do not land in one caller's cycle."""
        with self.lock:
            self._ensure_open()
            pending = self._pending.get(registration_id)
            if pending is None or pending.cancelled:
                publication = self._publications.get(registration_id)
                if publication is None:
                    raise UnknownRegistrationError(
                        f"no publication with registration id {registration_id}: never added, or removed"
                    )
                return publication
            if not pending.done:
                return None
            del self._pending[registration_id]
            if pending.error is not None:
                raise pending.error
            result: Publication = pending.result
            return result

    def async_remove_publication(self, registration_id: int) -> None:
        """Let a publication of :meth:`async_add_publication` go, whether the
        driver has added it yet or not, without waiting for the driver
        (Aeron's ``asyncRemovePublication``).  Cleanup: a closed or failed
        client, or an add the driver refused, leaves nothing to remove."""
        with self.lock:
            pending = self._pending.get(registration_id)
            if pending is not None and not pending.done:
                # Not answered yet: the answer removes it (see _on_publication_ready).
                pending.cancelled = True
                return
            self._pending.pop(registration_id, None)
            publication = self._publications.pop(registration_id, None)
            if publication is None or publication.is_closed:
                return
            publication._mark_closed()
            self._release_log(str(publication.log.path))
            self._send_remove_publication(publication.original_registration_id)

    def _send_remove_publication(self, original_registration_id: int) -> None:
        if self._closed or self._terminal_error is not None:
            return
        try:
            self._send(
                protocol.RemovePublicationEncoder,
                client_id=self.client_id,
                correlation_id=self.to_driver.next_correlation_id(),
                registration_id=original_registration_id,
            )
        except DriverTimeoutError as error:
            self._fail(error)  # its command buffer stayed full: the driver is not working

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None,
    ) -> Subscription:
        subscription: Subscription = self._request(
            "subscription",
            protocol.AddSubscriptionEncoder,
            registration_correlation_id=-1,
            stream_id=stream_id,
            channel=channel,
            local={"handlers": (on_available_image, on_unavailable_image)},
        )
        return subscription

    def add_counter(self, type_id: int, label: str, key: bytes = b"") -> Counter:
        counter: Counter = self._request("counter", protocol.AddCounterEncoder, type_id=type_id, key=key, label=label)
        return counter

    def open_doorbell(self) -> None:
        """Add this client's own doorbell (a counter the driver names in the
        reader tables of the logs this client subscribes to) and sleep on it."""
        counter = self.add_counter(CLIENT_DOORBELL_TYPE_ID, f"client-doorbell: {self.client_id}")
        self._doorbell_counter = counter
        self.doorbell_id = counter.id
        self.data_doorbell = client_doorbell(self.cnc.counters_values, counter.id)

    def counter_watch(self) -> CounterWatch:
        """Watches that ring this client's doorbell when a counter moves."""
        if self.doorbell_id is None:
            raise ClientClosedError("the client has no doorbell of its own (open_doorbell)")
        return CounterWatch(self.cnc.counters_values, self.doorbell_id)

    def ring_counter_watchers(self, counter_id: int) -> int:
        """Wake the clients watching a counter this client has just moved."""
        return ring_counter_watchers(self.cnc.counters_values, counter_id)

    def add_destination(self, publication: Publication, channel: str) -> None:
        """Send a manual multi-destination-cast publication to one more endpoint."""
        self._destination_request(protocol.AddDestinationEncoder, publication.original_registration_id, channel)

    def remove_destination(self, publication: Publication, channel: str) -> None:
        self._destination_request(protocol.RemoveDestinationEncoder, publication.original_registration_id, channel)

    def add_receive_destination(self, subscription: Subscription, channel: str) -> None:
        """Receive a ``control-mode=manual`` UDP subscription's stream on one more endpoint."""
        self._destination_request(protocol.AddRcvDestinationEncoder, subscription.registration_id, channel)

    def remove_receive_destination(self, subscription: Subscription, channel: str) -> None:
        self._destination_request(protocol.RemoveRcvDestinationEncoder, subscription.registration_id, channel)

    def _destination_request(self, encoder: type[MessageEncoder], registration_id: int, channel: str) -> None:
        self._request(encoder.NAME, encoder, registration_correlation_id=registration_id, channel=channel)

    def local_socket_addresses(self, channel_status_id: int) -> list[str]:
        """Addresses of the local-socket-address counters (type 14) of a channel status counter."""
        if channel_status_id < 0:
            return []
        addresses = []
        for counter in self.counters_reader:
            if (
                counter.type_id == LOCAL_SOCKADDR_TYPE_ID
                and int.from_bytes(counter.key[:4], "little", signed=True) == channel_status_id
            ):
                addresses.append(counter.label.rsplit(" ", 1)[-1])
        return addresses

    def release_publication(self, publication: Publication) -> None:
        with self.lock:
            if publication.is_closed:
                return
            publication._mark_closed()
            self._publications.pop(publication.registration_id, None)
            writer = self._deferred_writers.pop(publication.registration_id, None)
            if writer is not None:
                ring_log_writer(writer)  # what its last appends were owed
                self._deferred_list = list(self._deferred_writers.values())
            self._release_log(str(publication.log.path))
            if self._closed or self._terminal_error is not None:
                return
        self._release_request(
            "remove publication", protocol.RemovePublicationEncoder, publication.original_registration_id
        )

    def release_subscription(self, subscription: Subscription) -> None:
        with self.lock:
            if subscription.is_closed:
                return
            for image in subscription._mark_closed():
                self._linger_log(str(image.log.path))
            self._subscriptions.pop(subscription.registration_id, None)
            if self._closed or self._terminal_error is not None:
                return
        self._release_request("remove subscription", protocol.RemoveSubscriptionEncoder, subscription.registration_id)

    def release_counter(self, counter: Counter) -> None:
        with self.lock:
            self._counters.pop(counter.registration_id, None)
            if self._closed or self._terminal_error is not None:
                return
        self._release_request("remove counter", protocol.RemoveCounterEncoder, counter.registration_id)

    def _release_request(self, kind: str, encoder: type[MessageEncoder], registration_id: int) -> None:
        """Closing is cleanup: with the driver gone there is nothing left to
        release there (this client is failed and reports it once)."""
        try:
            self._request(kind, encoder, registration_id=registration_id)
        except DriverTimeoutError as error:
            if self._terminal_error is None:
                self._fail(error)

    # ------------------------------------------------------------------ responses

    def _on_response(self, msg_type_id: int, body: memoryview) -> None:
        try:
            message = protocol.decode(msg_type_id, body, 0, len(body))
        except Exception as error:  # garbage from a broken driver: report, keep going
            self.context.error_handler(error)
            return
        handler = _RESPONSE_HANDLERS.get(msg_type_id)
        if handler is not None:
            handler(self, message)

    def _resolve(self, correlation_id: int) -> _Pending | None:
        pending = self._pending.get(correlation_id)
        return pending if pending is not None and not pending.done else None

    def _on_publication_ready(self, message: Any) -> None:
        pending = self._resolve(message.correlation_id)
        if pending is None:
            return
        if pending.cancelled:
            # Its owner let it go before the driver answered: remove it again
            # (the driver's reference to it for this client), mapping nothing.
            del self._pending[message.correlation_id]
            self._send_remove_publication(message.registration_id)
            return
        exclusive = message.TEMPLATE_ID == protocol.TemplateId.ON_EXCLUSIVE_PUBLICATION_READY
        log = self._map_log(message.log_file_name)
        bpe_id = self.counters_reader.find_by_type_and_registration(SENDER_BPE_TYPE_ID, message.registration_id)
        messages_id = self.counters_reader.find_by_type_and_registration(
            PUBLISHER_MESSAGES_TYPE_ID, message.registration_id
        )
        cls = ExclusivePublication if exclusive else Publication
        publication = cls(
            self,
            pending.args["channel"],
            message.stream_id,
            message.session_id,
            message.correlation_id,
            message.registration_id,
            log,
            self.cnc.counters_values,
            message.publication_limit_counter_id,
            bpe_id if bpe_id >= 0 else None,
            # UDP data wakes the driver's data plane, whose sender sends it;
            # IPC data only the log's readers (and the data plane when it
            # relays to more of them).
            self.driver_data_doorbell if pending.args["channel"].startswith("aeron:udp") else None,
            messages_id if messages_id >= 0 else None,
            relay_doorbell=self.driver_data_doorbell,
        )
        self._publications[message.correlation_id] = publication
        pending.result, pending.done = publication, True

    def _on_subscription_ready(self, message: Any) -> None:
        pending = self._resolve(message.correlation_id)
        if pending is None:
            return
        available, unavailable = pending.args["handlers"]
        subscription = Subscription(
            self, pending.args["channel"], pending.args["stream_id"], message.correlation_id, available, unavailable
        )
        subscription.channel_status_id = message.channel_status_indicator_id
        self._subscriptions[message.correlation_id] = subscription
        pending.result, pending.done = subscription, True

    def _on_available_image(self, message: Any) -> None:
        subscription = self._subscriptions.get(message.subscription_registration_id)
        if subscription is None:
            return
        image = Image(
            subscription,
            message.correlation_id,
            message.session_id,
            self._map_log(message.log_file_name),
            self.cnc.counters_values,
            message.subscriber_position_id,
            message.source_identity,
        )
        subscription._add_image(image)
        # The driver rang this client's doorbell when it sent the notice, but
        # with a conductor thread that ring can reach the agent before this
        # thread has added the image: the agent finds nothing, goes back to
        # sleep, and the first message (rung while it was not a reader yet)
        # waited out its longest sleep.  Ringing again once the image is there
        # ends that sleep; with nobody asleep it costs a fence and a load.
        self.data_doorbell.ring()
        if subscription.on_available_image is not None:
            self._call_user(subscription.on_available_image, image)

    def _on_unavailable_image(self, message: Any) -> None:
        subscription = self._subscriptions.get(message.subscription_registration_id)
        if subscription is None:
            return
        image = subscription._remove_image(message.correlation_id)
        if image is None:
            return
        self._linger_log(str(image.log.path))
        if subscription.on_unavailable_image is not None:
            self._call_user(subscription.on_unavailable_image, image)

    def _on_operation_success(self, message: Any) -> None:
        pending = self._resolve(message.correlation_id)
        if pending is not None:
            pending.done = True

    def _on_error(self, message: Any) -> None:
        pending = self._resolve(message.offending_command_correlation_id)
        if pending is not None and pending.cancelled:
            del self._pending[message.offending_command_correlation_id]  # nobody waits for it
        elif pending is not None:
            pending.error = RegistrationError(
                message.error_code_raw if hasattr(message, "error_code_raw") else int(message.error_code),
                f"{pending.kind}: {message.error_message}",
            )
            pending.done = True

    def _on_counter_ready(self, message: Any) -> None:
        pending = self._resolve(message.correlation_id)
        if pending is not None:
            counter = Counter(self, self.cnc.counters_values, message.counter_id, message.correlation_id)
            self._counters[message.correlation_id] = counter
            pending.result, pending.done = counter, True
        elif self.context.on_available_counter is not None:
            self._call_user(
                self.context.on_available_counter, self.counters_reader, message.correlation_id, message.counter_id
            )

    def _on_unavailable_counter(self, message: Any) -> None:
        counter = self._counters.pop(message.correlation_id, None)
        if counter is not None:
            counter._released = True
        if self.context.on_unavailable_counter is not None:
            self._call_user(
                self.context.on_unavailable_counter, self.counters_reader, message.correlation_id, message.counter_id
            )

    def _on_client_timeout(self, message: Any) -> None:
        if message.client_id == self.client_id:
            self._fail(
                ClientTimeoutError(
                    f"the media driver in {self.cnc.path.parent} timed out client {self.client_id} "
                    "(no keepalive within its client liveness timeout)"
                )
            )

    def _call_user(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception as error:
            self.context.error_handler(error)

    # ------------------------------------------------------------------ log buffers

    def _map_log(self, path: str) -> LogBuffers:
        entry = self._log_buffers.get(path)
        if entry is None:
            entry = (LogBuffers.open(path), 0)
        self._log_buffers[path] = (entry[0], entry[1] + 1)
        return entry[0]

    def _release_log(self, path: str) -> None:
        entry = self._log_buffers.get(path)
        if entry is not None:
            log, users = entry
            if users <= 1:
                del self._log_buffers[path]
                log.close()
            else:
                self._log_buffers[path] = (log, users - 1)

    def _linger_log(self, path: str) -> None:
        self._lingering.append((time.monotonic_ns() + self.context.resource_linger_ns, path))

    def _unmap(self, path: str) -> None:
        self._release_log(path)

    # ------------------------------------------------------------------ close

    def _close_resources(self) -> None:
        self.ring_deferred()  # what the last appends were owed, while the logs are mapped
        self._deferred_writers.clear()
        self._deferred_list = []
        for publication in list(self._publications.values()):
            publication._mark_closed()
        for subscription in list(self._subscriptions.values()):
            subscription._mark_closed()
        for counter in self._counters.values():
            counter._released = True
        self._publications.clear()
        self._subscriptions.clear()
        self._counters.clear()

    def close(self) -> None:
        with self.lock:
            if self._closed:
                return
            if self._terminal_error is None:
                try:
                    self._send(protocol.ClientCloseEncoder, client_id=self.client_id, correlation_id=0)
                except FulmarError:
                    pass
            self._close_resources()
            self._closed = True
            for log, _ in self._log_buffers.values():
                log.close()
            self._log_buffers.clear()
            self._lingering.clear()
            if self._driver_data_fd >= 0:
                os.close(self._driver_data_fd)
                self._driver_data_fd = -1
            self.cnc.close()


def _process_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # there, but not ours to look at


_RESPONSE_HANDLERS: dict[int, Callable[[ClientConductor, Any], None]] = {
    protocol.TemplateId.ON_PUBLICATION_READY: ClientConductor._on_publication_ready,
    protocol.TemplateId.ON_EXCLUSIVE_PUBLICATION_READY: ClientConductor._on_publication_ready,
    protocol.TemplateId.ON_SUBSCRIPTION_READY: ClientConductor._on_subscription_ready,
    protocol.TemplateId.ON_AVAILABLE_IMAGE: ClientConductor._on_available_image,
    protocol.TemplateId.ON_UNAVAILABLE_IMAGE: ClientConductor._on_unavailable_image,
    protocol.TemplateId.ON_OPERATION_SUCCESS: ClientConductor._on_operation_success,
    protocol.TemplateId.ON_ERROR: ClientConductor._on_error,
    protocol.TemplateId.ON_COUNTER_READY: ClientConductor._on_counter_ready,
    protocol.TemplateId.ON_STATIC_COUNTER: ClientConductor._on_counter_ready,
    protocol.TemplateId.ON_UNAVAILABLE_COUNTER: ClientConductor._on_unavailable_counter,
    protocol.TemplateId.ON_CLIENT_TIMEOUT: ClientConductor._on_client_timeout,
}


class Aeron:
    """A connection to a media driver."""

    def __init__(self, conductor: ClientConductor) -> None:
        self.conductor = conductor
        self.context = conductor.context
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @classmethod
    def connect(cls, directory: str | Path | None = None, context: AeronContext | None = None, **options: Any) -> Aeron:
        """Connect to the driver in ``directory``.

        ``DriverTimeoutError`` when no driver runs there or its heartbeat is
        stale.  Options override ``AeronContext`` fields.
        """
        context = context or AeronContext(**options)
        if directory is not None:
            context.directory = Path(directory)
        if context.directory is None:
            from fulmar.driver.context import default_driver_dir

            context.directory = default_driver_dir()
        deadline = time.monotonic() + context.driver_timeout_ms / 1000
        while True:
            try:
                cnc = CncFile.open(context.directory)
                break
            except CncError as error:
                # A driver that is starting has not published its version yet.
                if "version 0" not in str(error) or time.monotonic() > deadline:
                    raise DriverTimeoutError(str(error)) from None
                time.sleep(0.001)
        try:
            conductor = ClientConductor(context, cnc)
        except BaseException:
            cnc.close()
            raise
        try:
            conductor.open_doorbell()
        except BaseException:
            conductor.close()
            raise
        aeron = cls(conductor)
        if context.use_conductor_thread:
            aeron._start_thread()
        return aeron

    def _start_thread(self) -> None:
        def run() -> None:
            conductor = self.conductor
            doorbell = conductor.clients_doorbell
            while not self._stop.is_set():
                try:
                    if conductor.do_work(time.monotonic_ns()) == 0:
                        token = doorbell.prepare()
                        if self._stop.is_set():
                            doorbell.cancel()
                        else:
                            doorbell.wait(token, self.context.conductor_max_wait_ns)
                except Exception as error:
                    self.context.error_handler(error)

        self._thread = threading.Thread(target=run, name=f"aeron-client-conductor-{self.client_id}", daemon=True)
        self._thread.start()

    @property
    def client_id(self) -> int:
        return self.conductor.client_id

    @property
    def counters_reader(self) -> CountersReader:
        return self.conductor.counters_reader

    def next_correlation_id(self) -> int:
        """A correlation id unique among all clients of this driver (Aeron's
        ``nextCorrelationId``: it comes from the to-driver buffer's counter)."""
        return int(self.conductor.to_driver.next_correlation_id())

    @property
    def directory(self) -> Path:
        return Path(self.conductor.cnc.path).parent

    def ring_deferred(self) -> int:
        """Ring for the appends of deferring publications (``Publication.defer_rings``)."""
        return self.conductor.ring_deferred()

    def do_work(self, now_ns: int | None = None) -> int:
        """Invoker mode: run one conductor duty cycle from the caller's loop."""
        return self.conductor.do_work(time.monotonic_ns() if now_ns is None else now_ns)

    def add_publication(self, channel: str, stream_id: int) -> Publication:
        return self.conductor.add_publication(channel, stream_id, exclusive=False)

    def add_exclusive_publication(self, channel: str, stream_id: int) -> ExclusivePublication:
        publication = self.conductor.add_publication(channel, stream_id, exclusive=True)
        assert isinstance(publication, ExclusivePublication)
        return publication

    def async_add_publication(self, channel: str, stream_id: int) -> int:
        """Ask the driver for a (concurrent) publication without waiting; its registration id.

        For a duty cycle that must not stall on a driver round trip (the
        consensus module adding a session's egress): poll
        :meth:`get_publication` with the id until it returns the publication.
        """
        return self.conductor.async_add_publication(channel, stream_id)

    def get_publication(self, registration_id: int) -> Publication | None:
        """The publication of :meth:`async_add_publication` once the driver's answer
        was received (by the conductor thread, or :meth:`do_work` in invoker mode),
        None until then; raises the driver's ``RegistrationError`` if it refused."""
        return self.conductor.get_publication(registration_id)

    def async_remove_publication(self, registration_id: int) -> None:
        """Close a publication of :meth:`async_add_publication` (added yet or not) without waiting."""
        self.conductor.async_remove_publication(registration_id)

    def add_subscription(
        self,
        channel: str,
        stream_id: int,
        on_available_image: ImageHandler | None = None,
        on_unavailable_image: ImageHandler | None = None,
    ) -> Subscription:
        return self.conductor.add_subscription(channel, stream_id, on_available_image, on_unavailable_image)

    def add_counter(self, type_id: int, label: str, key: bytes = b"") -> Counter:
        return self.conductor.add_counter(type_id, label, key)

    @property
    def is_closed(self) -> bool:
        """Closed by ``close()``, or failed: the driver is gone (dead,
        restarted, its heartbeat stopped) or timed this client out
        (``terminal_error`` says which).  Either way nothing of it works any more."""
        return self.conductor._closed or self.conductor._terminal_error is not None

    @property
    def terminal_error(self) -> BaseException | None:
        """Why this client failed (a DriverTimeoutError or ClientTimeoutError
        naming the driver's directory), or None while it works or after a plain close."""
        return self.conductor._terminal_error

    def close(self) -> None:
        self._stop.set()
        self.conductor.clients_doorbell.ring()
        if self._thread is not None:
            self._thread.join(5)
        self.conductor.close()

    def __enter__(self) -> Aeron:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
