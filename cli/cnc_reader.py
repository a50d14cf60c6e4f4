"""Read a node's state out of its driver's cnc.dat, as plain data.

Everything here returns dicts and lists that ``json.dumps`` accepts; the
commands only format them.  Reading never writes to the file and never needs
the driver to be running: a stopped node's leftover cnc.dat still holds its
last counter values and its error log, which is what one wants to look at
after a crash.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

from fulmar.cnc import VERSION_OFFSET, CncError, CncFile
from fulmar.counters import CountersReader
from fulmar.driver.counters import (
    CLIENT_HEARTBEAT_TYPE_ID,
    PUBLISHER_LIMIT_TYPE_ID,
    PUBLISHER_POSITION_TYPE_ID,
    RECEIVER_HWM_TYPE_ID,
    RECEIVER_POSITION_TYPE_ID,
    SENDER_BPE_TYPE_ID,
    SENDER_POSITION_TYPE_ID,
    SUBSCRIBER_POSITION_TYPE_ID,
    SYSTEM_COUNTER_TYPE_ID,
)
from fulmar.error_log import ErrorObservation, read_error_log
from fulmar.ring_buffer import ManyToOneRingBuffer

# Short names for counter type ids, as the counter labels abbreviate them.
# Components that allocate counters of their own (archive, consensus module,
# service) add their type ids here.
COUNTER_TYPE_NAMES: dict[int, str] = {
    SYSTEM_COUNTER_TYPE_ID: "system",
    PUBLISHER_LIMIT_TYPE_ID: "pub-lmt",
    SENDER_POSITION_TYPE_ID: "snd-pos",
    RECEIVER_HWM_TYPE_ID: "rcv-hwm",
    SUBSCRIBER_POSITION_TYPE_ID: "sub-pos",
    RECEIVER_POSITION_TYPE_ID: "rcv-pos",
    CLIENT_HEARTBEAT_TYPE_ID: "client-heartbeat",
    PUBLISHER_POSITION_TYPE_ID: "pub-pos",
    SENDER_BPE_TYPE_ID: "snd-bpe",
}


def iso_utc(timestamp_ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC, e.g. ``2026-11-22T06:51:53.123Z``.

    A value no clock produces (a corrupt or zeroed field of a dead node's
    file) is shown as the raw number instead of failing the whole listing.
    """
    try:
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=timestamp_ms)
    except OverflowError:
        return f"<invalid timestamp {timestamp_ms} ms>"
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@contextmanager
def open_cnc(directory: str | Path) -> Iterator[CncFile]:
    """Map the cnc.dat in ``directory`` for the duration of the block.

    Raises ``CncError`` when there is no usable cnc.dat (no driver ever ran
    there, it is still being created, or it is of another version); a
    permission problem is reported the same way, since for the caller both
    mean "cannot inspect this directory".
    """
    try:
        cnc = CncFile.open(directory)
    except PermissionError as error:
        raise CncError(f"cannot open {Path(directory) / 'cnc.dat'}: {error.strerror}") from None
    try:
        yield cnc
    finally:
        cnc.close()


def read_counters(cnc: CncFile) -> list[dict[str, Any]]:
    """Every allocated counter, in id order."""
    reader = CountersReader(cnc.counters_metadata, cnc.counters_values)
    return [
        {
            "id": counter.counter_id,
            "type_id": counter.type_id,
            "type": COUNTER_TYPE_NAMES.get(counter.type_id),
            "label": counter.label,
            "value": reader.counter_value(counter.counter_id),
            "registration_id": reader.counter_registration_id(counter.counter_id),
        }
        for counter in reader
    ]


def read_errors(cnc: CncFile) -> list[dict[str, Any]]:
    """The distinct errors, oldest first.

    ``CorruptErrorLogError`` if the log holds a record no writer produces.
    """
    return error_documents(read_error_log(cnc.error_log))


def error_documents(errors: Iterable[ErrorObservation]) -> list[dict[str, Any]]:
    """Distinct errors as the tools print them and put in their JSON (the
    driver's, an archive's and a cluster component's error logs alike)."""
    return [
        {
            "observation_count": error.observation_count,
            "first_observation_timestamp_ms": error.first_observation_timestamp,
            "last_observation_timestamp_ms": error.last_observation_timestamp,
            "first_observation": iso_utc(error.first_observation_timestamp),
            "last_observation": iso_utc(error.last_observation_timestamp),
            "text": error.text,
        }
        for error in errors
    ]


def process_exists(pid: int) -> bool:
    """True if ``pid`` is a running process (a zombie has finished running).

    On Linux one read of ``/proc/<pid>/stat`` (its state follows the command
    name's closing parenthesis) answers it: a tenth of what psutil's process
    object costs, and a metrics scrape asks it for every process of the node.
    """
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except FileNotFoundError:
        return False
    except OSError:
        stat = b""  # no /proc (another system), or no access: psutil knows how
    end = stat.rfind(b")")
    if end > 0 and len(stat) > end + 2:
        return stat[end + 2 : end + 3] != b"Z"
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def read_driver_status(cnc: CncFile, now_ms: int) -> dict[str, Any]:
    """Who the driver is and whether it is alive.

    Alive means what clients and a starting driver check: the process exists
    and the driver updated its heartbeat (the to-driver ring buffer's consumer
    heartbeat) within the client liveness timeout.
    """
    pid = cnc.pid
    heartbeat_ms = ManyToOneRingBuffer(cnc.to_driver).consumer_heartbeat_time
    # The driver rounds its clock through a float: its heartbeat can read a
    # millisecond ahead of ours.
    heartbeat_age_ms = max(0, now_ms - heartbeat_ms)
    liveness_timeout_ms = cnc.client_liveness_timeout_ns // 1_000_000
    pid_exists = process_exists(pid)
    version = cnc.header.get_int32_volatile(VERSION_OFFSET)
    layout = cnc.layout
    return {
        "dir": str(cnc.path.parent),
        "pid": pid,
        "pid_exists": pid_exists,
        "alive": pid_exists and heartbeat_age_ms <= liveness_timeout_ms,
        "start_timestamp_ms": cnc.start_timestamp_ms,
        "start_time": iso_utc(cnc.start_timestamp_ms),
        "heartbeat_timestamp_ms": heartbeat_ms,
        "heartbeat_age_ms": heartbeat_age_ms,
        "client_liveness_timeout_ms": liveness_timeout_ms,
        "cnc_version": f"{version >> 16}.{(version >> 8) & 0xFF}.{version & 0xFF}",
        "cnc_file_length": cnc.mapped.length,
        "buffers": {
            "to_driver": layout.to_driver_length,
            "to_clients": layout.to_clients_length,
            "counters_metadata": layout.counters_metadata_length,
            "counters_values": layout.counters_values_length,
            "error_log": layout.error_log_length,
        },
    }
