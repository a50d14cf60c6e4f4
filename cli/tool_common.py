"""What the ``cluster-tool`` command modules share: the ``--json`` option, the
one-line failure, and the two tables more than one view prints (counters,
distinct error logs)."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


def fail(message: str, code: int) -> NoReturn:
    """Print ``cluster-tool: message`` on stderr and exit with ``code``."""
    click.echo(f"cluster-tool: {message}", err=True)
    sys.exit(code)


def format_counters(document: dict[str, Any]) -> str:
    counters = document["counters"]
    lines = [f"driver pid {document['driver_pid']} in {document['dir']}: {len(counters)} counters"]
    value_width = max([len("value")] + [len(str(counter["value"])) for counter in counters])
    lines.append(f"{'id':>4}  {'type':<22}  {'value':>{value_width}}  label")
    for counter in counters:
        kind = f"{counter['type_id']}" + (f" {counter['type']}" if counter["type"] else "")
        lines.append(f"{counter['id']:>4}  {kind:<22}  {counter['value']:>{value_width}}  {counter['label']}")
    return "\n".join(lines)


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
