"""The archive's view of ``cluster-tool`` (Aeron's ArchiveTool):
``cluster-tool archive describe | recordings | verify | errors``.

It reads an archive directory without writing to it: the catalog and the
mark file are mapped copy-on-write from read-only file descriptors
(MAP_PRIVATE), so not even a stray store could reach the files, and a live
archive's directory can be inspected while it runs.  Exit codes
(``tool_common``): 0 ok; 1 an unknown ``--id``, or (``verify``) problems
found; 3 (``archive describe`` only) the files are there but no archive is
running; 4 no usable archive files (missing, unreadable or corrupt catalog or
mark file).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from fulmar.archive.catalog import (
    CATALOG_FILE_NAME,
    NULL_POSITION,
    NULL_TIMESTAMP,
    Catalog,
    RecordingDescriptor,
    missing_segment_files,
)
from fulmar.archive.errors import ArchiveError, CatalogError, describe_os_error
from fulmar.archive.mark_file import LIVENESS_TIMEOUT_MS_DEFAULT, MARK_FILE_NAME, read_mark_file
from fulmar.archive.segment import SEGMENT_SUFFIX, first_bad_frame
from fulmar.buffers import AtomicBuffer
from fulmar.cli.cnc_reader import error_documents, iso_utc, process_exists
from fulmar.cli.tool_common import EXIT_NOT_RUNNING, EXIT_PROBLEM, EXIT_UNREADABLE, fail, format_error_list, json_option
from fulmar.clock import epoch_ms
from fulmar.codecs.generated.archive import RecordingState
from fulmar.codecs.generated.archive_mark import MarkFileHeaderDecoder
from fulmar.error_log import CorruptErrorLogError, read_error_log
from fulmar.errors import CodecError
from fulmar.semantic_version import version_text

EXIT_ARCHIVE_PROBLEM = EXIT_PROBLEM  # an unknown --id, or verify found problems
EXIT_ARCHIVE_NOT_RUNNING = EXIT_NOT_RUNNING  # (describe) no archive runs in the directory
EXIT_ARCHIVE_UNREADABLE = EXIT_UNREADABLE  # no usable archive files

STOP_ACTIVE = "active"
STOP_OPEN = "open (archive not running)"

_SEGMENT_FILE_NAME = re.compile(r"^(\d+)-(\d+)" + re.escape(SEGMENT_SUFFIX) + "$")
_STATE_NAMES = {RecordingState.VALID: "valid", RecordingState.INVALID: "invalid", RecordingState.DELETED: "deleted"}


class ArchiveReadError(Exception):
    """The archive directory cannot be read; the message is one line that names the file."""


def _archive_fail(error: ArchiveReadError) -> NoReturn:
    fail(str(error), EXIT_ARCHIVE_UNREADABLE)


def _check_archive_dir(archive_dir: Path) -> None:
    if not archive_dir.is_dir():
        raise ArchiveReadError(f"{archive_dir}: no such directory")


@contextmanager
def open_catalog_read_only(archive_dir: Path) -> Iterator[Catalog]:
    """The catalog of ``archive_dir``, validated by the archive's own loader, never written."""
    _check_archive_dir(archive_dir)
    try:
        catalog = Catalog.open_read_only(archive_dir)
    except CatalogError as error:
        raise ArchiveReadError(str(error)) from None
    except (CodecError, ValueError, IndexError) as error:  # defence in depth: the loader names offsets
        raise ArchiveReadError(f"{archive_dir / CATALOG_FILE_NAME}: corrupt catalog: {error}") from None
    try:
        yield catalog
    finally:
        catalog.close()


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


def mark_file_decoder(archive_dir: Path) -> tuple[MarkFileHeaderDecoder, int]:
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


def read_archive_errors(archive_dir: Path, decoder: MarkFileHeaderDecoder) -> list[dict[str, Any]]:
    """The mark file's distinct error log, oldest first.  Read, not mapped: an
    archive starting now recreates the file, and a mapping cut short under a
    reader faults it where a read comes back short."""
    path = archive_dir / MARK_FILE_NAME
    length = decoder.error_buffer_length
    if length == 0:
        return []
    try:
        with open(path, "rb") as file:
            file.seek(decoder.header_length)
            data = bytearray(file.read(length))
    except OSError as error:
        raise ArchiveReadError(f"{path}: cannot read the mark file: {describe_os_error(error)}") from None
    if len(data) < length:
        raise ArchiveReadError(f"{path}: corrupt mark file: the error buffer runs past the end of the file")
    buffer = AtomicBuffer(data, 0, length)
    try:
        return error_documents(read_error_log(buffer))
    except (CorruptErrorLogError, ValueError) as error:
        raise ArchiveReadError(f"{path}: the error log is corrupt: {error}") from None
    finally:
        buffer.release()


def mark_status(decoder: MarkFileHeaderDecoder, file_length: int, now_ms: int) -> dict[str, Any]:
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
        "version": version_text(version),
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


