"""A node's metrics for Prometheus, read from its files on each scrape.

Every process of a node is a client of the node's media driver, so the
driver's counters file (cnc.dat) holds the counters of all of them: the
driver's own, the archive's, the consensus module's and the services'.
``NodeCollector`` turns each allocated counter into a sample of a metric
named after what it counts (Prometheus' conventions: a ``fulmar_`` prefix,
the unit in the name, ``_total`` for what only goes up, gauges for positions
and for states, whose codes their help names), with the ids its key and label
hold as labels.  A counter of a type it does not know still appears, as
``fulmar_counter{type_id, counter_id, label}``.

Beside the counters it reports what operators alert on and the counters do
not say by themselves: whether each process of the node is alive (judged as
``cluster-tool describe`` judges it, from cnc.dat and the mark files), the
distinct errors in each process's error log, this member's recorded log
position and how much of it is uncommitted, each follower's lag behind the
leader (on the leader), and how long the commit position has not moved.

A scrape reads every counter of cnc.dat in one native pass; the mark files,
error logs and recording log, which cost more to read and change on a scale
of seconds, at most once a second.  Nothing is written anywhere, and the node
never notices (``bench.metrics`` measures it).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from fulmar.archive.protocol import RECORDING_POSITION_TYPE_ID, recording_position_ids
from fulmar.cli import archive_tool
from fulmar.cli.cluster_commands import (
    ClusterReadError,
    cluster_mark_document,
    read_cluster_mark,
    service_mark_paths,
)
from fulmar.cli.cnc_reader import read_driver_status
from fulmar.client_liveness import declared_process
from fulmar.clock import epoch_ms
from fulmar.cnc import CncError, CncFile
from fulmar.consensus import protocol as cluster_protocol
from fulmar.consensus.backup import (
    CLUSTER_BACKUP_ERROR_COUNT_TYPE_ID,
    CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID,
    CLUSTER_BACKUP_QUERY_DEADLINE_TYPE_ID,
    CLUSTER_BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID,
    ClusterBackupState,
)
from fulmar.consensus.consensus_module import parse_recovery_state_key
from fulmar.consensus.mark_file import FILENAME as CLUSTER_MARK_FILE_NAME
from fulmar.consensus.recording_log import RECORDING_LOG_FILE_NAME, RecordingLogError, decode_entries
from fulmar.consensus.states import ClusterRole, ConsensusModuleState, ControlToggle, ElectionState
from fulmar.counters import (
    RECORD_ALLOCATED,
    CountersReader,
)
from fulmar.driver.counters import (
    CLIENT_HEARTBEAT_TYPE_ID,
    LOCAL_SOCKADDR_TYPE_ID,
    PUBLISHER_LIMIT_TYPE_ID,
    PUBLISHER_MESSAGES_TYPE_ID,
    PUBLISHER_POSITION_TYPE_ID,
    RECEIVE_CHANNEL_STATUS_TYPE_ID,
    RECEIVER_HWM_TYPE_ID,
    RECEIVER_POSITION_TYPE_ID,
    SEND_CHANNEL_STATUS_TYPE_ID,
    SENDER_BPE_TYPE_ID,
    SENDER_POSITION_TYPE_ID,
    SUBSCRIBER_POSITION_TYPE_ID,
    SYSTEM_COUNTER_TYPE_ID,
    SystemCounter,
)
from fulmar.error_log import CorruptErrorLogError, read_error_log

NULL_POSITION = -1
DRIVER = "media driver"
ARCHIVE = "archive"
CONSENSUS_MODULE = "consensus module"

_INT32 = struct.Struct("<i")
_TWO_INT32 = struct.Struct("<ii")
_STREAM_KEY = struct.Struct("<qii")  # registration id, session id, stream id (driver/counters.registration_key)
_NS = 1e-9
_MS = 1e-3
_PPM = 1e-6


# ---------------------------------------------------------------------------- which node


@dataclass(frozen=True)
class MetricsNode:
    """Where one node's files are.  ``driver_dir`` None: the directory its
    consensus module's mark file names; ``archive_dir`` None: no archive is
    known (it is then reported as not running)."""

    name: str
    cluster_dir: Path
    archive_dir: Path | None
    driver_dir: Path | None = None


@dataclass(frozen=True)
class ProcessState:
    """One process of a node as the tools judge it: ``running`` and, when
    not, why (the ``state`` text ``cluster-tool describe`` prints)."""

    name: str  # "media driver", "archive", "consensus module", "service 0"
    running: bool
    state: str
    pid: int | None


@dataclass
class NodeFiles:
    """What one read of a node's mark files and cnc.dat found."""

    processes: list[ProcessState] = field(default_factory=list)
    errors: dict[str, tuple[int, int]] = field(default_factory=dict)  # process -> (distinct, observations)
    member_id: int | None = None
    driver_dir: Path | None = None


