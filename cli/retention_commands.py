"""``cluster-tool purge-log``: let go of the log and snapshots before the
snapshot sets a member keeps (``fulmar.consensus.log_retention``).

It works on running nodes, through each node's own driver and archive (the
archive owns its catalog and segment files), and marks the recording log's
entries of the snapshots it deletes invalid in place, beside the running
consensus module (which only appends to that file and rewrites other fields).
With ``--dir BASE`` of a local cluster it does every member, and the cluster
backup when there is one.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from fulmar.aeron import Aeron
from fulmar.archive.client import AeronArchive
from fulmar.cli.tool_common import EXIT_NOT_RUNNING, EXIT_PROBLEM, EXIT_UNREADABLE, worst
from fulmar.clock import epoch_ms
from fulmar.consensus.log_retention import (
    LogRetentionError,
    RetentionPlan,
    RetentionResult,
    apply_retention,
    plan_retention,
)
from fulmar.consensus.mark_file import FILENAME as CLUSTER_MARK_FILE_NAME
from fulmar.consensus.mark_file import SERVICE_FILENAME_PREFIX, read_cluster_mark_file, read_liveness
from fulmar.consensus.recording_log import (
    RECORDING_LOG_FILE_NAME,
    Entry,
    decode_entries,
    invalidate_entry_in_place,
)
from fulmar.errors import FulmarError


@dataclass
class NodeRetention:
    name: str
    cluster_dir: Path
    plan: RetentionPlan | None = None
    result: RetentionResult | None = None
    error: str | None = None
    running: bool = True  # whether its consensus module ran when it could not be done

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return EXIT_PROBLEM if self.running else EXIT_NOT_RUNNING
        return EXIT_PROBLEM if self.result is not None and self.result.problems else 0

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.name, "cluster_dir": str(self.cluster_dir)}
        if self.error is not None:
            out["error"] = self.error
        plan = self.result.plan if self.result is not None else self.plan
        if plan is not None:
            out.update(
                {
                    "kept_snapshot_positions": [s.log_position for s in plan.kept],
                    "snapshot_recordings_to_delete": [e.recording_id for e in plan.removed],
                    "log_recording_id": plan.log_recording_id,
                    "log_start_position": plan.log_start_position,
                    "new_log_start_position": plan.new_log_start_position,
                }
            )
        if self.result is not None:
            out.update(
                {
                    "segments_deleted": self.result.segments_deleted,
                    "snapshot_recordings_deleted": self.result.snapshots_deleted,
                    "problems": self.result.problems,
                }
            )
        return out

    def text(self, dry_run: bool) -> str:
        if self.error is not None:
            return f"{self.name}: {self.error}"
        if self.result is not None:
            return f"{self.name}: {self.result.describe()}"
        assert self.plan is not None
        plan = self.plan
        kept = ", ".join(str(s.log_position) for s in plan.kept) or "none"
        log = (
            f"purge log recording {plan.log_recording_id} from {plan.log_start_position} to "
            f"{plan.new_log_start_position}"
            if plan.purges_log
            else f"nothing to purge in log recording {plan.log_recording_id} (starts at {plan.log_start_position})"
        )
        prefix = "would keep" if dry_run else "keeps"
        return (
            f"{self.name}: {prefix} snapshot sets at {kept}; delete {len(plan.removed)} older snapshot "
            f"recording(s); {log}"
        )


def service_count_of(cluster_dir: Path, entries: list[Entry]) -> int:
    """How many services a member's snapshot sets hold: its service mark
    files, or (a backup has none) every service id its recording log names.
    Counting one too many only keeps more; one too few could keep a set that
    recovery would pass over."""
    marks = [p for p in cluster_dir.glob(f"{SERVICE_FILENAME_PREFIX}*") if p.is_file()]
    named = max((e.service_id for e in entries if e.is_valid_snapshot), default=-1) + 1
    return max(len(marks), named)


def purge_node(name: str, cluster_dir: Path, keep_snapshots: int, dry_run: bool) -> NodeRetention:
    node = NodeRetention(name, cluster_dir)
    try:
        mark = read_cluster_mark_file(cluster_dir / CLUSTER_MARK_FILE_NAME)
        driver_dir = mark.header.aeron_directory
        log_path = cluster_dir / RECORDING_LOG_FILE_NAME
        entries = decode_entries(log_path.read_bytes(), str(log_path)).entries
        with Aeron.connect(driver_dir) as aeron, AeronArchive.connect(aeron) as archive:
            node.plan = plan_retention(
                entries, service_count_of(cluster_dir, entries), keep_snapshots, archive.list_recording, str(log_path)
            )
            if not dry_run:
                node.result = apply_retention(
                    archive, lambda entry: invalidate_entry_in_place(log_path, entry), node.plan
                )
    except FileNotFoundError as error:
        node.error = f"{error.filename or error}: no such file"
    except (FulmarError, LogRetentionError, OSError) as error:
        node.error = f"{type(error).__name__}: {error}"
    if node.error is not None:
        liveness = read_liveness(cluster_dir / CLUSTER_MARK_FILE_NAME)
        node.running = liveness is not None and liveness.is_active(epoch_ms())
        if not node.running:
            node.error += " (the node is not running: its driver and archive must be)"
    return node


def _fail(message: str) -> NoReturn:
    click.echo(f"cluster-tool: {message}", err=True)
    sys.exit(EXIT_UNREADABLE)


@click.command(name="purge-log", short_help="Purge each member's log and snapshots before the newest it keeps.")
@click.option(
    "--dir",
    "directory",
    required=True,
    type=click.Path(path_type=Path),
    help="A node's cluster directory, a node directory, or the base of a local cluster (every member, and its backup).",
)
@click.option(
    "--keep-snapshots",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="How many of the newest snapshot sets to keep; the log from the oldest of them on is kept.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be purged; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def purge_log(directory: Path, keep_snapshots: int, dry_run: bool, as_json: bool) -> None:
    """Keep the newest --keep-snapshots snapshot sets of each member (the
    consensus module's and every service's snapshot at one log position) and
    let go of the rest: the older snapshots' recording log entries are marked
    invalid and their recordings deleted, and the log recording's segment files
    before the segment holding the oldest kept snapshot are purged (Aeron's
    PurgeSegments).  A member recovers from its snapshot and the log after it,
    and a blank member joins from the leader's snapshot.  The node's driver
    and archive must be running.  Exit 1 if a running node could not be
    done (each says why), 3 if a node could not be done because it is not
    running, 4 if --dir holds no cluster files."""
    from fulmar.cli.cluster_commands import ClusterReadError, resolve_cluster_nodes

    try:
        _, nodes = resolve_cluster_nodes(directory)
    except ClusterReadError as error:
        _fail(str(error))
    done = [purge_node(node.name, node.cluster_dir, keep_snapshots, dry_run) for node in nodes]
    if as_json:
        click.echo(
            json.dumps(
                {"dry_run": dry_run, "keep_snapshots": keep_snapshots, "nodes": [node.document() for node in done]},
                indent=2,
            )
        )
    else:
        for node in done:
            click.echo(node.text(dry_run))
    sys.exit(worst(node.exit_code for node in done))
