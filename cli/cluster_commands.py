"""The cluster's view of ``cluster-tool`` (Aeron's ClusterTool):
``cluster-tool cluster describe | pid | list-members | is-leader |
recording-log | rebuild-recording-log | errors | mark-file | counters`` and
the operations ``snapshot | suspend | resume | shutdown | abort |
standby-snapshot``; a local cluster's backup shows beside its members.

A cluster node is read through three things: its cluster directory (the
consensus module's cluster-mark.dat, the services' cluster-mark-service-<id>.dat
and recording.log, all read, never written), and the counters its consensus
module keeps in the node's media driver's cnc.dat (found through the mark
file's aeron_directory).  The operations write one word: the leader's cluster
control toggle counter, with a compare-and-set from NEUTRAL, as Aeron's
ClusterTool does.

``--dir`` is a cluster directory, a node directory holding ``cluster/``, or
the base of a local cluster (``node0/``, ``node1/``, ...).  Exit codes
(``tool_common``): 0 ok; 1 an operation refused or not completed in time, or
no leader among running nodes (``is-leader`` exits 0 only for the leader); 3
a node's consensus module not running; 4 no usable cluster files.
"""

from __future__ import annotations

import json
import os
import re
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import click

from fulmar.archive.errors import describe_os_error
from fulmar.cli.archive_tool import archive_dir_option
from fulmar.cli.cnc_reader import error_documents, iso_utc, open_cnc, process_exists, read_counters
from fulmar.cli.tool_common import (
    EXIT_NOT_RUNNING,
    EXIT_PROBLEM,
    EXIT_UNREADABLE,
    fail,
    format_counters,
    format_error_list,
    json_option,
    worst,
)
from fulmar.clock import epoch_ms
from fulmar.cnc import CncError, CncFile
from fulmar.codecs.generated.cluster_mark import ClusterComponentType
from fulmar.consensus import protocol as cluster_protocol
from fulmar.consensus.backup import CLUSTER_BACKUP_ERROR_COUNT_TYPE_ID as BACKUP_ERROR_COUNT_TYPE_ID
from fulmar.consensus.backup import CLUSTER_BACKUP_LIVE_LOG_POSITION_TYPE_ID as BACKUP_LIVE_LOG_POSITION_TYPE_ID
from fulmar.consensus.backup import CLUSTER_BACKUP_QUERY_DEADLINE_TYPE_ID as BACKUP_QUERY_DEADLINE_TYPE_ID
from fulmar.consensus.backup import (
    CLUSTER_BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID as BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID,
)
from fulmar.consensus.backup import ClusterBackupState
from fulmar.consensus.log_rebuild import RecordingLogRebuildError, rebuild_recording_log
from fulmar.consensus.mark_file import FILE_EXTENSION as CLUSTER_MARK_FILE_EXTENSION
from fulmar.consensus.mark_file import FILENAME as CLUSTER_MARK_FILE_NAME
from fulmar.consensus.mark_file import LIVENESS_TIMEOUT_MS_DEFAULT as MARK_FILE_LIVENESS_TIMEOUT_MS
from fulmar.consensus.mark_file import (
    SERVICE_FILENAME_PREFIX,
    ClusterMarkFileContents,
    ClusterMarkFileError,
    read_cluster_mark_file,
    read_liveness,
)
from fulmar.consensus.recording_log import (
    CONSENSUS_MODULE_SERVICE_ID,
    RECORDING_LOG_FILE_NAME,
    DecodeResult,
    Entry,
    RecordingLogError,
    decode_entries,
)
from fulmar.consensus.recording_log import NULL_POSITION as LOG_NULL_POSITION
from fulmar.consensus.states import ClusterRole, ConsensusModuleState, ControlToggle, ElectionState
from fulmar.counters import CountersReader, counter_offset
from fulmar.errors import CodecError
from fulmar.semantic_version import version_text

EXIT_CLUSTER_PROBLEM = EXIT_PROBLEM  # a refused or failed operation, not the leader
EXIT_CLUSTER_NOT_RUNNING = EXIT_NOT_RUNNING  # a node's consensus module is not running
EXIT_CLUSTER_UNREADABLE = EXIT_UNREADABLE  # no usable cluster files, a corrupt file

# Counters the consensus module allocates with literal type ids (consensus/agent.py).
SESSIONS_COUNTER_TYPE_ID = cluster_protocol.CLUSTER_SESSIONS_TYPE_ID
TIMERS_COUNTER_TYPE_ID = cluster_protocol.CLUSTER_TIMERS_TYPE_ID
INVALID_REQUESTS_COUNTER_TYPE_ID = cluster_protocol.CLUSTER_INVALID_REQUESTS_TYPE_ID
MEMBER_APPEND_POSITION_COUNTER_TYPE_ID = cluster_protocol.CLUSTER_MEMBER_APPEND_POSITION_TYPE_ID
CONSENSUS_REFUSED_COUNTER_TYPE_ID = cluster_protocol.CLUSTER_CONSENSUS_REFUSED_TYPE_ID

# Aeron's cluster counter type ids span 200..249 (AeronCounters); fulmar's own
# cluster counters sit at 1200 and up.
_CLUSTER_COUNTER_TYPE_IDS = set(range(200, 250)) | {
    SESSIONS_COUNTER_TYPE_ID,
    TIMERS_COUNTER_TYPE_ID,
    INVALID_REQUESTS_COUNTER_TYPE_ID,
    MEMBER_APPEND_POSITION_COUNTER_TYPE_ID,
    CONSENSUS_REFUSED_COUNTER_TYPE_ID,
}

CLUSTER_COUNTER_TYPE_NAMES: dict[int, str] = {
    cluster_protocol.CONSENSUS_MODULE_STATE_TYPE_ID: "cm-state",
    cluster_protocol.CLUSTER_NODE_ROLE_TYPE_ID: "node-role",
    cluster_protocol.CLUSTER_CONTROL_TOGGLE_TYPE_ID: "control-toggle",
    cluster_protocol.COMMIT_POSITION_TYPE_ID: "commit-pos",
    cluster_protocol.RECOVERY_STATE_TYPE_ID: "recovery-state",
    cluster_protocol.SNAPSHOT_COUNTER_TYPE_ID: "snapshot-count",
    cluster_protocol.ELECTION_STATE_TYPE_ID: "election-state",
    cluster_protocol.CLUSTER_BACKUP_STATE_TYPE_ID: "backup-state",
    cluster_protocol.CLUSTERED_SERVICE_ERROR_COUNT_TYPE_ID: "service-errors",
    cluster_protocol.CLUSTER_ERROR_COUNT_TYPE_ID: "cluster-errors",
    cluster_protocol.CLUSTER_MAX_CYCLE_TIME_TYPE_ID: "max-cycle-time",
    cluster_protocol.CLUSTER_CYCLE_TIME_THRESHOLD_EXCEEDED_TYPE_ID: "cycle-time-exceeded",
    SESSIONS_COUNTER_TYPE_ID: "sessions",
    TIMERS_COUNTER_TYPE_ID: "timers",
    INVALID_REQUESTS_COUNTER_TYPE_ID: "invalid-requests",
    MEMBER_APPEND_POSITION_COUNTER_TYPE_ID: "member-append-pos",
    CONSENSUS_REFUSED_COUNTER_TYPE_ID: "consensus-refused",
    cluster_protocol.CLUSTER_NODE_CONTROL_TOGGLE_TYPE_ID: "node-control-toggle",
    cluster_protocol.CLUSTER_ELECTION_COUNT_TYPE_ID: "election-count",
    cluster_protocol.CLUSTER_LEADERSHIP_TERM_ID_TYPE_ID: "leadership-term-id",
}

