"""The consensus module process: recovery, then the agent's duty cycle.

``ConsensusModule.launch`` claims the cluster directory (``cluster-mark.dat``),
connects to the node's driver (the client conductor in invoker mode: the
agent drives it in its slow tick) and archive, opens ``recording.log``, makes
a recovery plan from it, loads the consensus module's snapshot, and
publishes the recovery state counter the services read to load theirs.
``run`` drives the agent; SIGTERM asks for an orderly stop (a snapshot, then
the services stop at the same log position).
"""

from __future__ import annotations

import os
import signal
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from fulmar.aeron import Aeron
from fulmar.agent import DUTY_CYCLE_ERROR_MAX_BACKOFF_NS
from fulmar.archive.client import AeronArchive
from fulmar.clock import epoch_ms
from fulmar.codecs.generated import cluster as codecs
from fulmar.consensus import protocol
from fulmar.consensus.agent import ClusterTerminationError, ConsensusModuleAgent, ControlToggle
from fulmar.consensus.cluster_session import ClusterSession, ClusterSessionState
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.mark_file import ClusterMarkFile
from fulmar.consensus.log_rebuild import log_recordings, unknown_log_recording_message
from fulmar.consensus.recording_log import RecordingExtent, RecordingLog, RecoveryPlan
from fulmar.consensus.snapshot import CONSENSUS_MODULE_SNAPSHOT_TYPE_ID, decode_snapshot, read_snapshot
from fulmar.codecs.generated.cluster_mark import ClusterComponentType
from fulmar.idle import DoorbellIdleStrategy
from fulmar.permissions import make_directory
from fulmar.retry import RetryBackoff

# Aeron's RecoveryState counter key: what the services need to recover.
_RECOVERY_STATE_HEAD = struct.Struct("<qqqiii")  # term id, log position, timestamp, replay flag, cluster id, service count



def recovery_state_key(plan: RecoveryPlan, timestamp: int, cluster_id: int, service_count: int) -> bytes:
    snapshot_ids = {snapshot.service_id: snapshot.recording_id for snapshot in plan.snapshots}
    log_position = plan.snapshots[0].log_position if plan.snapshots else 0
    key = _RECOVERY_STATE_HEAD.pack(plan.last_leadership_term_id, log_position, timestamp, int(plan.has_replay),
                                    cluster_id, service_count)
    return key + b"".join(struct.pack("<q", snapshot_ids.get(service_id, -1)) for service_id in range(service_count))


def parse_recovery_state_key(key: bytes) -> tuple[int, int, int, bool, int, list[int]]:
    """(leadership term id, log position, timestamp, replay required, cluster id, snapshot recording id per service)."""
    term_id, log_position, timestamp, replay, cluster_id, count = _RECOVERY_STATE_HEAD.unpack_from(key, 0)
    ids = [struct.unpack_from("<q", key, _RECOVERY_STATE_HEAD.size + 8 * i)[0] for i in range(count)]
    return term_id, log_position, timestamp, bool(replay), cluster_id, ids


