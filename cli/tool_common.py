"""What the ``cluster-tool`` command modules share: the exit codes, the
``--json`` option, the one-line failure, and the two tables more than one
view prints (counters, distinct error logs)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, NoReturn

import click

# One meaning per exit code, for every cluster-tool command (EXIT_CODES_HELP says it to users).
EXIT_OK = 0  # all good
EXIT_PROBLEM = 1  # an error in what was asked, or a violation
EXIT_USAGE = 2  # a bad option or argument (click's usage errors), or an extra the command needs is missing
EXIT_NOT_RUNNING = 3  # a node or process the command looks at is not running
EXIT_UNREADABLE = 4  # files that cannot be read: missing, unreadable or corrupt

EXIT_CODES_HELP = """\b
Exit codes (every command):
  0  all good
  1  an error in what was asked, or a violation: an operation refused or not
     done within --timeout, an unknown --id, a check that found problems
     (verify-log, archive verify), is-leader when the node is not the leader
     (no node leads), purge-log when a node could not be done, a Spark job
     (analyze, replay) that failed
  2  usage: a bad option or argument, or a command whose extra is not
     installed (analyze, replay, verify-log without the spark extra)
  3  a node or process the command looks at is not running (a member of a
     local cluster is down, the driver or the archive is not alive): what
     its files still say is shown.  Never from the commands that read an
     archive's files or judge a log, running or not (archive recordings,
     errors and verify, verify-log, analyze, replay)
  4  files that cannot be read: no such directory, no cluster, driver or
     archive files in it, a missing or corrupt file
  When several apply: 1, then 4, then 3."""

# Which code wins when several apply.
_PRECEDENCE = (EXIT_PROBLEM, EXIT_USAGE, EXIT_UNREADABLE, EXIT_NOT_RUNNING, EXIT_OK)


def worst(codes: Iterable[int]) -> int:
    """The exit code that wins among ``codes`` (EXIT_OK for none)."""
    present = set(codes)
    return next((code for code in _PRECEDENCE if code in present), EXIT_OK)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def fail(message: str, code: int) -> NoReturn:
    """Print ``cluster-tool: message`` on stderr and exit with ``code``."""
    click.echo(f"cluster-tool: {message}", err=True)
    sys.exit(code)


def format_counters(document: dict[str, Any]) -> str:
    """The counters as a table: id, type, value and label; with a rate/s column
    when the document has rates (``cluster-tool counters --watch``)."""
    counters = document["counters"]
    with_rates = "interval_s" in document
    title = f"driver pid {document['driver_pid']} in {document['dir']}: {len(counters)} counters"
    if with_rates:
        interval_s = document["interval_s"]
        title += (
            f", rates per second over the last {interval_s:.2f} s"
            if interval_s is not None
            else ", rates from the next refresh"
        )
    value_width = max([len("value")] + [len(str(counter["value"])) for counter in counters])
    rates = [_format_rate(counter.get("rate_per_s")) for counter in counters]
    rate_width = max([len("rate/s")] + [len(rate) for rate in rates])
    rate_title = f"  {'rate/s':>{rate_width}}" if with_rates else ""
    lines = [title, f"{'id':>4}  {'type':<22}  {'value':>{value_width}}{rate_title}  label"]
    for counter, rate in zip(counters, rates):
        kind = f"{counter['type_id']}" + (f" {counter['type']}" if counter["type"] else "")
        rate_cell = f"  {rate:>{rate_width}}" if with_rates else ""
        lines.append(
            f"{counter['id']:>4}  {kind:<22}  {counter['value']:>{value_width}}{rate_cell}  {counter['label']}"
        )
    return "\n".join(lines)


def _format_rate(rate_per_s: float | None) -> str:
    """``-`` without a rate; whole numbers from 100 up, two decimals below (one event a minute shows)."""
    if rate_per_s is None:
        return "-"
    return f"{rate_per_s:.0f}" if abs(rate_per_s) >= 100 else f"{rate_per_s:.2f}"


def format_error_list(errors: list[dict[str, Any]], title: str, indent: str = "") -> list[str]:
    """A distinct error log as text: a title line, then each error's counts,
    times and text (texts may span lines, e.g. stack traces: all indented)."""
    noun = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} distinct {noun} {title}"]
    for error in errors:
        count = error["observation_count"]
        lines.append(
            f"{indent}{count} observation{'' if count == 1 else 's'} "
            f"from {error['first_observation']} to {error['last_observation']}:"
        )
        lines.extend(f"{indent}    {line}" for line in error["text"].splitlines() or [""])
    return lines