# The counters of one consensus module that describe shows: JSON key -> type id.
# Each is keyed by the cluster id (an int32), as consensus/agent.py allocates them.
_MODULE_COUNTERS: dict[str, int] = {
    "module_state": cluster_protocol.CONSENSUS_MODULE_STATE_TYPE_ID,
    "role": cluster_protocol.CLUSTER_NODE_ROLE_TYPE_ID,
    "election_state": cluster_protocol.ELECTION_STATE_TYPE_ID,
    "control_toggle": cluster_protocol.CLUSTER_CONTROL_TOGGLE_TYPE_ID,
    "commit_position": cluster_protocol.COMMIT_POSITION_TYPE_ID,
    "leadership_term_id": cluster_protocol.CLUSTER_LEADERSHIP_TERM_ID_TYPE_ID,
    "sessions": SESSIONS_COUNTER_TYPE_ID,
    "timers": TIMERS_COUNTER_TYPE_ID,
    "errors": cluster_protocol.CLUSTER_ERROR_COUNT_TYPE_ID,
    "snapshot_count": cluster_protocol.SNAPSHOT_COUNTER_TYPE_ID,
    "invalid_requests": INVALID_REQUESTS_COUNTER_TYPE_ID,
    "max_cycle_time_ns": cluster_protocol.CLUSTER_MAX_CYCLE_TIME_TYPE_ID,
    "cycle_time_threshold_exceeded": cluster_protocol.CLUSTER_CYCLE_TIME_THRESHOLD_EXCEEDED_TYPE_ID,
}
_COUNTER_ENUMS: dict[str, type[IntEnum]] = {
    "module_state": ConsensusModuleState,
    "role": ClusterRole,
    "election_state": ElectionState,
    "control_toggle": ControlToggle,
}

_NODE_DIR_NAME = re.compile(r"^node(\d+)$")
BACKUP_DIR_NAME = "backup"  # a local cluster's backup, beside node0, node1, ...
_SERVICE_MARK_FILE_NAME = re.compile(
    "^" + re.escape(SERVICE_FILENAME_PREFIX) + r"(\d+)" + re.escape(CLUSTER_MARK_FILE_EXTENSION) + "$"
)
_OPERATION_POLL_S = 0.01
_CLUSTER_KEY = struct.Struct("<i")  # the key of the consensus module's counters: the cluster id


class ClusterReadError(Exception):
    """A node's cluster files cannot be used; the message is one line that names the file."""


@dataclass(frozen=True)
class ClusterNode:
    """One node found under ``--dir``: a name for people and its cluster directory."""

    name: str
    cluster_dir: Path


def _has_cluster_files(path: Path) -> bool:
    return (path / CLUSTER_MARK_FILE_NAME).is_file() or (path / RECORDING_LOG_FILE_NAME).is_file()


def resolve_cluster_nodes(directory: Path) -> tuple[str, list[ClusterNode]]:
    """What ``--dir`` names: ("cluster-dir" | "node-dir" | "base", its nodes).

    A cluster directory holds cluster-mark.dat or recording.log; a node
    directory holds one as ``cluster/``; the base of a local cluster holds
    node directories ``node0``, ``node1``, ... (each with ``cluster/``, or
    itself a cluster directory).
    """
    if not directory.is_dir():
        raise ClusterReadError(f"{directory}: {'not a directory' if directory.exists() else 'no such directory'}")
    if _has_cluster_files(directory):
        # BASE/node0/cluster is node0, not "cluster".
        name = directory.resolve().parent.name if directory.resolve().name == "cluster" else directory.name
        return "cluster-dir", [ClusterNode(name or str(directory), directory)]
    if _has_cluster_files(directory / "cluster"):
        return "node-dir", [ClusterNode(directory.name, directory / "cluster")]
    nodes: list[tuple[int, ClusterNode]] = []
    try:
        children = list(directory.iterdir())
    except OSError as error:
        raise ClusterReadError(f"{directory}: cannot list the directory: {describe_os_error(error)}") from None
    for child in children:
        match = _NODE_DIR_NAME.match(child.name)
        if match is None or not child.is_dir():
            continue
        for candidate in (child / "cluster", child):
            if _has_cluster_files(candidate):
                nodes.append((int(match.group(1)), ClusterNode(child.name, candidate)))
                break
    if not nodes:
        raise ClusterReadError(
            f"{directory}: no cluster files ({CLUSTER_MARK_FILE_NAME} or {RECORDING_LOG_FILE_NAME}) here, "
            f"in cluster/, or in node<N>/cluster/"
        )
    found = [node for _, node in sorted(nodes, key=lambda pair: pair[0])]
    if _has_cluster_files(directory / BACKUP_DIR_NAME / "cluster"):
        # A backup of this local cluster (cluster-node backup --local BASE) is shown beside the members.
        found.append(ClusterNode(BACKUP_DIR_NAME, directory / BACKUP_DIR_NAME / "cluster"))
    return "base", found


def archive_dir_beside(cluster_dir: Path) -> Path | None:
    """The node's archive directory as ``cluster-node start`` lays a node out
    (``NODE/archive`` beside ``NODE/cluster``); None when ``cluster_dir`` is
    not a node's ``cluster/``."""
    resolved = cluster_dir.resolve()
    return resolved.parent / "archive" if resolved.name == "cluster" else None


def _component_name(raw: int) -> str:
    try:
        return ClusterComponentType(raw).name
    except ValueError:
        return f"UNKNOWN({raw})"


def read_cluster_mark(path: Path) -> ClusterMarkFileContents:
    """A mark file, read (never written); ``ClusterReadError`` naming the file if unusable."""
    try:
        return read_cluster_mark_file(path)
    except FileNotFoundError:
        raise ClusterReadError(f"{path}: no mark file") from None
    except (ClusterMarkFileError, CodecError, OSError, ValueError) as error:
        text = str(error) if isinstance(error, ClusterMarkFileError) else f"{path}: unreadable mark file: {error}"
        raise ClusterReadError(text) from None


def cluster_mark_document(contents: ClusterMarkFileContents, now_ms: int) -> dict[str, Any]:
    """The decoded header, and whether its owner runs (as a starting component judges it).

    Running means a ready file (version written), a fresh activity timestamp
    (within the default liveness timeout; the owner updates it every second)
    and a pid that is a running process.
    """
    header = contents.header
    activity_ms = header.activity_timestamp
    age_ms = max(0, now_ms - activity_ms) if activity_ms > 0 else None
    pid = header.pid
    pid_exists = 0 < pid < 2**31 and process_exists(pid)
    fresh = age_ms is not None and age_ms < MARK_FILE_LIVENESS_TIMEOUT_MS
    running = contents.is_ready and fresh and pid_exists
    if running:
        state = "running"
    elif contents.failed_start:
        state = "not running (failed to start)"
    elif fresh and pid_exists:
        state = "starting (not ready yet)"
    elif activity_ms == 0:
        state = "not running (closed cleanly)"
    elif not pid_exists:
        state = f"not running (pid {pid} is gone)"
    else:
        state = f"not running (no activity for {age_ms} ms)"
    try:
        file_length = contents.path.stat().st_size
    except OSError:
        file_length = None
    return {
        "path": str(contents.path),
        "component_type": _component_name(header.component_type_raw),
        "running": running,
        "state": state,
        "version": version_text(header.version),
        "ready": contents.is_ready,
        "has_message_header": contents.has_message_header,
        "pid": pid,
        "pid_exists": pid_exists,
        "member_id": header.member_id,
        "cluster_id": header.cluster_id,
        "service_id": header.service_id,
        "candidate_term_id": header.candidate_term_id,
        "start_timestamp_ms": header.start_timestamp,
        "start_time": iso_utc(header.start_timestamp),
        "activity_timestamp_ms": activity_ms,
        "activity_age_ms": age_ms,
        "liveness_timeout_ms": MARK_FILE_LIVENESS_TIMEOUT_MS,
        "archive_stream_id": header.archive_stream_id,
        "service_stream_id": header.service_stream_id,
        "consensus_module_stream_id": header.consensus_module_stream_id,
        "ingress_stream_id": header.ingress_stream_id,
        "aeron_directory": header.aeron_directory,
        "control_channel": header.control_channel,
        "ingress_channel": header.ingress_channel,
        "service_name": header.service_name,
        "authenticator": header.authenticator,
        "services_cluster_dir": header.services_cluster_dir,
        "header_length": header.header_length,
        "error_buffer_length": header.error_buffer_length,
        "file_length": file_length,
        "error_count": len(contents.errors),
    }


