"""``cluster-tool``: inspect a node from outside, through its driver's cnc.dat.

Reading needs no running driver: a stopped node's leftover files still show
its last counters and errors.  Exit codes: 0 ok; 1 no (usable) driver files
in the directory; 3 (``driver`` only) the files are there but the driver is
not alive.

``cluster-tool archive ...`` does the same for an archive directory (Aeron's
ArchiveTool): mark file, catalog, segment files and error log, read without
writing a byte, whether or not an archive runs there.  Exit codes: 0 ok; 1 no
usable archive files (missing, unreadable or corrupt catalog or mark file),
an unknown ``--id``, or (``verify``) problems found; 3 (``archive describe``
only) the files are there but no archive is running.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from fulmar.archive.catalog import (
    CATALOG_FILE_NAME,
    CATALOG_HEADER_LENGTH,
    DESCRIPTOR_HEADER_LENGTH,
    NULL_POSITION,
    NULL_TIMESTAMP,
    RECORDED_POSITION_OFFSET,
    Catalog,
    RecordingDescriptor,
    missing_segment_files,
)
from fulmar.archive.errors import ArchiveError, CatalogError, describe_os_error
from fulmar.archive.mark_file import LIVENESS_TIMEOUT_MS_DEFAULT, MARK_FILE_NAME, read_mark_file
from fulmar.archive.segment import SEGMENT_SUFFIX
from fulmar.buffers import AtomicBuffer
from fulmar.cnc import CncError
from fulmar.codecs.generated.archive import RecordingState
from fulmar.codecs.generated.archive_mark import MarkFileHeaderDecoder
from fulmar.error_log import CorruptErrorLogError, read_error_log
from fulmar.errors import CodecError

from fulmar.cli.cnc_reader import (
    epoch_ms,
    iso_utc,
    open_cnc,
    process_exists,
    read_counters,
    read_driver_status,
    read_errors,
)
from fulmar.cli.options import driver_dir_option, resolve_driver_dir

EXIT_NO_DRIVER = 1
EXIT_DRIVER_NOT_ALIVE = 3

# ANSI: clear the screen, cursor to the top left.
CLEAR_SCREEN = "\033[2J\033[1;1H"

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
def main() -> None:
    """Inspect a fulmar node through its media driver's cnc.dat.

    Works on a stopped node's leftover files too.  Exit codes: 0 ok; 1 no
    usable cnc.dat in the directory; 3 (driver) the driver is not alive.
    The archive commands (cluster-tool archive --help) read an archive
    directory the same way.
    """


def _fail(message: str, code: int = EXIT_NO_DRIVER) -> NoReturn:
    click.echo(f"cluster-tool: {message}", err=True)
    sys.exit(code)


# ---------------------------------------------------------------------- counters


def counters_document(directory: str) -> dict[str, Any]:
    """``{"dir", "driver_pid", "counters": [...]}``; ``CncError`` without driver files."""
    with open_cnc(directory) as cnc:
        return {"dir": str(directory), "driver_pid": cnc.pid, "counters": read_counters(cnc)}


def format_counters(document: dict[str, Any]) -> str:
    counters = document["counters"]
    lines = [f"driver pid {document['driver_pid']} in {document['dir']}: {len(counters)} counters"]
    value_width = max([len("value")] + [len(str(counter["value"])) for counter in counters])
    lines.append(f"{'id':>4}  {'type':<22}  {'value':>{value_width}}  label")
    for counter in counters:
        kind = f"{counter['type_id']}" + (f" {counter['type']}" if counter["type"] else "")
        lines.append(f"{counter['id']:>4}  {kind:<22}  {counter['value']:>{value_width}}  {counter['label']}")
    return "\n".join(lines)


@main.command()
@driver_dir_option
@click.option(
    "--watch",
    type=click.FloatRange(min=0.05),
    default=None,
    metavar="SECONDS",
    help="Refresh every SECONDS until Ctrl-C (with --json: one JSON document per line); "
    "while the directory holds no driver, show why and keep trying.",
)
@json_option
def counters(directory: str | None, watch: float | None, as_json: bool) -> None:
    """List every allocated counter: id, type, value and label."""
    path = str(resolve_driver_dir(directory))
    if watch is None:
        try:
            document = counters_document(path)
        except CncError as error:
            _fail(str(error))
        click.echo(json.dumps(document) if as_json else format_counters(document))
        return
    _watch(path, counters_document, format_counters, watch, as_json)


def _watch(
    directory: str,
    read: Callable[[str], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    interval_s: float,
    as_json: bool,
) -> None:
    """Redraw ``render(read())`` every interval until Ctrl-C.

    On a terminal the screen is cleared and redrawn in one write (no flicker);
    piped, the refreshes follow each other, each starting with its header.
    """
    try:
        while True:
            try:
                document = read(directory)
                text = json.dumps(document) if as_json else render(document)
            except CncError as error:
                # A node being restarted: its directory comes back shortly.
                text = json.dumps({"dir": directory, "error": str(error)}) if as_json else f"cluster-tool: {error}"
            if not as_json and sys.stdout.isatty():
                text = CLEAR_SCREEN + text
            click.echo(text)
            sys.stdout.flush()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, and keep Python
        # from reporting the flush of the dead pipe at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


# ---------------------------------------------------------------------- errors


def errors_document(directory: str) -> dict[str, Any]:
    """``{"dir", "driver_pid", "errors": [...]}``; ``CncError`` without driver files."""
    with open_cnc(directory) as cnc:
        return {"dir": str(directory), "driver_pid": cnc.pid, "errors": read_errors(cnc)}


def format_errors(document: dict[str, Any]) -> str:
    errors = document["errors"]
    if not errors:
        return f"no errors in {document['dir']}"
    noun = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} distinct {noun} in {document['dir']} (driver pid {document['driver_pid']})"]
    for error in errors:
        count = error["observation_count"]
        lines.append(
            f"{count} observation{'' if count == 1 else 's'} "
            f"from {error['first_observation']} to {error['last_observation']}:"
        )
        # Texts may span lines (stack traces): indent them all under the header.
        lines.extend(f"    {line}" for line in error["text"].splitlines() or [""])
    return "\n".join(lines)


@main.command(short_help="List the distinct errors with counts and times.")
@driver_dir_option
@json_option
def errors(directory: str | None, as_json: bool) -> None:
    """List the distinct errors the driver recorded, with counts and times (UTC)."""
    path = str(resolve_driver_dir(directory))
    try:
        document = errors_document(path)
    except CncError as error:
        _fail(str(error))
    except CorruptErrorLogError as error:
        _fail(f"the error log in {path} is corrupt: {error}")
    click.echo(json.dumps(document) if as_json else format_errors(document))


# ---------------------------------------------------------------------- driver


def driver_document(directory: str) -> dict[str, Any]:
    with open_cnc(directory) as cnc:
        return read_driver_status(cnc, epoch_ms())


def format_driver(status: dict[str, Any]) -> str:
    state = "alive" if status["alive"] else "NOT ALIVE"
    process = "running" if status["pid_exists"] else "not running"
    buffers = ", ".join(f"{name} {length}" for name, length in status["buffers"].items())
    return "\n".join(
        [
            f"media driver in {status['dir']}: {state}",
            f"  pid            {status['pid']} ({process})",
            f"  started        {status['start_time']}",
            f"  heartbeat age  {status['heartbeat_age_ms']} ms "
            f"(liveness timeout {status['client_liveness_timeout_ms']} ms)",
            f"  cnc.dat        version {status['cnc_version']}, {status['cnc_file_length']} bytes",
            f"  buffers        {buffers}",
        ]
    )


@main.command(short_help="Show whether the driver is alive, its pid and buffers.")
@driver_dir_option
@json_option
def driver(directory: str | None, as_json: bool) -> None:
    """Show the driver's pid, start time, heartbeat age and buffer sizes.

    Exits 3 when the files are there but the driver is not alive (its process
    is gone or its heartbeat is older than the client liveness timeout).
    """
    path = str(resolve_driver_dir(directory))
    try:
        status = driver_document(path)
    except CncError as error:
        _fail(str(error))
    click.echo(json.dumps(status) if as_json else format_driver(status))
    if not status["alive"]:
        sys.exit(EXIT_DRIVER_NOT_ALIVE)


# ---------------------------------------------------------------------- archive
#
# Everything below reads an archive directory without writing to it: the
# catalog and the mark file are mapped copy-on-write from read-only file
# descriptors (MAP_PRIVATE), so not even a stray store could reach the files,
# and a live archive's directory can be inspected while it runs.

EXIT_ARCHIVE_PROBLEM = 1  # no usable archive files, unknown --id, or verify found problems
EXIT_ARCHIVE_NOT_RUNNING = 3

STOP_ACTIVE = "active"
STOP_OPEN = "open (archive not running)"

_SEGMENT_FILE_NAME = re.compile(r"^(\d+)-(\d+)" + re.escape(SEGMENT_SUFFIX) + "$")
_STATE_NAMES = {RecordingState.VALID: "valid", RecordingState.INVALID: "invalid", RecordingState.DELETED: "deleted"}


class ArchiveReadError(Exception):
    """The archive directory cannot be read; the message is one line that names the file."""


def _archive_fail(error: ArchiveReadError) -> NoReturn:
    _fail(str(error), EXIT_ARCHIVE_PROBLEM)


def _check_archive_dir(archive_dir: Path) -> None:
    if not archive_dir.is_dir():
        raise ArchiveReadError(f"{archive_dir}: no such directory")


@contextmanager
def open_catalog_read_only(archive_dir: Path) -> Iterator[Catalog]:
    """The catalog of ``archive_dir``, validated by the archive's own loader, never written.

    ``Catalog.open`` opens the file ``O_RDWR | O_CREAT``, maps it shared and
    writable and may grow it, so it is not used here.  The file is opened
    read-only and mapped copy-on-write (``ACCESS_COPY``: pages are shared with
    the file until written, and writes never reach it), and the catalog's own
    ``_load`` validates it entry by entry and builds the index, so queries
    decode exactly as the archive does.  (This reaches into private state;
    a ``Catalog.open_read_only`` in archive/catalog.py would make it clean.)
    """
    _check_archive_dir(archive_dir)
    path = archive_dir / CATALOG_FILE_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise ArchiveReadError(f"{path}: no catalog (not an archive directory?)") from None
    except OSError as error:
        raise ArchiveReadError(f"{path}: cannot open the catalog: {describe_os_error(error)}") from None
    catalog = Catalog(path, fd, 0, None)  # owns fd from here: close() closes it
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            raise ArchiveReadError(f"{path}: the catalog is empty (0 bytes; an archive died creating it?)")
        memory = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        catalog._mmap = memory
        catalog._atomic = AtomicBuffer(memory)
        catalog._capacity = size
        try:
            catalog._load(size)
        except (CatalogError, CodecError, ValueError, IndexError) as error:
            # CatalogError names the file and offset; the others are defence in depth.
            text = str(error) if isinstance(error, CatalogError) else f"{path}: corrupt catalog: {error}"
            raise ArchiveReadError(text) from None
        yield catalog
    except OSError as error:
        raise ArchiveReadError(f"{path}: cannot read the catalog: {describe_os_error(error)}") from None
    finally:
        catalog.close()


def _catalog_entries(catalog: Catalog) -> list[tuple[RecordingDescriptor, int]]:
    """Every entry (VALID, INVALID and DELETED) in id order, with its recorded position."""
    memory, _ = catalog._memory()
    entries = []
    offset = CATALOG_HEADER_LENGTH
    while offset < catalog._next_offset:  # every entry below it was validated by _load
        length = struct.unpack_from("<i", memory, offset)[0]
        recorded = struct.unpack_from("<q", memory, offset + RECORDED_POSITION_OFFSET)[0]
        entries.append((catalog._decode(offset), recorded))
        offset += DESCRIPTOR_HEADER_LENGTH + length
    return entries


def _catalog_version(catalog: Catalog) -> str:
    memory, _ = catalog._memory()
    version = struct.unpack_from("<i", memory, 0)[0]
    return f"{(version >> 16) & 0xFF}.{(version >> 8) & 0xFF}.{version & 0xFF}"


def _segment_files(archive_dir: Path) -> dict[int, list[tuple[int, str, int]]]:
    """recording id -> [(segment base position, file name, size in bytes)], in position order.

    One directory listing for all recordings (``segment.list_segment_files``
    lists the directory once per recording).
    """
    found: dict[int, list[tuple[int, str, int]]] = {}
    try:
        names = os.listdir(archive_dir)
    except OSError as error:
        raise ArchiveReadError(f"{archive_dir}: cannot list the directory: {describe_os_error(error)}") from None
    for name in names:
        match = _SEGMENT_FILE_NAME.match(name)
        if match is None:
            continue
        try:
            size = os.stat(archive_dir / name).st_size
        except OSError:
            continue  # deleted meanwhile (a purge on a live archive)
        found.setdefault(int(match.group(1)), []).append((int(match.group(2)), name, size))
    for files in found.values():
        files.sort()
    return found


def _mark_file_decoder(archive_dir: Path) -> tuple[MarkFileHeaderDecoder, int]:
    """The mark file's header and the file's length; ``ArchiveReadError`` if unusable."""
    path = archive_dir / MARK_FILE_NAME
    try:
        length = path.stat().st_size
        decoder = read_mark_file(archive_dir)
    except FileNotFoundError:
        raise ArchiveReadError(f"{path}: no mark file (no archive ever ran in {archive_dir}?)") from None
    except OSError as error:
        raise ArchiveReadError(f"{path}: cannot read the mark file: {describe_os_error(error)}") from None
    except (ArchiveError, CodecError, ValueError) as error:
        text = str(error) if isinstance(error, ArchiveError) else f"{path}: corrupt mark file: {error}"
        raise ArchiveReadError(text) from None
    if decoder.header_length <= 0 or decoder.error_buffer_length < 0 or decoder.error_buffer_length % 8:
        raise ArchiveReadError(
            f"{path}: corrupt mark file: header length {decoder.header_length}, "
            f"error buffer length {decoder.error_buffer_length}"
        )
    if decoder.header_length + decoder.error_buffer_length > length:
        raise ArchiveReadError(
            f"{path}: corrupt mark file: header ({decoder.header_length}) and error buffer "
            f"({decoder.error_buffer_length}) do not fit the {length}-byte file"
        )
    return decoder, length


def _read_archive_errors(archive_dir: Path, decoder: MarkFileHeaderDecoder) -> list[dict[str, Any]]:
    """The mark file's distinct error log, oldest first (mapped copy-on-write, never written)."""
    path = archive_dir / MARK_FILE_NAME
    if decoder.error_buffer_length == 0:
        return []
    try:
        with open(path, "rb") as file:
            memory = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as error:
        raise ArchiveReadError(f"{path}: cannot read the mark file: {describe_os_error(error)}") from None
    try:
        if decoder.header_length + decoder.error_buffer_length > len(memory):
            raise ArchiveReadError(f"{path}: corrupt mark file: the error buffer runs past the end of the file")
        buffer = AtomicBuffer(memory, decoder.header_length, decoder.error_buffer_length)
        try:
            return [
                {
                    "observation_count": error.observation_count,
                    "first_observation_timestamp_ms": error.first_observation_timestamp,
                    "last_observation_timestamp_ms": error.last_observation_timestamp,
                    "first_observation": iso_utc(error.first_observation_timestamp),
                    "last_observation": iso_utc(error.last_observation_timestamp),
                    "text": error.text,
                }
                for error in read_error_log(buffer)
            ]
        except (CorruptErrorLogError, ValueError) as error:
            raise ArchiveReadError(f"{path}: the error log is corrupt: {error}") from None
        finally:
            buffer.release()
    finally:
        memory.close()


