"""A whole cluster in one process: the production consensus module of every
member over the simulated driver, network and archive, on simulated time.

What runs is production code: ``ConsensusModuleAgent`` (with its
``Election``, ``NodeElectionHost``, sessions, timers, log publisher and
adapters, consensus publisher and adapter), ``RecordingLog`` on real files
in a temporary directory, and the launch steps of
``fulmar.consensus.consensus_module`` (``stop_active_log_recording``,
``refuse_unknown_log_recording``, the recovery plan, ``recover``, the
recovery state counter).  The native consensus threads are off (context
fields ``native_*``), so the agent does their work itself.

What is simulated, and how (each fake's docstring says what it models):
``sim_aeron`` (driver and client), ``sim_network``, ``sim_archive``; here
``SimService`` (the clustered service container's protocol with its
module) and ``SimClient`` (a cluster client).  A process (module, service,
archive, client) runs when something wakes it (data for one of its images,
its own timeout), as the doorbell idle strategy does, each wake-up a seeded
moment later.
"""

from __future__ import annotations

import heapq
import os
import random
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fulmar.codecs.errors import CodecError
from fulmar.codecs.generated import cluster as codecs
from fulmar.codecs.generated.cluster_mark import ClusterComponentType
from fulmar.consensus import protocol
from fulmar.consensus.agent import ClusterRole, ClusterTerminationError, ConsensusModuleAgent
from fulmar.consensus.consensus_module import (
    parse_recovery_state_key,
    recover,
    recovery_state_key,
    refuse_unknown_log_recording,
    stop_active_log_recording,
)
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.mark_file import ClusterMarkFile
from fulmar.consensus.protocol import CLUSTER_ACTION_FLAGS_DEFAULT, PROTOCOL_SEMANTIC_VERSION, cluster_action_flags
from fulmar.consensus.recording_log import RecordingExtent, RecordingLog
from fulmar.consensus.snapshot import SERVICE_SNAPSHOT_TYPE_ID, SnapshotWriter, decode_snapshot, read_snapshot
from sim_aeron import SimAeron, SimDriver
from sim_archive import SimArchive, SimArchiveProcess, SimArchiveStore
from sim_network import MS, EventQueue, SimNetwork

SECOND = 1000 * MS
EPOCH_MS = 1_700_000_000_000  # the simulated wall clock's start
SESSION_HEADER_LENGTH = codecs.HEADER_LENGTH + codecs.SessionMessageHeaderEncoder.BLOCK_LENGTH
REQUEST = struct.Struct("<qq")  # (client id, request number): a client's message
_STATE_TAG = b"SIMSTATE"  # the service's own snapshot record (not an SBE message: raw bytes to decode_snapshot)


class SimulationFailure(AssertionError):
    pass


def member_host(member_id: int) -> str:
    return f"127.0.0.{10 + member_id}"


def client_host(client_id: int) -> str:
    return f"127.0.1.{10 + client_id}"


def members_string(count: int) -> str:
    return "|".join(
        f"{m},{member_host(m)}:9010,{member_host(m)}:9020,{member_host(m)}:9030,{member_host(m)}:9040,"
        f"{member_host(m)}:8010"
        for m in range(count)
    )


class SimMarkFile:
    """The module's mark file as the agent uses it: the candidate term id,
    which outlives the process (the election's vote must survive a restart)."""

    def __init__(self) -> None:
        self.candidate_term_id = protocol.NULL_VALUE


# ---------------------------------------------------------------------------- processes


class Process:
    """Something the scheduler runs: ``run(now_ns)`` returns when it wants to run again."""

    name = "process"

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.alive = True
        self.scheduled_ns = -1

    def wake(self, delay_ns: int | None = None) -> None:
        sim = self.sim
        if delay_ns is None:
            delay_ns = sim.wake_latency_ns()
        at = sim.events.now_ns + delay_ns
        if self.alive and (self.scheduled_ns < 0 or at < self.scheduled_ns):
            self.scheduled_ns = at
            sim.push(at, self)

    def run(self, now_ns: int) -> int:
        raise NotImplementedError