class DriverFile:
    """The node's cnc.dat, mapped once and mapped again when the driver
    changes (a restarted driver creates a new file, another inode)."""

    def __init__(self) -> None:
        self.cnc: CncFile | None = None
        self._identity: tuple[str, int] | None = None

    def open(self, directory: Path) -> CncFile:
        """The mapped cnc.dat of ``directory``; ``CncError`` if there is none."""
        try:
            inode = os.stat(directory / "cnc.dat").st_ino
        except OSError:
            self.close()
            raise CncError(f"no cnc.dat in {directory}") from None
        identity = (str(directory), inode)
        if self.cnc is None or identity != self._identity:
            self.close()
            self.cnc = CncFile.open(directory)
            self._identity = identity
        return self.cnc

    def close(self) -> None:
        if self.cnc is not None:
            self.cnc.close()
        self.cnc, self._identity = None, None


def read_node_files(node: MetricsNode, driver: DriverFile, now_ms: int) -> NodeFiles:
    """Each process of the node, alive or not (the tools' own judgement: the
    driver's heartbeat, the archive's and the cluster mark files' activity and
    pid), the distinct errors each recorded, and the node's identity."""
    found = NodeFiles()
    module_path = node.cluster_dir / CLUSTER_MARK_FILE_NAME
    module_doc: dict[str, Any] | None = None
    module_state = "no mark file"
    try:
        contents = read_cluster_mark(module_path)
        module_doc = cluster_mark_document(contents, now_ms)
        found.errors[CONSENSUS_MODULE] = _error_counts(error.observation_count for error in contents.errors)
        found.member_id = contents.header.member_id
        aeron_directory = contents.header.aeron_directory
        found.driver_dir = node.driver_dir or (Path(aeron_directory) if aeron_directory else None)
    except ClusterReadError as error:
        module_state = str(error)
        found.driver_dir = node.driver_dir

    if found.driver_dir is None:
        found.processes.append(
            ProcessState(DRIVER, False, "its directory is unknown (no consensus module mark file)", None)
        )
    else:
        try:
            cnc = driver.open(found.driver_dir)
            status = read_driver_status(cnc, now_ms)
            state = (
                "running"
                if status["alive"]
                else (
                    f"not running (pid {status['pid']} is gone)"
                    if not status["pid_exists"]
                    else f"not running (no heartbeat for {status['heartbeat_age_ms']} ms)"
                )
            )
            found.processes.append(ProcessState(DRIVER, bool(status["alive"]), state, int(status["pid"])))
            found.errors[DRIVER] = _error_counts(error.observation_count for error in read_error_log(cnc.error_log))
        except (CncError, CorruptErrorLogError, OSError) as error:  # OSError: cnc.dat unreadable (permissions)
            found.processes.append(ProcessState(DRIVER, False, f"not running ({error})", None))

    found.processes.append(_archive_state(node.archive_dir, now_ms, found.errors))
    if module_doc is None:
        found.processes.append(ProcessState(CONSENSUS_MODULE, False, module_state, None))
    else:
        found.processes.append(
            ProcessState(CONSENSUS_MODULE, module_doc["running"], module_doc["state"], module_doc["pid"])
        )
    try:
        services = service_mark_paths(node.cluster_dir)
    except ClusterReadError:
        services = []
    for service_id, path in services:
        name = f"service {service_id}"
        try:
            contents = read_cluster_mark(path)
        except ClusterReadError as error:
            found.processes.append(ProcessState(name, False, str(error), None))
            continue
        document = cluster_mark_document(contents, now_ms)
        found.processes.append(
            ProcessState(name, bool(document["running"]), str(document["state"]), contents.header.pid)
        )
        found.errors[name] = _error_counts(error.observation_count for error in contents.errors)
    return found


def _archive_state(archive_dir: Path | None, now_ms: int, errors: dict[str, tuple[int, int]]) -> ProcessState:
    if archive_dir is None:
        return ProcessState(ARCHIVE, False, "its directory is unknown", None)
    try:
        decoder, length = archive_tool.mark_file_decoder(archive_dir)
    except archive_tool.ArchiveReadError as error:
        return ProcessState(ARCHIVE, False, f"not running ({error})", None)
    status = archive_tool.mark_status(decoder, length, now_ms)
    try:
        errors[ARCHIVE] = _error_counts(
            error["observation_count"] for error in archive_tool.read_archive_errors(archive_dir, decoder)
        )
    except archive_tool.ArchiveReadError:
        pass  # a corrupt error log: `cluster-tool archive errors` says why; the process is judged all the same
    return ProcessState(ARCHIVE, bool(status["running"]), str(status["state"]), int(status["pid"]))


def _error_counts(observation_counts: Iterable[int]) -> tuple[int, int]:
    """(distinct errors, observations of them all) of an error log, given each error's observation count."""
    counts = list(observation_counts)
    return len(counts), sum(counts)


def log_recording_id(cluster_dir: Path) -> int | None:
    """The recording of the node's log: the recording of its latest term in
    recording.log (None without one)."""
    try:
        result = decode_entries((cluster_dir / RECORDING_LOG_FILE_NAME).read_bytes(), str(cluster_dir))
    except (OSError, RecordingLogError):
        return None
    terms = [entry for entry in result.entries if entry.is_valid_term]
    if not terms:
        return None
    return max(terms, key=lambda entry: (entry.leadership_term_id, entry.entry_index)).recording_id


# ---------------------------------------------------------------------------- counter types