def _mark_status(decoder: MarkFileHeaderDecoder, file_length: int, now_ms: int) -> dict[str, Any]:
    """Who owns the directory and whether it is alive, as a new archive judges it.

    Running means what ``ArchiveMarkFile.create`` refuses to start over: a
    fresh activity timestamp (within the default liveness timeout) *and* a
    pid that is a running process.  Version 0 means the archive had not
    signalled ready yet (starting, or it died starting).
    """
    version = decoder.version
    activity_ms = decoder.activity_timestamp
    age_ms = max(0, now_ms - activity_ms) if activity_ms > 0 else None
    pid = decoder.pid
    pid_exists = process_exists(pid)
    fresh = age_ms is not None and age_ms < LIVENESS_TIMEOUT_MS_DEFAULT
    running = fresh and pid_exists
    if running:
        state = "running" if version != 0 else "starting (not ready yet)"
    elif activity_ms == 0:
        state = "not running (closed cleanly)"
    elif not pid_exists:
        state = f"not running (pid {pid} is gone)"
    else:
        state = f"not running (no activity for {age_ms} ms)"
    return {
        "running": running,
        "state": state,
        "version": f"{(version >> 16) & 0xFF}.{(version >> 8) & 0xFF}.{version & 0xFF}",
        "ready": version != 0,
        "pid": pid,
        "pid_exists": pid_exists,
        "archive_id": decoder.archive_id,
        "start_timestamp_ms": decoder.start_timestamp,
        "start_time": iso_utc(decoder.start_timestamp),
        "activity_timestamp_ms": activity_ms,
        "activity_age_ms": age_ms,
        "liveness_timeout_ms": LIVENESS_TIMEOUT_MS_DEFAULT,
        "control_channel": decoder.control_channel,
        "control_stream_id": decoder.control_stream_id,
        "local_control_channel": decoder.local_control_channel,
        "local_control_stream_id": decoder.local_control_stream_id,
        "events_channel": decoder.events_channel,
        "events_stream_id": decoder.events_stream_id,
        "aeron_directory": decoder.aeron_directory,
        "header_length": decoder.header_length,
        "error_buffer_length": decoder.error_buffer_length,
        "file_length": file_length,
    }


