"""``cluster-tool``: inspect a node from outside, through its driver's cnc.dat.

Reading needs no running driver: a stopped node's leftover files still show
its last counters and errors.  Exit codes: 0 ok; 1 no (usable) driver files
in the directory; 3 (``driver`` only) the files are there but the driver is
not alive.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import click

from fulmar.cnc import CncError
from fulmar.error_log import CorruptErrorLogError

from fulmar.cli.cnc_reader import epoch_ms, open_cnc, read_counters, read_driver_status, read_errors
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


if __name__ == "__main__":
    main()