Labels = dict[str, str]


@dataclass(frozen=True)
class CounterKind:
    """How the counters of one type id become samples of one metric.

    ``name`` is without the prefix and (for counters) without ``_total``;
    ``labels`` reads the ids out of the counter's key and label; ``value``
    turns the raw value (with the key and the scrape's time in ms) into the
    sample's, in the metric's unit."""

    name: str
    metric_type: str  # "counter" or "gauge"
    help: str
    labels: Callable[[bytes, str], Labels]
    value: Callable[[int, bytes, int], float | None] = lambda raw, key, now_ms: float(raw)


def _state(name: str, help_text: str, states: type[IntEnum], labels: Callable[[bytes, str], Labels]) -> CounterKind:
    """A state counter: a gauge of the state's code, the codes named in its help
    (one series per counter, not one per state: the scrape stays small)."""
    codes = ", ".join(f"{state.value} {state.name}" for state in states)
    return CounterKind(name, "gauge", f"{help_text} ({codes}).", labels)


def _no_labels(key: bytes, label: str) -> Labels:
    return {}


def _stream_labels(key: bytes, label: str) -> Labels:
    """A position counter of the driver: ``<type>: <registration> <session> <stream> <channel>[ @<join>]``."""
    registration_id, session_id, stream_id = _STREAM_KEY.unpack_from(key)
    parts = label.split(" ", 4)
    channel = parts[4] if len(parts) == 5 else ""
    head, separator, tail = channel.rpartition(" @")
    if separator and tail.isdigit():
        channel = head  # a subscriber position's join position
    return {
        "registration_id": str(registration_id),
        "session_id": str(session_id),
        "stream_id": str(stream_id),
        "channel": channel,
    }


def _channel_status_labels(key: bytes, label: str) -> Labels:
    return {"channel": label.partition(": ")[2]}


def _local_address_labels(key: bytes, label: str) -> Labels:
    status_id, _, address = label.partition(": ")[2].partition(" ")
    return {"channel_status_counter_id": status_id, "address": address}


def _heartbeat_labels(key: bytes, label: str) -> Labels:
    process = declared_process(label)
    return {
        "client_id": str(int.from_bytes(key[:8], "little", signed=True)),
        "pid": "" if process is None else str(process[0]),
    }


def _recording_labels(key: bytes, label: str) -> Labels:
    """An archive's ``rec-pos: <recording> <session> <stream> <channel> - archiveId=<id>``."""
    recording_id, session_id, archive_id = recording_position_ids(key)
    parts = label.split(" ", 4)
    stream_id = parts[3] if len(parts) == 5 else ""
    channel = parts[4].rpartition(" - archiveId=")[0] if len(parts) == 5 else ""
    return {
        "recording_id": str(recording_id),
        "session_id": str(session_id),
        "stream_id": stream_id,
        "channel": channel,
        "archive_id": str(archive_id),
    }


def _cluster_labels(key: bytes, label: str) -> Labels:
    return {"cluster_id": str(_INT32.unpack_from(key)[0])}


def _service_labels(key: bytes, label: str) -> Labels:
    cluster_id, service_id = _TWO_INT32.unpack_from(key)
    return {"cluster_id": str(cluster_id), "service_id": str(service_id)}


def _follower_labels(key: bytes, label: str) -> Labels:
    cluster_id, follower_id = _TWO_INT32.unpack_from(key)
    return {"cluster_id": str(cluster_id), "follower_member_id": str(follower_id)}


def _recovery_labels(key: bytes, label: str) -> Labels:
    term_id, _, _, _, cluster_id, _ = parse_recovery_state_key(key)
    return {"cluster_id": str(cluster_id), "leadership_term_id": str(term_id)}


def _scaled(scale: float) -> Callable[[int, bytes, int], float | None]:
    return lambda raw, key, now_ms: raw * scale


def _position(raw: int, key: bytes, now_ms: int) -> float | None:
    return None if raw == NULL_POSITION else float(raw)


def _age_s(raw: int, key: bytes, now_ms: int) -> float | None:
    return max(0, now_ms - raw) * _MS


def _recovery_position(raw: int, key: bytes, now_ms: int) -> float | None:
    return float(parse_recovery_state_key(key)[1])


def _system(name: str, help_text: str, kind: str = "counter", scale: float = 1.0) -> CounterKind:
    return CounterKind(name, kind, help_text, _no_labels, _scaled(scale))