class ModuleProcess(Process):
    """A consensus module process: launch as ``ConsensusModule.launch`` does,
    then the duty cycle as ``ConsensusModule.run`` does (a
    ``ClusterTerminationError`` ends the process; any other exception from
    the agent is a finding: production records it and goes on)."""

    def __init__(self, sim: Simulation, node: SimNode) -> None:
        super().__init__(sim)
        self.node = node
        self.name = f"module{node.member_id}"
        self.aeron = SimAeron(node.driver, self.name)
        self.aeron.process = self  # type: ignore[attr-defined]
        self.aeron.on_do_work = node.archive.do_work
        self.archive = SimArchive(node.archive, sim.next_id(), self.aeron)
        context = node.context
        recording_log = RecordingLog.open(node.cluster_dir, fsync=False)
        self.recording_log = recording_log
        member = node.member_id
        agent = ConsensusModuleAgent(
            context,
            self.aeron,  # type: ignore[arg-type]  # the simulated client stands in for the real one
            self.archive,  # type: ignore[arg-type]  # the simulated client stands in for the real one
            recording_log,
            sim.epoch_ms,
            lambda text: sim.trace(f"m{member} error: {text}"),
        )
        agent.log_event = lambda text: sim.trace(f"m{member} {text}")  # type: ignore[method-assign]
        agent.mark_file = node.mark_file
        stop_active_log_recording(self.archive, recording_log)  # type: ignore[arg-type]
        refuse_unknown_log_recording(self.archive, recording_log, context.log_stream_id)  # type: ignore[arg-type]
        plan = recording_log.create_recovery_plan(context.service_count, self._extent)
        recover(agent, plan)
        agent.recovery_state = self.aeron.add_counter(  # type: ignore[assignment]
            protocol.RECOVERY_STATE_TYPE_ID,
            f"Cluster recovery: leadershipTermId={plan.last_leadership_term_id}",
            recovery_state_key(plan, agent.cluster_time(), context.cluster_id, context.service_count),
        )
        self.agent = agent

    def _extent(self, recording_id: int) -> RecordingExtent | None:
        descriptor = self.archive.list_recording(recording_id)
        if descriptor is None:
            return None
        stop = descriptor.stop_position
        if stop < 0:
            stop = self.archive.get_max_recorded_position(recording_id)
        return RecordingExtent(
            descriptor.start_position,
            stop,
            descriptor.initial_term_id,
            descriptor.term_buffer_length,
            descriptor.mtu_length,
            descriptor.session_id,
        )

    def run(self, now_ns: int) -> int:
        agent = self.agent
        try:
            work = agent.do_work(now_ns)
        except ClusterTerminationError as error:
            self.sim.trace(f"m{self.node.member_id} terminated: {error}")
            self.sim.on_module_terminated(self.node, str(error))
            return 0
        except Exception as error:
            # As ConsensusModule.run: a bug's exception is recorded and the
            # module keeps serving; the simulator reports it as a finding.
            text = f"m{self.node.member_id} duty cycle raised {type(error).__name__}: {error}"
            if not self.sim.finding(text):
                raise
            return 1 * MS
        if work:
            # (It may have asked its archive for something: the archive's
            # control stream is a doorbell of its own.)
            self.node.archive_process_wake()
        self.sim.check_member(self.node)
        if work and not agent.is_steady():
            return 100_000
        return max(100_000, agent.idle_wait_ns(agent.context.idle_max_wait_ns))

    def crash(self) -> None:
        self.alive = False
        self.aeron.close(crashed=True)
        self.archive.close()
        self.recording_log.close()


class ArchiveRunner(Process):
    def __init__(self, sim: Simulation, node: SimNode) -> None:
        super().__init__(sim)
        self.node = node
        self.name = f"archive{node.member_id}"

    def run(self, now_ns: int) -> int:
        work = self.node.archive.do_work()
        if work and self.node.module is not None:
            self.node.module.wake()
        return 200_000 if work else 20 * MS