def _liveness(archive_dir: Path, now_ms: int) -> tuple[dict[str, Any] | None, str | None]:
    """The mark file's status (None without a mark file) and why it could not be read, if so.

    For the commands that need only "is an archive running": a missing or
    broken mark file means no archive can be running there (a starting
    archive rewrites it before anything else).
    """
    try:
        decoder, length = _mark_file_decoder(archive_dir)
    except ArchiveReadError as error:
        if not (archive_dir / MARK_FILE_NAME).exists():
            return None, None
        return None, str(error)
    return _mark_status(decoder, length, now_ms), None


def _recording_document(
    descriptor: RecordingDescriptor,
    recorded_position: int,
    segments: list[tuple[int, str, int]],
    archive_running: bool,
) -> dict[str, Any]:
    if descriptor.state != RecordingState.VALID:
        stop = "-"
    elif descriptor.stop_position == NULL_POSITION:
        stop = STOP_ACTIVE if archive_running else STOP_OPEN
    else:
        stop = str(descriptor.stop_position)
    stop_ms = descriptor.stop_timestamp
    return {
        "recording_id": descriptor.recording_id,
        "state": _STATE_NAMES[descriptor.state],
        "start_position": descriptor.start_position,
        "stop_position": None if descriptor.stop_position == NULL_POSITION else descriptor.stop_position,
        "stop": stop,
        "recorded_position": None if recorded_position == NULL_POSITION else recorded_position,
        "start_timestamp_ms": descriptor.start_timestamp,
        "start_time": iso_utc(descriptor.start_timestamp),
        "stop_timestamp_ms": None if stop_ms == NULL_TIMESTAMP else stop_ms,
        "stop_time": None if stop_ms == NULL_TIMESTAMP else iso_utc(stop_ms),
        "stream_id": descriptor.stream_id,
        "session_id": descriptor.session_id,
        "initial_term_id": descriptor.initial_term_id,
        "term_buffer_length": descriptor.term_buffer_length,
        "segment_file_length": descriptor.segment_file_length,
        "mtu_length": descriptor.mtu_length,
        "control_session_id": descriptor.control_session_id,
        "correlation_id": descriptor.correlation_id,
        "channel": descriptor.original_channel,
        "stripped_channel": descriptor.stripped_channel,
        "source_identity": descriptor.source_identity,
        "segment_files": len(segments),
        "segment_bytes": sum(size for _, _, size in segments),
    }