# The driver's system counters, by their id (the key of a counter of type 0).
SYSTEM_KINDS: dict[int, CounterKind] = {
    SystemCounter.BYTES_SENT: _system("driver_sent_bytes", "Bytes sent over UDP."),
    SystemCounter.BYTES_RECEIVED: _system("driver_received_bytes", "Bytes received over UDP."),
    SystemCounter.RECEIVER_PROXY_FAILS: _system("driver_receiver_proxy_fails", "Failed offers to the receiver proxy."),
    SystemCounter.SENDER_PROXY_FAILS: _system("driver_sender_proxy_fails", "Failed offers to the sender proxy."),
    SystemCounter.CONDUCTOR_PROXY_FAILS: _system(
        "driver_conductor_proxy_fails", "Failed offers to the driver conductor proxy."
    ),
    SystemCounter.NAK_MESSAGES_SENT: _system("driver_naks_sent", "NAKs sent (loss seen by this node's receivers)."),
    SystemCounter.NAK_MESSAGES_RECEIVED: _system("driver_naks_received", "NAKs received from other nodes' receivers."),
    SystemCounter.STATUS_MESSAGES_SENT: _system("driver_status_messages_sent", "Status messages sent."),
    SystemCounter.STATUS_MESSAGES_RECEIVED: _system("driver_status_messages_received", "Status messages received."),
    SystemCounter.HEARTBEATS_SENT: _system("driver_heartbeats_sent", "Data heartbeats sent."),
    SystemCounter.HEARTBEATS_RECEIVED: _system("driver_heartbeats_received", "Data heartbeats received."),
    SystemCounter.RETRANSMITS_SENT: _system("driver_retransmits_sent", "Retransmits sent."),
    SystemCounter.FLOW_CONTROL_UNDER_RUNS: _system("driver_flow_control_under_runs", "Flow control under runs."),
    SystemCounter.FLOW_CONTROL_OVER_RUNS: _system("driver_flow_control_over_runs", "Flow control over runs."),
    SystemCounter.INVALID_PACKETS: _system("driver_invalid_packets", "Invalid packets received."),
    SystemCounter.ERRORS: _system("driver_errors", "Errors the driver recorded (its distinct error log has the text)."),
    SystemCounter.SHORT_SENDS: _system("driver_short_sends", "Sends that did not send the whole datagram."),
    SystemCounter.FREE_FAILS: _system("driver_free_fails", "Failed attempts to free log buffers."),
    SystemCounter.SENDER_FLOW_CONTROL_LIMITS: _system(
        "driver_sender_flow_control_limits", "Times a sender was held back by flow control (back-pressure)."
    ),
    SystemCounter.UNBLOCKED_PUBLICATIONS: _system("driver_unblocked_publications", "Publications unblocked."),
    SystemCounter.UNBLOCKED_COMMANDS: _system("driver_unblocked_commands", "Control commands unblocked."),
    SystemCounter.POSSIBLE_TTL_ASYMMETRY: _system("driver_possible_ttl_asymmetry", "Possible TTL asymmetries."),
    SystemCounter.CONTROLLABLE_IDLE_STRATEGY: _system(
        "driver_controllable_idle_strategy_status", "Status of the controllable idle strategy.", "gauge"
    ),
    SystemCounter.LOSS_GAP_FILLS: _system("driver_loss_gap_fills", "Gaps filled after loss."),
    SystemCounter.CLIENT_TIMEOUTS: _system("driver_client_timeouts", "Clients closed for want of keepalives."),
    SystemCounter.RESOLUTION_CHANGES: _system("driver_resolution_changes", "Endpoint name resolution changes."),
    SystemCounter.CONDUCTOR_MAX_CYCLE_TIME: _system(
        "driver_conductor_max_cycle_time_seconds", "Longest duty cycle of the driver's conductor.", "gauge", _NS
    ),
    SystemCounter.CONDUCTOR_CYCLE_TIME_THRESHOLD_EXCEEDED: _system(
        "driver_conductor_cycle_time_threshold_exceeded", "Conductor duty cycles over the threshold."
    ),
    SystemCounter.ACTIVE_CLIENTS: _system("driver_active_clients", "Clients of the driver.", "gauge"),
    SystemCounter.ACTIVE_PUBLICATIONS: _system("driver_active_publications", "Publications of the driver.", "gauge"),
    SystemCounter.ACTIVE_SUBSCRIPTIONS: _system("driver_active_subscriptions", "Subscriptions of the driver.", "gauge"),
    SystemCounter.COMMANDS_RECEIVED: _system("driver_commands_received", "Commands received from clients."),
    SystemCounter.LOSS_RECEIVE_RATE_PPM: _system(
        "driver_loss_injection_receive_ratio", "Share of received datagrams the loss injection drops.", "gauge", _PPM
    ),
    SystemCounter.LOSS_SEND_RATE_PPM: _system(
        "driver_loss_injection_send_ratio", "Share of sent datagrams the loss injection drops.", "gauge", _PPM
    ),
    SystemCounter.LOSS_FRAME_TYPE_MASK: _system(
        "driver_loss_injection_frame_type_mask",
        "Frame types the loss injection drops (a bit per type, 0: all).",
        "gauge",
    ),
    SystemCounter.DATAGRAMS_DROPPED_BY_LOSS_INJECTION: _system(
        "driver_loss_injection_dropped_datagrams", "Datagrams the loss injection dropped."
    ),
    SystemCounter.DATAGRAMS_REFUSED_NO_MAC: _system(
        "driver_datagrams_refused_no_mac",
        "Datagrams of datagram-mac=true channels refused unread: no valid MAC (a forger, or a driver "
        "with another member secret).",
    ),
}

