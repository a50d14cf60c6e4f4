"""A publication sent over UDP: the driver's sender reads the log buffer
that local publishers append to and sends it to the channel's endpoint,
within the window the receivers' status messages allow, with SETUP frames
until a receiver answers, heartbeats when idle, and retransmits on NAKs."""

from __future__ import annotations

from pathlib import Path

from fulmar._native import ffi, lib
from fulmar.channel_uri import ChannelUri
from fulmar.counters import AtomicCounter
from fulmar.frames import (
    RTTM_REPLY_FLAG,
    SM_EOS_FLAG,
    SM_SEND_SETUP_FLAG,
    ErrorFrame,
    NakFrame,
    RttmFrame,
    StatusMessage,
    encode_heartbeat,
    encode_rttm,
    encode_setup,
)
from fulmar.reader_doorbells import LogReaders
from fulmar.logbuffer import (
    LogBuffers,
    compute_max_message_length,
    compute_position,
    compute_term_id_from_position,
    to_int32,
)

from fulmar.driver.counters import SystemCounter, SystemCounters
from fulmar.driver.flow_control import FlowControl
from fulmar.driver.ipc_publication import PublicationState, SubscriberLink
from fulmar.driver.retransmit_handler import RetransmitHandler
from fulmar.driver.send_channel_endpoint import SendChannelEndpoint
from fulmar.driver.sender_timing import SenderTiming, SetupDue
from fulmar.driver.udp_transport import UdpAddress

MAX_DATAGRAMS_PER_SEND = 64
# The sender's timed work for a publication runs at most this often (see send).
TIMED_WORK_INTERVAL_NS = 1_000_000



def in_resend_window(position: int, sender_position: int, term_length: int) -> bool:
    """Whether a NAKed position may be resent: below what was sent, and not
    older than half a term plus one max message behind it (Aeron's bottom
    resend window).  Older data's slot in the log may already hold a later
    term, or be being cleaned for one: resending it would send whatever is
    there now, so a stale or forged NAK gets nothing."""
    bottom = sender_position - (term_length >> 1) - compute_max_message_length(term_length)
    return bottom <= position < sender_position