def archive_describe_document(archive_dir: Path, now_ms: int) -> dict[str, Any]:
    """Mark file, catalog header and counts; ``ArchiveReadError`` if unusable."""
    _check_archive_dir(archive_dir)
    mark: dict[str, Any] | None = None
    if (archive_dir / MARK_FILE_NAME).exists():
        decoder, length = _mark_file_decoder(archive_dir)
        mark = _mark_status(decoder, length, now_ms)
        try:
            mark["error_count"] = len(_read_archive_errors(archive_dir, decoder))
        except ArchiveReadError:
            mark["error_count"] = None  # `archive errors` reports why
    with open_catalog_read_only(archive_dir) as catalog:
        entries = _catalog_entries(catalog)
        catalog_document = {
            "path": str(catalog.path),
            "file_length": catalog.capacity,
            "version": _catalog_version(catalog),
            "alignment": catalog.alignment,
            "next_recording_id": catalog.next_recording_id,
            "entries": len(entries),
        }
    running = mark is not None and mark["running"]
    segments = _segment_files(archive_dir)
    states = [descriptor.state for descriptor, _ in entries]
    valid = [descriptor for descriptor, _ in entries if descriptor.state == RecordingState.VALID]
    unstopped = sum(1 for descriptor in valid if descriptor.stop_position == NULL_POSITION)
    valid_ids = {descriptor.recording_id for descriptor in valid}
    counts = {
        "valid": len(valid),
        "invalid": states.count(RecordingState.INVALID),
        "deleted": states.count(RecordingState.DELETED),
        "stopped": len(valid) - unstopped,
        "active": unstopped if running else 0,
        "open": 0 if running else unstopped,
        "segment_files": sum(len(files) for files in segments.values()),
        "segment_bytes": sum(size for files in segments.values() for _, _, size in files),
        "orphan_segment_files": sum(len(files) for rid, files in segments.items() if rid not in valid_ids),
    }
    return {"dir": str(archive_dir), "running": running, "mark_file": mark, "catalog": catalog_document, "counts": counts}