_BYTES_POSITION = "a position in the stream, in bytes"
# Every other counter type, by type id.
COUNTER_KINDS: dict[int, CounterKind] = {
    PUBLISHER_LIMIT_TYPE_ID: CounterKind(
        "publisher_limit_bytes",
        "gauge",
        f"pub-lmt: how far a publication may append ({_BYTES_POSITION}).",
        _stream_labels,
    ),
    PUBLISHER_POSITION_TYPE_ID: CounterKind(
        "publisher_position_bytes",
        "gauge",
        f"pub-pos: what a publication appended ({_BYTES_POSITION}).",
        _stream_labels,
    ),
    SENDER_POSITION_TYPE_ID: CounterKind(
        "sender_position_bytes",
        "gauge",
        f"snd-pos: what the driver sent of a publication ({_BYTES_POSITION}).",
        _stream_labels,
    ),
    RECEIVER_HWM_TYPE_ID: CounterKind(
        "receiver_high_water_mark_bytes",
        "gauge",
        f"rcv-hwm: the highest position received of an image ({_BYTES_POSITION}).",
        _stream_labels,
    ),
    RECEIVER_POSITION_TYPE_ID: CounterKind(
        "receiver_position_bytes",
        "gauge",
        f"rcv-pos: what an image holds without gaps ({_BYTES_POSITION}).",
        _stream_labels,
    ),
    SUBSCRIBER_POSITION_TYPE_ID: CounterKind(
        "subscriber_position_bytes",
        "gauge",
        f"sub-pos: what a subscriber consumed of an image ({_BYTES_POSITION}).",
        _stream_labels,
    ),
    SENDER_BPE_TYPE_ID: CounterKind(
        "publisher_back_pressure_events",
        "counter",
        "snd-bpe: offers a publication refused for back-pressure.",
        _stream_labels,
    ),
    PUBLISHER_MESSAGES_TYPE_ID: CounterKind(
        "publisher_messages", "counter", "pub-msgs: messages appended to a publication.", _stream_labels
    ),
    SEND_CHANNEL_STATUS_TYPE_ID: CounterKind(
        "send_channel_status",
        "gauge",
        "A send channel's endpoint (0 initializing, 1 active, -1 errored, 2 closing).",
        _channel_status_labels,
    ),
    RECEIVE_CHANNEL_STATUS_TYPE_ID: CounterKind(
        "receive_channel_status",
        "gauge",
        "A receive channel's endpoint (0 initializing, 1 active, -1 errored, 2 closing).",
        _channel_status_labels,
    ),
    LOCAL_SOCKADDR_TYPE_ID: CounterKind(
        "channel_local_address_status",
        "gauge",
        "A channel endpoint's bound local address (its status).",
        _local_address_labels,
    ),
    CLIENT_HEARTBEAT_TYPE_ID: CounterKind(
        "client_heartbeat_age_seconds",
        "gauge",
        "Time since a client of the driver (a process of the node, or a tool) last kept itself alive.",
        _heartbeat_labels,
        _age_s,
    ),
    RECORDING_POSITION_TYPE_ID: CounterKind(
        "archive_recorded_position_bytes",
        "gauge",
        f"rec-pos: what the archive recorded of a stream ({_BYTES_POSITION}).",
        _recording_labels,
    ),
    cluster_protocol.CONSENSUS_MODULE_STATE_TYPE_ID: _state(
        "cluster_module_state", "The consensus module's state", ConsensusModuleState, _cluster_labels
    ),
    cluster_protocol.CLUSTER_NODE_ROLE_TYPE_ID: _state(
        "cluster_role", "This member's role", ClusterRole, _cluster_labels
    ),
    cluster_protocol.CLUSTER_CONTROL_TOGGLE_TYPE_ID: _state(
        "cluster_control_toggle",
        "The cluster control toggle (cluster-tool's operations)",
        ControlToggle,
        _cluster_labels,
    ),
    cluster_protocol.COMMIT_POSITION_TYPE_ID: CounterKind(
        "cluster_commit_position_bytes",
        "gauge",
        "The position of the log this member knows committed.",
        _cluster_labels,
    ),
    cluster_protocol.RECOVERY_STATE_TYPE_ID: CounterKind(
        "cluster_recovery_log_position_bytes",
        "gauge",
        "The log position of the snapshot the consensus module recovered from at its start.",
        _recovery_labels,
        _recovery_position,
    ),
    cluster_protocol.SNAPSHOT_COUNTER_TYPE_ID: CounterKind(
        "cluster_snapshots", "counter", "Snapshots this member took.", _cluster_labels
    ),
    cluster_protocol.ELECTION_STATE_TYPE_ID: _state(
        "cluster_election_state", "This member's election state, CLOSED when none runs", ElectionState, _cluster_labels
    ),
    cluster_protocol.CLUSTER_BACKUP_STATE_TYPE_ID: _state(
        "cluster_backup_state", "A cluster backup's state", ClusterBackupState, _cluster_labels
    ),
    CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID: CounterKind(
        "cluster_backup_live_log_position_bytes",
        "gauge",
        "What a cluster backup holds of the live log.",
        _cluster_labels,
        _position,
    ),
    CLUSTER_BACKUP_QUERY_DEADLINE_TYPE_ID: CounterKind(
        "cluster_backup_next_query_timestamp_seconds",
        "gauge",
        "When a cluster backup queries the members next.",
        _cluster_labels,
        _scaled(_MS),
    ),
    CLUSTER_BACKUP_ERROR_COUNT_TYPE_ID: CounterKind(
        "cluster_backup_errors", "counter", "Errors of a cluster backup.", _cluster_labels
    ),
    CLUSTER_BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID: CounterKind(
        "cluster_backup_snapshot_retrievals", "counter", "Snapshots a cluster backup retrieved.", _cluster_labels
    ),
    cluster_protocol.CLUSTER_ERROR_COUNT_TYPE_ID: CounterKind(
        "cluster_errors",
        "counter",
        "Errors the consensus module recorded (cluster-tool errors has the text).",
        _cluster_labels,
    ),
    cluster_protocol.CLUSTERED_SERVICE_ERROR_COUNT_TYPE_ID: CounterKind(
        "cluster_service_errors",
        "counter",
        "Errors a service container recorded, its service's exceptions included (cluster-tool errors has the text).",
        _service_labels,
    ),
    cluster_protocol.CLUSTER_MAX_CYCLE_TIME_TYPE_ID: CounterKind(
        "cluster_max_cycle_time_seconds",
        "gauge",
        "Longest duty cycle of the consensus module.",
        _cluster_labels,
        _scaled(_NS),
    ),
    cluster_protocol.CLUSTER_CYCLE_TIME_THRESHOLD_EXCEEDED_TYPE_ID: CounterKind(
        "cluster_cycle_time_threshold_exceeded",
        "counter",
        "Consensus module duty cycles over the threshold.",
        _cluster_labels,
    ),
    cluster_protocol.CLUSTER_STANDBY_SNAPSHOT_COUNTER_TYPE_ID: CounterKind(
        "cluster_standby_snapshots_received", "counter", "StandbySnapshot announcements recorded.", _cluster_labels
    ),
    cluster_protocol.CLUSTER_NODE_CONTROL_TOGGLE_TYPE_ID: _state(
        "cluster_node_control_toggle", "The node control toggle", ControlToggle, _cluster_labels
    ),
    cluster_protocol.CLUSTER_ELECTION_COUNT_TYPE_ID: CounterKind(
        "cluster_elections", "counter", "Elections this member took part in.", _cluster_labels
    ),
    cluster_protocol.CLUSTER_LEADERSHIP_TERM_ID_TYPE_ID: CounterKind(
        "cluster_leadership_term_id", "gauge", "The leadership term this member is in.", _cluster_labels
    ),
    cluster_protocol.CLUSTER_SESSIONS_TYPE_ID: CounterKind(
        "cluster_sessions", "gauge", "Client sessions open.", _cluster_labels
    ),
    cluster_protocol.CLUSTER_TIMERS_TYPE_ID: CounterKind(
        "cluster_timers", "gauge", "Cluster timers scheduled.", _cluster_labels
    ),
    cluster_protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID: CounterKind(
        "cluster_invalid_requests", "counter", "Requests ignored as invalid.", _cluster_labels
    ),
    cluster_protocol.CLUSTER_MEMBER_APPEND_POSITION_TYPE_ID: CounterKind(
        "cluster_member_append_position_bytes",
        "gauge",
        "On the leader: the log position each follower last reported appended (absent elsewhere).",
        _follower_labels,
        _position,
    ),
}