class ConsensusModule:
    def __init__(self, context: ConsensusModuleContext, aeron: Aeron, archive: AeronArchive,
                 mark_file: ClusterMarkFile, recording_log: RecordingLog, agent: ConsensusModuleAgent) -> None:
        self.context = context
        self.aeron = aeron
        self.archive = archive
        self.mark_file = mark_file
        self.recording_log = recording_log
        self.agent = agent
        self._stop = threading.Event()
        self._closed = False

    @classmethod
    def launch(cls, context: ConsensusModuleContext) -> "ConsensusModule":
        cluster_dir = Path(context.cluster_dir)
        make_directory(cluster_dir)
        aeron = Aeron.connect(context.driver_dir, use_conductor_thread=False)
        mark_file = archive = recording_log = None
        try:
            mark_file = ClusterMarkFile.create(
                cluster_dir, ClusterComponentType.CONSENSUS_MODULE, pid=os.getpid(), member_id=context.member_id,
                cluster_id=context.cluster_id, now_ms=epoch_ms(), aeron_directory=str(aeron.directory),
                control_channel=context.control_channel, ingress_channel=context.ingress_channel,
                service_stream_id=context.service_stream_id,
                consensus_module_stream_id=context.consensus_module_stream_id,
                ingress_stream_id=context.ingress_stream_id,
                liveness_timeout_ms=context.mark_file_liveness_timeout_ms,
            )
            archive = AeronArchive.connect(
                aeron, control_request_channel=context.archive_control_channel,
                control_request_stream_id=context.archive_control_stream_id,
                control_response_channel="aeron:ipc?term-length=64k",
                control_response_stream_id=context.archive_response_stream_id,
            )
            recording_log = RecordingLog.open(cluster_dir)
            error_log = mark_file.error_log(epoch_ms)
            agent = ConsensusModuleAgent(context, aeron, archive, recording_log, epoch_ms, error_log.record)
            agent.mark_file = mark_file
            stop_active_log_recording(archive, recording_log)
            refuse_unknown_log_recording(archive, recording_log, context.log_stream_id)
            plan = recording_log.create_recovery_plan(context.service_count, _extent_lookup(archive))
            recover(agent, plan)
            agent.recovery_state = aeron.add_counter(
                protocol.RECOVERY_STATE_TYPE_ID,
                f"Cluster recovery: leadershipTermId={plan.last_leadership_term_id} - clusterId={context.cluster_id}",
                recovery_state_key(plan, agent.cluster_time(), context.cluster_id, context.service_count),
            )
            mark_file.signal_ready()
        except BaseException:
            for resource in (recording_log, archive, mark_file):
                if resource is not None:
                    resource.close()
            aeron.close()
            raise
        return cls(context, aeron, archive, mark_file, recording_log, agent)

    def request_stop(self, action: ControlToggle = ControlToggle.SHUTDOWN) -> None:
        """Safe from a signal handler: an orderly stop, or at once if not yet running."""
        self._stop_action = action
        self._stop.set()

    def run(self) -> None:
        agent = self.agent
        idle = DoorbellIdleStrategy(self.aeron.conductor.data_doorbell, self.context.idle_max_wait_ns,
                                    has_work=agent.has_work)
        next_mark_ms = 0
        stop_requested_at = 0.0
        failures = RetryBackoff(max_ns=DUTY_CYCLE_ERROR_MAX_BACKOFF_NS)
        while not agent.terminated:
            if self._stop.is_set() and not stop_requested_at:
                stop_requested_at = time.monotonic()
                if agent.election is not None and not agent.is_multi_member:
                    return  # nothing running yet to stop in order
                agent.request_shutdown(getattr(self, "_stop_action", ControlToggle.SHUTDOWN))
            if stop_requested_at and time.monotonic() - stop_requested_at > 30:
                agent.record_error("consensus module: the orderly stop did not complete within 30 s")
                return
            now_ns = time.monotonic_ns()
            try:
                work = agent.do_work(now_ns)
            except ClusterTerminationError:
                raise
            except Exception as error:  # a bug: record it, keep serving
                agent._error(f"{type(error).__name__}: {error}")
                work = 0
                # (idle() returns at once while work waits: a cycle that fails on
                # that work every time backs off instead of spinning)
                pause_ns = failures.on_failure(now_ns)
            else:
                pause_ns = 0
                failures.on_success()
            now_ms = epoch_ms()
            if now_ms >= next_mark_ms:
                self.mark_file.update_activity_timestamp(now_ms)
                next_mark_ms = now_ms + 1000
            if self.aeron.is_closed:
                raise ClusterTerminationError("the media driver went away")
            if pause_ns:
                idle.pause(pause_ns)
                continue
            if not work:
                idle.max_wait_ns = agent.idle_wait_ns(self.context.idle_max_wait_ns)
            idle.idle(work)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.agent.close()
            self.archive.close()
        finally:
            self.recording_log.close()
            self.mark_file.close()
            self.aeron.close()


def _extent_lookup(archive: AeronArchive) -> Callable[[int], RecordingExtent | None]:
    def lookup(recording_id: int) -> RecordingExtent | None:
        descriptor = archive.list_recording(recording_id)
        if descriptor is None:
            return None
        stop = descriptor.stop_position
        if stop < 0:
            stop = archive.get_max_recorded_position(recording_id)
        return RecordingExtent(descriptor.start_position, stop, descriptor.initial_term_id,
                               descriptor.term_buffer_length, descriptor.mtu_length, descriptor.session_id)

    return lookup