def service_mark_paths(cluster_dir: Path) -> list[tuple[int, Path]]:
    """(service id, path) of every ``cluster-mark-service-<id>.dat``, by id."""
    found = []
    try:
        names = os.listdir(cluster_dir)
    except OSError as error:
        raise ClusterReadError(f"{cluster_dir}: cannot list the directory: {describe_os_error(error)}") from None
    for name in names:
        match = _SERVICE_MARK_FILE_NAME.match(name)
        if match is not None:
            found.append((int(match.group(1)), cluster_dir / name))
    return sorted(found)


# -- recording.log


def _read_recording_log(cluster_dir: Path) -> DecodeResult:
    """Every entry of ``recording.log``, decoded from a plain read.

    ``RecordingLog.open`` opens the file for writing and cuts a torn tail
    away; a tool must not, so the bytes are decoded as they are and a torn
    tail (a live module mid-append, or a crash) is only reported.
    """
    path = cluster_dir / RECORDING_LOG_FILE_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ClusterReadError(f"{path}: no recording log") from None
    except OSError as error:
        raise ClusterReadError(f"{path}: cannot read the recording log: {describe_os_error(error)}") from None
    try:
        return decode_entries(data, str(path))
    except RecordingLogError as error:
        raise ClusterReadError(str(error)) from None


def _entry_document(entry: Entry) -> dict[str, Any]:
    return {
        "index": entry.entry_index,
        "type": entry.type_name,
        "recording_id": entry.recording_id,
        "leadership_term_id": entry.leadership_term_id,
        "term_base_log_position": entry.term_base_log_position,
        "log_position": entry.log_position,
        "timestamp": entry.timestamp,
        "time": iso_utc(entry.timestamp),
        "service_id": entry.service_id,
        "valid": entry.is_valid,
        "archive_endpoint": entry.archive_endpoint,
    }


def _recording_log_summary(cluster_dir: Path) -> dict[str, Any]:
    result = _read_recording_log(cluster_dir)
    entries = result.entries
    terms = [entry for entry in entries if entry.is_valid_term]
    snapshots = [entry for entry in entries if entry.is_valid_snapshot]
    module_snapshots = [entry for entry in snapshots if entry.service_id == CONSENSUS_MODULE_SERVICE_ID]
    latest_term = max(terms, key=lambda e: (e.leadership_term_id, e.entry_index), default=None)
    latest_snapshot = max(
        module_snapshots, key=lambda e: (e.leadership_term_id, e.log_position, e.entry_index), default=None
    )
    return {
        "path": str(cluster_dir / RECORDING_LOG_FILE_NAME),
        "entries": len(entries),
        "invalid_entries": sum(1 for entry in entries if not entry.is_valid),
        "terms": len(terms),
        "snapshots": len(snapshots),
        "latest_term": None if latest_term is None else _entry_document(latest_term),
        "latest_snapshot": None if latest_snapshot is None else _entry_document(latest_snapshot),
        "torn_tail": result.torn_tail,
    }


# -- counters


class ModuleCounters:
    """The counters of one consensus module in its driver's cnc.dat.

    They are the counters of a cluster type keyed by the cluster id.  A
    module that died leaves its counters until the driver times its client
    out, and a restarted module allocates new ones: the newest module-state
    counter (highest registration id) names the live module, and its other
    counters are the ones with the same owner (the module's client id).
    """

    def __init__(self, cnc: CncFile, cluster_id: int) -> None:
        self.cnc = cnc
        self.reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
        key = _CLUSTER_KEY.pack(cluster_id)
        wanted = set(_MODULE_COUNTERS.values())
        found: list[tuple[int, int, int, int]] = []  # type id, registration id, owner id, counter id
        for counter in self.reader:
            if counter.type_id in wanted and counter.key[: len(key)] == key:
                cid = counter.counter_id
                found.append(
                    (counter.type_id, self.reader.counter_registration_id(cid), self.reader.counter_owner_id(cid), cid)
                )
        states = [entry for entry in found if entry[0] == cluster_protocol.CONSENSUS_MODULE_STATE_TYPE_ID]
        owner = max(states, key=lambda entry: entry[1])[2] if states else None
        self.ids: dict[int, int] = {}
        newest: dict[int, int] = {}
        for type_id, registration_id, owner_id, counter_id in found:
            if owner is not None and owner_id != owner:
                continue
            if registration_id >= newest.get(type_id, -(2**63)):
                newest[type_id] = registration_id
                self.ids[type_id] = counter_id

    def __bool__(self) -> bool:
        return cluster_protocol.CONSENSUS_MODULE_STATE_TYPE_ID in self.ids

    def value(self, type_id: int) -> int | None:
        counter_id = self.ids.get(type_id)
        return None if counter_id is None else self.reader.counter_value(counter_id)

    def compare_and_set(self, type_id: int, expected: int, desired: int) -> bool:
        counter_id = self.ids[type_id]
        return self.cnc.counters_values.compare_and_set_int64(counter_offset(counter_id), expected, desired)

    def document(self) -> dict[str, Any]:
        document: dict[str, Any] = {"driver_dir": str(self.cnc.path.parent)}
        for name, type_id in _MODULE_COUNTERS.items():
            value = self.value(type_id)
            document[name] = value
            enum = _COUNTER_ENUMS.get(name)
            if enum is not None:
                document[f"{name}_name"] = _enum_name(enum, value)
        return document


def _enum_name(enum: type[IntEnum], value: int | None) -> str | None:
    if value is None:
        return None
    try:
        return enum(value).name
    except ValueError:
        return f"UNKNOWN({value})"


def _module_counters_document(mark: ClusterMarkFileContents) -> dict[str, Any]:
    """The consensus module's counters; ``CncError`` if the driver's files are unusable."""
    directory = mark.header.aeron_directory
    if not directory:
        raise CncError(f"{mark.path}: the mark file names no aeron directory")
    with open_cnc(directory) as cnc:
        counters = ModuleCounters(cnc, mark.header.cluster_id)
        if not counters:
            raise CncError(f"no consensus module counters for cluster id {mark.header.cluster_id} in {cnc.path}")
        return counters.document()


# -- per-node documents


def _node_base(node: ClusterNode) -> dict[str, Any]:
    return {"node": node.name, "cluster_dir": str(node.cluster_dir)}


def _module_state(node: ClusterNode, now_ms: int) -> tuple[ClusterMarkFileContents, dict[str, Any]]:
    """The consensus module's mark file (``ClusterReadError`` if absent or unusable) and its status."""
    contents = read_cluster_mark(node.cluster_dir / CLUSTER_MARK_FILE_NAME)
    return contents, cluster_mark_document(contents, now_ms)


def _is_backup(mark: dict[str, Any]) -> bool:
    return bool(mark["component_type"] == ClusterComponentType.BACKUP.name)