def archive_liveness(archive_dir: Path, now_ms: int) -> tuple[dict[str, Any] | None, str | None]:
    """The mark file's status (None without a mark file) and why it could not be read, if so.

    For the commands that need only "is an archive running": a missing or
    broken mark file means no archive can be running there (a starting
    archive rewrites it before anything else).
    """
    try:
        decoder, length = mark_file_decoder(archive_dir)
    except ArchiveReadError as error:
        if not (archive_dir / MARK_FILE_NAME).exists():
            return None, None
        return None, str(error)
    return mark_status(decoder, length, now_ms), None


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
        decoder, length = mark_file_decoder(archive_dir)
        mark = mark_status(decoder, length, now_ms)
        try:
            mark["error_count"] = len(read_archive_errors(archive_dir, decoder))
        except ArchiveReadError:
            mark["error_count"] = None  # `archive errors` reports why
    with open_catalog_read_only(archive_dir) as catalog:
        entries = catalog.entries()
        catalog_document = {
            "path": str(catalog.path),
            "file_length": catalog.capacity,
            "version": version_text(catalog.version),
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
    return {
        "dir": str(archive_dir),
        "running": running,
        "mark_file": mark,
        "catalog": catalog_document,
        "counts": counts,
    }


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
    mark, mark_error = archive_liveness(archive_dir, now_ms)
    running = mark is not None and mark["running"]
    with open_catalog_read_only(archive_dir) as catalog:
        entries = catalog.entries()
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
            cell
            if column == len(row) - 1
            else cell.rjust(widths[column])
            if column in right
            else cell.ljust(widths[column])
            for column, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    lines.append(line(titles))
    lines.extend(line(row) for row in rows)
    return "\n".join(lines)


def archive_verify_document(archive_dir: Path, now_ms: int, checksum: bool = False) -> dict[str, Any]:
    """Check every VALID recording's segment files between start and stop exist;
    with ``checksum`` also walk every frame, checking its header and the CRC-32
    recorded with it (Aeron's ArchiveTool verify -checksum)."""
    _check_archive_dir(archive_dir)
    mark, mark_error = archive_liveness(archive_dir, now_ms)
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
        missing = missing_segment_files(archive_dir, descriptor)
        for path in missing:
            problems.append({"recording_id": descriptor.recording_id, "problem": "missing segment file", "path": path})
        if checksum and not missing:
            try:
                bad = first_bad_frame(archive_dir, descriptor, verify_crc=True)
            except ArchiveError as error:
                bad = (descriptor.start_position, str(error))
            if bad is not None:
                position, problem = bad
                problems.append(
                    {
                        "recording_id": descriptor.recording_id,
                        "position": position,
                        "problem": f"bad frame at position {position}:",
                        "path": problem,
                    }
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
    decoder, _ = mark_file_decoder(archive_dir)
    return {"dir": str(archive_dir), "archive_pid": decoder.pid, "errors": read_archive_errors(archive_dir, decoder)}


def format_archive_errors(document: dict[str, Any]) -> str:
    if not document["errors"]:
        return f"no errors in {document['dir']}"
    return "\n".join(
        format_error_list(document["errors"], f"in {document['dir']} (archive pid {document['archive_pid']})")
    )


archive_dir_option = click.option(
    "--archive-dir",
    "archive_dir",
    required=True,
    type=click.Path(file_okay=False, dir_okay=True, path_type=Path),
    help="The archive directory (archive.catalog, archive-mark.dat, segment files).",
)


@click.group(name="archive")
def archive_group() -> None:
    """Inspect an archive directory offline, like Aeron's ArchiveTool.

    Nothing is written: the catalog and the mark file are read, never opened
    for writing, so these commands are safe on a live archive's directory
    and show a stopped or crashed archive's files as it left them.

    Exit codes (as for every cluster-tool command): 0 ok; 1 an unknown
    --id, or (verify) problems found; 3 (describe, which says who owns the
    directory) the files are there but no archive is running: the other
    commands read the files, running or not; 4 no usable archive files
    (missing directory, missing or corrupt catalog or mark file).
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
        fail(str(error.args[0]), EXIT_ARCHIVE_PROBLEM)
    if document["mark_file_error"] is not None and not as_json:
        click.echo(f"cluster-tool: warning: {document['mark_file_error']}: taking the archive as not running", err=True)
    click.echo(json.dumps(document) if as_json else format_archive_recordings(document))


@archive_group.command(name="verify", short_help="Check that every recording's segment files exist.")
@archive_dir_option
@click.option(
    "--checksum",
    is_flag=True,
    help="Also read every frame: its header must be the one recorded there and its CRC-32 (recorded "
    "with --record-checksum) must match its payload.",
)
@json_option
def archive_verify(archive_dir: Path, checksum: bool, as_json: bool) -> None:
    """Check that every valid, stopped recording has all its segment files
    between its start and stop position; list what is missing and exit 1 if
    anything is.  With --checksum, also check every frame between start and
    stop (length, type, term id and offset, stream id, and the CRC-32 in its
    session id field) and report the first bad frame of each recording: its
    position, segment file and offset.  Nothing is changed: the repair is the
    operator's (see the recovery notes).

    Read-only, so it runs on a live archive too (the output says so: files
    may change while they are checked).  Active or open recordings are not
    checked.
    """
    try:
        document = archive_verify_document(archive_dir, epoch_ms(), checksum)
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
