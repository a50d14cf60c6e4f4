"""The consensus module process: recovery, then the agent's duty cycle.

``ConsensusModule.launch`` claims the cluster directory (``cluster-mark.dat``),
connects to the node's driver (the client conductor in invoker mode: the
agent drives it in its slow tick) and archive, opens ``recording.log``, makes
a recovery plan from it, loads the consensus module's snapshot, and
publishes the recovery state counter the services read to load theirs.
``run`` drives the agent; a stop signal asks for an orderly stop (a
snapshot, then the services stop at the same log position), by the rule of
``fulmar.stop_signals``: any number of SIGTERMs, or a SIGINT with them, is one
SHUTDOWN; only a second Ctrl-C (a SIGINT half a second or more after an earlier
one) is ABORT.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

from fulmar.aeron import Aeron
from fulmar.agent import DUTY_CYCLE_ERROR_MAX_BACKOFF_NS
from fulmar.archive.client import AeronArchive
from fulmar.clock import epoch_ms
from fulmar.codecs.generated import cluster as codecs
from fulmar.codecs.generated.cluster_mark import ClusterComponentType
from fulmar.consensus import protocol
from fulmar.consensus.agent import ConsensusModuleAgent, log_line
from fulmar.consensus.cluster_session import ClusterSession, ClusterSessionState
from fulmar.consensus.context import ConsensusModuleContext
from fulmar.consensus.errors import ClusterTerminationError
from fulmar.consensus.log_rebuild import log_recordings, unknown_log_recording_message
from fulmar.consensus.mark_file import ClusterMarkFile
from fulmar.consensus.recording_log import RecordingExtent, RecordingLog, RecoveryPlan
from fulmar.consensus.snapshot import CONSENSUS_MODULE_SNAPSHOT_TYPE_ID, decode_snapshot, read_snapshot
from fulmar.consensus.snapshot_join import join_from_snapshot_if_purged
from fulmar.consensus.states import ControlToggle
from fulmar.idle import DoorbellIdleStrategy
from fulmar.orderly_stop import StopOutcome
from fulmar.permissions import make_directory
from fulmar.retry import RetryBackoff
from fulmar.stop_signals import StopKind, StopSignalHandlers, StopSignals

# How long an orderly stop may take, from the request to the module's end
# (an election to complete first, the snapshot, the services' acknowledgements).
STOP_TIMEOUT_NS = 30_000_000_000

# Aeron's RecoveryState counter key: what the services need to recover.
_RECOVERY_STATE_HEAD = struct.Struct(
    "<qqqiii"
)  # term id, log position, timestamp, replay flag, cluster id, service count


def recovery_state_key(plan: RecoveryPlan, timestamp: int, cluster_id: int, service_count: int) -> bytes:
    snapshot_ids = {snapshot.service_id: snapshot.recording_id for snapshot in plan.snapshots}
    log_position = plan.snapshots[0].log_position if plan.snapshots else 0
    key = _RECOVERY_STATE_HEAD.pack(
        plan.last_leadership_term_id, log_position, timestamp, int(plan.has_replay), cluster_id, service_count
    )
    return key + b"".join(struct.pack("<q", snapshot_ids.get(service_id, -1)) for service_id in range(service_count))


def parse_recovery_state_key(key: bytes) -> tuple[int, int, int, bool, int, list[int]]:
    """(leadership term id, log position, timestamp, replay required, cluster id, snapshot recording id per service)."""
    term_id, log_position, timestamp, replay, cluster_id, count = _RECOVERY_STATE_HEAD.unpack_from(key, 0)
    ids = [struct.unpack_from("<q", key, _RECOVERY_STATE_HEAD.size + 8 * i)[0] for i in range(count)]
    return term_id, log_position, timestamp, bool(replay), cluster_id, ids


class ConsensusModule:
    def __init__(
        self,
        context: ConsensusModuleContext,
        aeron: Aeron,
        archive: AeronArchive,
        mark_file: ClusterMarkFile,
        recording_log: RecordingLog,
        agent: ConsensusModuleAgent,
    ) -> None:
        self.context = context
        self.aeron = aeron
        self.archive = archive
        self.mark_file = mark_file
        self.recording_log = recording_log
        self.agent = agent
        self._requested: ControlToggle | None = None  # the stop a signal asked for, not yet taken
        self._taken: ControlToggle | None = None  # the stop the agent took
        self._notes: list[str] = []  # what the signals asked for, said from the duty cycle
        self._closed = False

    @classmethod
    def launch(cls, context: ConsensusModuleContext) -> ConsensusModule:
        cluster_dir = Path(context.cluster_dir)
        make_directory(cluster_dir)
        aeron = Aeron.connect(context.driver_dir, use_conductor_thread=False)
        mark_file = archive = recording_log = None
        try:
            mark_file = ClusterMarkFile.create(
                cluster_dir,
                ClusterComponentType.CONSENSUS_MODULE,
                pid=os.getpid(),
                member_id=context.member_id,
                cluster_id=context.cluster_id,
                now_ms=epoch_ms(),
                aeron_directory=str(aeron.directory),
                control_channel=context.control_channel,
                ingress_channel=context.ingress_channel,
                service_stream_id=context.service_stream_id,
                consensus_module_stream_id=context.consensus_module_stream_id,
                ingress_stream_id=context.ingress_stream_id,
                liveness_timeout_ms=context.mark_file_liveness_timeout_ms,
            )
            archive = AeronArchive.connect(
                aeron,
                control_request_channel=context.archive_control_channel,
                control_request_stream_id=context.archive_control_stream_id,
                control_response_channel="aeron:ipc?term-length=64k",
                control_response_stream_id=context.archive_response_stream_id,
                credentials=context.archive_client_credentials(),
            )
            recording_log = RecordingLog.open(cluster_dir)
            error_log = mark_file.error_log(epoch_ms)
            # Before the agent opens this member's consensus endpoint, which the copy uses meanwhile.
            join_from_snapshot_if_purged(
                context, aeron, archive, recording_log, lambda text: log_line(context.member_id, text), error_log.record
            )
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

    def request_stop(self, action: ControlToggle = ControlToggle.SHUTDOWN, note: str = "") -> None:
        """Ask for SHUTDOWN or ABORT (never weakened: an ABORT stays one).
        Safe from a signal handler: it only sets fields, ``run`` acts on them."""
        if self._requested is not ControlToggle.ABORT and self._taken is not ControlToggle.ABORT:
            self._requested = action
        if note:
            self._notes.append(note)

    def note(self, text: str) -> None:
        """A line for the module's log, written from the duty cycle (safe from a signal handler)."""
        self._notes.append(text)

    def run(self) -> None:
        agent = self.agent
        ring_deferred = self.aeron.ring_deferred
        # Its sleeps are intended idles, not stalls of the duty cycle.
        idle = DoorbellIdleStrategy(
            self.aeron.conductor.data_doorbell,
            self.context.idle_max_wait_ns,
            has_work=agent.has_work,
            on_wait=agent.duty_cycle_tracker.on_idle_wait,
        )
        next_mark_ms = 0
        stop_deadline_ns = 0
        waiting_said_for: ControlToggle | None = None
        failures = RetryBackoff(max_ns=DUTY_CYCLE_ERROR_MAX_BACKOFF_NS)
        while not agent.terminated:
            while self._notes:
                agent.log_event(self._notes.pop(0))
            requested = self._requested
            if requested is not None:
                agent.take_leader_ingress()  # (the stop may append to the log)
                if not stop_deadline_ns:
                    stop_deadline_ns = time.monotonic_ns() + STOP_TIMEOUT_NS
                if agent.request_shutdown(requested):
                    self._taken, self._requested = requested, None
                    if agent.terminated:
                        break
                elif waiting_said_for is not requested:
                    waiting_said_for = requested
                    phase = (
                        f"election {agent.election.state.name}"
                        if agent.election is not None
                        else f"state {agent.state.name}"
                    )
                    agent.log_event(
                        f"{requested.name} requested in {phase}: acted on once the module can "
                        f"(within {STOP_TIMEOUT_NS // 1_000_000_000} s)"
                    )
            if stop_deadline_ns and time.monotonic_ns() > stop_deadline_ns:
                agent.record_error(
                    f"consensus module: the orderly stop did not complete within {STOP_TIMEOUT_NS // 1_000_000_000} s"
                )
                agent.termination_reason = f"stopped without completing the orderly stop (state {agent.state.name})"
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
            ring_deferred()  # the log's readers, once for all this cycle appended
            now_ms = epoch_ms()
            if now_ms >= next_mark_ms:
                self.mark_file.update_activity_timestamp(now_ms)
                next_mark_ms = now_ms + 1000
            if self.aeron.is_closed:
                raise ClusterTerminationError("the media driver went away")
            if pause_ns:
                idle.pause(pause_ns)
                continue
            if work and agent.is_steady():
                # A steady module sleeps right after a cycle that worked, unless
                # has_work finds something waiting: a further cycle only to find
                # nothing costs each wake-up about 5 us of CPU (three wake-ups of
                # each module per three-member round trip, on two shared cores).
                work = 0
            if not work:
                idle.max_wait_ns = agent.idle_wait_ns(self.context.idle_max_wait_ns)
                # The clients' messages are the native thread's while this
                # agent sleeps (its deferred rings were rung just above); the
                # next cycle takes the ingress back first.
                agent.arm_leader_ingress()
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
        return RecordingExtent(
            descriptor.start_position,
            stop,
            descriptor.initial_term_id,
            descriptor.term_buffer_length,
            descriptor.mtu_length,
            descriptor.session_id,
        )

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
                unknown_log_recording_message(recording_log.path, recording, stop, recording_log.repaired)
            )


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
    messages = read_snapshot(
        agent.aeron, agent.archive, recording_id, agent.context.replay_channel, agent.context.replay_stream_id
    )
    for record in decode_snapshot(messages, CONSENSUS_MODULE_SNAPSHOT_TYPE_ID):
        if isinstance(record, codecs.ConsensusModuleDecoder):
            agent.next_session_id = record.next_session_id
            agent.next_service_session_id = record.next_service_session_id
            agent.log_service_session_id = record.log_service_session_id
        elif isinstance(record, codecs.ClusterSessionDecoder):
            session = ClusterSession(
                record.cluster_session_id, record.response_stream_id, record.response_channel, record.correlation_id
            )
            session.state = ClusterSessionState.OPEN
            session.opened_log_position = record.opened_log_position
            agent.sessions[session.id] = session
        elif isinstance(record, codecs.TimerDecoder):
            agent.timers.schedule(record.correlation_id, record.deadline)
        elif isinstance(record, codecs.ClusterActionRequestDecoder):
            # Taken while suspended (see take_consensus_module_snapshot): the
            # module comes back suspended, as a replay of the log would leave it.
            if record.action_raw in (codecs.ClusterAction.SUSPEND, codecs.ClusterAction.RESUME):
                agent.on_replay_suspend_or_resume(record.action_raw == codecs.ClusterAction.SUSPEND)
    agent.sessions_counter.set(len(agent.sessions))
    agent.timers_counter.set(len(agent.timers))


