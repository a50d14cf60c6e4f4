"""The driver's view of ``cluster-tool`` (Aeron's AeronStat and its kin):
counters, the distinct error log, the driver's liveness, loss injection.

Everything is read from the driver's cnc.dat (``cli/cnc_reader.py``), with no
running driver needed: a stopped node's leftover files still show its last
counters and errors.  Exit codes (``tool_common``): 0 ok; 3 the files are
there but the driver is not alive (what they say is still shown); 4 no
(usable) driver files in the directory.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from fulmar.cli.cluster_commands import cluster_counters, cluster_errors, is_cluster_dir
from fulmar.cli.cnc_reader import open_cnc, read_counters, read_driver_status, read_errors
from fulmar.cli.options import driver_dir_option, resolve_driver_dir
from fulmar.cli.tool_common import (
    EXIT_NOT_RUNNING,
    EXIT_UNREADABLE,
    fail,
    format_counters,
    format_error_list,
    json_option,
)
from fulmar.clock import epoch_ms
from fulmar.cnc import CncError
from fulmar.counters import counter_offset
from fulmar.driver.counters import SystemCounter
from fulmar.driver.loss_injection import PARTS_PER_MILLION, frame_type_mask
from fulmar.error_log import CorruptErrorLogError
from fulmar.frames import FrameType

EXIT_NO_DRIVER = EXIT_UNREADABLE
EXIT_DRIVER_NOT_ALIVE = EXIT_NOT_RUNNING

# ANSI: clear the screen, cursor to the top left.
CLEAR_SCREEN = "\033[2J\033[1;1H"


# ---------------------------------------------------------------------- counters


def counters_document(directory: str) -> dict[str, Any]:
    """``{"dir", "driver_pid", "driver_alive", "counters": [...]}``; ``CncError`` without driver files."""
    with open_cnc(directory) as cnc:
        alive = bool(read_driver_status(cnc, epoch_ms())["alive"])
        return {"dir": str(directory), "driver_pid": cnc.pid, "driver_alive": alive, "counters": read_counters(cnc)}


def _exit_if_not_alive(document: dict[str, Any]) -> None:
    if not document["driver_alive"]:
        sys.exit(EXIT_DRIVER_NOT_ALIVE)


def add_rates(document: dict[str, Any], previous: dict[str, Any] | None, interval_s: float | None) -> dict[str, Any]:
    """``document`` with each counter's change per second since ``previous``.

    Each counter gets ``rate_per_s`` and the document ``interval_s`` (the
    seconds between the two reads).  A counter has no rate (None) on the first
    read, when it was allocated since (a freed id taken again has a new
    registration id) or when the driver is another one (restarted).
    """
    comparable = previous is not None and interval_s and previous["driver_pid"] == document["driver_pid"]
    earlier: dict[tuple[int, int], int] = {}
    if previous is not None and comparable:
        earlier = {(c["id"], c["registration_id"]): c["value"] for c in previous["counters"]}
    for counter in document["counters"]:
        value = earlier.get((counter["id"], counter["registration_id"]))
        counter["rate_per_s"] = None if value is None or not interval_s else (counter["value"] - value) / interval_s
    document["interval_s"] = interval_s if comparable else None
    return document


@click.command()
@driver_dir_option
@click.option(
    "--watch",
    type=click.FloatRange(min=0.05),
    default=None,
    metavar="SECONDS",
    help="Refresh every SECONDS until Ctrl-C, with each counter's change per second since the "
    "refresh before (with --json: one JSON document per line, rate_per_s on each counter); "
    "while the directory holds no driver, show why and keep trying.",
)
@json_option
def counters(directory: str | None, watch: float | None, as_json: bool) -> None:
    """List every allocated counter: id, type, value and label.

    Given a node's (or a local cluster's) directory instead of a driver's, the
    cluster counters of each node (as ``cluster-tool cluster counters``)."""
    if directory is not None and watch is None and is_cluster_dir(Path(directory)):
        assert cluster_counters.callback is not None
        cluster_counters.callback(Path(directory), as_json)
        return
    path = str(resolve_driver_dir(directory))
    if watch is None:
        try:
            document = counters_document(path)
        except CncError as error:
            fail(str(error), EXIT_NO_DRIVER)
        click.echo(json.dumps(document) if as_json else format_counters(document))
        _exit_if_not_alive(document)
        return
    _watch_counters(path, watch, as_json)


def _watch_counters(directory: str, interval_s: float, as_json: bool) -> None:
    """Redraw the counters, with their rates, every interval until Ctrl-C.

    On a terminal the screen is cleared and redrawn in one write (no flicker);
    piped, the refreshes follow each other, each starting with its header.
    The rates divide by the time measured between the reads, not the
    interval asked for: a slow read or a late wake-up does not skew them.
    """
    previous: dict[str, Any] | None = None
    previous_read_s = 0.0
    try:
        while True:
            try:
                document = counters_document(directory)
                read_s = time.monotonic()
                add_rates(document, previous, read_s - previous_read_s if previous is not None else None)
                previous, previous_read_s = document, read_s
                text = json.dumps(document) if as_json else format_counters(document)
            except CncError as error:
                # A node being restarted: its directory comes back shortly.
                previous = None
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
    """``{"dir", "driver_pid", "driver_alive", "errors": [...]}``; ``CncError`` without driver files."""
    with open_cnc(directory) as cnc:
        alive = bool(read_driver_status(cnc, epoch_ms())["alive"])
        return {"dir": str(directory), "driver_pid": cnc.pid, "driver_alive": alive, "errors": read_errors(cnc)}


def format_errors(document: dict[str, Any]) -> str:
    if not document["errors"]:
        return f"no errors in {document['dir']}"
    return "\n".join(
        format_error_list(document["errors"], f"in {document['dir']} (driver pid {document['driver_pid']})")
    )


@click.command(short_help="List the distinct errors with counts and times.")
@driver_dir_option
@json_option
def errors(directory: str | None, as_json: bool) -> None:
    """List the distinct errors the driver recorded, with counts and times (UTC).

    Given a node's (or a local cluster's) directory instead of a driver's, the
    errors in its cluster mark files (as ``cluster-tool cluster errors``)."""
    if directory is not None and is_cluster_dir(Path(directory)):
        assert cluster_errors.callback is not None
        cluster_errors.callback(Path(directory), as_json)
        return
    path = str(resolve_driver_dir(directory))
    try:
        document = errors_document(path)
    except CncError as error:
        fail(str(error), EXIT_NO_DRIVER)
    except CorruptErrorLogError as error:
        fail(f"the error log in {path} is corrupt: {error}", EXIT_NO_DRIVER)
    click.echo(json.dumps(document) if as_json else format_errors(document))
    _exit_if_not_alive(document)


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


@click.command(short_help="Show whether the driver is alive, its pid and buffers.")
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
        fail(str(error), EXIT_NO_DRIVER)
    click.echo(json.dumps(status) if as_json else format_driver(status))
    if not status["alive"]:
        sys.exit(EXIT_DRIVER_NOT_ALIVE)


# ---------------------------------------------------------------------- loss injection
#
# The driver reads its loss-injection settings from three of its system
# counters on every datagram (driver/loss_injection.py), so writing them in
# cnc.dat partitions a running node, or makes its links lossy, at once.


_LOSS_FRAME_TYPES = {frame_type.name.lower(): int(frame_type) for frame_type in FrameType if frame_type.value >= 0}


def set_loss(
    directory: str | os.PathLike[str],
    receive_ppm: int | None = None,
    send_ppm: int | None = None,
    frame_types: tuple[int, ...] | None = None,
) -> None:
    """Set a running driver's loss injection (None leaves a setting as it is).

    Parts per million of the received and sent datagrams to drop (1,000,000:
    all of them, a partition); ``frame_types`` limits it to those frame
    types, () to every datagram."""
    for name, rate in (("receive", receive_ppm), ("send", send_ppm)):
        if rate is not None and not 0 <= rate <= PARTS_PER_MILLION:
            raise ValueError(f"{name} loss {rate} ppm is outside 0..{PARTS_PER_MILLION}")
    with open_cnc(str(directory)) as cnc:
        values = cnc.counters_values
        if frame_types is not None:
            values.put_int64_ordered(counter_offset(SystemCounter.LOSS_FRAME_TYPE_MASK), frame_type_mask(*frame_types))
        if receive_ppm is not None:
            values.put_int64_ordered(counter_offset(SystemCounter.LOSS_RECEIVE_RATE_PPM), receive_ppm)
        if send_ppm is not None:
            values.put_int64_ordered(counter_offset(SystemCounter.LOSS_SEND_RATE_PPM), send_ppm)


def loss_document(directory: str) -> dict[str, Any]:
    with open_cnc(directory) as cnc:
        values = cnc.counters_values

        def value(counter: SystemCounter) -> int:
            return values.get_int64_volatile(counter_offset(counter))

        mask = value(SystemCounter.LOSS_FRAME_TYPE_MASK)
        return {
            "dir": directory,
            "driver_pid": cnc.pid,
            "driver_alive": bool(read_driver_status(cnc, epoch_ms())["alive"]),
            "receive_ppm": value(SystemCounter.LOSS_RECEIVE_RATE_PPM),
            "send_ppm": value(SystemCounter.LOSS_SEND_RATE_PPM),
            "frame_types": [name for name, bit in _LOSS_FRAME_TYPES.items() if mask & (1 << bit)] if mask else "all",
            "dropped": value(SystemCounter.DATAGRAMS_DROPPED_BY_LOSS_INJECTION),
        }


def format_loss(document: dict[str, Any]) -> str:
    types = document["frame_types"]
    return "\n".join(
        [
            f"loss injection of the driver pid {document['driver_pid']} in {document['dir']}:",
            f"  receive   {document['receive_ppm'] / 10_000:g}% ({document['receive_ppm']} ppm)",
            f"  send      {document['send_ppm'] / 10_000:g}% ({document['send_ppm']} ppm)",
            f"  frames    {types if types == 'all' else ', '.join(types)}",
            f"  dropped   {document['dropped']} datagrams so far",
        ]
    )


def _parse_rate(value: str | None, option: str) -> int | None:
    """``25%``, ``0.5%`` or parts per million (``250000``)."""
    if value is None:
        return None
    try:
        rate = round(float(value[:-1]) * 10_000) if value.endswith("%") else int(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a percentage (25%) nor parts per million", param_hint=option
        ) from None
    if not 0 <= rate <= PARTS_PER_MILLION:
        raise click.BadParameter(f"{value!r} is outside 0%..100%", param_hint=option)
    return rate


@click.command(short_help="Drop a share of a running driver's datagrams (partitions, lossy links).")
@driver_dir_option
@click.option(
    "--receive",
    "receive",
    default=None,
    metavar="RATE",
    help="Share of received datagrams to drop: 25%, or parts per million; 100% cuts the node off.",
)
@click.option("--send", "send", default=None, metavar="RATE", help="Share of sent datagrams to drop.")
@click.option(
    "--frame-types",
    default=None,
    metavar="TYPES",
    help=f"Only these frame types, comma separated ({', '.join(_LOSS_FRAME_TYPES)}), or 'all'.",
)
@click.option("--heal", is_flag=True, help="Drop nothing any more (rates 0, every frame type).")
@json_option
def loss(
    directory: str | None, receive: str | None, send: str | None, frame_types: str | None, heal: bool, as_json: bool
) -> None:
    """Show or set the driver's loss injection, while it runs.

    Without options, show the rates and how many datagrams were dropped.
    ``--receive 100% --send 100%`` isolates the node from every peer and
    client (a partition); ``--send 100%`` alone is one-way loss; ``--heal``
    undoes it.  Only UDP is affected: IPC within the node never drops.
    """
    path = str(resolve_driver_dir(directory))
    receive_ppm, send_ppm = _parse_rate(receive, "--receive"), _parse_rate(send, "--send")
    types: tuple[int, ...] | None = None
    if frame_types is not None:
        names = [name.strip().lower() for name in frame_types.split(",") if name.strip()]
        unknown = [name for name in names if name not in _LOSS_FRAME_TYPES and name != "all"]
        if unknown:
            raise click.BadParameter(
                f"unknown frame type {unknown[0]!r} (types: {', '.join(_LOSS_FRAME_TYPES)})", param_hint="--frame-types"
            )
        types = () if "all" in names else tuple(_LOSS_FRAME_TYPES[name] for name in names)
    if heal:
        receive_ppm, send_ppm, types = 0, 0, ()
    try:
        if receive_ppm is not None or send_ppm is not None or types is not None:
            set_loss(path, receive_ppm, send_ppm, types)
        document = loss_document(path)
    except CncError as error:
        fail(str(error), EXIT_NO_DRIVER)
    click.echo(json.dumps(document) if as_json else format_loss(document))
    _exit_if_not_alive(document)