class SimService(Process):
    """The clustered service container's side of the service protocol, as
    ``fulmar.service.agent`` does it: it acknowledges its start at the
    recovery state's log position; on JoinLog it subscribes to the named log
    (a replay, or the live log through a spy or the tagged follower
    subscription), acknowledges at the join position once it has the image,
    and applies the log up to commit-pos (and the JoinLog's max position);
    RequestServiceAck and ServiceTerminationPosition are acknowledged as the
    container does.  Its state is a running CRC of the client messages it
    applied (what a state machine would hold), recorded by log position so
    the invariants can compare members.  As leader it answers each client
    message on the session's egress (what a service replying does), so the
    client's acknowledgement means the message was committed and applied.

    On a SNAPSHOT action it writes its snapshot (sessions and state) with the
    production ``SnapshotWriter`` and acknowledges with its recording id; at
    start it loads the snapshot the recovery state names (``read_snapshot``,
    ``decode_snapshot``).

    Its mark file is a real one in the member's cluster directory, its
    activity timestamp on simulated time.

    Not modelled: timers and service messages (the sim service schedules none)."""

    def __init__(self, sim: Simulation, node: SimNode) -> None:
        super().__init__(sim)
        self.node = node
        self.name = f"service{node.member_id}"
        self.aeron = SimAeron(node.driver, self.name)
        self.aeron.process = self  # type: ignore[attr-defined]
        self.aeron.on_do_work = node.archive.do_work
        self.archive = SimArchive(node.archive, sim.next_id(), self.aeron)
        context = node.context
        self.to_module = self.aeron.add_exclusive_publication(
            context.control_channel, context.consensus_module_stream_id
        )
        self.from_module = self.aeron.add_subscription(context.control_channel, context.service_stream_id)
        self.started = False
        self.commit_counter_id = -1
        self.ack_id = 0
        self.log_position = 0
        self.leadership_term_id = protocol.NULL_VALUE
        self.role = ClusterRole.FOLLOWER
        self.active_log: Any = None
        self.log_subscription: Any = None
        self.log_image: Any = None
        self.max_log_position = -1
        self.termination_position = -1
        self.state = 0
        self.sessions: dict[int, tuple[str, int]] = {}
        self.egress: dict[int, Any] = {}
        self.buffer = bytearray(4096)
        # Its mark file, a real one (the module's service heartbeat check and
        # its dead-service check read it): its activity every second of
        # simulated time.
        self.mark_file = ClusterMarkFile.create(
            node.cluster_dir,
            ClusterComponentType.CONTAINER,
            service_id=0,
            pid=os.getpid(),
            member_id=node.member_id,
            now_ms=sim.epoch_ms(),
        )
        self.mark_file.signal_ready()
        self.next_mark_ms = sim.epoch_ms() + 1000

    def _start(self) -> bool:
        reader = self.aeron.counters_reader
        recovery = reader.ids_of_type(protocol.RECOVERY_STATE_TYPE_ID)
        commit = reader.ids_of_type(protocol.COMMIT_POSITION_TYPE_ID)
        if not recovery or not commit:
            return False
        self.commit_counter_id = commit[-1]
        self.aeron.conductor.counter_watch().watch(self.commit_counter_id)  # (woken when commit-pos moves)
        term_id, log_position, _ts, _replay, _cluster, snapshot_ids = parse_recovery_state_key(
            reader.counter_key(recovery[-1])
        )
        self.leadership_term_id = term_id
        self.log_position = log_position
        self.state = 0
        if snapshot_ids and snapshot_ids[0] != protocol.NULL_VALUE:
            self._load_snapshot(snapshot_ids[0])
        self.started = self._ack(log_position)
        return self.started

    def _load_snapshot(self, recording_id: int) -> None:
        """As the container: its sessions and the service's state from its snapshot."""
        context = self.node.context
        messages = read_snapshot(
            self.aeron,  # type: ignore[arg-type]  # the simulated client stands in for the real one
            self.archive,  # type: ignore[arg-type]  # the simulated client stands in for the real one
            recording_id,
            context.replay_channel,
            context.replay_stream_id,
        )
        for record in decode_snapshot(messages, SERVICE_SNAPSHOT_TYPE_ID):
            if isinstance(record, codecs.ClientSessionDecoder):
                self.sessions[record.cluster_session_id] = (str(record.response_channel), record.response_stream_id)
            elif isinstance(record, bytes) and record.startswith(_STATE_TAG):
                (self.state,) = struct.unpack_from("<Q", record, len(_STATE_TAG))
        self.sim.trace(f"m{self.node.member_id} service loaded snapshot {recording_id} at {self.log_position}")

    def _take_snapshot(self, log_position: int, leadership_term_id: int) -> int:
        """As the container's: markers, the sessions, the service's state, through
        the production ``SnapshotWriter`` recorded by the node's archive."""
        context = self.node.context
        writer = SnapshotWriter(
            self.aeron,  # type: ignore[arg-type]  # the simulated client stands in for the real one
            self.archive,  # type: ignore[arg-type]  # the simulated client stands in for the real one
            context.snapshot_channel,
            context.snapshot_stream_id,
        )
        writer.marker(SERVICE_SNAPSHOT_TYPE_ID, log_position, leadership_term_id, codecs.SnapshotMark.BEGIN)
        for session_id in sorted(self.sessions):
            channel, stream_id = self.sessions[session_id]
            writer.encode(
                codecs.ClientSessionEncoder,
                cluster_session_id=session_id,
                response_stream_id=stream_id,
                response_channel=channel,
                encoded_principal=b"",
            )
        writer.offer(_STATE_TAG + struct.pack("<Q", self.state))
        writer.marker(SERVICE_SNAPSHOT_TYPE_ID, log_position, leadership_term_id, codecs.SnapshotMark.END)
        return writer.close()

    def _ack(self, log_position: int, relevant_id: int = protocol.NULL_VALUE) -> bool:
        length = codecs.ServiceAckEncoder.encode(
            self.buffer,
            0,
            log_position=log_position,
            timestamp=self.sim.epoch_ms(),
            ack_id=self.ack_id,
            relevant_id=relevant_id,
            service_id=0,
        )
        if self.to_module.offer(bytes(self.buffer[:length])) > 0:
            self.sim.trace(f"m{self.node.member_id} service ack {self.ack_id} at {log_position} relevant {relevant_id}")
            self.ack_id += 1
            if self.node.module is not None:
                self.node.module.wake()
            return True
        return False

    def run(self, now_ns: int) -> int:
        now_ms = self.sim.epoch_ms()
        if now_ms >= self.next_mark_ms:
            self.mark_file.update_activity_timestamp(now_ms)
            self.next_mark_ms = now_ms + 1000
        self.aeron.do_work()
        if not self.started:
            return 1 * MS if not self._start() else 100_000
        work = self.from_module.poll(self._on_control, 16)
        if self.active_log is not None and self.log_image is None:
            work += self._join()
        work += self._poll_log()
        if self.termination_position >= 0 and self.log_position >= self.termination_position:
            if self._ack(self.termination_position):
                self.termination_position = -1
        return 100_000 if work else 100 * MS

    def _on_control(self, buffer: memoryview, offset: int, length: int, header: Any) -> None:
        message = codecs.decode(buffer, offset, length)
        if isinstance(message, codecs.JoinLogDecoder):
            self.max_log_position = message.log_position
            self.active_log = (
                message.log_position,
                message.max_log_position,
                message.log_session_id,
                message.log_stream_id,
                message.role,
                str(message.log_channel),
            )
            if self.log_image is None and self.log_subscription is not None:
                self.log_subscription.close()
                self.log_subscription = None
        elif isinstance(message, codecs.ServiceTerminationPositionDecoder):
            self.termination_position = message.log_position
        elif isinstance(message, codecs.RequestServiceAckDecoder):
            self._ack(message.log_position)

    def _join(self) -> int:
        from fulmar.channel_uri import ChannelUri

        log_position, max_log_position, session_id, stream_id, role, channel = self.active_log
        if self.log_subscription is None:
            uri = ChannelUri.parse(channel)
            if uri.get("session-id") is None:
                uri = uri.with_param("session-id", session_id)
            self.log_subscription = self.aeron.add_subscription(str(uri), stream_id)
        image = self.log_subscription.image_by_session_id(session_id)
        if image is None:
            return 0
        self.log_image = image
        self.max_log_position = max_log_position
        self.active_log = None
        self.role = ClusterRole(role) if role in (0, 1, 2) else ClusterRole.FOLLOWER
        if self.role is not ClusterRole.LEADER:
            for publication in self.egress.values():
                publication.close()
            self.egress.clear()
        self._ack(log_position)
        return 1

    def _poll_log(self) -> int:
        image = self.log_image
        if image is None:
            return 0
        limit = self.aeron.counters_reader.counter_value(self.commit_counter_id)
        if self.max_log_position != -1:
            limit = min(limit, self.max_log_position)
        work = image.bounded_poll(self._on_log, limit, 64)
        if image.position > self.log_position:
            self.log_position = image.position
        if (self.max_log_position != -1 and image.position >= self.max_log_position) or image.is_closed:
            if self.log_subscription is not None:
                self.log_subscription.close()
            self.log_subscription = None
            self.log_image = None
            if image.is_closed:
                for publication in self.egress.values():
                    publication.close()
                self.egress.clear()
                self.role = ClusterRole.FOLLOWER
        return work

    def _on_log(self, buffer: memoryview, offset: int, length: int, header: Any) -> None:
        position = header.position
        try:
            message_header = codecs.read_header(buffer, offset, length)
        except CodecError:
            return
        template = message_header.template_id
        if template == codecs.SessionMessageHeaderEncoder.TEMPLATE_ID:
            (session_id,) = struct.unpack_from("<q", buffer, offset + codecs.HEADER_LENGTH + 8)
            payload = bytes(buffer[offset + SESSION_HEADER_LENGTH : offset + length])
            self.state = zlib.crc32(payload, self.state)
            self.sim.on_applied(self.node.member_id, position, session_id, payload, self.state)
            if self.role is ClusterRole.LEADER:
                self._respond(session_id, payload)
            return
        message = codecs.decode(buffer, offset, length)
        if isinstance(message, codecs.SessionOpenEventDecoder):
            self.sessions[message.cluster_session_id] = (str(message.response_channel), message.response_stream_id)
        elif isinstance(message, codecs.SessionCloseEventDecoder):
            self.sessions.pop(message.cluster_session_id, None)
            publication = self.egress.pop(message.cluster_session_id, None)
            if publication is not None:
                publication.close()
        elif isinstance(message, codecs.NewLeadershipTermEventDecoder):
            self.leadership_term_id = message.leadership_term_id
        elif isinstance(message, codecs.ClusterActionRequestDecoder):
            if (
                message.action_raw == codecs.ClusterAction.SNAPSHOT
                and cluster_action_flags(message) == CLUSTER_ACTION_FLAGS_DEFAULT
            ):
                recording_id = self._take_snapshot(message.log_position, message.leadership_term_id)
                self._ack(message.log_position, recording_id)
                self.sim.trace(f"m{self.node.member_id} service snapshot {recording_id} at {message.log_position}")
        self.sim.on_applied(self.node.member_id, position, None, b"", self.state)

    def _respond(self, session_id: int, payload: bytes) -> None:
        publication = self.egress.get(session_id)
        if publication is None:
            session = self.sessions.get(session_id)
            if session is None:
                return
            publication = self.egress[session_id] = self.aeron.add_publication(session[0], session[1])
        header = bytearray(SESSION_HEADER_LENGTH)
        codecs.SessionMessageHeaderEncoder.encode(
            header, 0, leadership_term_id=self.leadership_term_id, cluster_session_id=session_id, timestamp=0
        )
        publication.offer(bytes(header) + payload)

    def crash(self) -> None:
        """(Its pid goes with it: the simulator, standing in for the kernel,
        leaves its mark file as a dead owner's reads, not live.)"""
        self.alive = False
        self.aeron.close(crashed=True)
        self.mark_file.close()