_UNKNOWN_NAME = "counter"
_UNKNOWN_HELP = "A counter of a type without a metric of its own (e.g. a client's doorbell word), as it is."

# Each process of the node gets these whether its counters are readable or not.
_DERIVED_HELP = {
    "process_up": "1 when the process runs, as cluster-tool judges it (the driver's heartbeat; the archive's "
    "and the cluster mark files' activity and pid), else 0; judged at most once a second, as are the errors.",
    "distinct_errors": "Distinct errors in the process's error log (cnc.dat, archive-mark.dat, cluster mark files).",
    "error_observations": "Observations of the errors in the process's error log.",
    "cluster_log_recorded_position_bytes": "What this member's archive recorded of the log (on a follower, what "
    "it reports appended to the leader).",
    "cluster_uncommitted_log_bytes": "Log this member recorded that is not committed yet.",
    "cluster_member_lag_bytes": "On the leader: how far each follower's appended log is behind the leader's.",
    "cluster_commit_position_unchanged_seconds": (
        "How long the commit position has not moved, as this exporter saw it: it remembers the commit position "
        "from one scrape to the next, so this counts from its first scrape, and from a restart of the consensus "
        "module (an idle cluster's commit position does not move either)."
    ),
}


# ---------------------------------------------------------------------------- the collector


@dataclass
class _CachedCounter:
    """A counter's metadata and what it maps to, read once per allocation
    (not on every scrape); ``kind`` None: a type without a metric of its own."""

    registration_id: int
    type_id: int
    key: bytes
    kind: CounterKind | None
    labels: Labels  # from its key and label
    member: str | None = None  # the member id ``sample_labels`` were made with
    sample_labels: Labels = field(default_factory=dict)  # ``labels`` and, for a cluster counter, the member id
    sorted_labels: tuple[tuple[str, str], ...] = ()