def format_archive_describe(document: dict[str, Any]) -> str:
    mark = document["mark_file"]
    catalog = document["catalog"]
    counts = document["counts"]
    state = mark["state"] if mark is not None else "not running (no mark file)"
    lines = [f"archive in {document['dir']}: {state}"]
    if mark is not None:
        process = "running" if mark["pid_exists"] else "not running"
        if mark["activity_timestamp_ms"] == 0:
            activity = "0 (closed cleanly)"
        else:
            activity = f"{mark['activity_age_ms']} ms ago (liveness timeout {mark['liveness_timeout_ms']} ms)"
        errors = mark["error_count"]
        lines += [
            f"  mark file      version {mark['version']}{'' if mark['ready'] else ' (not ready)'}, "
            f"{mark['file_length']} bytes",
            f"  pid            {mark['pid']} ({process})",
            f"  archive id     {mark['archive_id']}",
            f"  started        {mark['start_time']}",
            f"  activity       {activity}",
            f"  control        {mark['control_channel'] or '(none)'} stream {mark['control_stream_id']}",
            f"  local control  {mark['local_control_channel'] or '(none)'} stream {mark['local_control_stream_id']}",
            f"  events         {mark['events_channel'] or '(none)'} stream {mark['events_stream_id']}",
            f"  aeron dir      {mark['aeron_directory']}",
            f"  error log      {'corrupt' if errors is None else errors} distinct "
            f"error{'' if errors == 1 else 's'} ({mark['error_buffer_length']}-byte buffer)",
        ]
    else:
        lines.append("  mark file      none")
    unstopped = f"{counts['active']} active" if document["running"] else f"{counts['open']} open"
    lines += [
        f"  catalog        version {catalog['version']}, alignment {catalog['alignment']}, "
        f"next recording id {catalog['next_recording_id']}, {catalog['entries']} "
        f"entr{'y' if catalog['entries'] == 1 else 'ies'}, {catalog['file_length']} bytes",
        f"  recordings     {counts['valid']} valid ({counts['stopped']} stopped, {unstopped}), "
        f"{counts['invalid']} invalid, {counts['deleted']} deleted",
        f"  segments       {counts['segment_files']} files, {counts['segment_bytes']} bytes"
        + (f" ({counts['orphan_segment_files']} of no valid recording)" if counts["orphan_segment_files"] else ""),
    ]
    return "\n".join(lines)