def run_consensus_module(
    context: ConsensusModuleContext,
    on_ready: Callable[[ConsensusModule], None] | None = None,
    signals: StopSignals | None = None,
) -> StopOutcome:
    """Launch, serve until terminated, close.  Returns why it stopped, and
    whether that was an orderly stop (once everything is closed).

    SIGTERM or SIGINT: SHUTDOWN, a snapshot and an orderly stop; repeated, or
    both together (a terminal's Ctrl-C, a service manager's SIGTERM to every
    process, a supervisor's own SIGTERM) they are that same request.  A second
    Ctrl-C, half a second or more after the first: ABORT (no snapshot; a
    snapshot under way completes first).  See ``fulmar.stop_signals``."""
    running: list[ConsensusModule] = []
    rule = signals or StopSignals()
    actions = {StopKind.ORDERLY: ControlToggle.SHUTDOWN, StopKind.IMMEDIATE: ControlToggle.ABORT}

    def on_stop(kind: StopKind | None, signum: int) -> None:
        note = rule.describe(kind, signum) + (f" ({actions[kind].name})" if kind is not None else "")
        for module in running:
            if kind is None:
                module.note(note)
            else:
                module.request_stop(actions[kind], note)

    with StopSignalHandlers(rule, on_stop, time.monotonic_ns):
        module = ConsensusModule.launch(context)
        try:
            running.append(module)
            if rule.requested is not None:  # a signal during the launch
                action = actions[rule.requested]
                module.request_stop(action, f"stop requested during the launch ({action.name})")
            if on_ready is not None:
                on_ready(module)
            module.run()
        finally:
            running.clear()
            module.close()
        return StopOutcome(module.agent.termination_reason or "stopped", module.agent.orderly_stop)