def backup_counters_document(contents: ClusterMarkFileContents) -> dict[str, Any]:
    """A running cluster backup's counters (Aeron's ClusterBackup ones, keyed by
    the cluster id); ``CncError`` if its driver's files are unusable."""
    directory = contents.header.aeron_directory
    if not directory:
        raise CncError(f"{contents.path}: the mark file names no aeron directory")
    key = _CLUSTER_KEY.pack(contents.header.cluster_id)
    wanted = {
        cluster_protocol.CLUSTER_BACKUP_STATE_TYPE_ID: "state",
        BACKUP_LIVE_LOG_POSITION_TYPE_ID: "live_log_position",
        BACKUP_QUERY_DEADLINE_TYPE_ID: "next_query_deadline_ms",
        BACKUP_ERROR_COUNT_TYPE_ID: "errors",
        BACKUP_SNAPSHOT_RETRIEVE_COUNT_TYPE_ID: "snapshots_retrieved",
    }
    with open_cnc(directory) as cnc:
        reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
        newest: dict[int, tuple[int, int]] = {}  # type id -> (registration id, value)
        for counter in reader:
            if counter.type_id in wanted and counter.key[: len(key)] == key:
                registration = reader.counter_registration_id(counter.counter_id)
                if registration >= newest.get(counter.type_id, (-(2**63), 0))[0]:
                    newest[counter.type_id] = (registration, reader.counter_value(counter.counter_id))
    if cluster_protocol.CLUSTER_BACKUP_STATE_TYPE_ID not in newest:
        raise CncError(f"no cluster backup counters for cluster id {contents.header.cluster_id} in {directory}")
    document: dict[str, Any] = {"driver_dir": str(directory)}
    for type_id, name in wanted.items():
        document[name] = newest[type_id][1] if type_id in newest else None
    document["state_name"] = _enum_name(ClusterBackupState, document["state"])
    return document


def _live_counters(contents: ClusterMarkFileContents, mark: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The module's counters when it runs, else (None, why not)."""
    if _is_backup(mark):
        if not mark["running"]:
            return None, f"the cluster backup is {mark['state']}"
        return None, "a cluster backup, not a member"
    if not mark["running"]:
        return None, f"the consensus module is {mark['state']}"
    try:
        return _module_counters_document(contents), None
    except CncError as error:
        return None, str(error)


def cluster_describe_node(node: ClusterNode, now_ms: int) -> dict[str, Any]:
    document = _node_base(node)
    mark_path = node.cluster_dir / CLUSTER_MARK_FILE_NAME
    mark: dict[str, Any] | None = None
    counters: dict[str, Any] | None = None
    counters_note: str | None = "no consensus module mark file"
    backup: dict[str, Any] | None = None
    if mark_path.exists():
        contents, mark = _module_state(node, now_ms)
        counters, counters_note = _live_counters(contents, mark)
        if _is_backup(mark) and mark["running"]:
            try:
                backup = backup_counters_document(contents)
                counters_note = None
            except CncError as error:
                counters_note = str(error)
    recording_log: dict[str, Any] | None = None
    if (node.cluster_dir / RECORDING_LOG_FILE_NAME).exists():
        recording_log = _recording_log_summary(node.cluster_dir)
    services = []
    for service_id, path in service_mark_paths(node.cluster_dir):
        try:
            service = cluster_mark_document(read_cluster_mark(path), now_ms)
        except ClusterReadError as error:
            services.append({"service_id": service_id, "path": str(path), "error": str(error)})
            continue
        services.append({"service_id": service_id, **service})
    document.update(
        running=mark is not None and mark["running"],
        mark_file=mark,
        counters=counters,
        counters_note=counters_note,
        backup=backup,
        recording_log=recording_log,
        services=services,
    )
    return document


def cluster_member_node(node: ClusterNode, now_ms: int) -> dict[str, Any]:
    """What list-members, is-leader and pid need: identity, liveness, role."""
    contents, mark = _module_state(node, now_ms)
    counters, note = _live_counters(contents, mark)
    role = None if counters is None else counters["role"]
    backup: dict[str, Any] | None = None
    if _is_backup(mark) and mark["running"]:
        try:
            backup = backup_counters_document(contents)
            note = None
        except CncError as error:
            note = str(error)
    return {
        **_node_base(node),
        "running": mark["running"],
        "state": mark["state"],
        "pid": mark["pid"],
        "member_id": mark["member_id"],
        "cluster_id": mark["cluster_id"],
        "role": role,
        "role_name": None if counters is None else counters["role_name"],
        "leader": role == ClusterRole.LEADER,
        "module_state_name": None if counters is None else counters["module_state_name"],
        "leadership_term_id": None if counters is None else counters["leadership_term_id"],
        "commit_position": None if counters is None else counters["commit_position"],
        "ingress_channel": mark["ingress_channel"],
        "ingress_stream_id": mark["ingress_stream_id"],
        "aeron_directory": mark["aeron_directory"],
        "counters_note": note,
        "is_backup": _is_backup(mark),
        "backup": backup,
    }


def cluster_recording_log_node(node: ClusterNode) -> dict[str, Any]:
    result = _read_recording_log(node.cluster_dir)
    return {
        **_node_base(node),
        "path": str(node.cluster_dir / RECORDING_LOG_FILE_NAME),
        "entries": [_entry_document(entry) for entry in result.entries],
        "next_entry_index": result.next_entry_index,
        "torn_tail": result.torn_tail,
    }


def _mark_files(node: ClusterNode) -> list[tuple[str, Path]]:
    """("consensus module" | "service <id>", path) of every mark file of the node; none: ``ClusterReadError``."""
    files: list[tuple[str, Path]] = []
    module = node.cluster_dir / CLUSTER_MARK_FILE_NAME
    if module.exists():
        files.append(("consensus module", module))
    files.extend((f"service {service_id}", path) for service_id, path in service_mark_paths(node.cluster_dir))
    if not files:
        raise ClusterReadError(f"{node.cluster_dir}: no cluster mark files")
    return files


def cluster_errors_node(node: ClusterNode) -> dict[str, Any]:
    files = []
    for component, path in _mark_files(node):
        contents = read_cluster_mark(path)
        files.append(
            {
                "component": component,
                "path": str(path),
                "pid": contents.header.pid,
                "errors": error_documents(contents.errors),
            }
        )
    return {**_node_base(node), "files": files}


def cluster_mark_file_node(node: ClusterNode, now_ms: int) -> dict[str, Any]:
    files = []
    for component, path in _mark_files(node):
        files.append({"component": component, **cluster_mark_document(read_cluster_mark(path), now_ms)})
    return {**_node_base(node), "files": files}


def cluster_counters_node(node: ClusterNode, now_ms: int) -> dict[str, Any]:
    contents, mark = _module_state(node, now_ms)
    directory = contents.header.aeron_directory
    try:
        with open_cnc(directory) as cnc:
            counters = [
                {**counter, "type": CLUSTER_COUNTER_TYPE_NAMES.get(counter["type_id"])}
                for counter in read_counters(cnc)
                if counter["type_id"] in _CLUSTER_COUNTER_TYPE_IDS
            ]
            return {**_node_base(node), "driver_dir": directory, "driver_pid": cnc.pid, "counters": counters}
    except CncError as error:
        if not mark["running"]:
            # A stopped node's driver took its files with it: nothing to read, and nothing wrong.
            return {
                **_node_base(node),
                "driver_dir": directory,
                "driver_pid": None,
                "counters": None,
                "counters_note": f"the consensus module is {mark['state']}; {error}",
            }
        raise ClusterReadError(f"{error} (the driver dir named by {contents.path})") from None


# -- running a read command over the nodes


def cluster_document(directory: Path, read_node: Callable[[ClusterNode], dict[str, Any]]) -> dict[str, Any]:
    """``{"dir", "layout", "nodes": [...]}``; a node that cannot be read carries ``error``.

    ``ClusterReadError`` if ``directory`` holds no node at all.
    """
    layout, nodes = resolve_cluster_nodes(directory)
    now_ms = epoch_ms()
    documents = []
    for node in nodes:
        try:
            document = read_node(node)
        except ClusterReadError as error:
            documents.append({**_node_base(node), "error": str(error)})
            continue
        if "running" not in document or "is_backup" not in document:
            try:
                _, mark = _module_state(node, now_ms)
                running, backup = bool(mark["running"]), _is_backup(mark)
            except ClusterReadError:  # no (usable) mark file: no module runs there
                running, backup = False, False
            document.setdefault("running", running)
            document.setdefault("is_backup", backup)
        documents.append(document)
    return {"dir": str(directory), "layout": layout, "nodes": documents}


def cluster_exit_code(document: dict[str, Any]) -> int:
    """4 if a node could not be read, else 3 if a member's consensus module
    is not running (a cluster backup beside the members may be stopped), else 0."""
    return worst(
        EXIT_CLUSTER_UNREADABLE
        if "error" in node
        else EXIT_CLUSTER_NOT_RUNNING
        if not node.get("running", False) and not node.get("is_backup")
        else 0
        for node in document["nodes"]
    )


def _cluster_emit(
    document: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str], code: int | None = None
) -> None:
    """Print, then exit with ``code`` (by default cluster_exit_code's); a
    single node that could not be read: one ``cluster-tool:`` line, nothing printed, exit 4."""
    errors = [node["error"] for node in document["nodes"] if "error" in node]
    if errors and len(document["nodes"]) == 1:
        fail(errors[0], EXIT_CLUSTER_UNREADABLE)
    click.echo(json.dumps(document) if as_json else render(document))
    sys.exit(cluster_exit_code(document) if code is None else code)