@dataclass
class _Families:
    """The families of one scrape, by name, with each sample's labels kept
    once: two counters that give one series (a dead process's counters the
    driver has not freed yet, beside its restarted process's) leave the newer
    registration's value."""

    prefix: str
    metrics: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (type, help)
    # (name, sorted labels) -> (registration id, value, labels)
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[int, float | None, Labels]] = field(
        default_factory=dict
    )

    def add(
        self, name: str, kind: str, help_text: str, labels: Labels, value: float | None, registration_id: int = 0
    ) -> None:
        """A sample; ``value`` None gives none, but still hides an older registration's."""
        self.add_sorted(name, kind, help_text, tuple(sorted(labels.items())), labels, value, registration_id)

    def add_sorted(
        self,
        name: str,
        kind: str,
        help_text: str,
        sorted_labels: tuple[tuple[str, str], ...],
        labels: Labels,
        value: float | None,
        registration_id: int = 0,
    ) -> None:
        """``add`` with the labels also as sorted (name, value) pairs (a
        counter's, both kept from scrape to scrape and never changed)."""
        self.metrics.setdefault(name, (kind, help_text))
        key = (name, sorted_labels)
        previous = self.samples.get(key)
        if previous is None or registration_id >= previous[0]:
            self.samples[key] = (registration_id, value, labels)

    def families(self) -> Iterator[Metric]:
        by_name: dict[str, list[tuple[Labels, float]]] = {}
        for (name, _), (_, value, labels) in self.samples.items():
            if value is not None:
                by_name.setdefault(name, []).append((labels, value))
        for name, samples in by_name.items():
            kind, help_text = self.metrics[name]
            if kind == "counter":
                family: Metric = CounterMetricFamily(self.prefix + name, help_text)
                sample_name = family.name + "_total"
            else:
                family = GaugeMetricFamily(self.prefix + name, help_text)
                sample_name = family.name
            # The samples add_metric would make, from each counter's labels as
            # kept (add_metric would build every labels dict again).
            family.samples = [Sample(sample_name, labels, value) for labels, value in samples]
            yield family