def stop_active_log_recording(archive: AeronArchive, recording_log: RecordingLog, timeout_s: float = 10.0) -> None:
    """After a crash the archive may still be recording the dead module's log
    publication: stop it, so the log ends where the archive has it (anything
    later was never committed) and the new term can extend it."""
    recording_id = recording_log.find_last_term_recording_id()
    if recording_id == protocol.NULL_VALUE:
        return
    descriptor = archive.list_recording(recording_id)
    if descriptor is None or descriptor.stop_position != protocol.NULL_POSITION:
        return
    archive.stop_recording_by_identity(recording_id)
    deadline = time.monotonic() + timeout_s
    while archive.get_stop_position(recording_id) == protocol.NULL_POSITION:
        if time.monotonic() > deadline:
            raise ClusterTerminationError(f"the archive did not stop the old log recording {recording_id}")
        time.sleep(0.001)


def refuse_unknown_log_recording(archive: AeronArchive, recording_log: RecordingLog, log_stream_id: int) -> None:
    """A recording log without a TERM entry means a node that never ran, or a
    recording log that was lost or cut back (a torn tail dropped at open).  If
    the archive holds a recording of the log stream it is the latter: starting
    would begin a new, empty log and serve a state without the committed
    entries in that recording, so refuse and name the repair."""
    if recording_log.find_last_term() is not None:
        return
    for recording in log_recordings(archive.list_recordings(), log_stream_id):
        stop = recording.stop_position
        if stop == protocol.NULL_POSITION:
            stop = archive.get_max_recorded_position(recording.recording_id)
        if stop > recording.start_position:
            raise ClusterTerminationError(
                unknown_log_recording_message(recording_log.path, recording, stop, recording_log.repaired))


def recover(agent: ConsensusModuleAgent, plan: RecoveryPlan) -> None:
    """Load the consensus module's snapshot and note the log to replay."""
    if plan.snapshots:
        snapshot = plan.snapshots[0]
        load_snapshot(agent, snapshot.recording_id)
        agent.log_position = snapshot.log_position
        agent.commit_position = snapshot.log_position
        agent.append_position = snapshot.log_position
        agent.leadership_term_id = snapshot.leadership_term_id
        agent.term_base_log_position = snapshot.term_base_log_position
    if plan.log is not None:
        agent.log_recording_id = plan.log.recording_id
        if not plan.snapshots:
            agent.log_position = plan.log.start_position  # replay from where the recording starts
        agent.append_position = max(agent.append_position, plan.log.stop_position)
        agent.leadership_term_id = max(agent.leadership_term_id, plan.log.leadership_term_id)
    agent.commit_position_counter.set(agent.log_position)
    agent.leadership_term_counter.set(agent.leadership_term_id)


def load_snapshot(agent: ConsensusModuleAgent, recording_id: int) -> None:
    messages = read_snapshot(agent.aeron, agent.archive, recording_id, agent.context.replay_channel,
                             agent.context.replay_stream_id)
    for record in decode_snapshot(messages, CONSENSUS_MODULE_SNAPSHOT_TYPE_ID):
        if isinstance(record, codecs.ConsensusModuleDecoder):
            agent.next_session_id = record.next_session_id
            agent.next_service_session_id = record.next_service_session_id
            agent.log_service_session_id = record.log_service_session_id
        elif isinstance(record, codecs.ClusterSessionDecoder):
            session = ClusterSession(record.cluster_session_id, record.response_stream_id, record.response_channel,
                                     record.correlation_id)
            session.state = ClusterSessionState.OPEN
            session.opened_log_position = record.opened_log_position
            agent.sessions[session.id] = session
        elif isinstance(record, codecs.TimerDecoder):
            agent.timers.schedule(record.correlation_id, record.deadline)
    agent.sessions_counter.set(len(agent.sessions))
    agent.timers_counter.set(len(agent.timers))


def run_consensus_module(context: ConsensusModuleContext,
                         on_ready: Callable[[ConsensusModule], None] | None = None) -> str:
    """Launch, serve until terminated (SIGTERM: snapshot and orderly stop;
    SIGINT twice: abort), close.  Returns why it stopped."""
    running: list[ConsensusModule] = []
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        action = ControlToggle.SHUTDOWN if not stop_requested.is_set() else ControlToggle.ABORT
        stop_requested.set()
        for module in running:
            module.request_stop(action)

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        module = ConsensusModule.launch(context)
        try:
            running.append(module)
            if stop_requested.is_set():
                module.request_stop()
            if on_ready is not None:
                on_ready(module)
            module.run()
            return module.agent.termination_reason or "stopped"
        finally:
            running.clear()
            module.close()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