def archive_recordings_document(
    archive_dir: Path, now_ms: int, recording_id: int | None = None, include_all: bool = False
) -> dict[str, Any]:
    """The catalog's recordings; with ``recording_id`` just that one (in any state).

    ``LookupError`` if ``recording_id`` is not in the catalog.
    """
    _check_archive_dir(archive_dir)
    mark, mark_error = _liveness(archive_dir, now_ms)
    running = mark is not None and mark["running"]
    with open_catalog_read_only(archive_dir) as catalog:
        entries = _catalog_entries(catalog)
    if recording_id is not None:
        entries = [entry for entry in entries if entry[0].recording_id == recording_id]
        if not entries:
            raise LookupError(f"{archive_dir}: no recording {recording_id} in the catalog")
    elif not include_all:
        entries = [entry for entry in entries if entry[0].state == RecordingState.VALID]
    segments = _segment_files(archive_dir)
    return {
        "dir": str(archive_dir),
        "archive_running": running,
        "archive_pid": None if mark is None else mark["pid"],
        "mark_file_error": mark_error,
        "recordings": [
            _recording_document(descriptor, recorded, segments.get(descriptor.recording_id, []), running)
            for descriptor, recorded in entries
        ],
    }


def format_archive_recordings(document: dict[str, Any]) -> str:
    recordings = document["recordings"]
    running = "running" if document["archive_running"] else "not running"
    noun = "recording" if len(recordings) == 1 else "recordings"
    lines = [f"{len(recordings)} {noun} in {document['dir']} (archive {running})"]
    if not recordings:
        return lines[0]
    rows = [
        (
            str(r["recording_id"]),
            r["state"],
            str(r["start_position"]),
            r["stop"],
            r["start_time"],
            r["stop_time"] or "-",
            str(r["stream_id"]),
            str(r["session_id"]),
            str(r["segment_files"]),
            str(r["segment_bytes"]),
            r["channel"],
        )
        for r in recordings
    ]
    titles = ("id", "state", "start", "stop", "started", "stopped", "stream", "session", "segments", "bytes", "channel")
    right = {0, 2, 6, 7, 8, 9}
    widths = [max(len(row[column]) for row in [titles, *rows]) for column in range(len(titles))]

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell if column == len(row) - 1 else cell.rjust(widths[column]) if column in right else cell.ljust(widths[column])
            for column, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    lines.append(line(titles))
    lines.extend(line(row) for row in rows)
    return "\n".join(lines)