class NodeCollector(Collector):
    """The metrics of one node: its counters read afresh on every ``collect``
    (every scrape); its processes judged, their error logs counted and its
    log's recording looked up at most once every ``FILES_READ_INTERVAL_S``."""

    PREFIX = "fulmar_"
    # The mark files and error logs cost more to read than all the counters
    # together, and say nothing new at a scraper's pace of many times a
    # second: a process's liveness is judged from a timestamp it updates once
    # a second.  /health reads them on every request.
    FILES_READ_INTERVAL_S = 1.0

    def __init__(
        self,
        node: MetricsNode,
        clock_ms: Callable[[], int] = epoch_ms,
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self._clock_ms = clock_ms
        self._monotonic_s = monotonic_s
        self._driver = DriverFile()
        self._cache: dict[int, _CachedCounter] = {}
        self._lock = threading.Lock()  # scrapes arrive on threads of their own
        # The commit position last seen, per consensus module (its counter's
        # registration id), and since when (monotonic seconds).
        self._commit_seen: tuple[int, int, float] | None = None
        # The node's files as last read: (when, what was found, the log's recording id).
        self._files: tuple[float, NodeFiles, int | None] | None = None

    def close(self) -> None:
        with self._lock:
            self._driver.close()
            self._files = None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = self._read()
        return families.families()

    def read_files(self, now_ms: int | None = None) -> NodeFiles:
        """The node's files read now (as /health reads them), kept as the
        collector's reading: a scrape after it never shows an older one."""
        with self._lock:
            return self._read_files(self._clock_ms() if now_ms is None else now_ms, self._monotonic_s())[1]

    def _read_files(self, now_ms: int, now_s: float) -> tuple[float, NodeFiles, int | None]:
        self._files = (now_s, read_node_files(self.node, self._driver, now_ms), log_recording_id(self.node.cluster_dir))
        return self._files

    def _node_files(self, now_ms: int, now_s: float) -> tuple[NodeFiles, int | None]:
        files = self._files
        if files is None or now_s - files[0] >= self.FILES_READ_INTERVAL_S or now_s < files[0]:
            files = self._read_files(now_ms, now_s)
        return files[1], files[2]

    def _read(self) -> _Families:
        now_ms = self._clock_ms()
        families = _Families(self.PREFIX)
        files, log_recording = self._node_files(now_ms, self._monotonic_s())
        for process in files.processes:
            families.add(
                "process_up",
                "gauge",
                _DERIVED_HELP["process_up"],
                {"process": process.name},
                1 if process.running else 0,
            )
        for name, (distinct, observations) in files.errors.items():
            families.add("distinct_errors", "gauge", _DERIVED_HELP["distinct_errors"], {"process": name}, distinct)
            families.add(
                "error_observations", "counter", _DERIVED_HELP["error_observations"], {"process": name}, observations
            )
        cnc = self._driver.cnc
        if cnc is not None and files.driver_dir is not None:
            member = "" if files.member_id is None else str(files.member_id)
            processes = {str(process.pid): process.name for process in files.processes if process.pid is not None}
            self._read_counters(cnc, families, now_ms, member, processes, log_recording)
        return families

    def _counter(
        self, reader: CountersReader, counter_id: int, registration_id: int, type_id: int, member: str
    ) -> _CachedCounter:
        """The counter's metadata and metric, from the cache while the id holds
        the same registration (and the node the same member id)."""
        cached = self._cache.get(counter_id)
        if cached is None or cached.registration_id != registration_id or cached.type_id != type_id:
            key = reader.counter_key(counter_id)
            label = reader.counter_label(counter_id)
            kind = (
                SYSTEM_KINDS.get(_INT32.unpack_from(key)[0])
                if type_id == SYSTEM_COUNTER_TYPE_ID
                else COUNTER_KINDS.get(type_id)
            )
            labels = (
                kind.labels(key, label)
                if kind is not None
                else {"type_id": str(type_id), "counter_id": str(counter_id), "label": label}
            )
            cached = self._cache[counter_id] = _CachedCounter(registration_id, type_id, key, kind, labels)
        if cached.member != member:
            extra = {"member_id": member} if cached.kind is not None and cached.kind.name.startswith("cluster_") else {}
            cached.sample_labels = {**cached.labels, **extra}
            cached.sorted_labels = tuple(sorted(cached.sample_labels.items()))
            cached.member = member
        return cached

    def _read_counters(
        self,
        cnc: CncFile,
        families: _Families,
        now_ms: int,
        member: str,
        processes: dict[str, str],
        log_recording: int | None,
    ) -> None:
        reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
        snapshot = reader.snapshot()
        recorded: tuple[int, int] | None = None  # (registration id, position) of the log's rec-pos
        commit: tuple[int, int, Labels] | None = None  # (registration id, position, labels)
        followers: list[tuple[int, Labels, int]] = []  # (registration id, labels, follower's append position)
        for counter_id, state in enumerate(snapshot.states):
            if state != RECORD_ALLOCATED:
                continue
            registration_id = snapshot.registration_ids[counter_id]
            type_id = snapshot.type_ids[counter_id]
            counter = self._counter(reader, counter_id, registration_id, type_id, member)
            # A counter freed meanwhile shows its last value in this scrape: its
            # id is not reused before the reuse timeout, so no other's value.
            raw = snapshot.values[counter_id]
            kind = counter.kind
            if kind is None:
                families.add_sorted(
                    _UNKNOWN_NAME, "gauge", _UNKNOWN_HELP, counter.sorted_labels, counter.sample_labels, raw
                )
                continue
            labels = counter.sample_labels
            if type_id == CLIENT_HEARTBEAT_TYPE_ID:
                labels = {**labels, "process": processes.get(labels["pid"], "")}
                families.add(
                    kind.name,
                    kind.metric_type,
                    kind.help,
                    labels,
                    kind.value(raw, counter.key, now_ms),
                    registration_id,
                )
            else:
                families.add_sorted(
                    kind.name,
                    kind.metric_type,
                    kind.help,
                    counter.sorted_labels,
                    labels,
                    kind.value(raw, counter.key, now_ms),
                    registration_id,
                )
            if type_id == RECORDING_POSITION_TYPE_ID:
                if (
                    log_recording is not None
                    and recording_position_ids(counter.key)[0] == log_recording
                    and (recorded is None or registration_id > recorded[0])
                ):
                    recorded = (registration_id, raw)
            elif type_id == cluster_protocol.COMMIT_POSITION_TYPE_ID:
                if commit is None or registration_id > commit[0]:
                    commit = (registration_id, raw, labels)
            elif type_id == cluster_protocol.CLUSTER_MEMBER_APPEND_POSITION_TYPE_ID:
                followers.append((registration_id, labels, raw))
        self._add_log_positions(families, recorded, commit, followers)

    def _add_log_positions(
        self,
        families: _Families,
        recorded: tuple[int, int] | None,
        commit: tuple[int, int, Labels] | None,
        followers: list[tuple[int, Labels, int]],
    ) -> None:
        if commit is None:
            self._commit_seen = None
            return
        registration_id, position, labels = commit
        now_s = self._monotonic_s()
        seen = self._commit_seen
        if seen is None or seen[0] != registration_id or seen[1] != position:
            self._commit_seen = seen = (registration_id, position, now_s)
        families.add(
            "cluster_commit_position_unchanged_seconds",
            "gauge",
            _DERIVED_HELP["cluster_commit_position_unchanged_seconds"],
            labels,
            now_s - seen[2],
        )
        if recorded is None:
            return
        families.add(
            "cluster_log_recorded_position_bytes",
            "gauge",
            _DERIVED_HELP["cluster_log_recorded_position_bytes"],
            labels,
            recorded[1],
        )
        families.add(
            "cluster_uncommitted_log_bytes",
            "gauge",
            _DERIVED_HELP["cluster_uncommitted_log_bytes"],
            labels,
            max(0, recorded[1] - position),
        )
        for follower_registration, follower_labels, follower_position in followers:
            lag = None if follower_position == NULL_POSITION else max(0, recorded[1] - follower_position)
            families.add(
                "cluster_member_lag_bytes",
                "gauge",
                _DERIVED_HELP["cluster_member_lag_bytes"],
                follower_labels,
                lag,
                follower_registration,
            )