class SimClient(Process):
    """A cluster client as ``AeronCluster`` behaves on the wire: it sends
    SessionConnectRequest to every member's ingress until one answers OK
    (followers REDIRECT), then sends its messages (``REQUEST``: client id and
    a number, each sent once, never again) to the leader with the session
    header, keeps its session alive, follows NewLeaderEvent to a new leader,
    and starts a new session if its own is closed or goes silent.  A message
    is acknowledged when the service's reply to it comes back on the egress.

    Not modelled: authentication challenges, admin requests, back pressure."""

    def __init__(self, sim: Simulation, client_id: int, driver: SimDriver, rng: random.Random) -> None:
        super().__init__(sim)
        self.client_id = client_id
        self.name = f"client{client_id}"
        self.rng = rng
        self.aeron = SimAeron(driver, self.name)
        self.aeron.process = self  # type: ignore[attr-defined]
        self.egress_channel = f"aeron:udp?endpoint={client_host(client_id)}:7000"
        self.egress = self.aeron.add_subscription(self.egress_channel, protocol.EGRESS_STREAM_ID)
        self.ingress = {
            m: self.aeron.add_publication(f"aeron:udp?endpoint={member_host(m)}:9010", protocol.INGRESS_STREAM_ID)
            for m in range(sim.member_count)
        }
        self.buffer = bytearray(4096)
        self.session_id = -1
        self.leadership_term_id = -1
        self.leader = -1
        self.correlation_id = 0
        self.next_request = 0
        self.sent: dict[int, int] = {}  # request number -> when sent
        self.acknowledged: set[int] = set()
        self.next_send_ns = 0
        self.next_connect_ns = 0
        self.next_keepalive_ns = 0
        self.last_heard_ns = 0
        self.enabled = True

    def run(self, now_ns: int) -> int:
        self.aeron.do_work()
        self.egress.poll(self._on_egress, 64)
        if self.session_id < 0:
            if now_ns >= self.next_connect_ns:
                self.correlation_id = self.sim.next_id()
                length = codecs.SessionConnectRequestEncoder.encode(
                    self.buffer,
                    0,
                    correlation_id=self.correlation_id,
                    response_stream_id=protocol.EGRESS_STREAM_ID,
                    version=PROTOCOL_SEMANTIC_VERSION,
                    response_channel=self.egress_channel,
                )
                for publication in self.ingress.values():
                    publication.offer(bytes(self.buffer[:length]))
                self.next_connect_ns = now_ns + 500 * MS
            return 50 * MS
        if now_ns - self.last_heard_ns > 15 * SECOND:
            self.sim.trace(f"c{self.client_id} session {self.session_id} silent: new session")
            self.session_id = -1
            return 1 * MS
        publication = self.ingress[self.leader]
        if self.enabled and now_ns >= self.next_send_ns:
            request = self.next_request
            header = bytearray(SESSION_HEADER_LENGTH)
            codecs.SessionMessageHeaderEncoder.encode(
                header, 0, leadership_term_id=self.leadership_term_id, cluster_session_id=self.session_id, timestamp=0
            )
            if publication.offer(bytes(header) + REQUEST.pack(self.client_id, request)) > 0:
                self.next_request += 1
                self.sent[request] = now_ns
            self.next_send_ns = now_ns + self.rng.randint(10 * MS, 200 * MS)
        if now_ns >= self.next_keepalive_ns:
            length = codecs.SessionKeepAliveEncoder.encode(
                self.buffer, 0, leadership_term_id=self.leadership_term_id, cluster_session_id=self.session_id
            )
            publication.offer(bytes(self.buffer[:length]))
            self.next_keepalive_ns = now_ns + 1 * SECOND
        return max(1 * MS, min(self.next_send_ns, self.next_keepalive_ns) - now_ns)

    def _on_egress(self, buffer: memoryview, offset: int, length: int, header: Any) -> None:
        try:
            message = codecs.decode(buffer, offset, length)
        except CodecError:
            return
        now_ns = self.sim.events.now_ns
        if isinstance(message, codecs.SessionEventDecoder):
            if message.correlation_id == self.correlation_id and self.session_id < 0:
                if message.code_raw == codecs.EventCode.OK:
                    self.session_id = message.cluster_session_id
                    self.leadership_term_id = message.leadership_term_id
                    self.leader = message.leader_member_id
                    self.last_heard_ns = now_ns
                    self.sim.trace(f"c{self.client_id} session {self.session_id} open, leader {self.leader}")
            elif message.cluster_session_id == self.session_id and message.code_raw in (
                codecs.EventCode.CLOSED,
                codecs.EventCode.ERROR,
            ):
                self.sim.trace(f"c{self.client_id} session {self.session_id} closed: {message.detail}")
                self.session_id = -1
        elif isinstance(message, codecs.NewLeaderEventDecoder):
            if message.cluster_session_id == self.session_id:
                self.leadership_term_id = message.leadership_term_id
                self.leader = message.leader_member_id
                self.last_heard_ns = now_ns
        elif isinstance(message, codecs.SessionMessageHeaderDecoder):
            if message.cluster_session_id != self.session_id:
                return
            self.last_heard_ns = now_ns
            client_id, request = REQUEST.unpack_from(buffer, offset + SESSION_HEADER_LENGTH)
            if client_id == self.client_id and request in self.sent:
                self.acknowledged.add(request)