def archive_verify_document(archive_dir: Path, now_ms: int) -> dict[str, Any]:
    """Check every VALID recording's segment files between start and stop exist."""
    _check_archive_dir(archive_dir)
    mark, mark_error = _liveness(archive_dir, now_ms)
    running = mark is not None and mark["running"]
    problems: list[dict[str, Any]] = []
    notes: list[str] = []
    if running:
        assert mark is not None
        notes.append(
            f"a live archive (pid {mark['pid']}) owns the directory: it may change files while they are checked"
        )
    if mark_error is not None:
        notes.append(f"the mark file is unreadable ({mark_error}): the archive is taken as not running")
    with open_catalog_read_only(archive_dir) as catalog:
        valid = catalog.recordings()
    for descriptor in valid:
        if descriptor.stop_position == NULL_POSITION:
            if running:
                notes.append(f"recording {descriptor.recording_id} is active: its segment files are not checked")
            else:
                notes.append(
                    f"recording {descriptor.recording_id} is open (archive not running): the next archive start "
                    f"recovers it; its segment files are not checked"
                )
            continue
        for path in missing_segment_files(archive_dir, descriptor):
            problems.append(
                {"recording_id": descriptor.recording_id, "problem": "missing segment file", "path": path}
            )
    valid_ids = {descriptor.recording_id for descriptor in valid}
    orphans = sum(len(files) for rid, files in _segment_files(archive_dir).items() if rid not in valid_ids)
    if orphans:
        notes.append(f"{orphans} segment file{'' if orphans == 1 else 's'} of no valid recording (left by a purge?)")
    return {
        "dir": str(archive_dir),
        "archive_running": running,
        "recordings_checked": len(valid),
        "ok": not problems,
        "problems": problems,
        "notes": notes,
    }


def format_archive_verify(document: dict[str, Any]) -> str:
    problems = document["problems"]
    checked = document["recordings_checked"]
    verdict = "ok" if not problems else f"{len(problems)} problem{'' if len(problems) == 1 else 's'}"
    lines = [f"verified {checked} recording{'' if checked == 1 else 's'} in {document['dir']}: {verdict}"]
    lines.extend(f"  recording {p['recording_id']}: {p['problem']} {p['path']}" for p in problems)
    lines.extend(f"note: {note}" for note in document["notes"])
    return "\n".join(lines)


def archive_errors_document(archive_dir: Path) -> dict[str, Any]:
    _check_archive_dir(archive_dir)
    decoder, _ = _mark_file_decoder(archive_dir)
    return {"dir": str(archive_dir), "archive_pid": decoder.pid, "errors": _read_archive_errors(archive_dir, decoder)}


def format_archive_errors(document: dict[str, Any]) -> str:
    errors = document["errors"]
    if not errors:
        return f"no errors in {document['dir']}"
    noun = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} distinct {noun} in {document['dir']} (archive pid {document['archive_pid']})"]
    for error in errors:
        count = error["observation_count"]
        lines.append(
            f"{count} observation{'' if count == 1 else 's'} "
            f"from {error['first_observation']} to {error['last_observation']}:"
        )
        lines.extend(f"    {line}" for line in error["text"].splitlines() or [""])
    return "\n".join(lines)