class NetworkPublication:
    # The doorbells of the log's readers, named in its table (set by the conductor).
    readers: LogReaders
    # With more readers than the table holds: the producer position the driver last relayed a ring for.
    relayed_position = 0
    def __init__(
        self,
        registration_id: int,
        client_id: int,
        session_id: int,
        stream_id: int,
        channel: str,
        uri: ChannelUri,
        is_exclusive: bool,
        log: LogBuffers,
        endpoint: SendChannelEndpoint,
        flow_control: FlowControl,
        retransmit_handler: RetransmitHandler,
        publisher_limit: AtomicCounter,
        publisher_position: AtomicCounter,
        sender_position: AtomicCounter,
        back_pressure_events: AtomicCounter,
        messages: AtomicCounter,
        system: SystemCounters,
        term_window_length: int,
        now_ns: int,
        initial_setup_interval_ns: int | None = None,
    ) -> None:
        self.registration_id = registration_id
        self.session_id = session_id
        self.stream_id = stream_id
        self.channel = channel
        self.uri = uri
        self.is_exclusive = is_exclusive
        self.log = log
        self.endpoint = endpoint
        self.flow_control = flow_control
        self.retransmit_handler = retransmit_handler
        self.publisher_limit = publisher_limit
        self.publisher_position = publisher_position
        self.sender_position_counter = sender_position
        self.back_pressure_events = back_pressure_events
        self.messages = messages
        self.system = system
        self.term_window_length = term_window_length
        self.trip_gain = term_window_length // 8
        self.trip_limit = 0
        # A publication may start mid-stream (an initial position): send from there.
        start = log.clean_position
        self.client_refs: list[int] = [client_id]
        self.subscribers: list[SubscriberLink] = []  # spies: local subscribers reading this log directly
        # With ssc=true, spies alone make the publication connected.
        self.spies_simulate_connection = bool(uri.spies_simulate_connection())
        self.state = PublicationState.ACTIVE
        self.linger_deadline_ns = 0
        # Set each duty cycle: unsent data, or a spy behind (see IpcPublication).
        self.readers_behind = False
        self.timing = SenderTiming(now_ns, initial_setup_interval_ns=initial_setup_interval_ns)
        self._next_timed_work_ns = now_ns
        self.sender_position = start
        self.sender_limit = start
        self._connected = False
        self._bits = log.position_bits_to_shift
        self._term_length = log.term_length
        self._mtu = log.mtu
        self._padding = ffi.new("int32_t *")
        self._scratch = bytearray(64)
        self.ttl = uri.ttl() or 0
        endpoint.add(self)

    @property
    def log_file_name(self) -> str:
        return str(self.log.path)

    @property
    def path(self) -> Path:
        return self.log.path

    # ------------------------------------------------------------------ sender duty cycle

    def send(self, now_ns: int) -> int:
        work = 0
        # The timed part (SETUP, heartbeats, receiver liveness, connection)
        # runs at most once per TIMED_WORK_INTERVAL_NS: its timers are tens of
        # milliseconds and more, and in Python it cost more than sending.
        timed = now_ns - self._next_timed_work_ns >= 0
        if timed:
            self._next_timed_work_ns = now_ns + TIMED_WORK_INTERVAL_NS
            due = self.timing.setup_due(now_ns)
            if due is not SetupDue.NO:
                if due is SetupDue.ELICITED:
                    self.sender_limit = self.flow_control.on_setup(
                        self.sender_limit, self.sender_position, self._bits, now_ns
                    )
                self._send_setup()
                work += 1
        sent = self._send_data()
        if sent:
            self.timing.on_data_sent(now_ns)
            work += 1
        else:
            if timed and self.timing.heartbeat_due(now_ns):
                self._send_heartbeat()
                work += 1
            if self.spies_simulate_connection and self.subscribers and not self.timing.has_receivers:
                # Spies alone connect it (ssc), and no receiver sends status
                # messages to open the window: as Aeron, the sender follows
                # the fastest spy, so the publisher limit (slowest spy plus a
                # window) keeps moving.
                position = max([self.sender_position] + [spy.position.get() for spy in self.subscribers])
                if position != self.sender_position:
                    self.sender_position = position
                    self.sender_position_counter.set(position)
                self.sender_limit = self.flow_control.on_idle(now_ns, position, position, self.is_end_of_stream_sent())
            elif timed:
                self.sender_limit = self.flow_control.on_idle(
                    now_ns, self.sender_limit, self.sender_position, self.is_end_of_stream_sent()
                )
            if timed:
                self.timing.on_idle(now_ns)
                self._update_connected()
        if self.retransmit_handler.active_count:
            work += self.retransmit_handler.process_timeouts(now_ns, self._resend)
        return work

    def _update_connected(self) -> None:
        connected = self.timing.is_connected(self.flow_control.has_required_receivers()) or (
            self.spies_simulate_connection and bool(self.subscribers)
        )
        if connected != self._connected:
            self._connected = connected
            self.log.is_connected = connected

    def _regions(self, position: int, limit_length: int) -> tuple[list[tuple[int, int]], int]:
        """Datagram regions of whole committed frames from ``position``, at most
        ``limit_length`` bytes, within its term; and how far they advance."""
        term_length = self._term_length
        partition_base = (position >> self._bits) % 3 * term_length
        term_address = self.log.address + partition_base
        offset = position & (term_length - 1)
        regions: list[tuple[int, int]] = []
        advance = 0
        padding = self._padding
        mtu = self._mtu
        while limit_length > advance and len(regions) < MAX_DATAGRAMS_PER_SEND and offset < term_length:
            available = lib.fulmar_term_scan_for_availability(
                term_address, term_length, offset, min(mtu, limit_length - advance), padding
            )
            if available <= 0:
                break
            regions.append((partition_base + offset, available))
            step = available + padding[0]
            offset += step
            advance += step
            if padding[0]:
                break  # a term ends with the padding
        return regions, advance

    def _send_data(self) -> int:
        limit = min(self.sender_limit, self.log.producer_position())
        position = self.sender_position
        if limit <= position:
            return 0
        regions, advance = self._regions(position, limit - position)
        if not regions:
            return 0
        self.endpoint.send(self.log.log, regions)
        self.sender_position = position + advance
        self.sender_position_counter.set(self.sender_position)
        self.system[SystemCounter.BYTES_SENT].get_and_add(sum(length for _, length in regions))
        return advance

    def _resend(self, term_id: int, term_offset: int, length: int) -> None:
        position = compute_position(term_id, term_offset, self._bits, self.log.initial_term_id)
        if not in_resend_window(position, self.sender_position, self._term_length):
            return
        length = min(length, self.sender_position - position)
        if length <= 0:
            return
        regions, _ = self._regions(position, length)
        if regions:
            self.endpoint.send(self.log.log, regions)
            self.system[SystemCounter.RETRANSMITS_SENT].increment()

    def _position_fields(self) -> tuple[int, int]:
        position = self.sender_position
        term_id = compute_term_id_from_position(position, self._bits, self.log.initial_term_id)
        return term_id, position & (self._term_length - 1)

    def _send_setup(self) -> None:
        term_id, term_offset = self._position_fields()
        length = encode_setup(
            self._scratch,
            0,
            term_offset=term_offset,
            session_id=self.session_id,
            stream_id=self.stream_id,
            initial_term_id=self.log.initial_term_id,
            active_term_id=term_id,
            term_length=self._term_length,
            mtu_length=self._mtu,
            ttl=self.ttl,
        )
        self.endpoint.send_datagram(memoryview(self._scratch)[:length])

    def _send_heartbeat(self) -> None:
        term_id, term_offset = self._position_fields()
        length = encode_heartbeat(
            self._scratch,
            0,
            session_id=self.session_id,
            stream_id=self.stream_id,
            term_id=term_id,
            term_offset=term_offset,
            end_of_stream=self.is_end_of_stream_sent(),
        )
        self.endpoint.send_datagram(memoryview(self._scratch)[:length])
        self.system[SystemCounter.HEARTBEATS_SENT].increment()

    def is_end_of_stream_sent(self) -> bool:
        """Closed, and everything up to the end of the stream has been sent."""
        return self.state is not PublicationState.ACTIVE and self.sender_position >= self.log.producer_position()

    # ------------------------------------------------------------------ control frames from receivers

    def on_status_message(self, sm: StatusMessage, now_ns: int) -> None:
        self.system[SystemCounter.STATUS_MESSAGES_RECEIVED].increment()
        if sm.flags & SM_SEND_SETUP_FLAG:
            self.timing.on_trigger_send_setup(now_ns, self.is_end_of_stream_sent())
            self.flow_control.on_trigger_send_setup(sm.receiver_id, sm.group_tag, now_ns)
            return
        is_eos = bool(sm.flags & SM_EOS_FLAG)
        self.sender_limit = self.flow_control.on_status_message(
            sm.consumption_term_id,
            sm.consumption_term_offset,
            sm.receiver_window,
            sm.receiver_id,
            sm.group_tag,
            self.sender_limit,
            self.log.initial_term_id,
            self._bits,
            now_ns,
            is_eos,
        )
        self.timing.on_status_message(sm.receiver_id, is_eos, now_ns)
        self._update_connected()

    def on_nak(self, nak: NakFrame, now_ns: int) -> None:
        self.system[SystemCounter.NAK_MESSAGES_RECEIVED].increment()
        stats = self.retransmit_handler.stats
        invalid_before = stats.invalid_naks
        self.retransmit_handler.on_nak(
            nak.term_id, nak.term_offset, nak.length, self._term_length, self._mtu, now_ns, self._resend
        )
        if stats.invalid_naks != invalid_before:
            # The handler ignores a NAK outside the term; the operator sees it here.
            self.system[SystemCounter.INVALID_PACKETS].increment()

    def on_rttm(self, rttm: RttmFrame, source: UdpAddress, now_ns: int) -> None:
        if rttm.flags & RTTM_REPLY_FLAG:
            # This sender never asks for RTT measurements: a reply answers
            # nothing of ours, so it is counted rather than dropped unseen.
            self.system[SystemCounter.INVALID_PACKETS].increment()
            return
        length = encode_rttm(
            self._scratch,
            0,
            session_id=self.session_id,
            stream_id=self.stream_id,
            echo_timestamp_ns=rttm.echo_timestamp_ns,
            reception_delta_ns=0,
            receiver_id=rttm.receiver_id,
            flags=RTTM_REPLY_FLAG,
        )
        self.endpoint.reply(memoryview(self._scratch)[:length], source)

    def on_error_frame(self, error: ErrorFrame, now_ns: int) -> None:
        self.timing.on_error(error.receiver_id)
        self.flow_control.on_error(error.receiver_id, error.group_tag, now_ns)
        self._update_connected()

    # ------------------------------------------------------------------ conductor side

    def update_publisher_limit(self) -> int:
        """Publishers may run a term window ahead of what has been sent, while connected."""
        producer_position = self.log.producer_position()
        self.publisher_position.set(producer_position)
        self.readers_behind = False
        if self._connected:
            # Spies read this log directly: publishers must not lap them either.
            consumer_position = self.sender_position
            for spy in self.subscribers:
                consumer_position = min(consumer_position, spy.position.get())
            self.readers_behind = consumer_position < producer_position
            proposed = consumer_position + self.term_window_length
            if proposed > self.trip_limit:
                self.log.clean_to(consumer_position - self._term_length)
                self.publisher_limit.set(proposed)
                self.trip_limit = proposed + self.trip_gain
                return 1
        elif self.publisher_limit.get() > self.sender_position:
            self.publisher_limit.set(self.sender_position)
            self.trip_limit = 0
            return 1
        return 0

    def close_for_draining(self) -> None:
        self.log.end_of_stream_position = self.log.producer_position()
        self.state = PublicationState.DRAINING

    def is_drained(self) -> bool:
        end = self.log.producer_position()
        return self.sender_position >= end and all(spy.position.get() >= end for spy in self.subscribers)

    def join_position(self) -> int:
        """Spies start at the current end of the stream."""
        return self.log.producer_position()

    def on_spies_changed(self) -> None:
        self._update_connected()

    def check_for_blocked_publisher(self, now_ns: int, unblock_timeout_ns: int) -> bool:
        return False  # the sender never waits on an uncommitted frame: it only sends committed ones

    def close(self) -> None:
        self.endpoint.remove(self)