def _read_cluster(directory: Path, read_node: Callable[[ClusterNode], dict[str, Any]]) -> dict[str, Any]:
    try:
        return cluster_document(directory, read_node)
    except ClusterReadError as error:
        fail(str(error), EXIT_CLUSTER_UNREADABLE)


def _render_nodes(document: dict[str, Any], render_node: Callable[[dict[str, Any]], list[str]]) -> str:
    """A node's lines; for a base, each node's under a ``nodeN (dir):`` heading, indented."""
    nodes = document["nodes"]
    if document["layout"] != "base" and "error" not in nodes[0]:
        return "\n".join(render_node(nodes[0]))
    lines: list[str] = []
    for node in nodes:
        lines.append(f"{node['node']} ({node['cluster_dir']}):")
        body = [f"cluster-tool: {node['error']}"] if "error" in node else render_node(node)
        lines.extend(f"  {line}" for line in body)
    return "\n".join(lines)


# -- text


def _format_entry_short(entry: dict[str, Any]) -> str:
    return (
        f"term {entry['leadership_term_id']} recording {entry['recording_id']} "
        f"log position {entry['log_position']} ({entry['time']})"
    )


def _plural(count: int | None, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _render_describe_node(node: dict[str, Any]) -> list[str]:
    mark = node["mark_file"]
    lines = []
    if mark is None:
        lines.append(f"cluster dir {node['cluster_dir']}: no consensus module mark file")
    else:
        if mark["activity_timestamp_ms"] == 0:
            activity = "0 (closed cleanly)"
        elif mark["activity_age_ms"] is None:
            activity = f"{mark['activity_timestamp_ms']} (never)"
        else:
            activity = f"{mark['activity_age_ms']} ms ago (liveness timeout {mark['liveness_timeout_ms']} ms)"
        component = (
            "cluster backup" if mark["component_type"] == ClusterComponentType.BACKUP.name else "consensus module"
        )
        lines += [
            f"{component} in {node['cluster_dir']}: {mark['state']}",
            f"  pid             {mark['pid']} ({'running' if mark['pid_exists'] else 'not running'})",
            f"  member id       {mark['member_id']}, cluster id {mark['cluster_id']}",
            f"  component       {mark['component_type']}, mark file version {mark['version']}"
            f"{'' if mark['ready'] else ' (not ready)'}",
            f"  started         {mark['start_time']}",
            f"  activity        {activity}",
            f"  ingress         {mark['ingress_channel'] or '(none)'} stream {mark['ingress_stream_id']}",
            f"  aeron dir       {mark['aeron_directory']}",
            f"  error log       {mark['error_count']} distinct error{'' if mark['error_count'] == 1 else 's'}",
        ]
    counters = node["counters"]
    if counters is not None:
        lines += [
            f"  state           {counters['module_state_name']}, role {counters['role_name']}, "
            f"election {counters['election_state_name']}, control toggle {counters['control_toggle_name']}",
            f"  log             commit position {counters['commit_position']}, "
            f"leadership term {counters['leadership_term_id']}",
            f"  sessions        {counters['sessions']} open, {counters['timers']} timers",
            f"  counters        {_plural(counters['snapshot_count'], 'snapshot')} taken, "
            f"{_plural(counters['errors'], 'error')}, {_plural(counters['invalid_requests'], 'invalid request')}",
        ]
    elif node.get("backup") is not None:
        backup = node["backup"]
        deadline = backup["next_query_deadline_ms"]
        due = "-" if not deadline else f"in {max(0, deadline - epoch_ms())} ms"
        lines += [
            f"  backup          state {backup['state_name']}, live log position {backup['live_log_position']}",
            f"  counters        next query {due}, {_plural(backup['snapshots_retrieved'], 'snapshot retrieval')}, "
            f"{_plural(backup['errors'], 'error')}",
        ]
    elif node["counters_note"]:
        lines.append(f"  counters        none: {node['counters_note']}")
    log = node["recording_log"]
    if log is None:
        lines.append("  recording log   none")
    else:
        lines.append(
            f"  recording log   {log['entries']} entr{'y' if log['entries'] == 1 else 'ies'}: "
            f"{log['terms']} term{'' if log['terms'] == 1 else 's'}, "
            f"{log['snapshots']} snapshot entr{'y' if log['snapshots'] == 1 else 'ies'}"
            + (f", {log['invalid_entries']} invalid" if log["invalid_entries"] else "")
        )
        if log["latest_term"] is not None:
            term = log["latest_term"]
            lines.append(
                f"  latest term     {term['leadership_term_id']} from log position {term['term_base_log_position']}"
                f" (recording {term['recording_id']}, "
                f"{'open' if term['log_position'] == LOG_NULL_POSITION else 'ends at ' + str(term['log_position'])})"
            )
        if log["latest_snapshot"] is not None:
            lines.append(f"  latest snapshot {_format_entry_short(log['latest_snapshot'])}")
        if log["torn_tail"]:
            lines.append(f"  note            torn tail: {log['torn_tail']}")
    for service in node["services"]:
        if "error" in service:
            lines.append(f"  service {service['service_id']}       {service['error']}")
        else:
            lines.append(
                f"  service {service['service_id']}       {service['service_name'] or '(unnamed)'} pid {service['pid']}: "
                f"{service['state']}, {service['error_count']} error{'' if service['error_count'] == 1 else 's'}"
            )
    return lines


def format_cluster_describe(document: dict[str, Any]) -> str:
    return _render_nodes(document, _render_describe_node)


def format_cluster_members(document: dict[str, Any]) -> str:
    rows = []
    for node in document["nodes"]:
        if "error" in node:
            rows.append((node["node"], "-", "-", "-", "-", "-", f"cluster-tool: {node['error']}"))
            continue
        if node.get("is_backup"):
            backup = node.get("backup")
            state = f"BACKUP {backup['state_name']}" if backup else ("BACKUP" if node["running"] else "not running")
            position = "-" if not backup or backup["live_log_position"] is None else str(backup["live_log_position"])
            rows.append((node["node"], "-", state, "no", "-", position, "(a backup: live log position)"))
            continue
        rows.append(
            (
                node["node"],
                str(node["member_id"]),
                node["role_name"] or ("-" if node["running"] else "not running"),
                "yes" if node["leader"] else "no",
                "-" if node["leadership_term_id"] is None else str(node["leadership_term_id"]),
                "-" if node["commit_position"] is None else str(node["commit_position"]),
                node["ingress_channel"] or "(none)",
            )
        )
    titles = ("node", "member", "role", "leader", "term", "commit-pos", "ingress")
    widths = [max(len(row[column]) for row in [titles, *rows]) for column in range(len(titles))]
    right = {1, 4, 5}
    lines = []
    for row in [titles, *rows]:
        cells = [
            cell
            if column == len(row) - 1
            else cell.rjust(widths[column])
            if column in right
            else cell.ljust(widths[column])
            for column, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _render_recording_log_node(node: dict[str, Any]) -> list[str]:
    entries = node["entries"]
    lines = [f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} in {node['path']}"]
    if entries:
        titles = ("index", "type", "recording", "term", "base", "log-pos", "service", "valid", "timestamp")
        rows = [
            (
                str(e["index"]),
                e["type"],
                str(e["recording_id"]),
                str(e["leadership_term_id"]),
                str(e["term_base_log_position"]),
                str(e["log_position"]),
                str(e["service_id"]),
                "yes" if e["valid"] else "no",
                f"{e['timestamp']} {e['time']}"
                + (f" endpoint {e['archive_endpoint']}" if e["archive_endpoint"] else ""),
            )
            for e in entries
        ]
        widths = [max(len(row[column]) for row in [titles, *rows]) for column in range(len(titles))]
        left = {1, 7}
        for row in [titles, *rows]:
            cells = [
                cell
                if column == len(row) - 1
                else cell.ljust(widths[column])
                if column in left
                else cell.rjust(widths[column])
                for column, cell in enumerate(row)
            ]
            lines.append("  ".join(cells).rstrip())
    if node["torn_tail"]:
        lines.append(f"note: torn tail (not repaired: the file is only read): {node['torn_tail']}")
    return lines


def _render_errors_node(node: dict[str, Any]) -> list[str]:
    lines = []
    for file in node["files"]:
        errors = file["errors"]
        if not errors:
            lines.append(f"{file['component']}: no errors in {file['path']}")
            continue
        listed = format_error_list(errors, f"in {file['path']} (pid {file['pid']})", indent="  ")
        lines.append(f"{file['component']}: {listed[0]}")
        lines.extend(listed[1:])
    return lines


_MARK_FIELDS_SHOWN = (
    "component_type",
    "state",
    "version",
    "ready",
    "has_message_header",
    "pid",
    "pid_exists",
    "member_id",
    "cluster_id",
    "service_id",
    "candidate_term_id",
    "start_time",
    "activity_timestamp_ms",
    "activity_age_ms",
    "archive_stream_id",
    "service_stream_id",
    "consensus_module_stream_id",
    "ingress_stream_id",
    "aeron_directory",
    "control_channel",
    "ingress_channel",
    "service_name",
    "authenticator",
    "services_cluster_dir",
    "header_length",
    "error_buffer_length",
    "file_length",
    "error_count",
)


def _render_mark_file_node(node: dict[str, Any]) -> list[str]:
    lines = []
    for file in node["files"]:
        lines.append(f"{file['component']}: {file['path']}")
        width = max(len(name) for name in _MARK_FIELDS_SHOWN)
        lines.extend(f"  {name:<{width}}  {file[name]}" for name in _MARK_FIELDS_SHOWN)
    return lines


def _render_cluster_counters_node(node: dict[str, Any]) -> list[str]:
    if node["counters"] is None:
        return [f"no counters: {node['counters_note']}"]
    document = {"dir": node["driver_dir"], "driver_pid": node["driver_pid"], "counters": node["counters"]}
    return format_counters(document).splitlines()


# -- commands

cluster_dir_option = click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(path_type=Path),
    help="A node's cluster directory (cluster-mark.dat, recording.log), a node directory holding it as "
    "cluster/, or the base of a local cluster (node0/, node1/, ... each a node directory).",
)


@click.group(name="cluster")
def cluster_group() -> None:
    """Inspect and operate a cluster, like Aeron's ClusterTool.

    --dir is a node's cluster directory (holding cluster-mark.dat and
    recording.log), a node directory holding it as cluster/, or the base of a
    local cluster whose node directories are node0/, node1/, ...  Given a
    base, read commands show every node, and the operations (snapshot,
    suspend, resume, shutdown, abort) act on the leader: the running node
    whose role counter says LEADER.  The node's counters are read from its
    media driver's cnc.dat, found through the mark file's aeron directory.

    Read commands change nothing and work on a stopped node's files
    (recording-log, errors, mark-file fully; describe without counters),
    and exit 3 when a member's consensus module is not running.

    \b
    Exit codes: (as for every cluster-tool command: cluster-tool --help)
      0  ok (is-leader: the node is the leader)
      1  an operation that was refused (toggle not NEUTRAL, wrong module
         state) or did not complete within --timeout; is-leader when the
         node runs but is not the leader, an operation or is-leader on a
         base whose nodes all run and none leads
      3  not running: a node's consensus module is not running (the read
         commands still show its files); an operation or is-leader when no
         running leader is found and some node is not running
      4  no usable cluster files (no such directory, missing or corrupt mark
         file or recording log, unusable cnc.dat of a running node)
    """


@cluster_group.command(name="describe", short_help="Show mark file, recording log summary and counters.")
@cluster_dir_option
@json_option
def cluster_describe(directory: Path, as_json: bool) -> None:
    """Show each node's consensus module (pid, alive or not, member and
    cluster id, activity age, component), its recording log (terms, latest
    snapshot), its services' mark files and, while it runs, its counters:
    module state, role, election state, commit position, leadership term,
    sessions, timers, errors, snapshot count and control toggle.

    Exits 3 when a node's consensus module is not running (the files are
    still described).
    """
    now_ms = epoch_ms()
    document = _read_cluster(directory, lambda node: cluster_describe_node(node, now_ms))
    _cluster_emit(document, as_json, format_cluster_describe)


@cluster_group.command(name="pid", short_help="Print the consensus module's pid.")
@cluster_dir_option
@json_option
def cluster_pid(directory: Path, as_json: bool) -> None:
    """Print the consensus module's pid from its mark file (for a base: a
    ``nodeN pid`` line per node).  Exits 3 if it is not running (the pid
    printed is then that of a process that has gone)."""
    now_ms = epoch_ms()
    document = _read_cluster(directory, lambda node: cluster_member_node(node, now_ms))

    def render(document: dict[str, Any]) -> str:
        nodes = document["nodes"]
        if document["layout"] != "base":
            return str(nodes[0]["pid"])
        return "\n".join(
            f"{node['node']} " + (f"error: {node['error']}" if "error" in node else str(node["pid"])) for node in nodes
        )

    _cluster_emit(document, as_json, render)


@cluster_group.command(name="list-members", short_help="List members: id, role, leader, ingress, commit position.")
@cluster_dir_option
@json_option
def cluster_list_members(directory: Path, as_json: bool) -> None:
    """One line per node: member id, role, whether it leads, leadership term,
    commit position and ingress channel (from its mark file).  Role, term and
    commit position come from the running module's counters ("-" when not
    running).  Exits 3 when a node is not running."""
    now_ms = epoch_ms()
    document = _read_cluster(directory, lambda node: cluster_member_node(node, now_ms))
    document["leader"] = next((node["node"] for node in document["nodes"] if node.get("leader")), None)
    _cluster_emit(document, as_json, format_cluster_members)


@cluster_group.command(name="is-leader", short_help="Exit 0 if the node is the leader, else 1 (3: not running).")
@cluster_dir_option
@json_option
def cluster_is_leader(directory: Path, as_json: bool) -> None:
    """Exit 0 if the node's running consensus module is the leader, 1 if it
    is not, 3 if it is not running, 4 if its files cannot be read.  For a
    base, exit 0 if some node leads, and say which."""
    now_ms = epoch_ms()
    document = _read_cluster(directory, lambda node: cluster_member_node(node, now_ms))
    leader = next((node for node in document["nodes"] if node.get("leader")), None)
    document["leader"] = None if leader is None else leader["node"]

    def render(document: dict[str, Any]) -> str:
        def line(node: dict[str, Any]) -> str:
            if "error" in node:
                return f"{node['node']}: cluster-tool: {node['error']}"
            if not node["running"]:
                return f"{node['node']}: not leader: the consensus module is {node['state']}"
            if node["leader"]:
                return f"{node['node']}: leader (member {node['member_id']}, term {node['leadership_term_id']})"
            return f"{node['node']}: not leader (role {node['role_name']}, member {node['member_id']})"

        return "\n".join(line(node) for node in document["nodes"])

    # No leader: because a node is not running (3) or unreadable (4), else the answer is no (1).
    _cluster_emit(document, as_json, render, 0 if leader is not None else cluster_exit_code(document) or EXIT_PROBLEM)


@cluster_group.command(name="recording-log", short_help="List every recording.log entry.")
@cluster_dir_option
@json_option
def cluster_recording_log(directory: Path, as_json: bool) -> None:
    """Every entry of recording.log in file order: index, type (TERM,
    SNAPSHOT, STANDBY_SNAPSHOT), recording id, leadership term, term base
    log position, log position (-1: the term is open), timestamp (cluster
    time, ms), service id (-1: the consensus module) and whether it is valid.

    The file is only read: a torn tail is reported, not cut away."""
    document = _read_cluster(directory, cluster_recording_log_node)
    _cluster_emit(document, as_json, lambda d: _render_nodes(d, _render_recording_log_node))


@cluster_group.command(
    name="rebuild-recording-log", short_help="Rewrite a stopped node's recording.log from its archive's log recording."
)
@click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(file_okay=False, dir_okay=True, path_type=Path),
    help="The node's cluster directory (recording.log, cluster-mark.dat).",
)
@archive_dir_option
@click.option(
    "--log-stream-id",
    type=int,
    default=cluster_protocol.LOG_STREAM_ID,
    show_default=True,
    help="The stream id of the cluster log in the archive.",
)
@click.option(
    "--recording-id",
    type=int,
    default=None,
    help="The log recording to use, if the archive holds more than one of the log stream.",
)
def cluster_rebuild_recording_log(
    directory: Path, archive_dir: Path, log_stream_id: int, recording_id: int | None
) -> None:
    """The repair for a lost or damaged recording.log (the consensus module
    refuses to start, saying the archive holds a log recording the recording
    log does not name).

    Reads the NewLeadershipTermEvent that opens each leadership term from the
    log recording's segment files and writes a recording.log with one TERM
    entry per term; the old file is kept as recording.log.damaged-<time>.  The
    new log names no snapshot, so the next start replays the whole recording
    (which must begin at position 0).  Run it with the consensus module and
    service stopped; the archive may be running (its files are only read).
    """
    mark_path = directory / CLUSTER_MARK_FILE_NAME
    liveness = read_liveness(mark_path)  # the head of the file only: a module starting now may be writing the rest
    if liveness is not None and liveness.is_active(epoch_ms()):
        fail(
            f"{mark_path}: the consensus module (pid {liveness.pid}) is running; stop it first",
            EXIT_CLUSTER_PROBLEM,
        )
    try:
        result = rebuild_recording_log(directory, archive_dir, log_stream_id, recording_id)
    except OSError as error:
        fail(f"cannot rebuild {directory / RECORDING_LOG_FILE_NAME}: {error}", EXIT_CLUSTER_UNREADABLE)
    except (RecordingLogRebuildError, RecordingLogError) as error:
        fail(f"cannot rebuild {directory / RECORDING_LOG_FILE_NAME}: {error}", EXIT_CLUSTER_PROBLEM)
    if result.kept_damaged_file is not None:
        click.echo(f"kept the old recording log as {result.kept_damaged_file}")
    terms = ", ".join(f"{t.leadership_term_id}@{t.term_base_log_position}" for t in result.terms)
    click.echo(
        f"rebuilt {directory / RECORDING_LOG_FILE_NAME} from log recording {result.recording_id} "
        f"(positions 0..{result.stop_position}): {len(result.terms)} TERM entries (term@base: {terms}); "
        f"the next start replays the whole recording"
    )


