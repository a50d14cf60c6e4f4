"""``cluster-tool verify-log``: every member's recorded log checked against
the invariants of the Raft log (:mod:`fulmar.analytics.log_verify` says what
each check guarantees).

``--dir`` is what the other cluster commands take: a node's cluster
directory, a node directory (``cluster/`` and ``archive/``) or a local
cluster's base (``node0/``, ``node1/``, ...; a cluster backup beside them is
left out).  Each member's archive is the ``archive/`` beside its
``cluster/``, as ``cluster-node start`` lays a node out.

Exit codes: 0 every check passed on every member; 1 a violation (whatever
else); 2 the ``spark`` extra (numpy, for the log decoder) is not installed;
4 no violation, but a member (or anything at all under ``--dir``) could not
be read: no archive or cluster directory, a missing or corrupt catalog or
recording log.  (Click's usage errors exit 2 too.)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fulmar.cli.archive_tool import archive_liveness
from fulmar.cli.cluster_commands import BACKUP_DIR_NAME, ClusterReadError, archive_dir_beside, resolve_cluster_nodes
from fulmar.cli.tool_common import EXIT_PROBLEM, EXIT_UNREADABLE, EXIT_USAGE, fail, json_option
from fulmar.clock import epoch_ms
from fulmar.consensus.protocol import LOG_STREAM_ID

if TYPE_CHECKING:
    from fulmar.analytics.log_verify import LogVerification, MemberFiles

EXIT_VIOLATIONS = EXIT_PROBLEM
EXIT_NOT_INSTALLED = EXIT_USAGE


def cluster_member_files(directory: Path) -> tuple[list[MemberFiles], list[str]]:
    """The members under ``directory``, each with the archive beside its
    cluster directory and whether an archive runs there now; and notes on
    what is left out.  ``ClusterReadError`` when there is no member."""
    from fulmar.analytics.log_verify import MemberFiles

    _, nodes = resolve_cluster_nodes(directory)
    now_ms = epoch_ms()
    members, notes = [], []
    for node in nodes:
        if node.name == BACKUP_DIR_NAME:
            notes.append(
                f"{node.cluster_dir}: a cluster backup, not checked (its recording.log names only the terms it "
                f"copied, not every term of its log)"
            )
            continue
        archive_dir = archive_dir_beside(node.cluster_dir)
        running = False
        if archive_dir is not None and archive_dir.is_dir():
            mark, _ = archive_liveness(archive_dir, now_ms)  # an unreadable mark file: no archive runs there
            running = mark is not None and bool(mark["running"])
        members.append(MemberFiles(node.name, node.cluster_dir, archive_dir, running))
    if not members:
        raise ClusterReadError(f"{directory}: no cluster member here, only a cluster backup")
    return members, notes


def verify_log(directory: str | os.PathLike[str], *, log_stream_id: int = LOG_STREAM_ID) -> LogVerification:
    """Check the recorded logs of the members under ``directory`` (see the
    module's docstring): ``result.violations`` lists every broken invariant
    (check, member, position, what), ``result.unreadable`` the members that
    could not be read, ``result.ok`` is True when both are empty.  Raises
    ``ClusterReadError`` when ``directory`` holds no member at all, and
    ImportError without numpy (the ``spark`` extra)."""
    from fulmar.analytics.log_verify import verify_members

    members, notes = cluster_member_files(Path(directory))
    result = verify_members(members, log_stream_id=log_stream_id)
    result.notes[:0] = notes
    return result


def format_verification(result: LogVerification, directory: Path) -> str:
    """What was checked, every violation and every member not read, as text."""
    names = ", ".join(m.name for m in result.members) or "none"
    lines = [f"verify-log {directory}: {len(result.members)} member log(s) read ({names})"]
    lines += [f"  {member.text()}" for member in result.members]
    for comparison in result.comparisons:
        ranges = ", ".join(f"{low}..{high}" for low, high in comparison.ranges) or "nothing in common"
        lines.append(
            f"  {comparison.member}/{comparison.other_member}: {comparison.bytes_compared} bytes compared over {ranges}"
        )
    lines += [f"UNREADABLE {u.member}: {u.reason}" for u in result.unreadable]
    lines += [f"VIOLATION {v.text()}" for v in result.violations]
    lines += [f"note: {note}" for note in result.notes]
    total = sum(c.bytes_compared for c in result.comparisons)
    checked = f"{sum(m.messages for m in result.members)} messages, {total} bytes compared"
    if result.violations:
        count = len(result.violations)
        lines.append(f"{count} violation{'' if count == 1 else 's'} ({checked})")
    elif result.unreadable:
        lines.append(
            f"no violation in what was read, but {len(result.unreadable)} member(s) could not be read ({checked})"
        )
    else:
        lines.append(f"ok: every check passed ({checked})")
    return "\n".join(lines)


@click.command(name="verify-log", short_help="Check every member's recorded log against the Raft log's invariants.")
@click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(path_type=Path),
    help="A node's cluster directory, a node directory, or the base of a local cluster (every member).",
)
@click.option(
    "--log-stream-id",
    type=int,
    default=LOG_STREAM_ID,
    show_default=True,
    help="The stream id of the cluster log in the archives.",
)
@json_option
def verify_log_command(directory: Path, log_stream_id: int, as_json: bool) -> None:
    """Read each member's log recording (the one its recording.log names) and
    recording.log, and check: every term opens with a NewLeadershipTermEvent
    of that term (term-event); terms never decrease along the log, every
    message carries the term it lies in (term-order); recording.log's terms,
    ends and snapshots match the log (recording-log); members hold the same
    bytes below both members' commit positions and wherever both put a
    position in the same term (agreement); the log decodes (log-damaged).
    Works on a stopped cluster and on a running one (the frames still being
    written are not read).  Exit 0 all passed, 1 a violation, 4 a member
    could not be read, 2 numpy (the spark extra) missing."""
    try:
        result = verify_log(directory, log_stream_id=log_stream_id)
    except ClusterReadError as error:
        fail(str(error), EXIT_UNREADABLE)
    except ImportError as error:
        fail(
            f"verify-log decodes the log with numpy, from the spark extra: pip install 'fulmar[spark]' ({error})",
            EXIT_NOT_INSTALLED,
        )
    if as_json:
        click.echo(json.dumps({"dir": str(directory), "log_stream_id": log_stream_id, **result.document()}, indent=2))
    else:
        click.echo(format_verification(result, directory))
    if result.violations:
        sys.exit(EXIT_VIOLATIONS)
    if result.unreadable:
        sys.exit(EXIT_UNREADABLE)