archive_dir_option = click.option(
    "--archive-dir",
    "archive_dir",
    required=True,
    type=click.Path(file_okay=False, dir_okay=True, path_type=Path),
    help="The archive directory (archive.catalog, archive-mark.dat, segment files).",
)


@main.group(name="archive")
def archive_group() -> None:
    """Inspect an archive directory offline, like Aeron's ArchiveTool.

    Nothing is written: the catalog and the mark file are read, never opened
    for writing, so these commands are safe on a live archive's directory
    and show a stopped or crashed archive's files as it left them.

    Exit codes: 0 ok; 1 no usable archive files (missing directory, missing
    or corrupt catalog or mark file), an unknown --id, or (verify) problems
    found; 3 (describe) the files are there but no archive is running.
    """


@archive_group.command(name="describe", short_help="Show the mark file, catalog header and counts.")
@archive_dir_option
@json_option
def archive_describe(archive_dir: Path, as_json: bool) -> None:
    """Show who owns the directory (pid, archive id, channels, activity age,
    whether it is running), the catalog header and counts of recordings and
    segment files.

    Running means a fresh activity timestamp (within the default 10 s liveness
    timeout) and a live pid, as a starting archive checks.  Exits 3 when no
    archive is running in the directory.
    """
    try:
        document = archive_describe_document(archive_dir, epoch_ms())
    except ArchiveReadError as error:
        _archive_fail(error)
    click.echo(json.dumps(document) if as_json else format_archive_describe(document))
    if not document["running"]:
        sys.exit(EXIT_ARCHIVE_NOT_RUNNING)


@archive_group.command(name="recordings", short_help="List the recordings in the catalog.")
@archive_dir_option
@click.option("--id", "recording_id", type=int, default=None, help="Only this recording (in any state).")
@click.option("--all", "include_all", is_flag=True, help="Also list INVALID (purged) and DELETED entries.")
@json_option
def archive_recordings(archive_dir: Path, recording_id: int | None, include_all: bool, as_json: bool) -> None:
    """One line per recording: id, state, start and stop positions, times
    (UTC), stream and session id, segment files and their bytes, channel.

    A stop of "active" is a recording the running archive is writing;
    "open (archive not running)" is one left unstopped by an archive that
    died: the next archive started on the directory recovers it.  Exits 1
    if --id names no recording in the catalog.
    """
    try:
        document = archive_recordings_document(archive_dir, epoch_ms(), recording_id, include_all)
    except ArchiveReadError as error:
        _archive_fail(error)
    except LookupError as error:
        _fail(str(error.args[0]), EXIT_ARCHIVE_PROBLEM)
    if document["mark_file_error"] is not None and not as_json:
        click.echo(f"cluster-tool: warning: {document['mark_file_error']}: taking the archive as not running", err=True)
    click.echo(json.dumps(document) if as_json else format_archive_recordings(document))


@archive_group.command(name="verify", short_help="Check that every recording's segment files exist.")
@archive_dir_option
@json_option
def archive_verify(archive_dir: Path, as_json: bool) -> None:
    """Check that every valid, stopped recording has all its segment files
    between its start and stop position; list what is missing and exit 1 if
    anything is.

    Read-only, so it runs on a live archive too (the output says so: files
    may change while they are checked).  Active or open recordings are not
    checked.
    """
    try:
        document = archive_verify_document(archive_dir, epoch_ms())
    except ArchiveReadError as error:
        _archive_fail(error)
    click.echo(json.dumps(document) if as_json else format_archive_verify(document))
    if document["problems"]:
        sys.exit(EXIT_ARCHIVE_PROBLEM)


@archive_group.command(name="errors", short_help="List the archive's distinct errors with counts and times.")
@archive_dir_option
@json_option
def archive_errors(archive_dir: Path, as_json: bool) -> None:
    """List the distinct errors the archive recorded in its mark file, with
    counts and times (UTC)."""
    try:
        document = archive_errors_document(archive_dir)
    except ArchiveReadError as error:
        _archive_fail(error)
    click.echo(json.dumps(document) if as_json else format_archive_errors(document))


if __name__ == "__main__":
    main()