@cluster_group.command(name="errors", short_help="List the errors in the cluster mark files.")
@cluster_dir_option
@json_option
def cluster_errors(directory: Path, as_json: bool) -> None:
    """List the distinct errors the consensus module (cluster-mark.dat) and
    each service (cluster-mark-service-<id>.dat) recorded in their mark
    files, with counts and times (UTC)."""
    document = _read_cluster(directory, cluster_errors_node)
    _cluster_emit(document, as_json, lambda d: _render_nodes(d, _render_errors_node))


@cluster_group.command(name="mark-file", short_help="Show the decoded mark file headers.")
@cluster_dir_option
@json_option
def cluster_mark_file(directory: Path, as_json: bool) -> None:
    """Show the decoded header of cluster-mark.dat and of each service's
    cluster-mark-service-<id>.dat, with whether the owner is running."""
    now_ms = epoch_ms()
    document = _read_cluster(directory, lambda node: cluster_mark_file_node(node, now_ms))
    _cluster_emit(document, as_json, lambda d: _render_nodes(d, _render_mark_file_node))


@cluster_group.command(name="counters", short_help="List the cluster counters of the node's driver.")
@cluster_dir_option
@json_option
def cluster_counters(directory: Path, as_json: bool) -> None:
    """List the cluster counters (type ids 200-249, and fulmar's 1200-1204) in the node's media
    driver's cnc.dat (found through the mark file): id, type, value, label."""
    now_ms = epoch_ms()
    document = _read_cluster(directory, lambda node: cluster_counters_node(node, now_ms))
    _cluster_emit(document, as_json, lambda d: _render_nodes(d, _render_cluster_counters_node))