# ---------------------------------------------------------------------------- nodes


class SimNode:
    """One member's machine: driver, archive (its store survives crashes),
    cluster directory, the module's mark file, and its processes."""

    def __init__(self, sim: Simulation, member_id: int, root: Path) -> None:
        self.sim = sim
        self.member_id = member_id
        self.cluster_dir = root / f"member{member_id}"
        self.cluster_dir.mkdir(parents=True, exist_ok=True)
        self.driver = SimDriver(sim, member_id)
        self.driver.host = member_host(member_id)
        self.store = SimArchiveStore(archive_id=1000 + member_id)
        self.mark_file = SimMarkFile()
        self.context = sim.make_context(member_id, self.cluster_dir)
        self.archive = self._new_archive()
        self.archive_runner = ArchiveRunner(sim, self)
        self.module: ModuleProcess | None = None
        self.service: SimService | None = None
        self.restart_at_ns = -1
        self.last_log_recording_id: int | None = None

    def _new_archive(self) -> SimArchiveProcess:
        aeron = SimAeron(self.driver, f"archive{self.member_id}")
        process = SimArchiveProcess(self.sim, self.member_id, self.store, aeron)
        return process

    def archive_process_wake(self) -> None:
        self.archive_runner.wake()

    def start(self) -> None:
        if not self.archive.alive:
            self.archive = self._new_archive()
            self.archive_runner = ArchiveRunner(self.sim, self)
        self.archive.aeron.process = self.archive_runner  # type: ignore[attr-defined]
        self.archive_runner.wake()
        try:
            self.module = ModuleProcess(self.sim, self)
        except ClusterTerminationError as error:
            self.sim.trace(f"m{self.member_id} refused to start: {error}")
            self.module = None
            return
        self.service = SimService(self.sim, self)
        self.sim.on_started(self)
        self.module.wake()
        self.service.wake()
        self.sim.trace(f"m{self.member_id} started")

    def crash(self, with_archive: bool) -> None:
        if self.module is not None:
            self.module.crash()
        if self.service is not None:
            self.service.crash()
        self.module = None
        self.service = None
        if with_archive and self.archive.alive:
            self.archive.crash()
            self.archive_runner.alive = False
        self.sim.trace(f"m{self.member_id} crashed{' with its archive' if with_archive else ''}")

    @property
    def up(self) -> bool:
        return self.module is not None