# -- operations


@dataclass(frozen=True)
class _Operation:
    toggle: ControlToggle
    from_states: tuple[ConsensusModuleState, ...]  # where the module acts on the toggle
    waits_for: str


_OPERATIONS: dict[str, _Operation] = {
    "snapshot": _Operation(
        ControlToggle.SNAPSHOT,
        (ConsensusModuleState.ACTIVE,),
        "the snapshot count to go up and the toggle to return to NEUTRAL",
    ),
    "suspend": _Operation(ControlToggle.SUSPEND, (ConsensusModuleState.ACTIVE,), "module state SUSPENDED"),
    "resume": _Operation(ControlToggle.RESUME, (ConsensusModuleState.SUSPENDED,), "module state ACTIVE"),
    "shutdown": _Operation(
        ControlToggle.SHUTDOWN, (ConsensusModuleState.ACTIVE,), "the consensus module to exit (after a snapshot)"
    ),
    "abort": _Operation(
        ControlToggle.ABORT,
        (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED),
        "the consensus module to exit",
    ),
    "standby-snapshot": _Operation(
        ControlToggle.STANDBY_SNAPSHOT,
        (ConsensusModuleState.ACTIVE, ConsensusModuleState.SUSPENDED),
        "the toggle to return to NEUTRAL (the request appended to the log)",
    ),
}


class ClusterOperationError(Exception):
    def __init__(self, message: str, code: int = EXIT_CLUSTER_PROBLEM) -> None:
        super().__init__(message)
        self.code = code


def _find_leader(directory: Path, now_ms: int) -> tuple[ClusterNode, ClusterMarkFileContents]:
    """The running leader under ``directory``; ``ClusterOperationError`` (exit 1 or 3) if none."""
    try:
        layout, nodes = resolve_cluster_nodes(directory)
    except ClusterReadError as error:
        raise ClusterOperationError(str(error), EXIT_CLUSTER_UNREADABLE) from None
    reasons = []
    codes = []  # why each node is not the leader: unreadable, not running, or a follower
    for node in nodes:
        try:
            contents, mark = _module_state(node, now_ms)
        except ClusterReadError as error:
            if len(nodes) == 1:
                raise ClusterOperationError(str(error), EXIT_CLUSTER_UNREADABLE) from None
            reasons.append(f"{node.name}: {error}")
            codes.append(EXIT_CLUSTER_UNREADABLE)
            continue
        counters, note = _live_counters(contents, mark)
        if counters is None:
            reasons.append(f"{node.name}: {note}")
            codes.append(EXIT_CLUSTER_NOT_RUNNING if not mark["running"] else EXIT_CLUSTER_UNREADABLE)
            continue
        if counters["role"] == ClusterRole.LEADER:
            return node, contents
        reasons.append(f"{node.name}: not the leader (role {counters['role_name']})")
        codes.append(0)
    code = worst(codes) or EXIT_CLUSTER_PROBLEM  # every node runs, and none leads: the answer is no
    if len(nodes) == 1:
        raise ClusterOperationError(reasons[0].split(": ", 1)[1] + f" in {nodes[0].cluster_dir}", code)
    raise ClusterOperationError(f"no running leader in {directory}: " + "; ".join(reasons), code)


def cluster_operate(directory: Path, name: str, timeout_s: float) -> str:
    """Set the leader's control toggle for ``name`` and wait for its effect; what happened.

    ``ClusterOperationError`` (with the exit code) if it is refused or does
    not complete in time.
    """
    operation = _OPERATIONS[name]
    node, contents = _find_leader(directory, epoch_ms())
    pid = contents.header.pid
    where = f"{node.name} (member {contents.header.member_id}, pid {pid})"
    try:
        with open_cnc(contents.header.aeron_directory) as cnc:
            return _toggle_and_wait(cnc, name, operation, contents, where, timeout_s)
    except CncError as error:
        raise ClusterOperationError(str(error), EXIT_CLUSTER_UNREADABLE) from None


def _toggle_and_wait(
    cnc: CncFile, name: str, operation: _Operation, contents: ClusterMarkFileContents, where: str, timeout_s: float
) -> str:
    pid = contents.header.pid
    counters = ModuleCounters(cnc, contents.header.cluster_id)
    toggle_type = cluster_protocol.CLUSTER_CONTROL_TOGGLE_TYPE_ID
    state_type = cluster_protocol.CONSENSUS_MODULE_STATE_TYPE_ID
    snapshot_type = cluster_protocol.SNAPSHOT_COUNTER_TYPE_ID
    if toggle_type not in counters.ids:
        raise ClusterOperationError(f"{where}: no control toggle counter in {cnc.path}")
    state = counters.value(state_type)
    if state not in operation.from_states:
        wanted = " or ".join(s.name for s in operation.from_states)
        raise ClusterOperationError(
            f"{where}: the consensus module is {_enum_name(ConsensusModuleState, state)}, "
            f"not {wanted}: it would not act on {operation.toggle.name}"
        )
    snapshots_before = counters.value(snapshot_type) or 0
    if not counters.compare_and_set(toggle_type, ControlToggle.NEUTRAL, operation.toggle):
        current = counters.value(toggle_type)
        raise ClusterOperationError(
            f"{where}: the control toggle is {_enum_name(ControlToggle, current)}, not NEUTRAL"
            + (
                ": another operation is under way"
                if current != ControlToggle.INACTIVE
                else ": the node is not ready (an election is under way)"
            )
        )
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        if name in ("shutdown", "abort"):
            if not process_exists(pid):
                return f"{name}: the consensus module of {where} exited after {time.monotonic() - started:.2f} s"
        else:
            if not process_exists(pid):
                raise ClusterOperationError(f"{name}: the consensus module of {where} exited")
            toggle = counters.value(toggle_type)
            state = counters.value(state_type)
            if name == "snapshot":
                count = counters.value(snapshot_type) or 0
                if count > snapshots_before and toggle == ControlToggle.NEUTRAL:
                    return (
                        f"snapshot taken by {where}: snapshot count {snapshots_before} -> {count} "
                        f"in {time.monotonic() - started:.2f} s"
                    )
            elif name == "suspend" and state == ConsensusModuleState.SUSPENDED and toggle != operation.toggle:
                return f"suspended {where} in {time.monotonic() - started:.2f} s"
            elif name == "resume" and state == ConsensusModuleState.ACTIVE and toggle != operation.toggle:
                return f"resumed {where} in {time.monotonic() - started:.2f} s"
            elif name == "standby-snapshot" and toggle == ControlToggle.NEUTRAL:
                return (
                    f"standby snapshot requested by {where}: a SNAPSHOT with the standby flag is in the log "
                    f"({time.monotonic() - started:.2f} s); the members take no snapshot on it"
                )
        if time.monotonic() > deadline:
            withdrawn = ""
            if counters.value(state_type) in operation.from_states and counters.compare_and_set(
                toggle_type, operation.toggle, ControlToggle.NEUTRAL
            ):
                withdrawn = "; the request was withdrawn (toggle back to NEUTRAL)"
            raise ClusterOperationError(
                f"{name}: {where} did not complete within {timeout_s:g} s (waiting for {operation.waits_for}; "
                f"module state {_enum_name(ConsensusModuleState, counters.value(state_type))}, "
                f"control toggle {_enum_name(ControlToggle, counters.value(toggle_type))}){withdrawn}"
            )
        time.sleep(_OPERATION_POLL_S)


timeout_option = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=30.0,
    metavar="SECONDS",
    help="How long to wait for the operation to take effect.",
)


def _operation_command(name: str, summary: str, description: str) -> None:
    @cluster_group.command(name=name, short_help=summary, help=description)
    @cluster_dir_option
    @timeout_option
    def command(directory: Path, timeout_s: float) -> None:
        try:
            click.echo(cluster_operate(directory, name, timeout_s))
        except ClusterOperationError as error:
            fail(str(error), error.code)


_OPERATION_HELP_TAIL = (
    "\n\nSets the leader's cluster control toggle from NEUTRAL with a compare-and-set "
    "(exit 1, saying what it is, if it is not NEUTRAL) and waits up to --timeout for the effect "
    "(exit 1 if it does not come).  Exit 3 if no running leader is found."
)
_operation_command(
    "snapshot",
    "Take a snapshot on the leader and wait for it.",
    "Ask the leader to take a snapshot (SNAPSHOT=4); done when its snapshot count goes up and the "
    "toggle is back to NEUTRAL.  The snapshot shows in recording-log." + _OPERATION_HELP_TAIL,
)
_operation_command(
    "suspend",
    "Suspend the cluster: no client messages go into the log.",
    "Ask the leader to suspend (SUSPEND=2): client messages wait in the ingress until resume.  "
    "Done when the module state is SUSPENDED." + _OPERATION_HELP_TAIL,
)
_operation_command(
    "resume",
    "Resume a suspended cluster.",
    "Ask a suspended leader to resume (RESUME=3).  Done when the module state is ACTIVE." + _OPERATION_HELP_TAIL,
)
_operation_command(
    "shutdown",
    "Snapshot, then stop the cluster in order.",
    "Ask the leader for an orderly stop (SHUTDOWN=5): a snapshot, the services stop at the same log "
    "position, the module exits.  Done when the consensus module's process is gone." + _OPERATION_HELP_TAIL,
)
_operation_command(
    "abort",
    "Stop the cluster without a snapshot.",
    "Ask the leader to stop without a snapshot (ABORT=6): the services stop at the current log position, "
    "the module exits.  Done when the consensus module's process is gone." + _OPERATION_HELP_TAIL,
)
_operation_command(
    "standby-snapshot",
    "Ask standby members for a snapshot (in the log; members take none).",
    "Ask the leader to append a SNAPSHOT action with the standby flag (STANDBY_SNAPSHOT=7, seed 004): "
    "a standby member would take a snapshot at that log position; the cluster's own members and services "
    "go on without one.  Done when the toggle is back to NEUTRAL." + _OPERATION_HELP_TAIL,
)


def is_cluster_dir(directory: Path) -> bool:
    """A cluster directory, a node directory or a local cluster's base (not a driver's)."""
    if (directory / "cnc.dat").exists():
        return False
    return any((directory / name).exists() for name in ("cluster-mark.dat", "recording.log", "cluster", "node0"))