# ---------------------------------------------------------------------------- the simulation


class Simulation:
    def __init__(
        self,
        seed: int,
        member_count: int = 3,
        client_count: int = 2,
        root: Path | None = None,
        trace_limit: int = 20000,
    ) -> None:
        self.seed = seed
        self.member_count = member_count
        self.rng = random.Random(seed)
        self.events = EventQueue()
        self.network = SimNetwork(self.events, random.Random(self.rng.getrandbits(64)))
        self.consensus_stream_id = protocol.CONSENSUS_STREAM_ID
        self._ids = 1
        self._session_ids = 1000
        self._heap: list[tuple[int, int, Process]] = []
        self._seq = 0
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix=f"fulmar-sim-{seed}-")) if root is None else root
        self.trace_lines: list[str] = []
        self.trace_limit = trace_limit
        self.findings: list[str] = []
        self.election_rngs = random.Random(self.rng.getrandbits(64))
        self.observers: list[Callable[[Simulation, SimNode], None]] = []
        self.invariants: Any = None
        self.tolerated: list[str] = []  # findings (text patterns) a run goes on after
        self.applied: list[list[tuple[int, int | None, bytes, int]]] = [[] for _ in range(member_count)]
        self.nodes = [SimNode(self, m, self.root) for m in range(member_count)]
        self.client_drivers = []
        self.clients: list[SimClient] = []
        for k in range(client_count):
            driver = SimDriver(self, member_count + k)
            driver.host = client_host(k)
            self.client_drivers.append(driver)
            self.clients.append(SimClient(self, k, driver, random.Random(self.rng.getrandbits(64))))
        self._archives = {f"{member_host(m)}:8010": m for m in range(member_count)}
        self.terminated: list[tuple[int, int, str]] = []
        self.ticks = 0

    # -- ids and clocks

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def next_session_id(self) -> int:
        self._session_ids += 1
        return self._session_ids

    def epoch_ms(self) -> int:
        return EPOCH_MS + self.events.now_ns // MS

    def wake_latency_ns(self) -> int:
        return self.rng.randint(10_000, 200_000)

    def archive_at(self, endpoint: str) -> SimArchiveProcess | None:
        member = self._archives.get(endpoint)
        if member is None:
            return None
        archive = self.nodes[member].archive
        return archive if archive.alive else None

    def make_context(self, member_id: int, cluster_dir: Path) -> ConsensusModuleContext:
        return ConsensusModuleContext(
            cluster_dir=cluster_dir,
            member_id=member_id,
            cluster_members=members_string(self.member_count),
            ingress_channel=f"aeron:udp?endpoint={member_host(member_id)}:9010",
            log_channel="aeron:udp?term-length=16m",
            # The native threads are off: the agent does their work (issue 49:
            # context switches per thread may replace these fields' meaning).
            native_commit=False,
            native_follower_commit=False,
            native_append_position=False,
            native_ingress=False,
            election_timeout_ns=1 * SECOND,
            election_status_interval_ns=100 * MS,
            startup_canvass_timeout_ns=2 * SECOND,
            leader_heartbeat_timeout_ns=2 * SECOND,
            leader_heartbeat_interval_ns=200 * MS,
            session_timeout_ns=10 * SECOND,
            election_random=lambda: random.Random(self.election_rngs.getrandbits(64)),
        )

    # -- tracing

    def trace(self, text: str) -> None:
        lines = self.trace_lines
        lines.append(f"{self.events.now_ns / 1e9:10.6f} {text}")
        if len(lines) > self.trace_limit:
            del lines[: len(lines) - self.trace_limit]

    def finding(self, text: str) -> bool:
        """A production class misbehaved: True if it is a known finding the run goes on with."""
        import traceback

        if text not in self.findings:
            self.trace(f"FINDING {text}\n{traceback.format_exc()}")
        self.findings.append(text)
        return any(pattern in text for pattern in self.tolerated)

    # -- scheduling

    def start_network_ticks(self, interval_ns: int = 25 * MS) -> None:
        """The network's periodic work (stalled flows retried, lost connections
        timed out, SETUPs sent again), every ``interval_ns``."""

        def tick() -> None:
            self.network.tick()
            self.events.at(self.events.now_ns + interval_ns, tick)

        self.events.at(interval_ns, tick)

    def push(self, at: int, process: Process) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, process))

    def on_wake(self, client: SimAeron) -> None:
        process = getattr(client, "process", None)
        if process is not None:
            process.wake()

    def run_until(self, end_ns: int, step: Callable[[], None] | None = None) -> None:
        heap = self._heap
        events = self.events
        while True:
            next_event = events.next_time()
            next_process = heap[0][0] if heap else None
            candidates = [t for t in (next_event, next_process) if t is not None]
            if not candidates:
                events.now_ns = end_ns
                return
            at = min(candidates)
            if at > end_ns:
                events.now_ns = end_ns
                return
            events.now_ns = at
            if next_event is not None and next_event <= at:
                events.run_due(at)
                continue
            _, _, process = heapq.heappop(heap)
            if not process.alive or process.scheduled_ns != at:
                continue
            process.scheduled_ns = -1
            again = process.run(at)
            if process.alive and again > 0:
                process.wake(again)

    # -- observations

    def on_applied(self, member_id: int, position: int, session_id: int | None, payload: bytes, state: int) -> None:
        self.applied[member_id].append((position, session_id, payload, state))
        if self.invariants is not None:
            self.invariants.on_applied(member_id, position, state)

    def on_started(self, node: SimNode) -> None:
        self.applied[node.member_id].clear()  # (its service applies the log again from the start)
        if self.invariants is not None:
            self.invariants.last_commit[node.member_id] = 0

    def check_member(self, node: SimNode) -> None:
        for observer in self.observers:
            observer(self, node)

    def on_module_terminated(self, node: SimNode, reason: str) -> None:
        self.terminated.append((self.events.now_ns, node.member_id, reason))
        node.crash(with_archive=False)
        node.restart_at_ns = self.events.now_ns + 1 * SECOND

    def close(self) -> None:
        for node in self.nodes:
            if node.module is not None:
                node.module.recording_log.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
